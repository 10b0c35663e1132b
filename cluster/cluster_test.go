package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/internal/testcert"
)

// message is one published test message: key k, sequence number i.
func message(key string, i int) []byte { return []byte(fmt.Sprintf("%s:%d", key, i)) }

func parseMessage(t *testing.T, b []byte) (string, int) {
	t.Helper()
	key, n, ok := strings.Cut(string(b), ":")
	i, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Fatalf("unexpected payload %q", b)
	}
	return key, i
}

// TestQueueAcrossNodes: a producer on A, one group's consumers on B and C
// and a second group on C. Each group gets every message once, each key's
// messages in order.
func TestQueueAcrossNodes(t *testing.T) {
	c := newCluster(t)
	a, b, cc := c.start("a"), c.start("b"), c.start("c")
	start := arrivals.len()
	g1 := dial(t, b.mqtt, "g1-on-b", 32)
	g1.subscribe("$share/billing/$queue/orders")
	g2 := dial(t, cc.mqtt, "g1-on-c", 32)
	g2.subscribe("$share/billing/$queue/orders")
	h := dial(t, cc.mqtt, "audit-on-c", 32)
	h.subscribe("$share/audit/$queue/orders")
	// Spread over the nodes: each partition led by its preferred replica.
	c.waitPreferred("orders", 8, 20*time.Second, "a", "b", "c")

	prod := dial(t, a.mqtt, "producer-on-a", 32)
	const keys, per = 12, 25
	for i := 0; i < per; i++ {
		for k := 0; k < keys; k++ {
			key := "k" + strconv.Itoa(k)
			code, err := prod.publish("$queue/orders", key, message(key, i))
			if err != nil || code != 0 {
				t.Fatalf("publish %s %d: code %#x, %v", key, i, code, err)
			}
		}
	}
	waitCount(t, keys*per, 20*time.Second, g1, g2)
	waitCount(t, keys*per, 20*time.Second, h)

	for _, group := range []struct {
		name    string
		clients map[string]bool
	}{{"billing", map[string]bool{"g1-on-b": true, "g1-on-c": true}}, {"audit", map[string]bool{"audit-on-c": true}}} {
		seen := map[string]bool{}
		next := map[string]int{}
		by := map[string]int{}
		for _, a := range arrivals.since(start) {
			if !group.clients[a.client] {
				continue
			}
			key, i := parseMessage(t, a.p.Payload)
			id := string(a.p.Payload)
			if seen[id] {
				t.Errorf("group %s: %s delivered twice", group.name, id)
			}
			seen[id] = true
			if i != next[key] {
				t.Errorf("group %s: key %s got %d, expected %d (order per key)", group.name, key, i, next[key])
			}
			next[key] = i + 1
			by[a.client]++
		}
		if len(seen) != keys*per {
			t.Errorf("group %s: %d distinct messages, want %d", group.name, len(seen), keys*per)
		}
		if group.name == "billing" && (by["g1-on-b"] == 0 || by["g1-on-c"] == 0) {
			t.Errorf("group billing: deliveries by consumer %v: both nodes' consumers should take part", by)
		}
	}
}

// consumeAll subscribes a fresh consumer of group on n and waits until it
// received every message in want (payloads), then a quiet moment.
func consumeAll(t *testing.T, n *node, group string, ls ...*ledger) []arrival {
	t.Helper()
	start := arrivals.len()
	cl := dial(t, n.mqtt, "drain-"+group+"-"+n.id, 64)
	cl.subscribe("$share/" + group + "/$queue/orders")
	return awaitArrivals(t, start, ls...)
}

