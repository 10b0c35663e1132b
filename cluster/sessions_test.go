package cluster_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// sessionHolder reads the node recorded as holding a client's session in
// etcd, "" when there is no record.
func (c *testCluster) sessionHolder(clientID string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/shardq/sessions/"+clientID)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	var rec struct{ Node string }
	_ = json.Unmarshal(resp.Kvs[0].Value, &rec)
	return rec.Node
}

// waitSessionHolder waits until one of nodes holds the client's session.
func (c *testCluster) waitSessionHolder(clientID string, within time.Duration, nodes ...string) string {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if h := c.sessionHolder(clientID); slices.Contains(nodes, h) {
			return h
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the session of %s is held by %q after %s, want one of %v", clientID, c.sessionHolder(clientID), within, nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSessionOutlivesItsNode: a clean start false MQTT 5 session created
// on a node that is then killed for good is adopted by another node; its
// client, connecting to a third node without subscribing again, gets the
// QoS 1 message published while it was away. A session that ends (clean
// start) leaves no record behind.
func TestSessionOutlivesItsNode(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	first := dialSession(t, c.nodes["a"].mqtt, "keeper", false)
	// The SUBACK comes once the session's record in etcd holds the
	// subscription: a node killed right after it leaves the subscription
	// to the node adopting the session.
	first.subscribe("alerts/#")
	c.waitSessionHolder("keeper", 10*time.Second, "a")
	_ = first.c.Disconnect(&paho.Disconnect{})

	c.nodes["a"].kill()
	adopter := c.waitSessionHolder("keeper", 30*time.Second, "b", "c")
	other := map[string]string{"b": "c", "c": "b"}[adopter]

	pub := dial(t, c.nodes[adopter].mqtt, "alerter", 32)
	if code, err := pub.publish("alerts/1", "", []byte("fire")); err != nil || code != 0 {
		t.Fatalf("publish: %#x %v", code, err)
	}
	// mochi acknowledges a QoS 1 publish before it hands it to the
	// subscribers, and handles one client's packets in turn: once a
	// second publish of the same client is acknowledged, the first is
	// queued for the session. A takeover in between would miss it.
	if code, err := pub.publish("elsewhere/1", "", []byte("barrier")); err != nil || code != 0 {
		t.Fatalf("publish: %#x %v", code, err)
	}
	back := dialSession(t, c.nodes[other].mqtt, "keeper", false)
	waitCount(t, 1, 10*time.Second, back)
	if got := back.received(); string(got[0].Payload) != "fire" || got[0].Topic != "alerts/1" {
		t.Fatalf("the session got %s %q, want alerts/1 \"fire\"", got[0].Topic, got[0].Payload)
	}
	c.waitSessionHolder("keeper", 10*time.Second, other)

	// A clean start ends the session: its record goes.
	_ = back.c.Disconnect(&paho.Disconnect{})
	dialSession(t, c.nodes[adopter].mqtt, "keeper", true)
	deadline := time.Now().Add(10 * time.Second)
	for c.sessionHolder("keeper") != "" {
		if time.Now().After(deadline) {
			t.Fatalf("the session ended with a clean start is still recorded, held by %s", c.sessionHolder("keeper"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
