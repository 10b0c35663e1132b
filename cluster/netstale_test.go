package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// TestStaleDeliveryIsNotWritten (SPEC 3: every delivery after the first
// has DUP): a delivery held up on the link between the partition's owner
// and the consumer's node while its lease ran out, and the message went
// to another consumer with DUP, reaches its node late: it is not written
// to the client, whose copy would otherwise come without DUP after the
// redelivery. The cluster in network namespaces.
func TestStaleDeliveryIsNotWritten(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    late:\n      partitions: 1\n      replication_factor: 1\n      ack_timeout: 1s\n"+
		"cluster:\n  placement:\n    - queues: \"late\"\n      nodes: [a]\n")
	c, _ := newNetCluster(t, []string{"a", "b"}, "--config", cfg)
	c.start("a")
	c.start("b")
	owner, other := "a", "b"
	c.waitOwned("late", 1, 15*time.Second, owner)
	const filter = "$share/g/$queue/late"

	// x, on the other node, takes one message at a time through the
	// owner's stream to its node.
	x := dial(t, c.nodes[other].mqtt, "x", 1)
	x.subscribe(filter)
	prod := dial(t, c.nodes[owner].mqtt, "producer", 16)
	publish := func(payload string) {
		t.Helper()
		if code, err := prod.publish("$queue/late", "k", []byte(payload)); err != nil || code != 0 {
			t.Fatalf("publish %s: %#x %v", payload, code, err)
		}
	}
	publish("m0") // the stream is up once x has it
	waitCount(t, 1, 10*time.Second, x)

	if err := c.net.Partition(owner, other); err != nil {
		t.Fatal(err)
	}
	publish("m1") // delivered into the cut link, to x
	// y, on the owner, gets m1 once x's lease on it ran out (1 s).
	y := dial(t, c.nodes[owner].mqtt, "y", 16)
	y.subscribe(filter)
	waitCount(t, 1, 10*time.Second, y)
	// Healed at once: what was sent into the link arrives when TCP sends
	// it again, more than a second after it was sent, and before the
	// link's keepalive could give up on the connection.
	if err := c.net.Heal(owner, other); err != nil {
		t.Fatal(err)
	}
	_ = y.c.Disconnect(&paho.Disconnect{})
	// m2 comes to x through the same stream, after anything held up in it
	// (m1, when it is written).
	publish("m2")
	deadline := time.Now().Add(15 * time.Second)
	for !receivedPayload(x, "m2") && !receivedPayload(x, "m1") {
		if time.Now().After(deadline) {
			t.Fatalf("x got neither m2 nor m1 after the heal; it got %s", payloads(x))
		}
		time.Sleep(20 * time.Millisecond)
	}

	t.Logf("x got %s, y got %s", payloads(x), payloads(y))
	first := y.received()[0]
	if !first.Duplicate() || userProp(first, "delivery-count") != "2" {
		t.Fatalf("y got m1 without DUP or with delivery-count %s: x's delivery should have ended with its lease", userProp(first, "delivery-count"))
	}
	for _, p := range x.received() {
		if string(p.Payload) == "m1" && !p.Duplicate() {
			t.Errorf("x got m1 without DUP (delivery-count %s) after y got it with DUP", userProp(p, "delivery-count"))
		}
	}
}

func receivedPayload(cl *client, payload string) bool {
	for _, p := range cl.received() {
		if string(p.Payload) == payload {
			return true
		}
	}
	return false
}

func payloads(cl *client) string {
	var out []string
	for _, p := range cl.received() {
		out = append(out, fmt.Sprintf("%s#%s", p.Payload, userProp(p, "delivery-count")))
	}
	return fmt.Sprint(out)
}

// TestCutConsumerLinkReleasesItsLeases (SPEC 3, SPEC 7: a consumer's
// messages go back to its group when it is gone): the link between a
// partition's owner and the node of a consumer holding its messages is
// cut. The consumer can settle nothing any more; the owner finds the link
// dead within seconds and gives the messages to the group's consumer on
// another node, with DUP, rather than after ack_timeout (30 s).
func TestCutConsumerLinkReleasesItsLeases(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    cut:\n      partitions: 1\n      replication_factor: 1\n      ordering: none\n"+
		"cluster:\n  placement:\n    - queues: \"cut\"\n      nodes: [a]\n")
	c, _ := newNetCluster(t, []string{"a", "b", "c"}, "--config", cfg)
	c.start("a")
	c.start("b")
	c.start("c")
	c.waitOwned("cut", 1, 15*time.Second, "a")
	const filter, n = "$share/g/$queue/cut", 5
	holder := dialManual(t, c.nodes["b"].mqtt, "holder", 10)
	holder.subscribe(filter)
	prod := dial(t, c.nodes["a"].mqtt, "producer", 16)
	for i := range n {
		if code, err := prod.publish("$queue/cut", fmt.Sprint("k", i), []byte(fmt.Sprint("m", i))); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
	}
	waitCount(t, n, 10*time.Second, holder)
	taker := dial(t, c.nodes["c"].mqtt, "taker", 10)
	taker.subscribe(filter)
	if err := c.net.Partition("a", "b"); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	waitCount(t, n, 15*time.Second, taker)
	t.Logf("the %d messages the cut-off consumer held came to the other one %s after the cut", n, time.Since(cut).Round(100*time.Millisecond))
	for _, p := range taker.received() {
		if !p.Duplicate() {
			t.Errorf("%s redelivered without DUP", p.Payload)
		}
	}
}
