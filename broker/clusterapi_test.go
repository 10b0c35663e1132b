package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/config"
)

// getJSON GETs path of b's admin API with the token and decodes the 200
// answer into v.
func getJSON(t *testing.T, b *testBroker, token, path string, v any) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+b.HTTPAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, res.Status)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 15s: %s", what)
		}
	}
}

// twoNodes starts a cluster of two nodes, node-a and node-b, with an
// embedded etcd, one replica per partition and the admin token given, and
// waits until each sees the other.
func twoNodes(t *testing.T, token string) (a, b *testBroker) {
	t.Helper()
	e, err := devetcd.Start(devetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	node := func(id string) *testBroker {
		return startBroker(t, t.TempDir(), func(c *config.Config) {
			c.NodeID = id
			c.Admin.Token = token
			c.Cluster.Etcd.Endpoints = []string{e.Endpoint()}
			c.Queues.Defaults.ReplicationFactor = 1 // one owner per partition: the figures below
			c.Cluster.Addr = "127.0.0.1:0"
			c.Cluster.LeaseTTL = 2 * time.Second
		})
	}
	a, b = node("node-a"), node("node-b")
	waitUntil(t, "both nodes see each other", func() bool {
		for _, x := range []*testBroker{a, b} {
			st := x.Cluster().Status()
			if len(st.Nodes) != 2 || st.Nodes[0].State != "up" || st.Nodes[1].State != "up" {
				return false
			}
		}
		return true
	})
	return a, b
}

// TestClusterAdminAPI checks GET /api/v1/cluster and the reads of the
// queues in a cluster of two nodes: any node answers for the whole
// cluster, each partition counted once, by its owner; a node that went
// down owning partitions is named in nodes_missing.
func TestClusterAdminAPI(t *testing.T) {
	const token = "cluster-token"
	a, b := twoNodes(t, token)

	c := dialRaw(t, a.MQTTAddr(), "producer", connectOpts{})
	const n = 40
	for i := range n {
		if code := c.publish("$queue/jobs", fmt.Appendf(nil, "m%d", i), "key", fmt.Sprintf("k%d", i)); code != 0 {
			t.Fatalf("publish %d: 0x%02x", i, code)
		}
	}
	var st broker.ClusterView
	waitUntil(t, "every partition of jobs owned", func() bool {
		getJSON(t, b, token, "/api/v1/cluster", &st)
		owned := 0
		for _, p := range st.Partitions {
			if p.Queue == "jobs" && p.Owner != "" {
				owned++
			}
		}
		return owned == 8
	})
	if !st.Clustered || st.Node != "node-b" || len(st.Nodes) != 2 {
		t.Fatalf("cluster view: %+v", st)
	}
	owners := map[int]string{}
	for _, p := range st.Partitions {
		if p.Epoch < 1 || !slices.Equal(p.Replicas, []string{p.Owner}) || !slices.Equal(p.InSync, []string{p.Owner}) {
			t.Errorf("partition %+v: want epoch >= 1, replicas and in_sync [owner]", p)
		}
		owners[p.Partition] = p.Owner
	}
	for _, x := range st.Nodes {
		if x.MQTT == "" || x.HTTP == "" || x.ClusterAddr == "" {
			t.Errorf("node without its addresses: %+v", x)
		}
	}

	// Either node answers with every node's figures.
	for _, x := range []*testBroker{a, b} {
		var list broker.QueueList
		getJSON(t, x, token, "/api/v1/queues", &list)
		i := slices.IndexFunc(list.Queues, func(q broker.QueueView) bool { return q.Name == "jobs" })
		if i < 0 || list.Queues[i].Depth != n || list.Queues[i].Counts.Enqueued != n || len(list.NodesMissing) != 0 {
			t.Fatalf("queues from %s: %+v", list.Node, list)
		}
		var q broker.QueueView
		getJSON(t, x, token, "/api/v1/queues/jobs", &q)
		var depth uint64
		for _, p := range q.Partitions {
			depth += p.Depth
			if p.Node != owners[p.Partition] {
				t.Errorf("partition %d: figures of %q, owner %q", p.Partition, p.Node, owners[p.Partition])
			}
		}
		if q.Depth != n || depth != n || len(q.Partitions) != 8 || q.DLQ == nil {
			t.Errorf("queue from %s: depth %d, partitions' depth %d, %d partitions", q.Node, q.Depth, depth, len(q.Partitions))
		}
		var all, some broker.MessageList
		getJSON(t, x, token, "/api/v1/queues/jobs/messages?limit=100", &all)
		getJSON(t, x, token, "/api/v1/queues/jobs/messages?limit=7", &some)
		if len(all.Messages) != n || len(some.Messages) != 7 {
			t.Fatalf("peek from %s: %d and %d messages, want %d and 7", all.Node, len(all.Messages), len(some.Messages), n)
		}
		for i, m := range some.Messages {
			if m.ID != all.Messages[i].ID {
				t.Errorf("peek limit 7: message %d is %s, want %s", i, m.ID, all.Messages[i].ID)
			}
		}
		for i := 1; i < len(all.Messages); i++ {
			if p, q := all.Messages[i-1], all.Messages[i]; p.Partition > q.Partition || (p.Partition == q.Partition && p.Offset >= q.Offset) {
				t.Errorf("peek out of order: %s before %s", p.ID, q.ID)
			}
		}
	}

	// The cluster's metrics are documented.
	res, err := http.Get("http://" + a.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	doc, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (shardq_cluster_\w+)`).FindAllSubmatch(body, -1) {
		seen++
		if !strings.Contains(string(doc), "`"+string(m[1])+"`") {
			t.Errorf("%s is not in docs/METRICS.md", m[1])
		}
	}
	if seen < 5 {
		t.Errorf("%d shardq_cluster_* metrics on a cluster node", seen)
	}

	// node-b stops without handing anything over, as if it died: its
	// partitions stay its own, and the figures say they are missing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = b.Shutdown(ctx)
	waitUntil(t, "node-b down", func() bool {
		getJSON(t, a, token, "/api/v1/cluster", &st)
		return len(st.Nodes) == 2 && st.Nodes[1].State == cluster.StateDown
	})
	var list broker.QueueList
	getJSON(t, a, token, "/api/v1/queues", &list)
	if !slices.Equal(list.NodesMissing, []string{"node-b: down"}) {
		t.Errorf("nodes_missing %q, want node-b down", list.NodesMissing)
	}
	for _, p := range st.Partitions {
		if p.Owner == "node-b" && len(p.InSync) != 0 {
			t.Errorf("partition %d of a node down still in sync: %+v", p.Partition, p)
		}
	}
}

// TestClusterAdminAPISingleNode checks GET /api/v1/cluster on a single
// node: itself, up, owning every partition.
func TestClusterAdminAPISingleNode(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.NodeID = "solo"
		o := c.Queues.Defaults
		o.Partitions = 3
		c.Queues.Declared["jobs"] = o
	})
	var st broker.ClusterView
	getJSON(t, b, "", "/api/v1/cluster", &st)
	if st.Clustered || len(st.Nodes) != 1 || st.Nodes[0].ID != "solo" || st.Nodes[0].State != "up" || st.Nodes[0].MQTT != b.MQTTAddr() {
		t.Fatalf("nodes: %+v", st)
	}
	want := []cluster.PartitionStatus{}
	for p := range 3 {
		want = append(want, cluster.PartitionStatus{Queue: "jobs", Partition: p, Owner: "solo", Epoch: 1, Replicas: []string{"solo"}, Learners: []string{}, InSync: []string{"solo"}})
	}
	if fmt.Sprint(st.Partitions) != fmt.Sprint(want) {
		t.Errorf("partitions %+v, want %+v", st.Partitions, want)
	}
}
