package queue_test

import (
	"context"
	"testing"

	"github.com/shardq/shardq/queue"
)

// TestQueueOwner: a queue created by a call whose context names an owner
// belongs to it, across a crash and a change of its settings; one created
// without is nobody's.
func TestQueueOwner(t *testing.T) {
	h := newHarness(t, nil)
	ctx := queue.WithOwner(context.Background(), "alice")
	if _, err := h.m.Open(ctx, "mine"); err != nil {
		t.Fatal(err)
	}
	h.mustPublish("other", kmsg("k", "x"))
	o := h.m.Queue("mine").Options()
	o.MaxDeliveries = 2
	if _, _, err := h.m.Declare(context.Background(), "mine", o); err != nil {
		t.Fatal(err)
	}
	h.crash()
	if got := h.m.Queue("mine").Owner(); got != "alice" {
		t.Fatalf("after a crash and a change of settings, mine belongs to %q, not alice", got)
	}
	if got := h.m.Queue("other").Owner(); got != "" {
		t.Fatalf("a queue created without an owner belongs to %q", got)
	}
}
