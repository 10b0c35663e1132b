package cluster_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// TestEtcdOutage (SPEC 7: etcd is not the data path): etcd is paused for
// 20 s, four lease TTLs, under a load through every node. The replicated
// queue goes on acknowledging with 0x00, and delivering, for the whole
// outage; a queue of one replica answers 0x83 once the lease lapsed, as
// it must (only the lease fences it). A client connecting in the outage
// is taken and publishes. Nothing acknowledged is lost. The
// cluster in network namespaces, etcd in its own.
func TestEtcdOutage(t *testing.T) {
	cfg := configFile(t, "queues:\n  declared:\n    solo:\n      partitions: 1\n      replication_factor: 1\n")
	c, etcd := newNetCluster(t, []string{"a", "b", "c"}, "--config", cfg)
	prod := c.startThree()
	if code, err := prod.publish("$queue/solo", "k", []byte("solo-first")); err != nil || code != 0 {
		t.Fatalf("publish to solo: %#x %v", code, err)
	}
	stop := make(chan struct{})
	var ledgers []*ledger
	var dones []<-chan struct{}
	for _, id := range []string{"a", "b", "c"} {
		l, done := c.produceAcross([]string{id}, "p"+id+"-", 8, stop)
		ledgers = append(ledgers, l)
		dones = append(dones, done)
	}
	acked := func() int {
		n := 0
		for _, l := range ledgers {
			n += l.ackedCount()
		}
		return n
	}
	for _, l := range ledgers {
		waitAcked(t, l, 100)
	}
	// The consumer reads through b all along.
	start := arrivals.len()
	live := dial(t, c.nodes["b"].mqtt, "consumer", 64)
	live.subscribe("$share/g/$queue/orders")

	etcd.signal(syscall.SIGSTOP)
	paused := time.Now()
	// Past the lease (5 s) and its margin: every node lost it by now.
	time.Sleep(8 * time.Second)
	ackedAt, deliveredAt := acked(), arrivals.len()
	// A client connecting now is taken, its client ID recorded once etcd
	// is back.
	late := dial(t, c.nodes["c"].mqtt, "late-producer", 16)
	lateLedger := &ledger{acked: map[string]bool{}, codes: map[byte]int{}}
	for i := range 20 {
		payload := message("late", i)
		code, err := late.publish("$queue/orders", "late", payload)
		lateLedger.record(payload, code, err)
	}
	if codes := lateLedger.codeCounts(); codes[0] != 20 {
		t.Errorf("a client connected during the outage: publishes answered %v, want 0x00 each", codes)
	}
	if code, err := prod.publish("$queue/solo", "k", []byte("solo-during")); err != nil || code != 0x83 {
		t.Errorf("publish to a queue of one replica with etcd paused for %s: %#x %v, want 0x83", time.Since(paused).Round(time.Second), code, err)
	}
	time.Sleep(20*time.Second - time.Since(paused))
	during, deliveredDuring := acked()-ackedAt, arrivals.len()-deliveredAt
	etcd.signal(syscall.SIGCONT)
	resumed := time.Now()
	t.Logf("etcd paused 20 s: from 8 s to 20 s, %d publishes acknowledged and %d delivered", during, deliveredDuring)
	if during < 100 {
		t.Errorf("only %d publishes acknowledged from 8 s to 20 s into the etcd outage", during)
	}
	if deliveredDuring < 100 {
		t.Errorf("only %d messages delivered from 8 s to 20 s into the etcd outage", deliveredDuring)
	}
	for _, l := range ledgers {
		if codes := l.codeCounts(); len(codes) > 1 || l.errs > 0 {
			t.Errorf("publishes to the replicated queue answered %v, %d without an answer: want 0x00 only", codes, l.errs)
		}
	}
	// The cluster's records catch up: every node a member again, each
	// partition owned.
	for _, id := range []string{"a", "b", "c"} {
		waitFor(t, "node "+id+" a member again", 30*time.Second, func() bool { return c.member(id) })
	}
	t.Logf("every node a member again %s after etcd resumed", time.Since(resumed).Round(100*time.Millisecond))
	for _, l := range ledgers {
		waitAcked(t, l, l.ackedCount()+100)
	}
	close(stop)
	for _, d := range dones {
		<-d
	}
	all := append(ledgers, lateLedger)
	got := awaitArrivals(t, start, all...)
	for _, l := range all {
		l.check(t, got)
	}
	checkOrder(t, got)
	// Each node lost its lease once, in the outage; the lease it took
	// after it, granted late by the etcd coming back, was not taken for
	// spent.
	for _, id := range []string{"a", "b", "c"} {
		if lost := c.nodes[id].metric(t, "shardq_cluster_leases_lost_total"); lost != 1 {
			t.Errorf("node %s lost its lease %v times, want once", id, lost)
		}
	}
}

// TestLeaderDiesInEtcdOutage: with etcd paused, the leader of a partition
// is killed. Another replica wins its raft leadership and serves it
// without recording itself in etcd (raft fences it); publishes through
// the other nodes, routed to the leader their replicas know, are
// acknowledged again while etcd is still paused, and nothing acknowledged
// is lost once etcd is back.
func TestLeaderDiesInEtcdOutage(t *testing.T) {
	c, etcd := newNetCluster(t, []string{"a", "b", "c"})
	c.startThree()
	for _, id := range []string{"a", "b", "c"} {
		untilInSync(t, c, "orders", id, 30*time.Second)
	}
	victim := c.owners("orders")[0].Owner
	var others []string
	for _, id := range []string{"a", "b", "c"} {
		if id != victim {
			others = append(others, id)
		}
	}
	// A key of partition 0.
	prefix := ""
	for i := 0; prefix == ""; i++ {
		if p := fmt.Sprintf("x%d-", i); queue.PartitionFor(p+"0", 8) == 0 {
			prefix = p
		}
	}
	start := arrivals.len()
	cons := dial(t, c.nodes[others[0]].mqtt, "consumer", 64)
	cons.subscribe("$share/g/$queue/orders")
	stop := make(chan struct{})
	var ledgers []*ledger
	var dones []<-chan struct{}
	for i, id := range others {
		l, done := produceKeys(dial(t, c.nodes[id].mqtt, fmt.Sprint("producer-", i), 16), "$queue/orders", prefix+fmt.Sprint(i), 1, stop)
		ledgers, dones = append(ledgers, l), append(dones, done)
		waitAcked(t, l, 20)
	}

	etcd.signal(syscall.SIGSTOP)
	c.nodes[victim].kill()
	killed := time.Now()
	for _, l := range ledgers {
		waitAcked(t, l, l.ackedCount()+20)
	}
	t.Logf("partition 0 took publishes again %s after its leader %s was killed, etcd paused", time.Since(killed).Round(100*time.Millisecond), victim)
	etcd.signal(syscall.SIGCONT)
	for _, l := range ledgers {
		waitAcked(t, l, l.ackedCount()+20)
	}
	close(stop)
	for _, d := range dones {
		<-d
	}
	got := awaitArrivals(t, start, ledgers...)
	for _, l := range ledgers {
		l.check(t, got)
	}
}
