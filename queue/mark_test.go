package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// A consumer that takes messages faster than its group's delivered marks
// are stored would wait for each mark's write, a commit (in a cluster, a
// raft commit) per MarkAhead messages of a partition. A cursor that used
// up its mark before the next one was stored asks for wider marks from
// then on, never wider than MarkAheadMax; one whose mark lasts half its
// freshness asks for narrower ones again.
func TestAMarkUsedUpBeforeTheNextIsStoredWidens(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone; o.Prefetch = 4096 })
	var ms []msg
	for i := range 4000 {
		ms = append(ms, kmsg(fmt.Sprint("k", i), fmt.Sprint("m", i)))
	}
	h.mustPublish("q", ms...)
	h.subscribe("q", "c", sub{prefetch: 4096})
	ahead := func() int { return queue.MarkAheadOf(h.m, "q", "g", 0) }
	// The first mark is stored; the consumer's window is full.
	ds := h.newDeliveries(queue.InitialWindow)
	if got := ahead(); got != queue.MarkAhead {
		t.Fatalf("a new cursor's marks cover %d offsets, want %d", got, queue.MarkAhead)
	}
	// The disk stalls: settling the window gives the consumer more credit
	// (its window doubled) than the mark has offsets left, so the cursor
	// delivers up to its mark and waits for the next one, asked for at
	// half and held: from then on its marks cover more.
	h.store.HoldWrites()
	for _, d := range ds {
		h.mustSettle(d, acked)
	}
	waitFor(t, "marks wider than MarkAhead while a mark's write is held", func() bool { return ahead() > queue.MarkAhead })
	if got := ahead(); got > queue.MarkAheadMax {
		t.Fatalf("marks cover %d offsets, more than %d", got, queue.MarkAheadMax)
	}
	h.store.ReleaseWrites()
	// A slow consumer now: one delivery settled per half a mark's
	// freshness. Its marks are asked for by time, not used up: each
	// covers half as many offsets as the one before, down to MarkAhead.
	held := h.newDeliveries(1)
	for i := 0; ahead() > queue.MarkAhead; i++ {
		if i > 20 {
			t.Fatalf("marks still cover %d offsets after %d slow deliveries, want %d", ahead(), i, queue.MarkAhead)
		}
		// Its last mark is stored before the time passes.
		waitFor(t, "stored mark", func() bool {
			queue.WaitWritten(h.m)
			return !queue.MarkAsked(h.m, "q", "g", 0)
		})
		h.tick(300 * time.Millisecond)
		h.mustSettle(held[0], acked)
		held = append(held[1:], h.newDeliveries(0)...)
	}
}

// waitFor waits until cond holds, failing the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, waitLimit)
		}
		time.Sleep(time.Millisecond)
	}
}