// awaitArrivals waits until every message the ledgers acknowledged
// arrived since start (an index of arrivals), for as long as messages
// keep arriving, and returns those arrivals.
func awaitArrivals(t *testing.T, start int, ls ...*ledger) []arrival {
	t.Helper()
	want := 0
	for _, l := range ls {
		want += l.ackedCount()
	}
	last, since := 0, time.Now()
	for {
		got := arrivals.since(start)
		if len(got) > last {
			last, since = len(got), time.Now()
		}
		have := map[string]bool{}
		for _, a := range got {
			have[string(a.p.Payload)] = true
		}
		missing := 0
		for _, l := range ls {
			l.mu.Lock()
			for p := range l.acked {
				if !have[p] {
					missing++
				}
			}
			l.mu.Unlock()
		}
		if missing == 0 || time.Since(since) > stallAfter {
			if missing > 0 {
				t.Logf("%d of %d acknowledged messages still missing, none arrived for %s", missing, want, stallAfter)
			}
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkOrder reports keys whose messages arrived out of order: a message
// delivered for the first time after a later one of its key. A message
// delivered again (its lease lost in a failover) may come after later
// ones that were delivered once already.
func checkOrder(t *testing.T, got []arrival) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, a := range got {
		if seen[string(a.p.Payload)] {
			continue
		}
		seen[string(a.p.Payload)] = true
		key, i := parseMessage(t, a.p.Payload)
		if prev, ok := last[key]; ok && i < prev {
			t.Errorf("key %s: %d arrived after %d (%s)", key, i, prev, history(t, got, key))
		}
		last[key] = max(last[key], i)
	}
}

// history lists the arrivals of key's messages: sequence number, msg-id
// and delivery count.
func history(t *testing.T, got []arrival, key string) string {
	var b strings.Builder
	for _, a := range got {
		k, i := parseMessage(t, a.p.Payload)
		if k != key {
			continue
		}
		fmt.Fprintf(&b, " %d[%s #%s]", i, userProp(a.p, "msg-id"), userProp(a.p, "delivery-count"))
	}
	return strings.TrimSpace(b.String())
}

func userProp(p *paho.Publish, name string) string {
	if p.Properties == nil {
		return ""
	}
	return p.Properties.User.Get(name)
}

// TestSIGTERMHandsOver: a node stopped with SIGTERM under load hands its
// partitions over and exits; no acknowledged message is lost and order
// per key holds.
func TestSIGTERMHandsOver(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, rf1))
	a := c.start("a")
	c.start("b")
	cc := c.start("c")
	prod := dial(t, a.mqtt, "producer", 64)
	if code, err := prod.publish("$queue/orders", "k0", message("warmup", 0)); err != nil || code != 0 {
		t.Fatalf("first publish: %#x %v", code, err)
	}
	owned := c.waitOwned("orders", 8, 10*time.Second, "a", "b", "c")
	onC := 0
	for _, o := range owned {
		if o.Owner == "c" {
			onC++
		}
	}
	stop := make(chan struct{})
	l, done := produce(prod, "$queue/orders", 16, stop)
	waitAcked(t, l, 300)
	cc.signal(syscall.SIGTERM)
	cc.waitExit(t, 30*time.Second)
	if cc.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("node c exited with %d:\n%s", cc.cmd.ProcessState.ExitCode(), cc.logTail())
	}
	n := l.ackedCount()
	waitAcked(t, l, n+200)
	close(stop)
	<-done
	for p, o := range c.owners("orders") {
		if o.Owner == "c" {
			t.Errorf("partition %d still owned by the stopped node", p)
		}
	}
	t.Logf("c owned %d partitions; %d acknowledged, codes %v", onC, l.ackedCount(), l.codes)
	got := consumeAll(t, a, "g", l)
	l.check(t, got)
	checkOrder(t, got)
}

// threeUnderLoad starts nodes a, b and c and a producer on a, and returns
// once it has 200 messages acknowledged.
func (c *testCluster) threeUnderLoad(stop <-chan struct{}) (*node, *ledger, <-chan struct{}) {
	t := c.t.(*testing.T)
	a := c.start("a")
	c.start("b")
	c.start("c")
	prod := dial(t, a.mqtt, "producer", 64)
	l, done := produce(prod, "$queue/orders", 16, stop)
	waitAcked(t, l, 200)
	return a, l, done
}

// waitAcked waits until the ledger holds n acknowledged messages.
func waitAcked(t *testing.T, l *ledger, n int) {
	t.Helper()
	waitProgress(t, l.ackedCount, n, func() string { return fmt.Sprintf("codes %v", l.codeCounts()) })
}

// stallAfter is how long a wait for acknowledgements goes without a new
// one before the test fails: the cluster stopped taking publishes. How
// fast they come is not a test's business.
const stallAfter = 15 * time.Second

