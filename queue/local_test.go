package queue_test

import (
	"strconv"
	"testing"

	"github.com/shardq/shardq/queue"
)

// A cluster relays the deliveries of a consumer connected to another node
// (and its settlements back), which costs both nodes. A group gives a
// partition's messages to its local consumers first while they keep up;
// one that falls behind leaves the rest to the remote ones, holding at
// most queue.LocalLead more unsettled deliveries than the least busy of
// them.
func TestLocalConsumersGoFirst(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.subscribe("q", "remote", sub{remote: true})
	h.subscribe("q", "local", sub{})
	// Settled as they come: each goes to the local consumer.
	for i := range 20 {
		h.mustPublish("q", kmsg("k"+strconv.Itoa(i), "m"+strconv.Itoa(i)))
		for _, d := range h.newDeliveries(1) {
			if d.to != "local" {
				t.Fatalf("delivery %d went to %s with the local consumer settling each one", i, d.to)
			}
			h.mustSettle(d, acked)
		}
	}
	// None settled: the local consumer takes LocalLead, then the two
	// take turns.
	lead := queue.LocalLead
	n := 3 * lead
	for i := range n {
		h.mustPublish("q", kmsg("k"+strconv.Itoa(i), "u"+strconv.Itoa(i)))
	}
	got := map[string]int{}
	for _, d := range h.newDeliveries(n) {
		got[d.to]++
	}
	if got["local"]+got["remote"] != n || got["local"]-got["remote"] != lead {
		t.Fatalf("unsettled: local %d, remote %d of %d; want the local one to hold %d more", got["local"], got["remote"], n, lead)
	}
}

// A group's consumers take turns, message by message, also when each
// message comes on its own; with local consumers only, or remote ones
// only, as well.
func TestConsumersTakeTurns(t *testing.T) {
	for _, remote := range []bool{false, true} {
		h := newHarness(t, nil)
		h.start()
		h.subscribe("q", "a", sub{remote: remote})
		h.subscribe("q", "b", sub{remote: remote})
		const n = 20
		for i := range n {
			h.mustPublish("q", kmsg("k"+strconv.Itoa(i), "m"+strconv.Itoa(i)))
		}
		got := map[string]int{}
		for _, d := range h.newDeliveries(n) {
			got[d.to]++
		}
		if got["a"] != n/2 || got["b"] != n/2 {
			t.Fatalf("remote %v: a got %d, b %d of %d; want turns", remote, got["a"], got["b"], n)
		}
	}
}

// A turn that ends in a message for another consumer (the one its key's
// messages are in flight to, key_inflight) is not used up either.
func TestTurnGivenToAKeysHolderIsKept(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Partitions, o.KeyInflight = 1, 4 })
	h.start()
	h.subscribe("q", "a", sub{})
	h.subscribe("q", "b", sub{})
	h.mustPublish("q", kmsg("k", "k1"))
	h.expect("a:k1")
	h.mustPublish("q", kmsg("k", "k2")) // b's turn; k's messages go to a
	h.expect("a:k2")
	h.mustPublish("q", kmsg("y", "y1"))
	h.expect("b:y1")
}
