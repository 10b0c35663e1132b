package queue_test

import (
	"testing"

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
	t.Run("a message never delivered is not counted", func(t *testing.T) {
		h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
		h.mustPublish("q", kmsg("a", "a1"), kmsg("b", "b1"))
		h.subscribe("q", "c", sub{prefetch: 1})
		h.expect("c:a1#1")
		h.crash()
		h.subscribe("q", "c", sub{})
		h.expect("c:a1#2", "c:b1#1")
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
