package cluster_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestNotReadyWhileAPeerIsCutOff: a node that cannot reach a member for
// longer than a lease reports not ready, naming it, and is ready again
// once the link is back; the cluster in network namespaces.
func TestNotReadyWhileAPeerIsCutOff(t *testing.T) {
	c, _ := newNetCluster(t, []string{"a", "b", "c"})
	c.startThree()
	if err := c.net.Partition("a", "b"); err != nil {
		t.Fatal(err)
	}
	// Both still renew their leases in etcd: members that cannot reach
	// each other.
	why := waitReadyz(t, c.nodes["a"], http.StatusServiceUnavailable, 30*time.Second)
	if !strings.Contains(why, "node b") {
		t.Errorf("a not ready, but not for its link to b: %q", why)
	}
	if err := c.net.Heal("a", "b"); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, c.nodes["a"], http.StatusOK, 15*time.Second)
}

// waitReadyz waits until the node's /readyz answers code, and returns its
// body.
func waitReadyz(t *testing.T, n *node, code int, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := probe.Get("http://" + n.http + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == code {
				return string(body)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: /readyz not %d within %s:\n%s", n.id, code, within, n.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNoLeaseFlapAfterEtcdCut: a node cut from etcd past its lease loses
// it once, joins again once the cut heals, and keeps its new lease: it
// does not lose it again right after, releasing its partitions a second
// time.
func TestNoLeaseFlapAfterEtcdCut(t *testing.T) {
	c, _ := newNetCluster(t, []string{"a", "b", "c"})
	c.startThree()
	a := c.nodes["a"]
	if err := c.net.Partition("a", etcdNS); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a, "shardq_cluster_leases_lost_total", func(v float64) bool { return v >= 1 })
	if err := c.net.Heal("a", etcdNS); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, a, http.StatusOK, 20*time.Second)
	// Two lease TTLs (5 s each) with the network whole.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if lost := a.metric(t, "shardq_cluster_leases_lost_total"); lost > 1 {
			t.Fatalf("a lost its lease %v times; once, in the cut, is all it should:\n%s", lost, a.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
