package cluster_test

import (
	"strconv"
	"testing"
	"time"
)

// TestBusyConsumerLeavesTheRestToOthers: two consumers of one group on a
// node that leads none of the queue's partitions (placed on a, of three). The first takes as many
// as its Receive Maximum allows and settles none; the second, joining
// later, gets every other message at once: none waits on the first one's
// node for a credit it will not get, and the first is offered no more
// than it can take.
func TestBusyConsumerLeavesTheRestToOthers(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    fair:\n      partitions: 4\n      replication_factor: 1\n      ordering: none\n"+
		"cluster:\n  placement:\n    - queues: \"fair\"\n      nodes: [a]\n")
	c := newCluster(t, "--config", cfg)
	a := c.start("a")
	b := c.start("b")
	c.start("c")
	c.waitOwned("fair", 4, 15*time.Second, "a")
	prod := dial(t, a.mqtt, "producer", 64)
	const total, rm = 20, 10
	for i := range total {
		if code, err := prod.publish("$queue/fair", "k"+strconv.Itoa(i), message("m", i)); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
	}
	busy := dialManual(t, b.mqtt, "busy", rm)
	busy.subscribe("$share/g/$queue/fair")
	waitCount(t, rm, 10*time.Second, busy)
	other := dial(t, b.mqtt, "other", rm)
	joined := time.Now()
	other.subscribe("$share/g/$queue/fair")
	waitCount(t, total-rm, 10*time.Second, other)
	t.Logf("the second consumer had the other %d %s after it subscribed", total-rm, time.Since(joined).Round(time.Millisecond))
	if got := len(busy.received()); got != rm {
		t.Errorf("the busy consumer got %d deliveries; its Receive Maximum is %d and it settled none", got, rm)
	}
	seen := map[string]bool{}
	for _, cl := range []*client{busy, other} {
		for _, p := range cl.received() {
			if seen[string(p.Payload)] {
				t.Errorf("%s delivered twice", p.Payload)
			}
			seen[string(p.Payload)] = true
		}
	}
}