// waitProgress waits until count() reaches n, failing when it does not
// grow for stallAfter.
func waitProgress(t *testing.T, count func() int, n int, detail func() string) {
	t.Helper()
	last, since := count(), time.Now()
	for last < n {
		time.Sleep(20 * time.Millisecond)
		if c := count(); c > last {
			last, since = c, time.Now()
		} else if time.Since(since) > stallAfter {
			dumpNodes(t)
			t.Fatalf("only %d of %d publishes acknowledged, none for %s (%s)", last, n, stallAfter, detail())
		}
	}
}

// TestJoinMovesOnlyItsShare: a fourth node takes over the partitions it
// wins and no other partition changes owner; the messages of the moved
// partitions are all consumed after the move.
func TestJoinMovesOnlyItsShare(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, rf1))
	stop := make(chan struct{})
	_, l, done := c.threeUnderLoad(stop)
	before := c.waitOwned("orders", 8, 10*time.Second, "a", "b", "c")
	d := c.start("d")
	// The partitions d wins move to it; wait until it owns some and every
	// move is over.
	deadline := time.Now().Add(20 * time.Second)
	var after map[int]ownership
	for {
		after = c.owners("orders")
		toD := 0
		for _, o := range after {
			if o.Owner == "d" {
				toD++
			}
		}
		if toD > 0 && d.metric(t, "shardq_cluster_partition_owned") == float64(toD) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node d serves no partition 20s after joining: %v", after)
		}
		time.Sleep(50 * time.Millisecond)
	}
	moved := 0
	for p, o := range after {
		if o.Owner != before[p].Owner {
			moved++
			if o.Owner != "d" {
				t.Errorf("partition %d moved from %s to %s: only moves to the new node are expected", p, before[p].Owner, o.Owner)
			}
			if o.Epoch <= before[p].Epoch {
				t.Errorf("partition %d moved with epoch %d, not above %d", p, o.Epoch, before[p].Epoch)
			}
		}
	}
	waitAcked(t, l, l.ackedCount()+100)
	close(stop)
	<-done
	t.Logf("%d of 8 partitions moved to d; codes %v", moved, l.codes)
	got := consumeAll(t, d, "g", l)
	l.check(t, got)
	checkOrder(t, got)
}

// metric returns the sum of a metric's series on the node's /metrics.
func (n *node) metric(t testing.TB, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.http + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// TestOwnerDownRF1: with replication factor 1, while a partition's owner
// is down its publishes are refused with 0x83, never acknowledged, and its
// messages come back with it.
func TestOwnerDownRF1(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, rf1))
	a := c.start("a")
	c.start("b")
	prod := dial(t, a.mqtt, "producer", 64)
	stop := make(chan struct{})
	l, done := produce(prod, "$queue/orders", 16, stop)
	waitAcked(t, l, 200)
	b := c.nodes["b"]
	b.kill()
	// Publishes to b's partitions fail while it is down; a's go on.
	n := l.ackedCount()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.mu.Lock()
		refused := l.codes[0x83]
		l.mu.Unlock()
		if refused >= 20 && l.ackedCount() > n+50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with b down: codes %v, %d acknowledged since", l.codes, l.ackedCount()-n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.start("b")
	// Back: its partitions serve again, under a higher epoch.
	waitAcked(t, l, l.ackedCount()+200)
	close(stop)
	<-done
	got := consumeAll(t, a, "g", l)
	l.check(t, got)
	checkOrder(t, got)
	t.Logf("codes %v", l.codes)
}

// TestDuplicateNodeID: a second node with a live node's id refuses to
// start and says why.
func TestDuplicateNodeID(t *testing.T) {
	c := newCluster(t)
	c.start("a")
	dup := &node{id: "a", dir: t.TempDir(), mqtt: freeAddr(t), http: freeAddr(t), grpc: freeAddr(t)}
	dup.launch(t, c, nil)
	dup.waitExit(t, 30*time.Second)
	if code := dup.cmd.ProcessState.ExitCode(); code == 0 {
		t.Fatalf("a second node with id a exited 0")
	}
	if !strings.Contains(dup.logTail(), "is held by a live node") {
		t.Errorf("no reason given:\n%s", dup.logTail())
	}
}

// TestRestartTakesIDOver: a node killed and started again on its data
// directory takes its id over from its earlier run at once, not after
// that run's lease lapsed.
func TestRestartTakesIDOver(t *testing.T) {
	c := newCluster(t)
	c.start("a").kill()
	c.start("a")
	if log := c.nodes["a"].logTail(); !strings.Contains(log, "took the node id over from an earlier run") {
		t.Fatalf("a waited for its earlier run's lease:\n%s", log)
	}
}

