package queue_test

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// A delayed message parked behind a message of its key keeps its delay when
// the key frees.
func TestQueueDelayHoldsWhenParkedBehindItsKey(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), nil)
	if err := publish(t, m, "d", &queue.Message{Key: "k", Payload: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, m, "d", &queue.Message{Key: "k", Payload: []byte("delayed"), NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	if _, err := m.Queue("d").Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := r.wait(t, 1)
	start := time.Now()
	m.Settle(ds[0].Lease, queue.Ack)
	time.Sleep(100 * time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ds) > 1 {
		t.Fatalf("delayed-by-1h message %q delivered %v after the first was acked", r.ds[1].Message.Payload, time.Since(start))
	}
}

// With drop-oldest and a group, each evicted message is dead-lettered once,
// even while it waits for retention to delete it.
func TestQueueDropOldestDeadLettersEachMessageOnce(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), func(o *queue.ManagerOptions) {
		o.RetainEvery = 2 * time.Second
		o.Declared = map[string]queue.Options{}
		d := queue.DefaultOptions()
		d.Partitions = 1
		d.MaxMessages = 10
		d.Overflow = queue.OverflowDropOldest
		o.Declared["x"] = d
	})
	q, err := m.Open(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	// a group with no consumers
	c, _ := q.Subscribe("g", newRecorder(), queue.ConsumerOptions{Prefetch: 1})
	c.Close()
	for i := 0; i < 40; i++ {
		if err := publish(t, m, "x", &queue.Message{Key: "k", Payload: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	seen := map[string]int{}
	msgs, _ := q.DLQ().Peek(t.Context(), 0, 0, 1000)
	for _, mm := range msgs {
		seen[mm.DeadLetter.OriginalID]++
	}
	dups := 0
	for _, n := range seen {
		if n > 1 {
			dups += n - 1
		}
	}
	if got, want := q.DLQ().Stats().Enqueued.Load(), q.Stats().DeadLettered.Load(); got != want {
		t.Fatalf("dead-letter queue took %d messages for %d dead-lettered", got, want)
	}
	if dups > 0 {
		t.Fatalf("%d duplicate dead letters", dups)
	}
}

// With max_bytes only, a full dead-letter queue drops its own oldest: a
// reject never waits on it (the dead-letter publish may fail at once, with
// the queue's lock held).
func TestQueueRejectIntoFullDeadLetterQueueByBytes(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), func(o *queue.ManagerOptions) {
		d := queue.DefaultOptions()
		d.Partitions = 1
		d.MaxBytes = 1000
		o.Declared = map[string]queue.Options{"b": d}
	})
	payload := make([]byte, 400)
	q, _ := m.Open(t.Context(), "b")
	r := newRecorder()
	if _, err := q.Subscribe("g", r, queue.ConsumerOptions{Prefetch: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		var err error
		for try := 0; try < 100; try++ { // wait for retention to free the parent
			if err = publish(t, m, "b", &queue.Message{Key: "k", Payload: payload}); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		ds := r.wait(t, i+1)
		done := make(chan error, 1)
		go func() { done <- m.Settle(ds[i].Lease, queue.Reject) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("Settle(Reject) of delivery %d never returned: queue deadlocked (dlq full by bytes)", i+1)
		}
	}
}
