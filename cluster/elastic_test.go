package cluster_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/queue"
)

// Elasticity (SPEC 7): replicas follow placement at runtime. A node that
// joins takes its share of the replicas and leaderships; a drained node
// gives all of its away; a placement change moves a queue onto the nodes
// it names. Each under a producer's load, with nothing acknowledged lost
// and per-key order kept.

const queue24 = "queues:\n  declared:\n    orders:\n      partitions: 24\n"

// waitPlaced waits until every partition of the queue has exactly the
// replicas placement wants among the nodes live, drained ones left out:
// no learner left, each replica in sync with its leader. It returns the
// replicas by partition.
func (c *testCluster) waitPlaced(queue string, partitions int, live, drained []string, within time.Duration) map[int][]string {
	c.t.Helper()
	want := map[int][]string{}
	for p := range partitions {
		want[p] = cluster.WantedReplicas(live, drained, queue, p, 3)
	}
	deadline := time.Now().Add(within)
	for {
		owners := c.owners(queue)
		off := 0
		for p := range partitions {
			o := owners[p]
			if !sameNodes(o.Replicas, want[p]) || len(o.Learners) > 0 || o.Owner == "" {
				off++
			}
		}
		if off == 0 && replicaInSyncAll(c, queue) {
			return want
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d of %d partitions of %s not on the replicas placement wants (%v, drained %v) within %s: %v",
				off, partitions, queue, live, drained, within, owners)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func sameNodes(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(b, x) })
}

// replicaInSyncAll asks each partition's leader whether every replica is
// in sync with it.
func replicaInSyncAll(c *testCluster, queue string) bool {
	for p, o := range c.owners(queue) {
		st, ok := c.status(o.Owner)
		if !ok {
			return false
		}
		for _, ps := range st.Partitions {
			if ps.Queue == queue && ps.Partition == p && !sameNodes(ps.InSync, ps.Replicas) {
				return false
			}
		}
	}
	return true
}

// status reads GET /api/v1/cluster from a node.
func (c *testCluster) status(node string) (cluster.Status, bool) {
	var st cluster.Status
	n := c.nodes[node]
	if n == nil {
		return st, false
	}
	resp, err := http.Get("http://" + n.http + "/api/v1/cluster")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st) == nil
}

// admin sends an admin call to a node and fails the test unless it is
// answered 200.
func (c *testCluster) admin(node, method, path, body string) {
	c.t.Helper()
	if status, answer := c.call(node, method, path, body); status != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(answer, &e)
		c.t.Fatalf("%s %s: HTTP %d: %s", method, path, status, e.Error)
	}
}

// TestGrowAndDrain: three nodes keep 24 partitions with three replicas
// each under load. A fourth joins: within 2 minutes it holds the replicas
// placement gives it (about a quarter of 72), each partition has three
// voters in sync, only the partitions it joined changed, and it leads
// some. Then b is drained: it ends holding nothing, shows "drained", and
// exits within 30 s of SIGTERM.
func TestGrowAndDrain(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, queue24))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	stop := make(chan struct{})
	l, done := c.produceAcross([]string{"a", "c"}, "p", 16, stop)
	waitAcked(t, l, 300)
	before := c.waitPlaced("orders", 24, []string{"a", "b", "c"}, nil, time.Minute)

	joined := time.Now()
	c.start("d")
	abcd := []string{"a", "b", "c", "d"}
	after := c.waitPlaced("orders", 24, abcd, nil, 2*time.Minute)
	held, moved := 0, 0
	for p := range 24 {
		if slices.Contains(after[p], "d") {
			held++
		}
		if !sameNodes(before[p], after[p]) {
			moved++
			if !slices.Contains(after[p], "d") {
				t.Errorf("partition %d moved from %v to %v: only moves to the new node are expected", p, before[p], after[p])
			}
		}
	}
	t.Logf("d holds %d of 72 replicas, placed %s after it started; %d partitions moved", held, time.Since(joined).Round(time.Second), moved)
	if held < 12 || held > 24 {
		t.Errorf("d holds %d replicas, far from its share of 18", held)
	}
	waitFor(t, "d leads the partitions it is preferred for", 30*time.Second, func() bool {
		leads := 0
		for p, o := range c.owners("orders") {
			if o.Owner == "d" {
				leads++
			} else if after[p][0] == "d" {
				return false
			}
		}
		return leads > 0
	})
	// Each replica d took was added to its group under a raft id of its
	// own (multiraft/ids.go), which the record names.
	ids := map[uint64]bool{}
	for p, o := range c.owners("orders") {
		if !slices.Contains(o.Replicas, "d") {
			continue
		}
		id := o.IDs["d"]
		if id == 0 || ids[id] {
			t.Errorf("partition %d: d's replica has raft id %d (ids %v)", p, id, o.IDs)
		}
		ids[id] = true
	}
	waitAcked(t, l, l.ackedCount()+200)

	drained := time.Now()
	c.admin("a", http.MethodPost, "/api/v1/cluster/nodes/b/drain", "")
	c.waitPlaced("orders", 24, abcd, []string{"b"}, 2*time.Minute)
	waitFor(t, "b owns nothing and shows drained", 30*time.Second, func() bool {
		st, ok := c.status("a")
		if !ok {
			return false
		}
		for _, n := range st.Nodes {
			if n.ID == "b" {
				return n.State == cluster.StateDrained && n.Replicas == 0 && n.Leads == 0
			}
		}
		return false
	})
	t.Logf("b drained %s after the call", time.Since(drained).Round(time.Second))
	b := c.nodes["b"]
	b.signal(syscall.SIGTERM)
	b.waitExit(t, 30*time.Second)
	if code := b.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("b exited with %d:\n%s", code, b.logTail())
	}
	waitAcked(t, l, l.ackedCount()+200)
	close(stop)
	<-done
	t.Logf("%d acknowledged, codes %v", l.ackedCount(), l.codeCounts())
	got := consumeAll(t, c.nodes["a"], "g", l)
	l.check(t, got)
	if t.Failed() {
		lostByPartition(t, l, got, 24)
	}
	checkOrder(t, got)
}

