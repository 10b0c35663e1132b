package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	. "github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// deliveries is a Receiver that keeps what it is given.
type deliveries struct {
	mu sync.Mutex
	ds []Delivery
}

func (r *deliveries) Deliver(d Delivery) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
}

func (r *deliveries) waitFor(t *testing.T, n int) []Delivery {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		got := append([]Delivery(nil), r.ds...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d deliveries, want %d", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func ownershipManager(t *testing.T) *Manager {
	t.Helper()
	o := DefaultManagerOptions()
	o.Store = queuetest.NewMemStore(2)
	o.Tick, o.RetainEvery = time.Hour, time.Hour
	o.Defaults.Partitions = 2
	m, err := NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func publishWait(m *Manager, q string, msg *Message) error {
	done := make(chan error, 1)
	m.Publish(context.Background(), q, msg, func(err error) { done <- err })
	return <-done
}

// keyOf returns a key of partition p in a queue of n partitions.
func keyOf(p, n int) string {
	for i := 0; ; i++ {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if PartitionFor(k, n) == p {
			return k
		}
	}
}

func TestQueueReleaseHandsLeasesBackAndRefusesPublishes(t *testing.T) {
	ctx := context.Background()
	m := ownershipManager(t)
	k0, k1 := keyOf(0, 2), keyOf(1, 2)
	for _, k := range []string{k0, k1} {
		if err := publishWait(m, "jobs", &Message{Key: k, Payload: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	q := m.Queue("jobs")
	r := &deliveries{}
	if _, err := q.Subscribe("g", r, ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := r.waitFor(t, 2)
	var onP0 Delivery
	for _, d := range ds {
		if d.Partition == 0 {
			onP0 = d
		}
	}
	id := PartitionID{Queue: "jobs", Partition: 0}
	if err := m.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := publishWait(m, "jobs", &Message{Key: k0}); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("publish to a released partition: %v, want ErrNotOwned", err)
	}
	if err := publishWait(m, "jobs", &Message{Key: k1, Payload: []byte("other")}); err != nil {
		t.Fatalf("publish to the partition still owned: %v", err)
	}
	if err := m.Settle(onP0.Lease, Ack); !errors.Is(err, ErrNotLeased) {
		t.Fatalf("settling a lease of a released partition: %v, want ErrNotLeased", err)
	}
	if err := m.Acquire(ctx, id, 2); err != nil {
		t.Fatal(err)
	}
	// The publish to partition 1 waits behind its key's leased message:
	// the third delivery is partition 0's, back.
	again := r.waitFor(t, 3)
	var redelivered *Delivery
	for i := range again[2:] {
		if d := again[2+i]; d.Partition == 0 {
			redelivered = &d
		}
	}
	if redelivered == nil || string(redelivered.Message.Payload) != k0 || redelivered.Count != 2 {
		t.Fatalf("after the partition came back: %+v, want %q again with delivery-count 2", redelivered, k0)
	}
	if err := m.Acquire(ctx, id, 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("acquire with an older epoch: %v, want ErrFenced", err)
	}
}

func TestQueueStaleEpochWriteIsFenced(t *testing.T) {
	m := ownershipManager(t)
	k0 := keyOf(0, 2)
	if err := publishWait(m, "jobs", &Message{Key: k0}); err != nil {
		t.Fatal(err)
	}
	// Another owner took the partition over at epoch 7 while this node
	// still believes it owns it at epoch 1.
	if err := RaiseFence(m, PartitionID{Queue: "jobs", Partition: 0}, 7); err != nil {
		t.Fatal(err)
	}
	err := publishWait(m, "jobs", &Message{Key: k0, Payload: []byte("late")})
	var fe *FencedError
	if !errors.As(err, &fe) || fe.Epoch != 1 || fe.Current != 7 {
		t.Fatalf("publish under a stale epoch: %v, want a FencedError 1 < 7", err)
	}
	msgs, rerr := m.Queue("jobs").Peek(context.Background(), 0, 0, 10)
	if rerr != nil || len(msgs) != 1 {
		t.Fatalf("stored after the fenced publish: %d messages (%v), want the first only", len(msgs), rerr)
	}
}
