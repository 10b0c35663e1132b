package cluster_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDamagedRaftLog: one replica's raft log is damaged in the middle of
// data it had synced and acknowledged. A first load reaches all three
// nodes; with c paused, a and b acknowledge a second one; all three are
// killed; 64 bytes of a's newest raft log segment, in the first load's
// part, are flipped; a and c come back first, b last. Cut at the damage,
// a's log would be shorter than c's, and a's vote would make c, without
// the second load, the leader. a must take no part in elections until it
// has its entries back: nothing acknowledged is lost.
func TestDamagedRaftLog(t *testing.T) {
	c := newCluster(t)
	prod := c.startThree()
	segs, _ := filepath.Glob(filepath.Join(c.nodes["a"].dir, "raft", "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("raft log segments on a: %v, want one", segs)
	}
	seg := segs[0]
	stop := make(chan struct{})
	first, done := produceKeys(prod, "$queue/orders", "one-", 16, stop)
	waitAcked(t, first, 1500)
	close(stop)
	<-done
	st, err := os.Stat(seg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes["c"].signal(syscall.SIGSTOP)
	stop = make(chan struct{})
	second, done := produceKeys(prod, "$queue/orders", "two-", 16, stop)
	waitAcked(t, second, 1500)
	close(stop)
	<-done
	for _, id := range []string{"a", "b", "c"} {
		c.nodes[id].kill()
	}

	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := int(st.Size()) / 2
	for i := at; i < at+64; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	c.start("a")
	c.start("c")
	if log := c.nodes["a"].logTail(); !strings.Contains(log, "raft log damaged") {
		t.Fatalf("a did not report its damaged raft log:\n%s", log)
	}
	waitMetric(t, c.nodes["a"], "shardq_cluster_raft_recovering_groups", func(v float64) bool { return v > 0 })
	c.start("b")
	got := consumeAll(t, c.nodes["c"], "g", first, second)
	first.check(t, got)
	second.check(t, got)
	// a has its entries back and votes again; its raft log stops saying
	// it is recovering at the node's next pass over its partitions,
	// which the last group's recovery starts.
	waitMetric(t, c.nodes["a"], "shardq_cluster_raft_recovering_groups", func(v float64) bool { return v == 0 })
	waitFor(t, "a's raft log no longer says it is recovering", 10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(c.nodes["a"].dir, "raft", "RECOVERING"))
		return os.IsNotExist(err)
	})
}

// waitMetric waits until the node's metric satisfies ok.
func waitMetric(t *testing.T, n *node, name string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := n.metric(t, name)
		if ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %s = %v after 30s:\n%s", n.id, name, v, n.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRaftLogRemoved: a node whose raft log was removed, or whose whole
// data directory was replaced by an empty one, while it was a replica,
// comes back recovering: it votes again only once it has its entries
// back, and nothing acknowledged is lost.
func TestRaftLogRemoved(t *testing.T) {
	for _, tc := range []struct{ name, remove string }{
		{"raft log", "raft"},
		{"data directory", "."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			prod := c.startThree()
			stop := make(chan struct{})
			l, done := produce(prod, "$queue/orders", 16, stop)
			waitAcked(t, l, 1000)
			close(stop)
			<-done
			c.nodes["c"].kill()
			if err := os.RemoveAll(filepath.Join(c.nodes["c"].dir, tc.remove)); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(c.nodes["c"].dir, 0o755); err != nil {
				t.Fatal(err)
			}
			c.start("c")
			if log := c.nodes["c"].logTail(); !strings.Contains(log, "raft log is empty while the cluster names it a replica") {
				t.Fatalf("c did not report its missing raft log:\n%s", log)
			}
			waitMetric(t, c.nodes["c"], "shardq_cluster_raft_recovering_groups", func(v float64) bool { return v > 0 })
			waitMetric(t, c.nodes["c"], "shardq_cluster_raft_recovering_groups", func(v float64) bool { return v == 0 })
			got := consumeAll(t, c.nodes["c"], "g", l)
			l.check(t, got)
		})
	}
}
