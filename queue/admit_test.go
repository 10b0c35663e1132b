package queue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// While Admit refuses, publishes fail with its error and store nothing;
// settlements go on; once it admits again, publishes are taken.
func TestManagerAdmitRefusesPublishesNotSettlements(t *testing.T) {
	var full atomic.Bool
	m := newManager(t, queuetest.NewMemStore(1), func(o *queue.ManagerOptions) {
		o.Admit = func(string) error {
			if full.Load() {
				return queue.ErrStorageFull
			}
			return nil
		}
	})
	if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	full.Store(true)
	if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("refused")}); !errors.Is(err, queue.ErrStorageFull) {
		t.Fatalf("publish while full: %v, want ErrStorageFull", err)
	}
	r := newRecorder()
	if _, err := m.Queue("q").Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := r.wait(t, 1)
	if string(ds[0].Message.Payload) != "before" {
		t.Fatalf("delivery %q, want before", ds[0].Message.Payload)
	}
	if err := m.Settle(ds[0].Lease, queue.Ack); err != nil {
		t.Fatalf("settle while full: %v", err)
	}
	full.Store(false)
	if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	ds = r.wait(t, 2)
	if string(ds[1].Message.Payload) != "after" {
		t.Fatalf("second delivery %q, want after (the refused message must not exist)", ds[1].Message.Payload)
	}
}

// A publish refused before it is stored creates no queue: a payload too
// large for the node, sent to a name no queue has, leaves no queue behind
// (a typo or a mistake would otherwise become a permanent queue).
func TestManagerRefusedFirstPublishCreatesNoQueue(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), func(o *queue.ManagerOptions) { o.MaxPayload = 8 })
	if err := publish(t, m, "big", &queue.Message{Key: "a", Payload: []byte("far too large")}); !errors.Is(err, queue.ErrTooLarge) {
		t.Fatalf("publish of 13 bytes with max_payload 8: %v, want ErrTooLarge", err)
	}
	if q := m.Queue("big"); q != nil {
		t.Fatalf("the refused publish created queue %s", q.Name())
	}
	if err := publish(t, m, "big", &queue.Message{Key: "a", Payload: []byte("fits")}); err != nil {
		t.Fatal(err)
	}
}

// Nor does a subscribe refused for partitions the queue would not have.
func TestManagerRefusedFirstSubscribeCreatesNoQueue(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), nil)
	f := queue.Filter{Queue: "typo", Group: "g"}
	if _, err := m.Subscribe(context.Background(), f, newRecorder(), queue.ConsumerOptions{Partitions: []int{99}}); !errors.Is(err, queue.ErrBadPartitions) {
		t.Fatalf("subscribe to partition 99: %v, want ErrBadPartitions", err)
	}
	if q := m.Queue("typo"); q != nil {
		t.Fatalf("the refused subscribe created queue %s", q.Name())
	}
}
