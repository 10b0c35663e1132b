package broker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/config"
)

// clusterNodes starts an embedded etcd and n brokers clustered on it, n1
// to nN, and waits until each sees the others as members.
func clusterNodes(t *testing.T, n int) []*testBroker {
	nodes, _ := clusterNodesEtcd(t, n)
	return nodes
}

// clusterNodesEtcd is clusterNodes, and returns the etcd endpoint too.
func clusterNodesEtcd(t *testing.T, n int) ([]*testBroker, string) {
	t.Helper()
	e, err := devetcd.Start(devetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	nodes := make([]*testBroker, n)
	for i := range nodes {
		id := fmt.Sprintf("n%d", i+1)
		nodes[i] = startBroker(t, t.TempDir(), func(c *config.Config) {
			c.NodeID = id
			c.Cluster.Etcd.Endpoints = []string{e.Endpoint()}
			c.Cluster.Addr = "127.0.0.1:0"
		})
	}
	for _, b := range nodes {
		awaitCond(t, fmt.Sprintf("%s sees %d other members", b.Cluster().ID(), n-1), func() bool {
			_, _, members := b.Cluster().PlainTargets("x")
			return len(members) == n-1
		})
	}
	return nodes, e.Endpoint()
}

// awaitCond waits for cond, which interest or membership propagating
// through etcd makes true.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 15s: %s", what)
		}
	}
}

// awaitRoutes waits until from routes publishes on topic to exactly the
// nodes named (plain subscribers).
func awaitRoutes(t *testing.T, from *testBroker, topic string, nodes ...string) {
	t.Helper()
	awaitCond(t, fmt.Sprintf("%s routes %s to %v", from.Cluster().ID(), topic, nodes), func() bool {
		plain, _, _ := from.Cluster().PlainTargets(topic)
		return slices.Equal(plain, nodes)
	})
}

// awaitShared waits until from sees members of the shared subscription
// on exactly the nodes named.
func awaitShared(t *testing.T, from *testBroker, topic, share string, nodes ...string) {
	t.Helper()
	awaitCond(t, fmt.Sprintf("%s sees %s on %v", from.Cluster().ID(), share, nodes), func() bool {
		_, shared, _ := from.Cluster().PlainTargets(topic)
		return slices.Equal(shared[share], nodes)
	})
}

// recv waits for the next delivery to c and acknowledges it.
func recv(c *rawClient, within time.Duration) *packets.Publish {
	c.t.Helper()
	p := c.next(within)
	if p.QoS > 0 {
		c.puback(p, 0)
	}
	return p
}

// recvPayloads receives n deliveries and returns their payloads.
func recvPayloads(c *rawClient, n int) []string {
	c.t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = string(recv(c, 10*time.Second).Payload)
	}
	return out
}

// publishRetained sends a retained QoS 1 PUBLISH and waits for its PUBACK.
func publishRetained(c *rawClient, topic string, payload []byte) {
	c.t.Helper()
	id := c.id16()
	ch := make(chan *packets.Puback, 1)
	c.mu.Lock()
	c.acks[id] = ch
	c.mu.Unlock()
	c.write(&packets.Publish{Topic: topic, Payload: payload, QoS: 1, Retain: true, PacketID: id, Properties: &packets.Properties{}})
	if code := c.waitAck(ch).ReasonCode; code != 0 {
		c.t.Fatalf("retained publish to %s: 0x%02x", topic, code)
	}
}

