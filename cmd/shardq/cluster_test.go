package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/config"
)

// TestClusterDev runs shardq cluster dev --nodes 3 as a process: it prints
// every node's addresses once they are ready, shardq cluster status shows
// the three nodes up and the owners of a queue's partitions, and Ctrl-C
// stops everything, exit 0, removing its temporary data.
func TestClusterDev(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shardq")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The config file declares a queue with 2 replicas per partition.
	file := filepath.Join(t.TempDir(), "shardq.yaml")
	if err := os.WriteFile(file, []byte("queues:\n  declared:\n    pairs:\n      partitions: 2\n      replication_factor: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "cluster", "dev", "--nodes", "3", "--base-port", "0", "--http-port", "0", "--cluster-port", "0", "--config", file)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		waitErr error
		exited  = make(chan struct{})
	)
	var (
		mu    sync.Mutex
		lines []string
	)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "cluster of 3 nodes ready") {
				once.Do(func() { close(ready) })
			}
		}
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("cluster dev exited before it was ready: %v\n%s", waitErr, stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("cluster dev not ready after 90s\n%s", stderr.String())
	}
	mu.Lock()
	output := strings.Join(lines, "\n")
	mu.Unlock()

	nodeLine := regexp.MustCompile(`(?m)^(node-\d)\s+mqtt (\S+)\s+http (http://\S+)\s+cluster (\S+)$`)
	found := nodeLine.FindAllStringSubmatch(output, -1)
	if len(found) != 3 || !regexp.MustCompile(`(?m)^etcd\s+http://127\.0\.0\.1:\d+$`).MatchString(output) {
		t.Fatalf("want etcd and 3 nodes with their addresses:\n%s", output)
	}
	dataDir := regexp.MustCompile(`data in (\S+) \(removed at exit\)`).FindStringSubmatch(output)
	if dataDir == nil {
		t.Fatalf("no data directory printed:\n%s", output)
	}
	server := found[0][3]

	// A publish to node-2 creates the queue in the cluster.
	o := paho3.NewClientOptions().AddBroker("tcp://" + found[1][2]).SetClientID("producer").SetAutoReconnect(false)
	c := paho3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to node-2: %v", tok.Error())
	}
	publish(t, c, "$queue/jobs", "hello")
	c.Disconnect(0)

	// The first node creates the partitions alone; they gain replicas as
	// the others join, and pairs' move to the two nodes placement wants
	// (a learner added, promoted, then a replica removed).
	var st broker.ClusterView
	waitWithin(t, func() bool {
		st = jsonOf[broker.ClusterView](t, must(t, "cluster", "status", "--json", "--server", server))
		// Owned and on all three nodes: a queue created while the node
		// that created it saw fewer members gains its third replica as
		// soon as it sees the third.
		owned, pairs := 0, 0
		for _, p := range st.Partitions {
			if p.Queue == "jobs" && p.Owner != "" && len(p.Replicas) == 3 && len(p.InSync) == 3 {
				owned++
			}
			if p.Queue == "pairs" && p.Owner != "" && len(p.Replicas) == 2 && len(p.InSync) == 2 {
				pairs++
			}
		}
		return owned == 8 && pairs == 2
	}, 30*time.Second)
	if !st.Clustered || len(st.Nodes) != 3 {
		t.Fatalf("cluster status: %+v", st)
	}
	ids := []string{}
	for i, n := range st.Nodes {
		ids = append(ids, n.ID)
		if n.State != "up" || n.MQTT != found[i][2] || "http://"+n.HTTP != found[i][3] || n.ClusterAddr != found[i][4] {
			t.Errorf("node %+v, printed %q", n, found[i][0])
		}
	}
	for _, p := range st.Partitions {
		if p.Queue != "jobs" {
			continue
		}
		// Replicated on every node (replication factor 3, the default of
		// a cluster), owned by one of them.
		if !slices.Contains(ids, p.Owner) || p.Epoch < 1 || len(p.Replicas) != 3 || !slices.Contains(p.Replicas, p.Owner) || !slices.Contains(p.InSync, p.Owner) {
			t.Errorf("partition %+v", p)
		}
	}
	table := must(t, "cluster", "status", "--server", server)
	for _, want := range []string{"NODE", "node-1  up", "node-3  up", "QUEUE  PARTITION  OWNER", "jobs   7"} {
		if !strings.Contains(table, want) {
			t.Errorf("cluster status lacks %q:\n%s", want, table)
		}
	}
	// Any node lists the queue with the whole cluster's figures.
	list := jsonOf[broker.QueueList](t, must(t, "queues", "--json", "--server", found[2][3]))
	if len(list.Queues) != 2 || list.Queues[0].Name != "jobs" || list.Queues[0].Depth != 1 || len(list.NodesMissing) != 0 {
		t.Errorf("queues from node-3: %+v", list)
	}

	start := time.Now()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit after SIGINT: %v\n%s", waitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after SIGINT\n%s", stderr.String())
	}
	t.Logf("stopped %s after SIGINT", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(dataDir[1]); !os.IsNotExist(err) {
		t.Errorf("temporary data %s not removed: %v", dataDir[1], err)
	}
}

