package cluster_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

const growConfig = "queues:\n  declared:\n    orders:\n      partitions: 4\n      retention: time\n      max_age: 1h\n      ack_timeout: 5s\n      replication_factor: %d\n"

// growConfig's ack_timeout is short: a delivery lost with the node killed
// below holds back, until it is redelivered, the moved keys that follow
// it in the group.
//
// TestGrowAcrossNodes (SPEC 7, partition count in a cluster): a queue of
// three nodes, replicated on all three, grows from 4 to 8 partitions
// through the admin API while producers on every node publish and a
// group on every node consumes. Nothing acknowledged is lost, every key's
// messages reach the group in order across the growth, and a group made
// afterwards, which reads the whole queue from its start (the moved keys
// in their old partitions, then in their new ones), gets them all in
// order too, though the leader of an old partition was killed as the
// growth spread. The count holds on every node, and survives a node's
// restart. The same with one replica per partition, whose owner cuts it
// alone.
func TestGrowAcrossNodes(t *testing.T) {
	for _, rf := range []int{3, 1} {
		t.Run(fmt.Sprintf("rf%d", rf), func(t *testing.T) { testGrowAcrossNodes(t, rf) })
	}
}

func testGrowAcrossNodes(t *testing.T, rf int) {
	c := newCluster(t, "--config", configFile(t, fmt.Sprintf(growConfig, rf)))
	nodes := []string{"a", "b", "c"}
	for _, id := range nodes {
		c.start(id)
	}
	placed := func(partitions int) {
		if rf == 1 {
			c.waitOwned("orders", partitions, 60*time.Second, nodes...)
		} else {
			c.waitPlaced("orders", partitions, nodes, nil, 60*time.Second)
		}
	}
	if rf == 1 {
		// A first publish makes the queue's partitions claimed.
		prod := dial(t, c.nodes["a"].mqtt, "first", 8)
		if code, err := prod.publish("$queue/orders", "first", message("first", 0)); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
	}
	placed(4)
	start := arrivals.len()
	for _, id := range nodes {
		dial(t, c.nodes[id].mqtt, "live-"+id, 64).subscribe("$share/live/$queue/orders")
	}
	stop := make(chan struct{})
	var ledgers []*ledger
	var dones []<-chan struct{}
	for _, id := range nodes {
		l, done := c.produceAcross([]string{id}, id+"k", 12, stop)
		ledgers, dones = append(ledgers, l), append(dones, done)
	}
	acked := func() int {
		n := 0
		for _, l := range ledgers {
			n += l.ackedCount()
		}
		return n
	}
	waitUntil(t, 20*time.Second, "300 messages acknowledged before the growth", func() bool { return acked() >= 300 })

	before := acked()
	begin := time.Now()
	status, body := c.call("b", http.MethodPut, "/api/v1/queues/orders", `{"partitions": 8}`)
	if status != http.StatusOK {
		t.Fatalf("PUT partitions 8 through b: HTTP %d %s", status, body)
	}
	if rf > 1 {
		// The leader of an old partition is killed as the growth spreads,
		// and comes back: the partition's next leader has its cut from
		// the replicated log, or takes one.
		victim := c.owners("orders")[0].Owner

		c.nodes[victim].kill()
		c.start(victim)
	}
	placed(8)
	t.Logf("%s: grown and placed", time.Since(begin).Round(time.Millisecond))
	waitUntil(t, 30*time.Second, "600 more messages acknowledged after the growth", func() bool { return acked() >= before+600 })

	close(stop)
	for _, d := range dones {
		<-d
	}
	for _, id := range nodes {
		status, body := c.call(id, http.MethodGet, "/api/v1/queues/orders", "")
		var v struct {
			Partitions []json.RawMessage `json:"partitions"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &v) != nil || len(v.Partitions) != 8 {
			t.Errorf("queue orders seen from %s: HTTP %d %s; want 8 partitions", id, status, body)
		}
	}
	for _, l := range ledgers {
		if codes := l.codeCounts(); codes[0x83] > 0 || codes[0x80] > 0 {
			t.Logf("publish answers across the growth: %v", codes)
		}
	}

	t.Logf("%s: producers stopped, %d acknowledged", time.Since(begin).Round(time.Millisecond), acked())
	live := waitArrivals(t, start, "live-", ledgers)

	t.Logf("%s: the live group got them all", time.Since(begin).Round(time.Millisecond))
	for _, l := range ledgers {
		l.check(t, live)
	}
	checkOrder(t, live)

	after := drainOrders(t, c, "after", ledgers...)

	t.Logf("%s: the group made afterwards got them all", time.Since(begin).Round(time.Millisecond))
	for _, l := range ledgers {
		l.check(t, after)
	}
	checkOrder(t, after)
	if moved := movedKeys(t, after); moved == 0 {
		t.Errorf("no key moved partition in the growth: the test checked nothing")
	}

	// A node restarted keeps the count and serves again.
	c.nodes["c"].kill()
	c.start("c")
	placed(8)
}

// waitUntil polls ok until it holds, or fails the test after within.
func waitUntil(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitArrivals waits until the clients whose ids start with prefix got
// every message the ledgers acknowledged, and returns their arrivals
// since start.
func waitArrivals(t *testing.T, start int, prefix string, ls []*ledger) []arrival {
	t.Helper()
	want := ackedBy(ls...)
	var mine []arrival
	deadline := time.Now().Add(30 * time.Second)
	seen := 0
	for len(want) > 0 && time.Now().Before(deadline) {
		got := arrivals.since(start + seen)
		seen += len(got)
		for _, a := range got {
			if strings.HasPrefix(a.client, prefix) {
				mine = append(mine, a)
				delete(want, string(a.p.Payload))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return mine
}

// movedKeys counts the keys whose messages arrived from more than one
// partition (the partition user property): those the growth moved.
func movedKeys(t *testing.T, got []arrival) int {
	parts := map[string]map[string]bool{}
	for _, a := range got {
		key, _ := parseMessage(t, a.p.Payload)
		if parts[key] == nil {
			parts[key] = map[string]bool{}
		}
		parts[key][userProp(a.p, "partition")] = true
	}
	n := 0
	for _, ps := range parts {
		if len(ps) > 1 {
			n++
		}
	}
	return n
}
