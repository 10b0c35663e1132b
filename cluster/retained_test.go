package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// waitRetained subscribes new clients on node to filter until one is
// sent exactly the retained messages want ("topic=payload", sorted), and
// fails the test when none is within 15 s. A retained message reaches a
// subscriber as it subscribes: one recorded a moment later is not sent.
func (c *testCluster) waitRetained(node, filter string, want ...string) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := c.retainedOn(node, filter, len(want))
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s serves the retained messages %v of %s, want %v", node, got, filter, want)
		}
	}
}

// retainedOn subscribes a new client on node to filter and returns the
// retained messages it is sent, "topic=payload" sorted, once want
// arrived (or, within a second, what did).
func (c *testCluster) retainedOn(node, filter string, want int) []string {
	c.t.Helper()
	cl := dial(c.t, c.nodes[node].mqtt, fmt.Sprintf("look-%s-%d", node, time.Now().UnixNano()), 32)
	defer func() { _ = cl.c.Disconnect(&paho.Disconnect{}) }()
	cl.subscribe(filter)
	deadline := time.Now().Add(time.Second)
	for len(cl.received()) < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := []string{}
	for _, p := range cl.received() {
		if p.Retain {
			out = append(out, p.Topic+"="+string(p.Payload))
		}
	}
	slices.Sort(out)
	return out
}

func publishRetained(t *testing.T, cl *client, topic, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: []byte(payload)}); err != nil {
		t.Fatalf("retained publish to %s: %v", topic, err)
	}
}

// TestRetainedAcrossNodes: a retained message published while a node was
// down is served by that node once it is back; it is still served by the
// others after the node it was published on is killed for good; a
// topic cleared while a node was down is cleared there once it is back.
func TestRetainedAcrossNodes(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	pubA := dial(t, c.nodes["a"].mqtt, "pub-a", 32)
	publishRetained(t, pubA, "status/old", "gone soon")
	c.waitRetained("c", "status/#", "status/old=gone soon")

	// c is down while status/dev1 is retained and status/old cleared.
	c.nodes["c"].signal(syscall.SIGTERM)
	c.nodes["c"].waitExit(t, 30*time.Second)
	publishRetained(t, pubA, "status/dev1", "on")
	publishRetained(t, pubA, "status/old", "")
	c.start("c")
	// Only status/dev1: status/old was cleared while c was down.
	c.waitRetained("c", "status/#", "status/dev1=on")

	// a, where it was published, is gone for good.
	c.nodes["a"].kill()
	for _, n := range []string{"b", "c"} {
		c.waitRetained(n, "status/#", "status/dev1=on")
	}

	// The last retained message of a topic wins on every node: published
	// on b and c in turn.
	pubB := dial(t, c.nodes["b"].mqtt, "pub-b", 32)
	pubC := dial(t, c.nodes["c"].mqtt, "pub-c", 32)
	for i := range 10 {
		publishRetained(t, []*client{pubB, pubC}[i%2], "status/dev1", fmt.Sprint("v", i))
	}
	publishRetained(t, pubB, "status/marker", "m") // after the last, on b's writer
	for _, n := range []string{"b", "c"} {
		c.waitRetained(n, "status/#", "status/dev1=v9", "status/marker=m")
	}
}