// TestClusterStatusSingleNode checks shardq cluster status against a
// single node: itself, up, owning every partition.
func TestClusterStatusSingleNode(t *testing.T) {
	_, server := startNode(t)
	st := jsonOf[broker.ClusterView](t, must(t, "cluster", "status", "--json", "--server", server, "--token", cliToken))
	if st.Clustered || len(st.Nodes) != 1 || st.Nodes[0].ID != "node-cli" || st.Nodes[0].State != "up" {
		t.Fatalf("nodes: %+v", st.Nodes)
	}
	if len(st.Partitions) != 8 || st.Partitions[7].Owner != "node-cli" || st.Partitions[7].Epoch != 1 {
		t.Errorf("partitions: %+v", st.Partitions)
	}
	if n := st.Nodes[0]; n.Replicas != 8 || n.Leads != 8 || n.Drained {
		t.Errorf("node: %+v; want 8 replicas and 8 leads, not drained", n)
	}
	out := must(t, "cluster", "status", "--server", server, "--token", cliToken)
	if !strings.Contains(out, "node-cli is a single node") || !strings.Contains(out, "jobs   7          node-cli  1") ||
		!regexp.MustCompile(`(?m)^NODE +STATE +MQTT +HTTP +CLUSTER +REPLICAS +LEADS$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^node-cli +up +.* 8 +8$`).MatchString(out) || strings.Contains(out, "LEARNERS") {
		t.Errorf("cluster status:\n%s", out)
	}
	fails(t, 2, "--nodes: want 1 to 9", "cluster", "dev", "--nodes", "12")
	fails(t, 2, "both take port", "cluster", "dev", "--base-port", "8990")
	fails(t, 2, "unexpected argument", "cluster", "dev", "now")
	fails(t, 2, "cannot read the config file", "cluster", "dev", "--config", filepath.Join(t.TempDir(), "none.yaml"))
}

