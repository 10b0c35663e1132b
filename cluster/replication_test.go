package cluster_test

import (
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/cluster"
)

// Replication: three nodes, replication factor 3, ack_policy quorum (the
// defaults of a cluster). A ledger records every publish acknowledged
// 0x00; at the end a consumer reads everything and nothing acknowledged
// may be missing.

// mostOwned returns the node owning the most partitions of the queue.
func (c *testCluster) mostOwned(queue string) string {
	count := map[string]int{}
	best := ""
	for _, o := range c.owners(queue) {
		count[o.Owner]++
		if best == "" || count[o.Owner] > count[best] || (count[o.Owner] == count[best] && o.Owner < best) {
			best = o.Owner
		}
	}
	return best
}

// waitFailover waits until no partition of the queue is owned by node and
// every one has an owner; it returns how long that took from since.
func (c *testCluster) waitFailover(queue string, partitions int, node string, since time.Time, within time.Duration) time.Duration {
	c.t.Helper()
	for {
		o := c.owners(queue)
		ok := len(o) == partitions
		for _, r := range o {
			ok = ok && r.Owner != "" && r.Owner != node
		}
		if ok {
			return time.Since(since)
		}
		if time.Since(since) > within {
			c.t.Fatalf("partitions of %s still on %s or unowned %s after it went: %v", queue, node, within, o)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaderKilled: the node leading the most partitions is killed with
// SIGKILL under load, three times, and restarted each time. Every
// acknowledged message is consumed; the partitions get new leaders within
// seconds (logged: the failover figures are measured by the benchmark).
func TestLeaderKilled(t *testing.T) {
	c := newCluster(t)
	// Producers on every node, so that some always survive.
	stop := make(chan struct{})
	ledgers, dones := c.underLoad(stop)
	var took []time.Duration
	for kill := 0; kill < 3; kill++ {
		victim := c.mostOwned("orders")
		before := total(ledgers)
		c.nodes[victim].kill()
		killed := time.Now()
		took = append(took, c.waitFailover("orders", 8, victim, killed, 20*time.Second))
		waitTotal(t, ledgers, before+100)
		c.start(victim)
		c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	}
	close(stop)
	for _, d := range dones {
		<-d
	}
	slices.Sort(took)
	t.Logf("failover after SIGKILL of the busiest leader: %v", took)
	got := consumeAll(t, c.nodes["a"], "g", ledgers...)
	for _, l := range ledgers {
		l.check(t, got)
		t.Logf("codes %v", l.codes)
	}
	checkOrder(t, got)
}

// waitPreferred waits until each partition of the queue is led by its
// preferred replica among the live nodes.
func (c *testCluster) waitPreferred(queueName string, partitions int, within time.Duration, live ...string) map[int]ownership {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		o := c.owners(queueName)
		ok := len(o) == partitions
		for p, r := range o {
			ok = ok && r.Owner == cluster.PreferredReplica(live, queueName, p)
		}
		if ok {
			return o
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("partitions of %s not led by their preferred replicas among %v within %s: %v", queueName, live, within, o)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeadershipReturns: each partition is led by its preferred replica;
// when that node is killed the others lead its partitions, and once it is
// back and caught up the leadership returns to it, under load, with
// nothing acknowledged lost.
func TestLeadershipReturns(t *testing.T) {
	c := newCluster(t)
	stop := make(chan struct{})
	ledgers, dones := c.underLoad(stop)
	all := []string{"a", "b", "c"}
	before := c.waitPreferred("orders", 8, 20*time.Second, all...)
	victim := c.mostOwned("orders")
	c.nodes[victim].kill()
	c.waitFailover("orders", 8, victim, time.Now(), 20*time.Second)
	waitTotal(t, ledgers, total(ledgers)+100)
	c.start(victim)
	after := c.waitPreferred("orders", 8, 30*time.Second, all...)
	for p, o := range after {
		if o.Owner == victim && o.Epoch <= before[p].Epoch {
			t.Errorf("partition %d: led by %s again under epoch %d, not above %d", p, victim, o.Epoch, before[p].Epoch)
		}
	}
	waitTotal(t, ledgers, total(ledgers)+100)
	close(stop)
	for _, d := range dones {
		<-d
	}
	got := consumeAll(t, c.nodes["a"], "g", ledgers...)
	for _, l := range ledgers {
		l.check(t, got)
	}
	checkOrder(t, got)
}

// underLoad starts nodes a, b and c with a producer on each, and returns
// once the queue's partitions are owned and messages acknowledged.
func (c *testCluster) underLoad(stop <-chan struct{}) ([]*ledger, []<-chan struct{}) {
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	ledgers, dones := c.produceFromAll(stop)
	waitAcked(c.t.(*testing.T), ledgers[0], 100)
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	return ledgers, dones
}

// produceFromAll starts a producer on each of a, b and c, each going on
// through the next node when its own goes.
func (c *testCluster) produceFromAll(stop <-chan struct{}) ([]*ledger, []<-chan struct{}) {
	var ledgers []*ledger
	var dones []<-chan struct{}
	for i, id := range []string{"a", "b", "c"} {
		order := []string{"a", "b", "c", "a", "b"}[i : i+3]
		l, done := c.produceAcross(order, id, 8, stop)
		ledgers = append(ledgers, l)
		dones = append(dones, done)
	}
	return ledgers, dones
}

func total(ls []*ledger) int {
	n := 0
	for _, l := range ls {
		n += l.ackedCount()
	}
	return n
}

func waitTotal(t *testing.T, ls []*ledger, n int) {
	t.Helper()
	waitProgress(t, func() int { return total(ls) }, n, func() string { return fmt.Sprintf("%d producers", len(ls)) })
}

// TestLeaderPaused: a leader paused past the election timeout loses its
// partitions to other replicas; resumed, it cannot commit what it
// accepted meanwhile, and no acknowledged message is lost. Producers on
// the other nodes get 0x00 for every publish: those in flight to the
// paused leader are routed again to the new one.
func TestLeaderPaused(t *testing.T) {
	c := newCluster(t)
	stop := make(chan struct{})
	ledgers, dones := c.underLoad(stop)
	victim := c.mostOwned("orders")
	before := c.owners("orders")
	c.nodes[victim].signal(syscall.SIGSTOP)
	paused := time.Now()
	took := c.waitFailover("orders", 8, victim, paused, 20*time.Second)
	n := total(ledgers)
	waitTotal(t, ledgers, n+100)
	// Past its lease too: it resumes as a node that lost its membership,
	// still believing it leads (the case of a stale leader claiming back).
	deadline := time.Now().Add(15 * time.Second)
	for c.member(victim) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still a member 15s after it was paused", victim)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.nodes[victim].signal(syscall.SIGCONT)
	c.nodes[victim].waitReady(t, 30*time.Second)
	waitTotal(t, ledgers, total(ledgers)+100)
	close(stop)
	for _, d := range dones {
		<-d
	}
	for p, o := range c.owners("orders") {
		if o.Epoch <= before[p].Epoch && before[p].Owner == victim {
			t.Errorf("partition %d: epoch %d not above %d after its leader was paused", p, o.Epoch, before[p].Epoch)
		}
	}
	t.Logf("failover after SIGSTOP of %s: %s", victim, took)
	got := consumeAll(t, c.nodes[victim], "g", ledgers...)
	for _, l := range ledgers {
		l.check(t, got)
	}
	onlyAcked(t, ledgers, victim)
	checkOrder(t, got)
}

// TestFollowerCatchesUp: a replica down while messages are published
// catches up when it returns: the leaders report it in sync, and with the
// other replicas' nodes gone in turn it serves everything acknowledged.
func TestFollowerCatchesUp(t *testing.T) {
	// A short raft log: the replica that returns is behind its compacted
	// part and gets a copy of each partition.
	c := newCluster(t, "--config", configFile(t, "cluster:\n  raft_log_keep: 20\n"))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	prod := dial(t, c.nodes["a"].mqtt, "producer", 64)
	if code, err := prod.publish("$queue/orders", "k0", message("first", 0)); err != nil || code != 0 {
		t.Fatalf("publish: %#x %v", code, err)
	}
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	c.nodes["c"].kill()
	stop := make(chan struct{})
	l, done := produce(prod, "$queue/orders", 16, stop)
	waitAcked(t, l, 2000)
	close(stop)
	<-done
	c.start("c")
	// In sync, as every partition's leader sees it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if replicaInSync(c, "orders", "c") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c not in sync 30s after it came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	copies := 0.0
	for _, id := range []string{"a", "b"} {
		copies += c.nodes[id].metric(t, "shardq_cluster_replica_copies_total")
	}
	if copies == 0 {
		t.Errorf("no copy sent: the test meant c to be behind the compacted logs")
	}
	// Its copy is whole: with b gone, a and c serve everything.
	c.nodes["b"].kill()
	c.waitFailover("orders", 8, "b", time.Now(), 20*time.Second)
	got := consumeAll(t, c.nodes["c"], "g", l)
	l.check(t, got)
	checkOrder(t, got)
}

// dumpNodes makes every node of the test print its goroutines into its
// log (SHARDQ_TEST_LOGS keeps them), when SHARDQ_TEST_DUMP is set.
func dumpNodes(t *testing.T) {
	if os.Getenv("SHARDQ_TEST_DUMP") == "" {
		return
	}
	for _, n := range current.nodes {
		if n.cmd != nil && n.cmd.ProcessState == nil {
			n.signal(syscall.SIGQUIT)
		}
	}
	time.Sleep(time.Second)
}

// TestSIGTERMReplicated: a node stopped with SIGTERM under load hands the
// leadership of its partitions to other replicas before it exits; nothing
// acknowledged is lost.
func TestSIGTERMReplicated(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	stop := make(chan struct{})
	l, done := c.produceAcross([]string{"a", "b"}, "p", 16, stop)
	waitAcked(t, l, 200)
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	victim := c.mostOwned("orders")
	if victim == "a" || victim == "b" {
		// The producer's nodes stay up: stop c whatever it leads.
		victim = "c"
	}
	c.nodes[victim].signal(syscall.SIGTERM)
	c.nodes[victim].waitExit(t, 30*time.Second)
	if code := c.nodes[victim].cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited with %d", victim, code)
	}
	for p, o := range c.owners("orders") {
		if o.Owner == victim {
			t.Errorf("partition %d still owned by %s after it left", p, victim)
		}
	}
	waitAcked(t, l, l.ackedCount()+200)
	close(stop)
	<-done
	got := consumeAll(t, c.nodes["a"], "g", l)
	l.check(t, got)
	checkOrder(t, got)
	t.Logf("codes %v", l.codes)
}

// TestQuorumLost: with two of three replicas down, publishes are refused
// with 0x83 within a bounded time, never acknowledged; the node stays up,
// and serves again once a replica returns.
func TestQuorumLost(t *testing.T) {
	c := newCluster(t)
	cl := c.startThree()
	c.nodes["b"].kill()
	c.nodes["c"].kill()
	refused := 0
	for i := 1; i <= 5; i++ {
		start := time.Now()
		code, err := cl.publish("$queue/orders", "k", message("k", i))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if code == 0 {
			t.Fatalf("publish %d acknowledged with two of three replicas down", i)
		}
		if code == 0x83 {
			refused++
		}
		t.Logf("publish %d: %#x after %s", i, code, time.Since(start).Round(time.Millisecond))
	}
	if refused == 0 {
		t.Errorf("no publish refused with 0x83")
	}
	c.start("b")
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, err := cl.publish("$queue/orders", "k", message("k", 100))
		if err == nil && code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no publish acknowledged 30s after a replica returned: %#x %v", code, err)
		}
	}
}

// TestReplicaReplaced: a replica's node stopped for good is replaced, by
// each partition's leader, with the node that was no replica; the new
// replica gets what the partition holds: with a second original replica
// gone, the new one and the last serve every acknowledged message.
func TestReplicaReplaced(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, "cluster:\n  replace_after: 2s\n  raft_log_keep: 20\n"))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	stop := make(chan struct{})
	l, done := c.produceAcross([]string{"a", "b"}, "p", 16, stop)
	waitAcked(t, l, 300)
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	c.start("d")
	c.nodes["c"].signal(syscall.SIGTERM)
	c.nodes["c"].waitExit(t, 30*time.Second)
	// Every partition: c replaced by d.
	deadline := time.Now().Add(40 * time.Second)
	for {
		ok := true
		for _, r := range c.replicas("orders") {
			ok = ok && len(r) == 3 && !slices.Contains(r, "c") && slices.Contains(r, "d")
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas not replaced 40s after c left: %v", c.replicas("orders"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitAcked(t, l, l.ackedCount()+200)
	close(stop)
	<-done
	c.nodes["b"].kill()
	c.waitFailover("orders", 8, "b", time.Now(), 20*time.Second)
	got := consumeAll(t, c.nodes["d"], "g", l)
	l.check(t, got)
	checkOrder(t, got)
}

// replicas reads each partition's replicas from etcd.
func (c *testCluster) replicas(queue string) map[int][]string {
	c.t.Helper()
	out := map[int][]string{}
	for p, o := range c.owners(queue) {
		out[p] = o.Replicas
	}
	return out
}

// TestFailoverInvisibleToProducers (SPEC 7, Failover): the leader of most
// partitions is killed under load; producers connected to the other nodes
// get 0x00 for every publish (their publishes in flight to the dead
// leader are routed again to the new one, with the same origin), and
// every message is stored once.
func TestFailoverInvisibleToProducers(t *testing.T) {
	c := newCluster(t)
	stop := make(chan struct{})
	ledgers, dones := c.underLoad(stop)
	victim := c.mostOwned("orders")
	before := total(ledgers)
	c.nodes[victim].kill()
	killed := time.Now()
	took := c.waitFailover("orders", 8, victim, killed, 20*time.Second)
	waitTotal(t, ledgers, before+300)
	close(stop)
	for _, d := range dones {
		<-d
	}
	c.start(victim)
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	t.Logf("failover after SIGKILL of %s: %s", victim, took)
	got := consumeAll(t, c.nodes["a"], "g", ledgers...)
	for _, l := range ledgers {
		l.check(t, got)
	}
	onlyAcked(t, ledgers, victim)
	checkOrder(t, got)
}

// onlyAcked checks that the producers of produceFromAll on the nodes other
// than victim got 0x00 for every publish.
func onlyAcked(t *testing.T, ledgers []*ledger, victim string) {
	t.Helper()
	for i, l := range ledgers {
		node := []string{"a", "b", "c"}[i]
		t.Logf("producer on %s: codes %v", node, l.codeCounts())
		if node == victim {
			continue
		}
		for code, n := range l.codeCounts() {
			if code != 0 {
				t.Errorf("producer on %s, a node that stayed up: %d publishes answered %#x", node, n, code)
			}
		}
	}
}

// TestLargeMessagesReplicate: a follower paused while 72 MiB of large
// messages were committed without it catches up once it resumes. The
// leader sends what it missed in messages of up to 4 MiB of entries, 256
// of them at a time: the stream to the follower carries them in batches
// bounded in bytes, under the 64 MiB a peer takes in one gRPC message.
func TestLargeMessagesReplicate(t *testing.T) {
	const n, size = 72, 1<<20 - 1024 // under storage.max_payload (1 MiB)
	c := newCluster(t, "--config", configFile(t, "queues:\n  declared:\n    big:\n      partitions: 1\n"))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	prod := dial(t, c.nodes["a"].mqtt, "producer", 64)
	if code, err := prod.publish("$queue/big", "k", message("first", 0)); err != nil || code != 0 {
		t.Fatalf("publish: %#x %v", code, err)
	}
	leader := c.waitOwned("big", 1, 15*time.Second, "a", "b", "c")[0].Owner
	follower := "a"
	for _, id := range []string{"a", "b", "c"} {
		if id != leader {
			follower = id
		}
	}
	waitUntil(t, 30*time.Second, follower+" in sync before the test", func() bool { return replicaInSync(c, "big", follower) })
	c.nodes[follower].signal(syscall.SIGSTOP)
	for i := range n {
		p := append(message("big", i), make([]byte, size)...)
		if code, err := prod.publish("$queue/big", "k", p); err != nil || code != 0 {
			c.nodes[follower].signal(syscall.SIGCONT)
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
	}
	c.nodes[follower].signal(syscall.SIGCONT)
	waitUntil(t, 60*time.Second, follower+" in sync after it resumed", func() bool { return replicaInSync(c, "big", follower) })
}