func lostByPartition(t *testing.T, l *ledger, got []arrival, partitions int) {
	seen := map[string]bool{}
	for _, a := range got {
		seen[string(a.p.Payload)] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lost := map[int]int{}
	for p := range l.acked {
		if !seen[p] {
			key, _, _ := strings.Cut(p, ":")
			lost[queue.PartitionFor(key, partitions)]++
		}
	}
	t.Logf("lost by partition: %v", lost)
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			dumpNodes(t)
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPlacementAtRuntime (three replicas): four nodes keep a queue under
// load; placement set through one node's API pins it to three others,
// and every partition's replicas and leadership move there, a few at a
// time; then a fourth node is allowed, and it takes its share. Rules
// that cannot apply are refused, saying why.
func TestPlacementAtRuntime(t *testing.T) {
	c := newCluster(t)
	abcd := []string{"a", "b", "c", "d"}
	for _, id := range abcd {
		c.start(id)
	}
	stop := make(chan struct{})
	l, done := c.produceAcross([]string{"a", "b"}, "p", 16, stop)
	waitAcked(t, l, 300)
	c.waitPlaced("orders", 8, abcd, nil, time.Minute)

	c.admin("b", http.MethodPut, "/api/v1/cluster/placement", `{"rules":[{"queues":"ord*","nodes":["b","c","d"]}]}`)
	placed := c.waitPlaced("orders", 8, []string{"b", "c", "d"}, nil, 2*time.Minute)
	for p, o := range c.owners("orders") {
		if o.Owner == "a" {
			t.Errorf("partition %d still led by a, outside its placement %v", p, placed[p])
		}
	}
	waitAcked(t, l, l.ackedCount()+200)
	c.admin("c", http.MethodPut, "/api/v1/cluster/placement", `{"rules":[]}`)
	c.waitPlaced("orders", 8, abcd, nil, 2*time.Minute)
	// a, removed from every partition, came back to some as a new
	// replica: under a raft id of its own, not the one it had.
	back := 0
	for p, o := range c.owners("orders") {
		if slices.Contains(o.Replicas, "a") {
			back++
			if id := o.IDs["a"]; id == 0 {
				t.Errorf("partition %d: a is a replica again under its first raft id (ids %v)", p, o.IDs)
			}
		}
	}
	if back == 0 {
		t.Error("a came back to no partition")
	}

	for _, bad := range []struct{ body, want string }{
		{`{"rules":[{"queues":"ord*","nodes":["zz"]}]}`, `names node "zz", which never joined`},
		{`{"rules":[{"queues":"[","nodes":["a"]}]}`, "not a valid glob"},
		{`{"rules":[{"queues":"x","nodes":[]}]}`, "names no node"},
		{`{"rules":[{"queues":"orders","nodes":["a","b"]}]}`, `gives queue "orders" 2 node(s), fewer than its replication factor 3`},
		{`{"rule":[]}`, `did you mean "rules"`},
	} {
		req, _ := http.NewRequest(http.MethodPut, "http://"+c.nodes["a"].http+"/api/v1/cluster/placement", strings.NewReader(bad.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error, bad.want) {
			t.Errorf("PUT placement %s: HTTP %d %q, want 400 saying %q", bad.body, resp.StatusCode, e.Error, bad.want)
		}
	}
	waitAcked(t, l, l.ackedCount()+200)
	close(stop)
	<-done
	t.Logf("%d acknowledged, codes %v", l.ackedCount(), l.codeCounts())
	got := consumeAll(t, c.nodes["b"], "g", l)
	l.check(t, got)
	checkOrder(t, got)
}
