package queue_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 3 and 4: a broker crash or restart ends the deliveries it had out:
// after it they come again with delivery-count one higher (and DUP, which
// hooks sets for every count above 1), and a message whose
// max_deliveries-th delivery a crash ended goes to the dead-letter queue,
// so a message that crashes the broker cannot loop forever.
func TestQueueCrashEndsDeliveries(t *testing.T) {
	t.Run("redelivered with the count raised", func(t *testing.T) {
		h := newHarness(t, nil)
		h.mustPublish("q", kmsg("a", "a1"), kmsg("b", "b1"))
		h.subscribe("q", "c", sub{})
		first := h.expect("c:a1#1", "c:b1#1")
		h.mustSettle(first[1], acked)
		h.crash()
		h.subscribe("q", "c", sub{})
		h.expect("c:a1#2")
	})
	t.Run("a delivery cut before any timer pass still counts", func(t *testing.T) {
		// The delivered mark is stored before the delivery is made.
		h := newHarness(t, nil)
		h.mustPublish("q", kmsg("a", "a1"))
		h.subscribe("q", "c", sub{})
		h.expect("c:a1#1")
		h.crashNow()
		h.subscribe("q", "c", sub{})
		h.expect("c:a1#2")
	})
	t.Run("the crash of the last allowed delivery dead-letters", func(t *testing.T) {
		h := newHarness(t, func(o *queue.Options) { o.MaxDeliveries = 2 })
		h.mustPublish("q", kmsg("a", "poison"))
		h.subscribe("q", "c", sub{})
		h.expect("c:poison#1")
		h.crash()
		h.subscribe("q", "c", sub{})
		h.expect("c:poison#2")
		h.crash()
		h.subscribe("q", "c", sub{})
		h.expectDeadLetters("q", deadLetter{payload: "poison", reason: queue.ReasonMaxDeliveries, id: "0-0", topic: "$queue/q", count: 2, group: "g"})
		h.expect()
	})
	t.Run("a message beyond the delivered mark is not counted", func(t *testing.T) {
		// The mark covers MarkAhead offsets from the first delivery: those
		// under it that were not delivered count one delivery more (and
		// come with DUP), those beyond it none.
		h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone; o.Prefetch = 1000 })
		var ms []msg
		for i := range queue.MarkAhead + 1 {
			ms = append(ms, kmsg(fmt.Sprint("k", i), fmt.Sprint("m", i)))
		}
		h.mustPublish("q", ms...)
		h.subscribe("q", "c", sub{prefetch: 1})
		h.expect("c:m0#1")
		h.crash()
		h.subscribe("q", "c", sub{prefetch: 1000})
		// A consumer starts with a window of InitialWindow deliveries:
		// the first ones are settled to let the last one through.
		counts := map[string]uint32{}
		for got := 0; got < queue.MarkAhead+1; {
			ds := h.newDeliveries(min(queue.InitialWindow, queue.MarkAhead+1-got))
			for _, d := range ds {
				counts[d.payload] = d.count
				h.mustSettle(d, acked)
			}
			got += len(ds)
		}
		first, beyond := "m0", fmt.Sprint("m", queue.MarkAhead)
		if counts[first] != 2 || counts[beyond] != 1 {
			t.Fatalf("after the crash: %s#%d, %s#%d; want %s#2 (delivered before it), %s#1 (beyond the mark)",
				first, counts[first], beyond, counts[beyond], first, beyond)
		}
	})
}

// A restart with nothing delivered since the last one ends no delivery:
// the count goes up once per crash that cut a delivery, not once per start.
func TestQueueRestartsWithoutDeliveriesCountNothing(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.MaxDeliveries = 3 })
	h.mustPublish("q", kmsg("a", "a1"))
	h.subscribe("q", "c", sub{})
	h.expect("c:a1#1")
	h.crash() // cuts delivery 1
	h.crash() // nothing was delivered
	h.crash()
	h.subscribe("q", "c", sub{})
	h.expect("c:a1#2")
}

