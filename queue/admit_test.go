package queue_test

import (
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
		o.Admit = func() error {
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
