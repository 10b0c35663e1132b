package cluster_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// message is one published test message: key k, sequence number i.
func message(key string, i int) []byte { return []byte(fmt.Sprintf("%s:%d", key, i)) }

func parseMessage(t *testing.T, b []byte) (string, int) {
	t.Helper()
	key, n, ok := strings.Cut(string(b), ":")
	i, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Fatalf("unexpected payload %q", b)
	}
	return key, i
}

// TestQueueAcrossNodes: a producer on A, one group's consumers on B and C
// and a second group on C. Each group gets every message once, each key's
// messages in order.
func TestQueueAcrossNodes(t *testing.T) {
	c := newCluster(t)
	a, b, cc := c.start("a"), c.start("b"), c.start("c")
	start := arrivals.len()
	g1 := dial(t, b.mqtt, "g1-on-b", 32)
	g1.subscribe("$share/billing/$queue/orders")
	g2 := dial(t, cc.mqtt, "g1-on-c", 32)
	g2.subscribe("$share/billing/$queue/orders")
	h := dial(t, cc.mqtt, "audit-on-c", 32)
	h.subscribe("$share/audit/$queue/orders")
	c.waitOwned("orders", 8, 10*time.Second, "a", "b", "c")
	owners := map[string]int{}
	for _, o := range c.owners("orders") {
		owners[o.Owner]++
	}
	if len(owners) < 2 {
		t.Fatalf("partitions owned by %v: expected them spread over the nodes", owners)
	}

	prod := dial(t, a.mqtt, "producer-on-a", 32)
	const keys, per = 12, 25
	for i := 0; i < per; i++ {
		for k := 0; k < keys; k++ {
			key := "k" + strconv.Itoa(k)
			code, err := prod.publish("$queue/orders", key, message(key, i))
			if err != nil || code != 0 {
				t.Fatalf("publish %s %d: code %#x, %v", key, i, code, err)
			}
		}
	}
	waitCount(t, keys*per, 20*time.Second, g1, g2)
	waitCount(t, keys*per, 20*time.Second, h)

	for _, group := range []struct {
		name    string
		clients map[string]bool
	}{{"billing", map[string]bool{"g1-on-b": true, "g1-on-c": true}}, {"audit", map[string]bool{"audit-on-c": true}}} {
		seen := map[string]bool{}
		next := map[string]int{}
		by := map[string]int{}
		for _, a := range arrivals.since(start) {
			if !group.clients[a.client] {
				continue
			}
			key, i := parseMessage(t, a.p.Payload)
			id := string(a.p.Payload)
			if seen[id] {
				t.Errorf("group %s: %s delivered twice", group.name, id)
			}
			seen[id] = true
			if i != next[key] {
				t.Errorf("group %s: key %s got %d, expected %d (order per key)", group.name, key, i, next[key])
			}
			next[key] = i + 1
			by[a.client]++
		}
		if len(seen) != keys*per {
			t.Errorf("group %s: %d distinct messages, want %d", group.name, len(seen), keys*per)
		}
		if group.name == "billing" && (by["g1-on-b"] == 0 || by["g1-on-c"] == 0) {
			t.Errorf("group billing: deliveries by consumer %v: both nodes' consumers should take part", by)
		}
	}
}