// sawDisconnect reports whether c received a DISCONNECT.
func (c *rawClient) sawDisconnect() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.seen, packets.DISCONNECT)
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// TestClusterPlainFanOut: a publish on one node reaches the plain
// subscribers of every node once, in order, MQTT 5 and 3.1.1 alike, and
// the other way round.
func TestClusterPlainFanOut(t *testing.T) {
	nodes := clusterNodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	local := dialRaw(t, n1.MQTTAddr(), "fan-local", connectOpts{})
	local.subscribe(1, nil, "fan/#")
	onB := dialRaw(t, n2.MQTTAddr(), "fan-b", connectOpts{})
	onB.subscribe(1, nil, "fan/1/x")
	onC := dialRaw(t, n3.MQTTAddr(), "fan-c", connectOpts{})
	onC.subscribe(0, nil, "fan/+/x")
	var (
		mu  sync.Mutex
		got []string
	)
	v3 := dialV3(t, n3.MQTTAddr(), "fan-c-v3", nil)
	if tok := v3.Subscribe("fan/1/#", 1, func(_ paho3.Client, m paho3.Message) {
		mu.Lock()
		got = append(got, string(m.Payload()))
		mu.Unlock()
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("v3 subscribe: %v", tok.Error())
	}
	awaitRoutes(t, n1, "fan/1/x", "n2", "n3")

	pub := dialRaw(t, n1.MQTTAddr(), "fan-pub", connectOpts{})
	want := numbered("m", 50)
	for _, m := range want {
		if code := pub.publish("fan/1/x", []byte(m)); code != 0 {
			t.Fatalf("publish: 0x%02x", code)
		}
	}
	for _, c := range []*rawClient{local, onB, onC} {
		if got := recvPayloads(c, len(want)); !slices.Equal(got, want) {
			t.Errorf("%s got %v, want %v", c.id, got, want)
		}
	}
	awaitCond(t, "the 3.1.1 subscriber on n3 has every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(want)
	})
	for _, c := range []*rawClient{local, onB, onC} {
		c.none(200 * time.Millisecond)
	}
	mu.Lock()
	if !slices.Equal(got, want) {
		t.Errorf("3.1.1 subscriber got %v, want %v", got, want)
	}
	mu.Unlock()

	// From n3 to n1 and n2; nobody on n3 itself but the publisher's peers.
	awaitRoutes(t, n3, "fan/2/x", "n1")
	back := dialRaw(t, n3.MQTTAddr(), "fan-pub-c", connectOpts{})
	if code := back.publish("fan/2/x", []byte("back")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	if p := recv(local, 10*time.Second); string(p.Payload) != "back" || p.Topic != "fan/2/x" {
		t.Errorf("n1 got %s %q, want fan/2/x back", p.Topic, p.Payload)
	}
	if p := recv(onC, 10*time.Second); string(p.Payload) != "back" {
		t.Errorf("n3 got %q, want back", p.Payload)
	}
	onB.none(200 * time.Millisecond)
	local.none(100 * time.Millisecond)
}

// TestClusterPlainSharedOncePerGroup: each shared subscription group gets
// each message once in the whole cluster: a group with members on the
// publisher's node is served there, one with members elsewhere only is
// served by those nodes in turn.
func TestClusterPlainSharedOncePerGroup(t *testing.T) {
	nodes := clusterNodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	g := []*rawClient{
		dialRaw(t, n2.MQTTAddr(), "g-b1", connectOpts{}),
		dialRaw(t, n2.MQTTAddr(), "g-b2", connectOpts{}),
		dialRaw(t, n3.MQTTAddr(), "g-c", connectOpts{}),
	}
	for _, c := range g {
		c.subscribe(1, nil, "$share/g/jobs/+")
	}
	hA := dialRaw(t, n1.MQTTAddr(), "h-a", connectOpts{})
	hC := dialRaw(t, n3.MQTTAddr(), "h-c", connectOpts{})
	for _, c := range []*rawClient{hA, hC} {
		c.subscribe(1, nil, "$share/h/jobs/#")
	}
	plainC := dialRaw(t, n3.MQTTAddr(), "plain-c", connectOpts{})
	plainC.subscribe(1, nil, "jobs/+")
	awaitShared(t, n1, "jobs/1", "$share/g/jobs/+", "n2", "n3")
	awaitShared(t, n1, "jobs/1", "$share/h/jobs/#", "n3")
	awaitRoutes(t, n1, "jobs/1", "n3")

	pub := dialRaw(t, n1.MQTTAddr(), "jobs-pub", connectOpts{})
	want := numbered("j", 60)
	for _, m := range want {
		if code := pub.publish("jobs/1", []byte(m)); code != 0 {
			t.Fatalf("publish: 0x%02x", code)
		}
	}

	// h has a member on n1: it is served there, every message.
	if got := recvPayloads(hA, len(want)); !slices.Equal(got, want) {
		t.Errorf("h-a got %v, want %v", got, want)
	}
	if got := recvPayloads(plainC, len(want)); !slices.Equal(got, want) {
		t.Errorf("plain subscriber on n3 got %v, want %v", got, want)
	}
	// g has members on n2 and n3 only: each message once, on both nodes.
	var (
		mu    sync.Mutex
		seen  = map[string]int{}
		byCli = map[string]int{}
		wg    sync.WaitGroup
	)
	for _, c := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case p := <-c.msgs:
					c.puback(p, 0)
					mu.Lock()
					seen[string(p.Payload)]++
					byCli[c.id]++
					mu.Unlock()
				case <-time.After(time.Second):
					return
				}
			}
		}()
	}
	awaitCond(t, "group g has every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(want)
	})
	wg.Wait() // a second without deliveries: any duplicate is in
	for _, m := range want {
		if seen[m] != 1 {
			t.Errorf("group g got %s %d times, want once", m, seen[m])
		}
	}
	if byCli["g-c"] == 0 || byCli["g-b1"]+byCli["g-b2"] == 0 {
		t.Errorf("group g deliveries by member %v: want some on each node", byCli)
	}
	hC.none(200 * time.Millisecond)
	hA.none(100 * time.Millisecond)

	// Published on n3, h is served on n3 and g there too.
	pubC := dialRaw(t, n3.MQTTAddr(), "jobs-pub-c", connectOpts{})
	if code := pubC.publish("jobs/2", []byte("from-c")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	if p := recv(hC, 10*time.Second); string(p.Payload) != "from-c" {
		t.Errorf("h-c got %q", p.Payload)
	}
	if p := recv(g[2], 10*time.Second); string(p.Payload) != "from-c" {
		t.Errorf("g-c got %q", p.Payload)
	}
	hA.none(200 * time.Millisecond)
	g[0].none(100 * time.Millisecond)
	g[1].none(100 * time.Millisecond)
}

