package cluster_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// infoLog makes the nodes of a benchmark log at info, as by default: at
// debug mochi logs every publish to a $queue/ topic.
const infoLog = "--log-level=info"

// BenchmarkPublishLatency measures the PUBACK latency of QoS 1 publishes,
// one at a time, to a one-partition queue with replication factor 1:
// sent to the node that owns the partition, and to a node that forwards
// them to it. Run with
//
//	go test ./cluster -run '^$' -bench 'PublishLatency$' -benchtime 3000x
//
// It reports p50 and p99 of each and their ratios.
func BenchmarkPublishLatency(b *testing.B) {
	cfg := configFile(b, "queues:\n  declared:\n    lat:\n      partitions: 1\n      replication_factor: 1\n")
	c := newCluster(b, "--config", cfg, infoLog)
	c.start("a")
	c.start("b")
	publishLatency(b, c, "a", "b")
}

// BenchmarkPublishLatencyRF3 is BenchmarkPublishLatency with replication
// factor 3 and ack_policy quorum over three nodes: the owner is the raft
// leader of the partition, the forwarding node one of its followers. The
// first node creates the partition alone; it gains the others as replicas
// as they join, and the measurement starts once all three are in sync.
// Run with
//
//	go test ./cluster -run '^$' -bench 'PublishLatencyRF3$' -benchtime 3000x
func BenchmarkPublishLatencyRF3(b *testing.B) {
	cfg := configFile(b, "queues:\n  declared:\n    lat:\n      partitions: 1\n      replication_factor: 3\n      ack_policy: quorum\n")
	c := newCluster(b, "--config", cfg, infoLog)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	for _, id := range []string{"a", "b", "c"} {
		untilInSync(b, c, "lat", id, 30*time.Second)
	}
	publishLatency(b, c, "a", "b", "c")
}

// publishLatency measures b.N publishes to the owner of lat's partition
// and b.N through another node, twice, alternating.
func publishLatency(b *testing.B, c *testCluster, ids ...string) {
	// Settled: with replication factor 1 the partition moves to the node
	// that wins it once that node joins; with replicas, its leadership
	// moves to the preferred replica once its leader led leaderSettle
	// (3s): settled is the same owner for longer than that.
	owned := c.waitOwned("lat", 1, 10*time.Second, ids...)
	for deadline := time.Now().Add(40 * time.Second); ; {
		time.Sleep(4 * time.Second)
		now := c.waitOwned("lat", 1, 10*time.Second, ids...)
		if now[0].Owner == owned[0].Owner && now[0].Epoch == owned[0].Epoch {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("lat still moving after 40s: %v", now)
		}
		owned = now
	}
	owner := c.nodes[owned[0].Owner]
	var other *node
	for _, id := range ids {
		if id != owner.id {
			other = c.nodes[id]
			break
		}
	}
	po := dial(c.t, owner.mqtt, "to-owner", 64)
	pf := dial(c.t, other.mqtt, "to-other", 64)
	payload := make([]byte, 256)
	measure := func(cl *client) []time.Duration {
		lat := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if code, err := cl.publish("$queue/lat", "", payload); err != nil || code != 0 {
				b.Fatalf("publish: %#x %v", code, err)
			}
			lat = append(lat, time.Since(start))
		}
		return lat
	}
	// The first publishes of each client, not measured.
	for _, cl := range []*client{po, pf} {
		for i := 0; i < 10; i++ {
			if code, err := cl.publish("$queue/lat", "", payload); err != nil || code != 0 {
				b.Fatalf("publish: %#x %v", code, err)
			}
		}
	}
	// Alternate, so that both see the same machine.
	var own, fwd []time.Duration
	b.ResetTimer()
	for round := 0; round < 2; round++ {
		own = append(own, measure(po)...)
		fwd = append(fwd, measure(pf)...)
	}
	b.StopTimer()
	if o := c.owners("lat"); o[0].Owner != owner.id {
		b.Fatalf("lat moved from %s to %s during the measurement", owner.id, o[0].Owner)
	}
	slices.Sort(own)
	slices.Sort(fwd)
	q := func(l []time.Duration, p float64) float64 { return float64(l[int(float64(len(l)-1)*p)].Microseconds()) }
	b.ReportMetric(q(own, 0.5), "owner-p50-µs")
	b.ReportMetric(q(own, 0.99), "owner-p99-µs")
	b.ReportMetric(q(fwd, 0.5), "forwarded-p50-µs")
	b.ReportMetric(q(fwd, 0.99), "forwarded-p99-µs")
	b.ReportMetric(q(fwd, 0.5)/q(own, 0.5), "p50-ratio")
	b.ReportMetric(q(fwd, 0.99)/q(own, 0.99), "p99-ratio")
}

