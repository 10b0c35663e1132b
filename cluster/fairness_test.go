package cluster_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBusyConsumerLeavesTheRestToOthers: two consumers of one group on a
// node that leads none of the queue's partitions (placed on a, of three). The first takes as many
// as its Receive Maximum allows and settles none; the second, joining
// later, gets every other message at once: none waits on the first one's
// node for a credit it will not get, and the first is offered no more
// than it can take.
func TestBusyConsumerLeavesTheRestToOthers(t *testing.T) {
	nodes := placedOnA(t, "fair", "a", "b", "c")
	a, b := nodes[0], nodes[1]
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

// placedOnA starts the nodes ids of a new cluster whose queue q, of 4
// partitions with replication factor 1 and ordering none, is placed on
// node a, and waits until a leads all of them.
func placedOnA(t *testing.T, q string, ids ...string) []*node {
	t.Helper()
	cfg := configFile(t, "queues:\n  declared:\n    "+q+":\n      partitions: 4\n      replication_factor: 1\n      ordering: none\n"+
		"cluster:\n  placement:\n    - queues: \""+q+"\"\n      nodes: [a]\n")
	c := newCluster(t, "--config", cfg)
	var nodes []*node
	for _, id := range ids {
		nodes = append(nodes, c.start(id))
	}
	c.waitOwned(q, 4, 15*time.Second, "a")
	return nodes
}

// TestGroupStartLatestAcrossNodes: a subscription with start=latest on a
// node that serves none of the queue's partitions makes a group that,
// on the node that does, starts after the newest message.
func TestGroupStartLatestAcrossNodes(t *testing.T) {
	nodes := placedOnA(t, "feed", "a", "b")
	a, b := nodes[0], nodes[1]
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
	waitLocalView(t, a.http, "feed", `"name": "audit"`)
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

// waitLocalView waits up to 10s for the queue's view of the node at addr
// alone to contain want.
func waitLocalView(t *testing.T, addr, q, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := localView(t, addr, q)
		if strings.Contains(v, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view of %s on %s has no %s after 10s: %s", q, addr, want, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLeased waits up to 10s for the group's leases on the node at addr
// alone to number n.
func waitLeased(t *testing.T, addr, q, group string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var v struct {
			Groups []struct {
				Name   string `json:"name"`
				Leased int    `json:"leased"`
			} `json:"groups"`
		}
		body := localView(t, addr, q)
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("the view of %s on %s: %v: %s", q, addr, err, body)
		}
		for _, g := range v.Groups {
			if g.Name == group && g.Leased == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s of %s on %s has not %d leases after 10s: %s", group, q, addr, n, body)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeaseOutlivesAMembershipBlip: a consumer on one node holds a message
// of a partition led on another; etcd then ends the leader's lease (as it
// does after a pause of etcd longer than the lease, with the renewals held
// up). The leader joins again at once and leads on under raft; the message
// stays the first consumer's, however long it holds it: no other consumer
// of the group gets it while the first is connected and has not settled.
func TestLeaseOutlivesAMembershipBlip(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    held:\n      partitions: 1\n      replication_factor: 3\n      ordering: none\n")
	c := newCluster(t, "--config", cfg)
	nodes := map[string]*node{"a": c.start("a"), "b": c.start("b"), "c": c.start("c")}
	prod := dial(t, nodes["a"].mqtt, "producer", 64)
	if code, err := prod.publish("$queue/held", "k", message("m", 0)); err != nil || code != 0 {
		t.Fatalf("publish: %#x %v", code, err)
	}
	leader := c.waitOwned("held", 1, 15*time.Second, "a", "b", "c")[0].Owner
	other := "a"
	if leader == "a" {
		other = "b"
	}
	holder := dialManual(t, nodes[other].mqtt, "holder", 10)
	holder.subscribe("$share/g/$queue/held")
	waitCount(t, 1, 10*time.Second, holder)
	rival := dial(t, nodes[leader].mqtt, "rival", 10)
	rival.subscribe("$share/g/$queue/held")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/shardq/nodes/"+leader)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading node %s's key: %v", leader, err)
	}
	var info struct {
		Session int64 `json:"session"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cli.Revoke(ctx, clientv3.LeaseID(info.Session)); err != nil {
		t.Fatalf("revoking node %s's lease: %v", leader, err)
	}
	// Back as a member under a new lease, and every node's view has
	// seen it leave and come back; then as long again as a consumer
	// stream takes to be opened and serve (well under the queue's 30 s
	// ack_timeout, which would end the lease).
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.cli.Get(ctx, "/shardq/nodes/"+leader)
		if err == nil && len(resp.Kvs) == 1 && !strings.Contains(string(resp.Kvs[0].Value), strconv.FormatInt(info.Session, 10)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s did not join again within 15s", leader)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, n := range nodes {
		n.waitReady(t, 10*time.Second)
	}
	time.Sleep(3 * time.Second)
	if got := rival.received(); len(got) != 0 {
		t.Fatalf("%s was delivered to a second consumer while the first, still connected, held it", got[0].Payload)
	}
	// The holder settles; the group goes on with the next message.
	if err := holder.c.Ack(holder.received()[0]); err != nil {
		t.Fatal(err)
	}
	if code, err := prod.publish("$queue/held", "k", message("m", 1)); err != nil || code != 0 {
		t.Fatalf("publish after the blip: %#x %v", code, err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for len(rival.received())+len(holder.received()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the message published after the blip was not delivered within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLocalConsumerGoesFirst: of a group's two consumers, one connected to
// the node that leads every partition of the queue and one connected to
// another node, the local one gets each message while it keeps up (it
// settles each at once): none is relayed to the other node and back. The
// remote one gets messages once the local one falls behind.
func TestLocalConsumerGoesFirst(t *testing.T) {
	nodes := placedOnA(t, "near", "a", "b")
	a, b := nodes[0], nodes[1]
	far := dial(t, b.mqtt, "far", 64)
	far.subscribe("$share/g/$queue/near")
	near := dialManual(t, a.mqtt, "near", 64)
	near.subscribe("$share/g/$queue/near")
	// Both consumers are in the group on a once its view counts two.
	waitLocalView(t, a.http, "near", `"consumers": 2`)
	prod := dial(t, b.mqtt, "producer", 64)
	const settled = 30
	acked := 0
	for i := range settled {
		if code, err := prod.publish("$queue/near", "k"+strconv.Itoa(i), message("m", i)); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
		waitCount(t, i+1, 10*time.Second, near, far)
		for _, p := range near.received()[acked:] {
			if err := near.c.Ack(p); err != nil {
				t.Fatal(err)
			}
			acked++
		}
		// Settled once a has the PUBACK: the client library may send
		// it later than Ack returns.
		waitLeased(t, a.http, "near", "g", 0)
	}
	if got := len(far.received()); got != 0 {
		t.Fatalf("the remote consumer got %d of %d messages while the local one settled each at once", got, settled)
	}
	// The local consumer settles no more: past its lead, the remote one
	// gets messages too.
	const more = 40
	for i := range more {
		if code, err := prod.publish("$queue/near", "k"+strconv.Itoa(i), message("u", i)); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
	}
	waitCount(t, settled+more, 10*time.Second, near, far)
	if got := len(far.received()); got == 0 {
		t.Fatalf("the remote consumer got none of %d messages the local one left unsettled", more)
	}
}
