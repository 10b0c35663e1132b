package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// heldDLQStore holds back the completion of dead-letter queue appends
// while gate is set, until it is closed.
type heldDLQStore struct {
	*queuetest.MemStore
	mu   sync.Mutex
	gate chan struct{}
}

func (s *heldDLQStore) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	l, err := s.MemStore.OpenLogs(o)
	return &heldDLQLogs{Logs: l, s: s}, err
}

type heldDLQLogs struct {
	queue.Logs
	s *heldDLQStore
}

func (l *heldDLQLogs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	inner := l.Logs.Log(id, committed)
	if !queue.IsDLQ(id.Queue) {
		return inner
	}
	return &heldDLQLog{Log: inner, s: l.s}
}

type heldDLQLog struct {
	queue.Log
	s *heldDLQStore
}

func (g *heldDLQLog) Append(epoch uint64, msg *queue.Message, st *queue.Batch, sync bool, done func(error)) {
	g.s.mu.Lock()
	gate := g.s.gate
	g.s.mu.Unlock()
	if gate == nil || msg == nil || done == nil {
		g.Log.Append(epoch, msg, st, sync, done)
		return
	}
	g.Log.Append(epoch, msg, st, sync, func(err error) { go func() { <-gate; done(err) }() })
}

// TestQueuePurgeWhileDeadLettering: a message rejected and on its way to
// the dead-letter queue when the queue is purged does not, once its copy
// is stored, pass its key on to the key's next message: that one is
// still delivered one at a time (ordering key).
func TestQueuePurgeWhileDeadLettering(t *testing.T) {
	st := &heldDLQStore{MemStore: queuetest.NewMemStore(1)}
	o := testOptions()
	m := newManager(t, st, func(mo *queue.ManagerOptions) {
		mo.Defaults, mo.AutoCreate = o, true
		mo.Tick, mo.RetainEvery = time.Hour, time.Hour
	})
	ctx := context.Background()
	pub := func(p string) {
		t.Helper()
		done := make(chan error, 1)
		m.Publish(ctx, "q", &queue.Message{Key: "K", Payload: []byte(p)}, func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	r := newRecorder()
	if _, err := m.Subscribe(ctx, queue.Filter{Queue: "q", Group: "g"}, r, queue.ConsumerOptions{Prefetch: 10}); err != nil {
		t.Fatal(err)
	}
	pub("a")
	pub("b")
	a := r.wait(t, 1)[0]
	gate := make(chan struct{})
	st.mu.Lock()
	st.gate = gate
	st.mu.Unlock()
	if err := m.Settle(a.Lease, queue.Reject); err != nil {
		t.Fatal(err)
	}
	q := m.Queue("q")
	if _, err := q.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.gate = nil
	st.mu.Unlock()
	pub("c")
	pub("d")
	r.wait(t, 2) // c
	close(gate)  // a's dead-letter copy is stored now
	deadline := time.Now().Add(5 * time.Second)
	for q.Stats().DeadLettered.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a was not dead-lettered")
		}
		time.Sleep(time.Millisecond)
	}
	q.Info() // takes the partition's lock: the dead-lettering's turn with it is over
	var got []string
	for _, d := range r.wait(t, 2) {
		got = append(got, string(d.Message.Payload))
	}
	if len(got) != 2 || got[1] != "c" {
		t.Fatalf("deliveries %v: d went out while c, of the same key, was not settled", got)
	}
}