// BenchmarkFailover: three nodes, replication factor 3, ack_policy quorum
// (a cluster's defaults), three producers publishing one at a time to
// orders, each through the nodes in turn whenever its node goes. Each
// iteration kills the node leading the most partitions with SIGKILL and
// measures the time until every partition it led has another owner in
// etcd; then it restarts the node and waits until it is in sync again.
// At the end every acknowledged message must be consumed. Run with
//
//	go test ./cluster -run '^$' -bench Failover -benchtime 10x -timeout 30m
//
// It reports p50, p90 and max of the failover times in seconds and the
// acknowledged messages lost; any loss fails it.
func BenchmarkFailover(b *testing.B) {
	c := newCluster(b, infoLog)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		c.start(id)
	}
	stop := make(chan struct{})
	var ledgers []*ledger
	var dones []<-chan struct{}
	for i, id := range ids {
		order := []string{"a", "b", "c", "a", "b"}[i : i+3]
		l, done := c.produceAcross(order, id, 8, stop)
		ledgers = append(ledgers, l)
		dones = append(dones, done)
	}
	untilAcked(b, ledgers, 100, 20*time.Second)
	c.waitOwned("orders", 8, 15*time.Second, ids...)
	for _, id := range ids {
		untilInSync(b, c, "orders", id, 30*time.Second)
	}
	var took []time.Duration
	var kills []string
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		victim := c.mostOwned("orders")
		led := 0
		for _, o := range c.owners("orders") {
			if o.Owner == victim {
				led++
			}
		}
		killed := time.Now()
		c.nodes[victim].kill()
		d := c.waitFailover("orders", 8, victim, killed, 30*time.Second)
		took = append(took, d)
		kills = append(kills, fmt.Sprintf("%s (%d led) %s", victim, led, d.Round(time.Millisecond)))
		// The survivors take publishes.
		untilAcked(b, ledgers, total(ledgers)+100, 20*time.Second)
		c.start(victim)
		c.waitOwned("orders", 8, 15*time.Second, ids...)
		untilInSync(b, c, "orders", victim, 30*time.Second)
	}
	b.StopTimer()
	close(stop)
	for _, d := range dones {
		<-d
	}
	got := drainOrders(b, c, "g", ledgers...)
	lost := 0
	var codes []string
	for _, l := range ledgers {
		lost += l.lost(got)
		l.check(b, got)
		codes = append(codes, fmt.Sprintf("%v, %d errors", l.codes, l.errs))
	}
	// One line each: a benchmark's log is cut after 10 lines.
	b.Logf("kills: %s", strings.Join(kills, "; "))
	b.Logf("producers: %s", strings.Join(codes, "; "))
	slices.Sort(took)
	q := func(p float64) float64 { return took[int(float64(len(took)-1)*p)].Seconds() }
	b.ReportMetric(q(0.5), "failover-p50-s")
	b.ReportMetric(q(0.9), "failover-p90-s")
	b.ReportMetric(q(1), "failover-max-s")
	b.ReportMetric(float64(total(ledgers)), "acked")
	b.ReportMetric(float64(lost), "lost")
}

// untilAcked waits until the ledgers hold n acknowledged messages.
func untilAcked(tb testing.TB, ls []*ledger, n int, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for total(ls) < n {
		if time.Now().After(deadline) {
			codes := []map[byte]int{}
			for _, l := range ls {
				l.mu.Lock()
				codes = append(codes, maps.Clone(l.codes))
				l.mu.Unlock()
			}
			tb.Fatalf("only %d of %d publishes acknowledged within %s (codes %v)", total(ls), n, within, codes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// untilInSync waits until every partition's owner reports node in sync.
func untilInSync(tb testing.TB, c *testCluster, queue, node string, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !replicaInSync(c, queue, node) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s not in sync on every partition of %s within %s", node, queue, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replicaInSync asks each partition's owner whether node, where it is a
// replica, is among its in-sync replicas.
func replicaInSync(c *testCluster, queue, node string) bool {
	for _, o := range c.owners(queue) {
		owner := c.nodes[o.Owner]
		if owner == nil {
			return false
		}
		resp, err := http.Get("http://" + owner.http + "/api/v1/cluster")
		if err != nil {
			return false
		}
		var st struct {
			Partitions []struct {
				Queue    string   `json:"queue"`
				Owner    string   `json:"owner"`
				Replicas []string `json:"replicas"`
				InSync   []string `json:"in_sync"`
			} `json:"partitions"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return false
		}
		for _, p := range st.Partitions {
			if p.Queue == queue && p.Owner == o.Owner && slices.Contains(p.Replicas, node) && !slices.Contains(p.InSync, node) {
				return false
			}
		}
	}
	return true
}

// ackedBy returns the payloads the ledgers acknowledged.
func ackedBy(ls ...*ledger) map[string]bool {
	want := map[string]bool{}
	for _, l := range ls {
		l.mu.Lock()
		for p := range l.acked {
			want[p] = true
		}
		l.mu.Unlock()
	}
	return want
}

// drainOrders subscribes a consumer of group on every node and waits until
// every message the ledgers acknowledged arrived, for as long as messages
// keep arriving (30s without one ends the wait).
func drainOrders(tb testing.TB, c *testCluster, group string, ls ...*ledger) []arrival {
	tb.Helper()
	start := arrivals.len()
	for _, id := range slices.Sorted(maps.Keys(c.nodes)) {
		cl := dial(tb, c.nodes[id].mqtt, "drain-"+group+"-"+id, 1024)
		cl.subscribe("$share/" + group + "/$queue/orders")
	}
	want := ackedBy(ls...)
	seen, last := 0, time.Now()
	for len(want) > 0 && time.Since(last) < 30*time.Second {
		got := arrivals.since(start + seen)
		if len(got) > 0 {
			last = time.Now()
		}
		for _, a := range got {
			delete(want, string(a.p.Payload))
		}
		seen += len(got)
		time.Sleep(100 * time.Millisecond)
	}
	if len(want) > 0 {
		tb.Logf("%d acknowledged messages still missing 30s after the last arrival", len(want))
	}
	return arrivals.since(start)
}

// lost counts the messages the ledger acknowledged that are not in got.
func (l *ledger) lost(got []arrival) int {
	seen := map[string]bool{}
	for _, a := range got {
		seen[string(a.p.Payload)] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for p := range l.acked {
		if !seen[p] {
			n++
		}
	}
	return n
}