// TestEtcdUnreachable: a node whose etcd does not answer exits non-zero
// naming the endpoints it tried.
func TestEtcdUnreachable(t *testing.T) {
	bin := shardqBinary(t)
	dead := "http://" + freeAddr(t)
	cmd := exec.Command(bin, "serve", "--data-dir", t.TempDir(), "--mqtt", freeAddr(t), "--http", freeAddr(t), "--ws", "",
		"--node-id", "x", "--etcd", dead, "--cluster-addr", freeAddr(t))
	f, err := os.CreateTemp(t.TempDir(), "config-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "cluster:\n  etcd:\n    dial_timeout: 1s\n")
	f.Close()
	cmd.Args = append(cmd.Args, "--config", f.Name())
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("node started without etcd:\n%s", out)
	}
	if !strings.Contains(string(out), dead) {
		t.Errorf("the error does not name the endpoint %s:\n%s", dead, out)
	}
}

// TestPausedOwnerIsFenced: an owner paused (SIGSTOP) past its lease loses
// its membership; once resumed it refuses to commit under its old epoch,
// joins again by itself and serves its partitions under a higher epoch.
// No acknowledged message is lost, whichever node the producers used.
func TestPausedOwnerIsFenced(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, rf1+"cluster:\n  lease_ttl: 2s\n"))
	a := c.start("a")
	b := c.start("b")
	pa := dial(t, a.mqtt, "producer-a", 64)
	pb := dial(t, b.mqtt, "producer-b", 64)
	stop := make(chan struct{})
	la, doneA := produceKeys(pa, "$queue/orders", "a", 16, stop)
	lb, doneB := produceKeys(pb, "$queue/orders", "b", 16, stop)
	waitAcked(t, la, 100)
	waitAcked(t, lb, 100)
	before := c.waitOwned("orders", 8, 10*time.Second, "a", "b")
	b.signal(syscall.SIGSTOP)
	// Past the lease: etcd drops b from the membership.
	deadline := time.Now().Add(10 * time.Second)
	for c.member("b") {
		if time.Now().After(deadline) {
			t.Fatal("b still a member 10s after it was paused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	n := la.ackedCount()
	b.signal(syscall.SIGCONT)
	b.waitReady(t, 20*time.Second)
	waitAcked(t, la, n+100)
	waitAcked(t, lb, lb.ackedCount()+100)
	close(stop)
	<-doneA
	<-doneB
	for p, o := range c.owners("orders") {
		if o.Owner == "b" && o.Epoch <= before[p].Epoch {
			t.Errorf("partition %d served by b again under epoch %d, not above %d", p, o.Epoch, before[p].Epoch)
		}
	}
	got := consumeAll(t, a, "g", la, lb)
	la.check(t, got)
	lb.check(t, got)
	checkOrder(t, got)
	t.Logf("producer on a: %v; producer on b: %v", la.codes, lb.codes)
}

// member reports whether node id holds its membership key in etcd.
func (c *testCluster) member(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/shardq/nodes/"+id)
	if err != nil {
		c.t.Fatal(err)
	}
	return len(resp.Kvs) > 0
}

// TestConsumerNodeDies: the leases held by a consumer whose node is killed
// end at once: the other nodes' partitions deliver its messages to the
// group's consumer elsewhere long before ack_timeout.
func TestConsumerNodeDies(t *testing.T) {
	c := newCluster(t)
	first := arrivals.len() // arrivals of earlier tests are not this one's
	a := c.start("a")
	b := c.start("b")
	cc := c.start("c")
	prod := dial(t, a.mqtt, "producer", 64)
	const total = 64
	for i := 0; i < total; i++ {
		key := "k" + strconv.Itoa(i)
		if code, err := prod.publish("$queue/orders", key, message(key, 0)); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
	}
	owners := c.waitOwned("orders", 8, 10*time.Second, "a", "b", "c")
	// A consumer on c that takes messages and never settles them.
	holder := dialManual(t, cc.mqtt, "holder", 200)
	holder.subscribe("$share/g/$queue/orders")
	waitCount(t, total, 10*time.Second, holder)
	cc.kill()
	killed := time.Now()
	start := arrivals.len()
	other := dial(t, b.mqtt, "taker", 200)
	other.subscribe("$share/g/$queue/orders")
	want := 0
	for _, a := range arrivals.since(first) {
		if a.client == "holder" && owners[partitionOf(t, a.p)].Owner != "c" {
			want++
		}
	}
	if want == 0 {
		t.Fatal("the holder took no message of a or b's partitions")
	}
	deadline := killed.Add(10 * time.Second)
	for {
		got := 0
		for _, a := range arrivals.since(start) {
			if a.client == "taker" {
				got++
			}
		}
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d messages the dead node's consumer held came back within 10s (ack_timeout is 30s)", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d messages back %s after the kill", want, time.Since(killed).Round(time.Millisecond))
}

// partitionOf returns the partition of a delivery's msg-id.
func partitionOf(t *testing.T, p *paho.Publish) int {
	t.Helper()
	id := p.Properties.User.Get("msg-id")
	part, _, _ := strings.Cut(id, "-")
	n, err := strconv.Atoi(part)
	if err != nil {
		t.Fatalf("msg-id %q", id)
	}
	return n
}

// TestPlacement (one replica): placement rules set at runtime move the
// queues they pin to the nodes named, under load, nothing lost, order per
// key kept. A rule in a node's config naming a node that never joined
// refuses the start and names the rule.
func TestPlacement(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, rf1))
	stop := make(chan struct{})
	a, l, done := c.threeUnderLoad(stop)
	c.waitOwned("orders", 8, 10*time.Second, "a", "b", "c")

	c.admin("b", http.MethodPut, "/api/v1/cluster/placement", `{"rules":[{"queues":"ord*","nodes":["c"]}]}`)
	c.waitOwned("orders", 8, 30*time.Second, "c")
	waitAcked(t, l, l.ackedCount()+100)
	close(stop)
	<-done
	got := consumeAll(t, a, "g", l)
	l.check(t, got)
	checkOrder(t, got)

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("cluster:\n  placement:\n    - queues: \"x*\"\n      nodes: [c, zz]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &node{id: "d", dir: t.TempDir(), mqtt: freeAddr(t), http: freeAddr(t), grpc: freeAddr(t)}
	c.nodes["d"] = d
	d.launch(t, c, []string{"--config", bad})
	d.waitExit(t, 30*time.Second)
	if d.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(d.logTail(), "cluster.placement[0]") || !strings.Contains(d.logTail(), "zz") {
		t.Errorf("a rule naming an unknown node: exit %d\n%s", d.cmd.ProcessState.ExitCode(), d.logTail())
	}
}

// TestDeclareAcrossNodes: a queue declared through one node's admin API is
// the cluster's: its partitions get owners, and every node applies its
// settings; deleted through another node, it is gone from both.
func TestDeclareAcrossNodes(t *testing.T) {
	c := newCluster(t)
	a := c.start("a")
	b := c.start("b")
	req, _ := http.NewRequest(http.MethodPut, "http://"+a.http+"/api/v1/queues/decl", strings.NewReader(`{"partitions":3,"ack_timeout":"7s"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	c.waitOwned("decl", 3, 10*time.Second, "a", "b")
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + b.http + "/api/v1/queues/decl")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			var q struct {
				Settings struct {
					AckTimeout string `json:"ack_timeout"`
				} `json:"settings"`
			}
			if json.Unmarshal(body, &q) == nil && q.Settings.AckTimeout == "7s" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node b does not apply the declared settings: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Deleted through b, it is gone from a too, its declared settings
	// with it.
	if status, body := c.call("b", http.MethodDelete, "/api/v1/queues/decl", ""); status != http.StatusOK {
		t.Fatalf("queue delete in a cluster: %d %s", status, body)
	}
	if status, body := c.call("a", http.MethodGet, "/api/v1/queues/decl", ""); status != http.StatusNotFound {
		t.Errorf("GET through a after the delete: %d %s", status, body)
	}
}

// rf1 is the config of queues with one replica each.
const rf1 = "queues:\n  defaults:\n    replication_factor: 1\n"

// configFile writes a config file for the nodes of a test.
func configFile(t testing.TB, yaml string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "shardq.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPartitionCountDisagreement: a node whose config declares a queue
// with another partition count than the cluster's refuses to start and
// says so; the cluster's queue is left as it is.
func TestPartitionCountDisagreement(t *testing.T) {
	c := newCluster(t)
	c.start("a", "--config", configFile(t, "queues:\n  declared:\n    orders:\n      partitions: 8\n"))
	c.waitOwned("orders", 8, 10*time.Second, "a")
	b := &node{id: "b", dir: t.TempDir(), mqtt: freeAddr(t), http: freeAddr(t), grpc: freeAddr(t)}
	c.nodes["b"] = b
	b.launch(t, c, []string{"--config", configFile(t, "queues:\n  declared:\n    orders:\n      partitions: 4\n")})
	b.waitExit(t, 30*time.Second)
	if code := b.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(b.logTail(), "has 8 partitions in the cluster, this node's config says 4") {
		t.Errorf("exit %d:\n%s", code, b.logTail())
	}
	if got := len(c.owners("orders")); got != 8 {
		t.Errorf("the cluster's queue has %d partitions now", got)
	}
}

// TestClusterTLS: with cluster.tls the nodes talk over mutual TLS; a
// queue spans them as without it, and the cluster listener refuses a
// client without a certificate the CA signed.
func TestClusterTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, dir, "ca")
	cfg := func(name string) string {
		p := ca.Peer(t, dir, name)
		return configFile(t, fmt.Sprintf("cluster:\n  tls:\n    cert: %s\n    key: %s\n    ca: %s\n", p.CertFile, p.KeyFile, ca.CertFile))
	}
	c := newCluster(t)
	a := c.start("a", "--config", cfg("a"))
	b := c.start("b", "--config", cfg("b"))
	spans(t, a, b)

	// Without a certificate: refused.
	conn, err := grpc.NewClient(b.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pb.NewNodeClient(conn).Admin(ctx, &pb.AdminRequest{Method: "GET", Path: "/api/v1/queues"}); err == nil {
		t.Fatal("the cluster listener answered a client without TLS")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	tconn, err := grpc.NewClient(b.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer tconn.Close()
	if _, err := pb.NewNodeClient(tconn).Admin(ctx, &pb.AdminRequest{Method: "GET", Path: "/api/v1/queues"}); err == nil {
		t.Fatal("the cluster listener answered a client without a certificate")
	}
}

// spans publishes 40 messages of different keys on a and waits until a
// consumer on b got them all: the queue spans the two nodes.
func spans(t *testing.T, a, b *node) {
	t.Helper()
	cons := dial(t, b.mqtt, "consumer-on-b", 64)
	cons.subscribe("$share/g/$queue/orders")
	prod := dial(t, a.mqtt, "producer-on-a", 64)
	for i := 0; i < 40; i++ {
		key := "k" + strconv.Itoa(i)
		if code, err := prod.publish("$queue/orders", key, message(key, 0)); err != nil || code != 0 {
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
	}
	waitCount(t, 40, 20*time.Second, cons)
}

// TestClusterToken: with cluster.token every call between nodes carries
// it: a queue spans the nodes as without it, a call without it is
// refused, and the Admin call also needs the node's admin token.
func TestClusterToken(t *testing.T) {
	c := newCluster(t, "--cluster-token", "s3cret", "--admin-token", "adm1n")
	a, b := c.start("a"), c.start("b")
	spans(t, a, b)

	conn, err := grpc.NewClient(b.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := func(md ...string) codes.Code {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
		_, err := pb.NewNodeClient(conn).Admin(ctx, &pb.AdminRequest{Method: "GET", Path: "/api/v1/queues"})
		return status.Code(err)
	}
	if got := admin(); got != codes.Unauthenticated {
		t.Errorf("Admin without any token: %v, want Unauthenticated", got)
	}
	if got := admin("shardq-cluster-token", "wrong", "shardq-admin-token", "adm1n"); got != codes.Unauthenticated {
		t.Errorf("Admin with a wrong cluster token: %v, want Unauthenticated", got)
	}
	if got := admin("shardq-cluster-token", "s3cret"); got != codes.PermissionDenied {
		t.Errorf("Admin without the admin token: %v, want PermissionDenied", got)
	}
	if got := admin("shardq-cluster-token", "s3cret", "shardq-admin-token", "adm1n"); got != codes.OK {
		t.Errorf("Admin with both tokens: %v, want OK", got)
	}
}

// TestPlainMQTTAcrossNodes: ordinary MQTT between real processes: a
// publish on a reaches subscribers on b and c, a retained message
// published on a is seen by a new subscriber on c, and a client ID that
// connects on b takes its session over from a, keeping its subscription.
func TestPlainMQTTAcrossNodes(t *testing.T) {
	c := newCluster(t)
	a, b, cc := c.start("a"), c.start("b"), c.start("c")
	onB := dial(t, b.mqtt, "sub-b", 32)
	onB.subscribe("plain/#")
	onC := dial(t, cc.mqtt, "sub-c", 32)
	onC.subscribe("plain/#")
	pub := dial(t, a.mqtt, "pub-a", 32)
	// Interest reaches a through etcd: publish until both have one.
	deadline := time.Now().Add(15 * time.Second)
	for len(onB.received()) == 0 || len(onC.received()) == 0 {
		if code, err := pub.publish("plain/x", "", []byte("hello")); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("plain publish on a: b got %d, c got %d", len(onB.received()), len(onC.received()))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Retained: published on a, seen by a subscriber arriving on c.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pub.c.Publish(ctx, &paho.Publish{Topic: "kept/1", QoS: 1, Retain: true, Payload: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	for {
		late := dial(t, cc.mqtt, "late-"+strconv.FormatInt(time.Now().UnixNano(), 36), 32)
		late.subscribe("kept/#")
		time.Sleep(200 * time.Millisecond)
		if got := late.received(); len(got) == 1 && string(got[0].Payload) == "r" && got[0].Retain {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retained message on c: %v", late.received())
		}
	}

	// Session takeover: "mover" subscribes on a without clean start, then
	// connects on b; a drops it, b keeps its subscription.
	first := dialSession(t, a.mqtt, "mover", false)
	first.subscribe("moved/#")
	second := dialSession(t, b.mqtt, "mover", false)
	select {
	case <-first.c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection on a still open after the client ID connected on b")
	}
	for len(second.received()) == 0 {
		if code, err := pub.publish("moved/1", "", []byte("m")); err != nil || code != 0 {
			t.Fatalf("publish: %#x %v", code, err)
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("the session moved to b lost its subscription")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLargeMessagesMove: a partition of large messages, more of them than
// a peer takes in one gRPC message (64 MiB), moves whole to another node
// when its owner stops with SIGTERM: its copy goes in chunks bounded in
// bytes, not only in messages.
func TestLargeMessagesMove(t *testing.T) {
	const n, size = 72, 1<<20 - 1024 // under storage.max_payload (1 MiB)
	c := newCluster(t, "--config", configFile(t, "queues:\n  declared:\n    big:\n      partitions: 1\n      replication_factor: 1\n"))
	nodes := map[string]*node{"a": c.start("a"), "b": c.start("b")}
	prod := dial(t, nodes["a"].mqtt, "producer", 64)
	l := &ledger{acked: map[string]bool{}, codes: map[byte]int{}}
	for i := range n {
		p := append(message("big", i), bytes.Repeat([]byte{'x'}, size)...)
		code, err := prod.publish("$queue/big", "k", p)
		l.record(p, code, err)
		if err != nil || code != 0 {
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
	}
	owner := c.waitOwned("big", 1, 10*time.Second, "a", "b")[0].Owner
	survivor := nodes["a"]
	if owner == "a" {
		survivor = nodes["b"]
	}
	nodes[owner].signal(syscall.SIGTERM)
	nodes[owner].waitExit(t, 60*time.Second)
	if o := c.owners("big")[0]; o.Owner != survivor.id {
		t.Fatalf("partition owned by %q after its owner %s stopped, want %s:\n%s", o.Owner, owner, survivor.id, nodes[owner].logTail())
	}
	start := arrivals.len()
	cl := dial(t, survivor.mqtt, "drain", 64)
	cl.subscribe("$share/g/$queue/big")
	got := awaitArrivals(t, start, l)
	seen := map[string]bool{}
	for _, a := range got {
		seen[string(a.p.Payload)] = true
	}
	lost := 0
	for p := range l.acked {
		if !seen[p] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged messages of %d bytes not consumed after the move", lost, n, len(message("big", 0))+size)
	}
}
