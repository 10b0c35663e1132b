package main

import (
	"bufio"
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
	cmd := exec.Command(bin, "cluster", "dev", "--nodes", "3", "--base-port", "0", "--http-port", "0", "--cluster-port", "0")
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

	var st broker.ClusterView
	waitUntil(t, func() bool {
		st = jsonOf[broker.ClusterView](t, must(t, "cluster", "status", "--json", "--server", server))
		// Owned and on all three nodes: a queue created while the node
		// that created it saw fewer members gains its third replica as
		// soon as it sees the third.
		owned := 0
		for _, p := range st.Partitions {
			if p.Queue == "jobs" && p.Owner != "" && len(p.Replicas) == 3 && len(p.InSync) == 3 {
				owned++
			}
		}
		return owned == 8
	})
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
	if len(list.Queues) != 1 || list.Queues[0].Depth != 1 || len(list.NodesMissing) != 0 {
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
	out := must(t, "cluster", "status", "--server", server, "--token", cliToken)
	if !strings.Contains(out, "node-cli is a single node") || !strings.Contains(out, "jobs   7          node-cli  1") {
		t.Errorf("cluster status:\n%s", out)
	}
	fails(t, 2, "--nodes: want 1 to 9", "cluster", "dev", "--nodes", "12")
	fails(t, 2, "both take port", "cluster", "dev", "--base-port", "8990")
	fails(t, 2, "unexpected argument", "cluster", "dev", "now")
}