// TestClusterPlainRetained: a retained message published on one node is
// stored on every node, as is its clearing.
func TestClusterPlainRetained(t *testing.T) {
	nodes := clusterNodes(t, 3)
	n1, n3 := nodes[0], nodes[2]

	// The probe's publishes follow the retained ones to n3 on the same
	// link: once it arrives, n3 has the retained message.
	probe := dialRaw(t, n3.MQTTAddr(), "probe", connectOpts{})
	probe.subscribe(0, nil, "probe")
	awaitRoutes(t, n1, "probe", "n3")
	pub := dialRaw(t, n1.MQTTAddr(), "ret-pub", connectOpts{})
	publishRetained(pub, "ret/1", []byte("kept"))
	if code := pub.publish("probe", []byte("1")); code != 0 {
		t.Fatalf("probe: 0x%02x", code)
	}
	recv(probe, 10*time.Second)

	late := dialRaw(t, n3.MQTTAddr(), "late", connectOpts{})
	late.subscribe(1, nil, "ret/#")
	p := recv(late, 5*time.Second)
	if p.Topic != "ret/1" || string(p.Payload) != "kept" || !p.Retain {
		t.Fatalf("new subscriber on n3 got %s %q retain=%v, want ret/1 kept retained", p.Topic, p.Payload, p.Retain)
	}
	late.none(100 * time.Millisecond)

	// An empty retained publish clears it everywhere; the subscriber now
	// on n3 gets the clearing as a message.
	publishRetained(pub, "ret/1", nil)
	if code := pub.publish("probe", []byte("2")); code != 0 {
		t.Fatalf("probe: 0x%02x", code)
	}
	recv(probe, 10*time.Second)
	if p := recv(late, 5*time.Second); p.Topic != "ret/1" || len(p.Payload) != 0 {
		t.Fatalf("subscriber on n3 got %s %q, want the empty ret/1", p.Topic, p.Payload)
	}
	later := dialRaw(t, n3.MQTTAddr(), "later", connectOpts{})
	later.subscribe(1, nil, "ret/#")
	later.none(300 * time.Millisecond)
}

