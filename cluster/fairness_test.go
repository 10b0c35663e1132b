package cluster_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
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

// TestGroupStartLatestAcrossNodes: a subscription with start=latest on a
// node that serves none of the queue's partitions makes a group that,
// on the node that does, starts after the newest message.
func TestGroupStartLatestAcrossNodes(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    feed:\n      partitions: 4\n      replication_factor: 1\n      ordering: none\n"+
		"cluster:\n  placement:\n    - queues: \"feed\"\n      nodes: [a]\n")
	c := newCluster(t, "--config", cfg)
	a := c.start("a")
	b := c.start("b")
	c.waitOwned("feed", 4, 15*time.Second, "a")
	prod := dial(t, a.mqtt, "producer", 64)
	publish := func(prefix string) {
		for i := range 8 {
			if code, err := prod.publish("$queue/feed", "k"+strconv.Itoa(i), message(prefix, i)); err != nil || code != 0 {
				t.Fatalf("publish: %#x %v", code, err)
			}
		}
	}
	publish("old")
	cons := dial(t, b.mqtt, "late", 64)
	cons.subscribeWith("$share/audit/$queue/feed", map[string]string{"start": "latest"})
	// The group starts when the subscription reaches a, shortly after
	// the SUBACK: a's view of the queue names it then.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if strings.Contains(localView(t, a.http, "feed"), `"name": "audit"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("group audit not on a 10s after the subscription")
		}
		time.Sleep(20 * time.Millisecond)
	}
	publish("new")
	waitCount(t, 8, 10*time.Second, cons)
	for _, p := range cons.received() {
		if !strings.HasPrefix(string(p.Payload), "new") {
			t.Errorf("the group starting at latest got %q, published before it", p.Payload)
		}
	}
}

// localView is the queue's view of the node at addr alone (the header the
// nodes use between themselves), not the cluster's.
func localView(t *testing.T, addr, q string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/api/v1/queues/"+q, nil)
	req.Header.Set("X-Shardq-Local", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}