// A cursor that delivered nothing for longer than a stored mark lasts (a
// node paused, or cut off from its replicas) delivers nothing, not even a
// lease that expired meanwhile, until it stored a new mark: a node that
// lost its partition cannot, and so never leases a message another node
// leases too.
func TestQueueDeliversOnlyUnderAFreshMark(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.AckTimeout = time.Second })
	h.mustPublish("q", kmsg("a", "a1"))
	h.subscribe("q", "c", sub{})
	h.expect("c:a1#1")
	h.store.FailWrites(errors.New("not the leader any more"))
	h.tick(2 * time.Second) // the lease expires, the mark is stale
	if got := h.newDeliveries(1); len(got) != 0 {
		t.Fatalf("delivered %v with no fresh mark stored", got)
	}
	h.store.FailWrites(nil)
	h.tick(0)
	h.expect("c:a1#2")
}

// A delivered mark whose write fails (a leader stepping down, a disk
// error) is asked for again by itself: nothing else may come to dispatch
// the cursor, whose messages would then wait for good.
func TestQueueFailedMarkIsAskedAgain(t *testing.T) {
	h := newHarness(t, nil)
	h.mustPublish("q", kmsg("a", "a1"))
	h.store.FailNextWrites(1, errors.New("not the leader any more"))
	h.subscribe("q", "c", sub{})
	h.expect("c:a1#1")
}

// A delivery its connection gives back before writing it (it turned stale
// on its way from another node) never reached the client: the message is
// delivered again at once, without backoff, and with the same count, so
// the client sees no DUP for a delivery it never saw.
func TestQueueUnsentDeliveryIsNotCounted(t *testing.T) {
	h := newHarness(t, nil)
	h.mustPublish("q", kmsg("a", "a1"), kmsg("a", "a2"))
	h.subscribe("q", "c", sub{})
	d := h.expect("c:a1#1")[0]
	h.mustSettle(d, unsent)
	again := h.expect("c:a1#1")[0]
	h.mustSettle(again, acked)
	h.expect("c:a2#1")
}

// A lease made here is live until it ends; a delivery from another node
// until its Until.
func TestQueueLeaseLive(t *testing.T) {
	h := newHarness(t, nil)
	h.mustPublish("q", kmsg("a", "a1"))
	h.subscribe("q", "c", sub{})
	d := h.expect("c:a1#1")[0]
	now := h.clock()
	if !d.raw.Lease.Live(now) {
		t.Fatal("a delivery not settled yet: its lease is not live")
	}
	h.mustSettle(d, nacked)
	if d.raw.Lease.Live(now) {
		t.Fatal("a nacked delivery's lease is still live: its connection would write it after the nack")
	}
	remote := queue.LeaseRef{Partition: queue.PartitionID{Queue: "q"}, Group: "g", Until: now.Add(time.Second)}
	if !remote.Live(now) || remote.Live(now.Add(time.Second)) {
		t.Fatalf("a delivery from another node until %v: live at %v %v, at Until %v; want true, false",
			remote.Until, now, remote.Live(now), remote.Live(now.Add(time.Second)))
	}
}

// In a cluster a partition loaded with deliveries its last owner had out
// holds those back for HandoverGrace: a delivery of the last owner still
// on its way to a client on another node reaches it first, or turns stale
// there, so the next delivery, with DUP, comes after it. Messages it never
// delivered go out at once.
func TestQueueHandoverGraceHoldsRedeliveries(t *testing.T) {
	h := newHarness(t, nil)
	h.mo.HandoverGrace = 2 * time.Second
	h.mustPublish("q", kmsg("a", "a1"), kmsg("b", "b1"))
	h.subscribe("q", "c", sub{})
	first := h.expect("c:a1#1", "c:b1#1")
	h.mustSettle(first[1], acked)
	h.crash()
	h.subscribe("q", "c", sub{})
	h.mustPublish("q", kmsg("x", "x1"))
	h.mustSettle(h.expect("c:x1#1")[0], acked) // new: not held
	if got := h.newDeliveries(1); len(got) != 0 {
		t.Fatalf("delivered %v before the handover grace ran out", got)
	}
	h.tick(2 * time.Second)
	h.mustSettle(h.expect("c:a1#2")[0], acked)

	// Nothing was out: nothing is held.
	h.crash()
	h.mustPublish("q", kmsg("c", "c1"))
	h.subscribe("q", "c", sub{})
	h.expect("c:c1#1")
}