// TestClusterPlainClientIDUnique: a client ID connecting on another node
// takes the session over: the first connection gets a DISCONNECT and is
// closed, from whichever node.
func TestClusterPlainClientIDUnique(t *testing.T) {
	nodes := clusterNodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	first := dialRaw(t, n1.MQTTAddr(), "dup", connectOpts{})
	second := dialRaw(t, n2.MQTTAddr(), "dup", connectOpts{})
	select {
	case <-first.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection on n1 is still open after the client ID connected on n2")
	}
	if !first.sawDisconnect() {
		t.Error("no DISCONNECT before the connection on n1 closed")
	}
	third := dialRaw(t, n3.MQTTAddr(), "dup", connectOpts{})
	select {
	case <-second.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection on n2 is still open after the client ID connected on n3")
	}
	select {
	case <-third.closed:
		t.Fatal("the newest connection was closed")
	case <-time.After(200 * time.Millisecond):
	}

	// MQTT 3.1.1 alike, back to the first node.
	lost := make(chan error, 1)
	dialV3(t, n3.MQTTAddr(), "dup3", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	dialV3(t, n1.MQTTAddr(), "dup3", nil)
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the 3.1.1 connection on n3 is still up after the client ID connected on n1")
	}
}

// TestClusterPlainSessionMoves: a client reconnecting on another node with
// clean start false keeps its subscriptions (session present), whether
// its connection on the first node is still up or gone, and gets the
// messages queued for it there.
func TestClusterPlainSessionMoves(t *testing.T) {
	nodes := clusterNodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	keep := connectOpts{keepClean: true, expiry: 600}

	// Connected on n1, then on n2.
	a := dialRaw(t, n1.MQTTAddr(), "mover", keep)
	a.subscribe(1, nil, "move/t")
	a.subscribe(1, map[string]string{"group": "movers"}, "$queue/mq")
	watcher := dialRaw(t, n3.MQTTAddr(), "watcher", connectOpts{})
	watcher.subscribe(1, nil, "$queue/mq") // the default group
	awaitRoutes(t, n3, "move/t", "n1")
	b := dialRaw(t, n2.MQTTAddr(), "mover", keep)
	if !b.connack.SessionPresent {
		t.Error("CONNACK on n2: session present false, want true")
	}
	select {
	case <-a.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection on n1 is still open")
	}
	awaitRoutes(t, n3, "move/t", "n2")
	pub := dialRaw(t, n3.MQTTAddr(), "move-pub", connectOpts{})
	if code := pub.publish("move/t", []byte("after")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	if p := recv(b, 10*time.Second); string(p.Payload) != "after" {
		t.Errorf("moved session got %q, want after", p.Payload)
	}
	// Its queue subscription moved too, in its group: the default
	// group's consumer gets the message as well.
	if code := pub.publish("$queue/mq", []byte("queued-job")); code != 0 {
		t.Fatalf("queue publish: 0x%02x", code)
	}
	if p := recv(b, 10*time.Second); string(p.Payload) != "queued-job" {
		t.Errorf("moved queue subscription got %q, want queued-job", p.Payload)
	}
	if p := recv(watcher, 10*time.Second); string(p.Payload) != "queued-job" {
		t.Errorf("default group got %q, want queued-job", p.Payload)
	}
	b.none(200 * time.Millisecond)

	// Gone from n1, with a message queued there; back on n3.
	off := dialRaw(t, n1.MQTTAddr(), "sleeper", keep)
	off.subscribe(1, nil, "off/t")
	off.close()
	probe := dialRaw(t, n1.MQTTAddr(), "off-probe", connectOpts{})
	probe.subscribe(0, nil, "off/probe")
	pub1 := dialRaw(t, n1.MQTTAddr(), "off-pub", connectOpts{})
	if code := pub1.publish("off/t", []byte("queued")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	// n1 delivers a client's publishes in order: once the probe has the
	// next one, "queued" waits in the sleeper's session.
	if code := pub1.publish("off/probe", []byte("p")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	recv(probe, 10*time.Second)
	back := dialRaw(t, n3.MQTTAddr(), "sleeper", keep)
	if !back.connack.SessionPresent {
		t.Error("CONNACK on n3: session present false, want true")
	}
	if p := recv(back, 10*time.Second); string(p.Payload) != "queued" || p.Topic != "off/t" {
		t.Errorf("resumed session got %s %q, want off/t queued", p.Topic, p.Payload)
	}
	awaitRoutes(t, n1, "off/t", "n3")
	if code := pub1.publish("off/t", []byte("later")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	if p := recv(back, 10*time.Second); string(p.Payload) != "later" {
		t.Errorf("resumed session got %q, want later", p.Payload)
	}
	back.none(200 * time.Millisecond)

	// A clean start on another node drops the subscriptions.
	fresh := dialRaw(t, n2.MQTTAddr(), "sleeper", connectOpts{})
	if fresh.connack.SessionPresent {
		t.Error("clean start: session present true")
	}
	awaitRoutes(t, n1, "off/t")
	if code := pub1.publish("off/t", []byte("gone")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	fresh.none(300 * time.Millisecond)
}

// TestClusterPlainAfterLeaseLoss: a node that lost its etcd lease, and
// with it the records of its topic filters and client IDs, writes them
// again once it has joined again.
func TestClusterPlainAfterLeaseLoss(t *testing.T) {
	nodes, endpoint := clusterNodesEtcd(t, 2)
	n1, n2 := nodes[0], nodes[1]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease := func() clientv3.LeaseID {
		resp, err := cli.Get(ctx, "/shardq/nodes/n2")
		if err != nil || len(resp.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	keys := func(prefix string) (n int, leases []clientv3.LeaseID) {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			leases = append(leases, clientv3.LeaseID(kv.Lease))
		}
		return len(resp.Kvs), leases
	}

	sub := dialRaw(t, n2.MQTTAddr(), "lease-sub", connectOpts{})
	sub.subscribe(1, nil, "lease/t")
	awaitRoutes(t, n1, "lease/t", "n2")
	old := lease()
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if n, _ := keys("/shardq/interest/n2/"); n != 0 {
		t.Fatalf("%d interest keys of n2 left after its lease was revoked", n)
	}
	if n, _ := keys("/shardq/clients/lease-sub"); n != 0 {
		t.Fatal("the client's record is left after its node's lease was revoked")
	}
	awaitCond(t, "n2 joined again under a new lease", func() bool { l := lease(); return l != 0 && l != old })
	now := lease()
	awaitCond(t, "n2 wrote its topic filters and client ID again", func() bool {
		ni, il := keys("/shardq/interest/n2/")
		nc, cl := keys("/shardq/clients/lease-sub")
		return ni == 1 && nc == 1 && il[0] == now && cl[0] == now
	})
	awaitRoutes(t, n1, "lease/t", "n2")
	pub := dialRaw(t, n1.MQTTAddr(), "lease-pub", connectOpts{})
	if code := pub.publish("lease/t", []byte("again")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	if p := recv(sub, 10*time.Second); string(p.Payload) != "again" {
		t.Errorf("got %q, want again", p.Payload)
	}
	dialRaw(t, n1.MQTTAddr(), "lease-sub", connectOpts{})
	select {
	case <-sub.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection on n2 is still open after the client ID connected on n1")
	}
}