// TestClusterCommandsUsage checks the mistakes in the arguments of the
// cluster commands: exit 2, saying what to type, before anything is
// called.
func TestClusterCommandsUsage(t *testing.T) {
	// A closed port: a command that called the node would exit 1.
	t.Setenv("SHARDQ_SERVER", "http://127.0.0.1:1")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"drain without a node", []string{"cluster", "drain"}, "want the id of the node to drain"},
		{"drain two nodes", []string{"cluster", "drain", "b", "c"}, "want 1 argument(s) (NODE), got 2"},
		{"undrain without a node", []string{"cluster", "undrain"}, "want the id of the node to undrain"},
		{"status with an argument", []string{"cluster", "status", "now"}, `unexpected argument "now"`},
		{"placement with a typo", []string{"cluster", "placement", "sett", "a=b"}, `unexpected argument "sett" (subcommands: set, clear)`},
		{"set without a rule", []string{"cluster", "placement", "set"}, "want one rule or more, like 'orders-*=a,b' (shardq cluster placement clear removes them all)"},
		{"set without = and no such file", []string{"cluster", "placement", "set", "orders-*"}, `want rules like 'orders-*=a,b', or a file of them: open orders-*: no such file`},
		{"set with two, one without =", []string{"cluster", "placement", "set", "orders-*=a", "audit"}, `want QUEUES=NODE[,NODE...], like 'orders-*=a,b', got "audit"`},
		{"set without a pattern", []string{"cluster", "placement", "set", "=a"}, `got "=a"`},
		{"set without a node", []string{"cluster", "placement", "set", "orders-*=a", "audit="}, `rule "audit=" names no node`},
		{"set with an empty node id", []string{"cluster", "placement", "set", "orders-*=a,,b"}, `rule "orders-*=a,,b" has an empty node id`},
		{"clear with a rule", []string{"cluster", "placement", "clear", "orders-*=a"}, `unexpected argument "orders-*=a"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fails(t, 2, tc.want, tc.args...)
			// The usage follows the error.
			_, _, errs := shardq(tc.args...)
			if !strings.Contains(errs, "usage: shardq cluster ") {
				t.Errorf("no usage after the error:\n%s", errs)
			}
		})
	}
	// shardq cluster placement show is shardq cluster placement.
	fails(t, 1, "nothing listens at", "cluster", "placement", "show")
}

// TestClusterCommandsSingleNode checks the cluster's changes against a
// single node: refused, saying they need a cluster; its placement is
// empty.
func TestClusterCommandsSingleNode(t *testing.T) {
	_, server := startNode(t)
	for _, args := range [][]string{
		{"cluster", "drain", "node-cli"},
		{"cluster", "undrain", "node-cli"},
		{"cluster", "placement", "set", "jobs=node-cli"},
		{"cluster", "placement", "clear"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			fails(t, 1, "needs a cluster: this node runs alone", append(args, "--server", server, "--token", cliToken)...)
			fails(t, 1, "(HTTP 409)", append(args, "--server", server, "--token", cliToken)...)
			fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", append(args, "--server", server)...)
		})
	}
	if out := must(t, "cluster", "placement", "--server", server, "--token", cliToken); out != "no placement rules: every queue on every node\n" {
		t.Errorf("placement: %q", out)
	}
	if v := jsonOf[broker.PlacementView](t, must(t, "cluster", "placement", "--json", "--server", server, "--token", cliToken)); v.Rules == nil || len(v.Rules) != 0 {
		t.Errorf("placement --json: %+v, want an empty list", v)
	}
}

// TestClusterCommandsOneNodeCluster runs drain, undrain and placement
// against a cluster of one node over a real etcd: the changes are taken,
// kept in etcd and shown by status and placement; an unknown node and a
// bad glob are refused.
func TestClusterCommandsOneNodeCluster(t *testing.T) {
	e, err := devetcd.Start(devetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	_, server := startNode(t, func(c *config.Config) {
		c.Cluster.Etcd.Endpoints = []string{e.Endpoint()}
		c.Cluster.Addr = "127.0.0.1:0"
	})
	flags := []string{"--server", server, "--token", cliToken}
	status := func() broker.ClusterView {
		return jsonOf[broker.ClusterView](t, must(t, append([]string{"cluster", "status", "--json"}, flags...)...))
	}
	waitUntil(t, func() bool {
		st := status()
		return len(st.Nodes) == 1 && st.Nodes[0].Replicas == 8 && st.Nodes[0].Leads == 8
	})

	t.Run("drain", func(t *testing.T) {
		out := must(t, append([]string{"cluster", "drain", "node-cli"}, flags...)...)
		if out != "node node-cli drained: its partitions move to the other nodes; watch shardq cluster status\n" {
			t.Errorf("drain: %q", out)
		}
		// The only node keeps its partitions: there is no other to take
		// them.
		var n cluster.NodeStatus
		waitUntil(t, func() bool { n = status().Nodes[0]; return n.Drained })
		if n.State != cluster.StateDraining || n.Replicas != 8 {
			t.Errorf("drained alone: %+v; want draining with its 8 replicas", n)
		}
		table := must(t, append([]string{"cluster", "status"}, flags...)...)
		if !regexp.MustCompile(`(?m)^node-cli +draining +.* 8 +8$`).MatchString(table) {
			t.Errorf("status:\n%s", table)
		}
		if v := jsonOf[broker.DrainView](t, must(t, append([]string{"cluster", "drain", "node-cli", "--json"}, flags...)...)); v != (broker.DrainView{Node: "node-cli", Drained: true}) {
			t.Errorf("drain --json: %+v", v)
		}
		fails(t, 1, `"ghost" never joined the cluster (known: node-cli) (HTTP 404)`, append([]string{"cluster", "drain", "ghost"}, flags...)...)

		out = must(t, append([]string{"cluster", "undrain", "node-cli"}, flags...)...)
		if out != "node node-cli undrained: it takes its share of partitions again\n" {
			t.Errorf("undrain: %q", out)
		}
		waitUntil(t, func() bool { n = status().Nodes[0]; return !n.Drained && n.State == cluster.StateUp })
	})

	t.Run("placement", func(t *testing.T) {
		out := must(t, append([]string{"cluster", "placement", "set", "jobs*=node-cli", "audit = node-cli"}, flags...)...)
		for _, want := range []string{"placement set: partitions move", "RULE  QUEUES  NODES", "1     jobs*   node-cli", "2     audit   node-cli", "the first rule that matches"} {
			if !strings.Contains(out, want) {
				t.Errorf("placement set lacks %q:\n%s", want, out)
			}
		}
		want := broker.PlacementView{Rules: []broker.PlacementRuleView{{Queues: "jobs*", Nodes: []string{"node-cli"}}, {Queues: "audit", Nodes: []string{"node-cli"}}}}
		waitUntil(t, func() bool {
			got := jsonOf[broker.PlacementView](t, must(t, append([]string{"cluster", "placement", "--json"}, flags...)...))
			return fmt.Sprint(got) == fmt.Sprint(want)
		})
		fails(t, 1, `names node "ghost", which never joined the cluster`, append([]string{"cluster", "placement", "set", "jobs=node-cli,ghost"}, flags...)...)
		fails(t, 1, "(HTTP 400)", append([]string{"cluster", "placement", "set", "[=node-cli"}, flags...)...)
		fails(t, 1, "is not a valid glob", append([]string{"cluster", "placement", "set", "[=node-cli"}, flags...)...)
		// A refused change changes nothing.
		if got := jsonOf[broker.PlacementView](t, must(t, append([]string{"cluster", "placement", "--json"}, flags...)...)); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after refused changes: %+v, want %+v", got, want)
		}

		// From a file, as cluster.placement holds them.
		file := filepath.Join(t.TempDir(), "placement.yaml")
		if err := os.WriteFile(file, []byte("cluster:\n  placement:\n    - queues: \"orders-*\"\n      nodes: [node-cli]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		must(t, append([]string{"cluster", "placement", "set", file}, flags...)...)
		fromFile := broker.PlacementView{Rules: []broker.PlacementRuleView{{Queues: "orders-*", Nodes: []string{"node-cli"}}}}
		waitUntil(t, func() bool {
			got := jsonOf[broker.PlacementView](t, must(t, append([]string{"cluster", "placement", "--json"}, flags...)...))
			return fmt.Sprint(got) == fmt.Sprint(fromFile)
		})
		if err := os.WriteFile(file, []byte("- queues: x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fails(t, 2, "rule 1 needs queues (or tenants) and nodes", append([]string{"cluster", "placement", "set", file}, flags...)...)

		out = must(t, append([]string{"cluster", "placement", "clear"}, flags...)...)
		if !strings.HasPrefix(out, "placement rules cleared: every queue on every node") {
			t.Errorf("placement clear: %q", out)
		}
		waitUntil(t, func() bool {
			return must(t, append([]string{"cluster", "placement"}, flags...)...) == "no placement rules: every queue on every node\n"
		})
	})
}

// TestClusterStatusTable checks the tables of shardq cluster status: the
// node states, replicas and leads; learners only while some partition has
// one.
func TestClusterStatusTable(t *testing.T) {
	nodes := []cluster.NodeStatus{
		{ID: "a", MQTT: "10.0.0.1:1883", HTTP: "10.0.0.1:8990", ClusterAddr: "10.0.0.1:8991", State: cluster.StateUp, Replicas: 3, Leads: 2},
		{ID: "b", MQTT: "10.0.0.2:1883", HTTP: "10.0.0.2:8990", ClusterAddr: "10.0.0.2:8991", State: cluster.StateDraining, Drained: true, Replicas: 1},
		{ID: "c", MQTT: "10.0.0.3:1883", HTTP: "10.0.0.3:8990", ClusterAddr: "10.0.0.3:8991", State: cluster.StateDrained, Drained: true},
		{ID: "d", State: cluster.StateDown},
	}
	settled := []cluster.PartitionStatus{
		{Queue: "orders", Partition: 0, Owner: "a", Epoch: 3, Replicas: []string{"a", "b"}, Learners: []string{}, InSync: []string{"a", "b"}},
		{Queue: "orders", Partition: 1, Owner: "a", Epoch: 2, Replicas: []string{"a"}, Learners: []string{}, InSync: []string{"a"}},
	}
	moving := slices.Clone(settled)
	moving[0].Learners = []string{"d"}
	tests := []struct {
		name       string
		partitions []cluster.PartitionStatus
		want       []string // lines, spaces squeezed
	}{
		{"settled", settled, []string{
			"NODE STATE MQTT HTTP CLUSTER REPLICAS LEADS",
			"a up 10.0.0.1:1883 10.0.0.1:8990 10.0.0.1:8991 3 2",
			"b draining 10.0.0.2:1883 10.0.0.2:8990 10.0.0.2:8991 1 0",
			"c drained 10.0.0.3:1883 10.0.0.3:8990 10.0.0.3:8991 0 0",
			"d down - - - 0 0",
			"",
			"QUEUE PARTITION OWNER EPOCH REPLICAS IN-SYNC",
			"orders 0 a 3 a,b a,b",
			"orders 1 a 2 a a",
		}},
		{"a learner", moving, []string{
			"QUEUE PARTITION OWNER EPOCH REPLICAS IN-SYNC LEARNERS",
			"orders 0 a 3 a,b a,b d",
			"orders 1 a 2 a a -",
		}},
	}
	squeeze := regexp.MustCompile(` +`)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printCluster(&b, broker.ClusterView{Node: "a", Clustered: true, Status: cluster.Status{Nodes: nodes, Partitions: tc.partitions}})
			got := squeeze.ReplaceAllString(b.String(), " ")
			if !strings.Contains(got, strings.Join(tc.want, "\n")) {
				t.Errorf("got\n%s\nwant\n%s", b.String(), strings.Join(tc.want, "\n"))
			}
		})
	}
}
