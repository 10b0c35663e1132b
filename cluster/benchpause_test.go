package cluster_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// BenchmarkFailoverPause measures how long the partitions of a paused
// leader take writes again through the other nodes: each iteration stops
// the node leading the most partitions with SIGSTOP for 12 s, with one
// producer per partition connected to the other nodes only (one publish
// in flight each, so that a stalled partition does not hold the others'
// PUBACKs back). Run with
//
//	go test ./cluster -run '^$' -bench FailoverPause -benchtime 20x -timeout 30m
//
// For every partition the victim led it takes the time from the pause to
// the PUBACK 0x00 of the first publish sent after it, and reports p50,
// p99 and max of those in seconds, and the publishes answered otherwise
// than 0x00 by the healthy nodes. At the end a group reads the queue:
// every publish acknowledged must be there once (lost and stored-twice
// are reported, and fail it).
func BenchmarkFailoverPause(b *testing.B) { failoverWrites(b, false) }

// BenchmarkFailoverKill is BenchmarkFailoverPause with SIGKILL: the
// victim is started again once its partitions took writes, and in sync
// before the next iteration. Run with
//
//	go test ./cluster -run '^$' -bench FailoverKill -benchtime 20x -timeout 30m
func BenchmarkFailoverKill(b *testing.B) { failoverWrites(b, true) }

func failoverWrites(b *testing.B, kill bool) {
	c := newCluster(b, infoLog)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		c.start(id)
	}
	// A key of each partition.
	keys := make([]string, 8)
	for i, found := 0, 0; found < 8; i++ {
		k := "k" + strconv.Itoa(i)
		if p := queue.PartitionFor(k, 8); keys[p] == "" {
			keys[p] = k
			found++
		}
	}
	warm := dial(b, c.nodes["a"].mqtt, "warm", 64)
	for _, k := range keys {
		if code, err := warm.publish("$queue/orders", k, []byte("warm")); err != nil || code != 0 {
			b.Fatalf("publish: %#x %v", code, err)
		}
	}
	c.waitOwned("orders", 8, 15*time.Second, ids...)
	for _, id := range ids {
		untilInSync(b, c, "orders", id, 30*time.Second)
	}
	var took []time.Duration
	var refused []string
	var ackedMu sync.Mutex
	acked := map[string]bool{} // payloads answered 0x00
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		victim := c.mostOwned("orders")
		var led []int
		for p, o := range c.owners("orders") {
			if o.Owner == victim {
				led = append(led, p)
			}
		}
		var others []string
		for _, id := range ids {
			if id != victim {
				others = append(others, id)
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var paused time.Time
		resumed := map[int]time.Duration{}
		codes := map[string]int{}
		for _, p := range led {
			cl := dial(b, c.nodes[others[p%len(others)]].mqtt, fmt.Sprintf("pause-%d-%d", i, p), 64)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; ; j++ {
					select {
					case <-stop:
						return
					default:
					}
					sent := time.Now()
					payload := fmt.Sprintf("%d-%d-%d", i, p, j)
					code, err := cl.publish("$queue/orders", keys[p], []byte(payload))
					if err == nil && code == 0 {
						ackedMu.Lock()
						acked[payload] = true
						ackedMu.Unlock()
					}
					mu.Lock()
					if !paused.IsZero() && sent.After(paused) {
						if err == nil && code == 0 {
							if _, ok := resumed[p]; !ok {
								resumed[p] = time.Since(paused)
							}
						} else {
							codes[fmt.Sprintf("%#x %v", code, err)]++
						}
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Second)
		mu.Lock()
		paused = time.Now()
		mu.Unlock()
		if kill {
			c.nodes[victim].kill()
		} else {
			c.nodes[victim].signal(syscall.SIGSTOP)
			time.Sleep(12 * time.Second)
			c.nodes[victim].signal(syscall.SIGCONT)
		}
		// Until every partition the victim led took a publish again.
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			n := len(resumed)
			mu.Unlock()
			if n == len(led) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		for _, p := range led {
			d, ok := resumed[p]
			if !ok {
				b.Fatalf("partition %d took no publish within 60 s after its leader %s resumed", p, victim)
			}
			took = append(took, d)
		}
		for k, n := range codes {
			refused = append(refused, fmt.Sprintf("%s x%d", k, n))
		}
		if kill {
			c.start(victim)
		} else {
			c.nodes[victim].waitReady(b, 30*time.Second)
		}
		for _, id := range ids {
			untilInSync(b, c, "orders", id, 60*time.Second)
		}
	}
	b.StopTimer()
	lost, twice := readBack(b, c, acked)
	slices.Sort(took)
	b.Logf("resumed after: %v; not 0x00: %s", took, strings.Join(refused, ", "))
	q := func(p float64) float64 { return took[int(float64(len(took)-1)*p)].Seconds() }
	b.ReportMetric(q(0.5), "resume-p50-s")
	b.ReportMetric(q(0.99), "resume-p99-s")
	b.ReportMetric(q(1), "resume-max-s")
	b.ReportMetric(float64(len(refused)), "kinds-not-0x00")
	b.ReportMetric(float64(lost), "lost")
	b.ReportMetric(float64(twice), "stored-twice")
	if lost+twice > 0 {
		b.Errorf("%d acknowledged publishes lost, %d stored twice", lost, twice)
	}
}

// readBack reads every message of orders with a new group and returns how
// many of the acknowledged payloads are missing and how many payloads are
// stored at more than one offset.
func readBack(b *testing.B, c *testCluster, acked map[string]bool) (lost, twice int) {
	b.Helper()
	var node string
	for id := range c.nodes {
		node = id
		break
	}
	cons := dial(b, c.nodes[node].mqtt, "read-back", 256)
	cons.subscribe("$share/readback/$queue/orders")
	// Until every acknowledged payload came and nothing more for a second
	// (a copy stored twice comes with the rest), or nothing came for 15 s.
	last, seen := time.Now(), 0
	for {
		got := cons.received()
		if len(got) > seen {
			seen, last = len(got), time.Now()
		}
		if len(got) >= len(acked) && time.Since(last) > time.Second || time.Since(last) > stallAfter {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ids := map[string]map[string]bool{} // payload -> msg-ids
	for _, p := range cons.received() {
		id := ""
		if p.Properties != nil {
			id = p.Properties.User.Get("msg-id")
		}
		if ids[string(p.Payload)] == nil {
			ids[string(p.Payload)] = map[string]bool{}
		}
		ids[string(p.Payload)][id] = true
	}
	for payload := range acked {
		if ids[payload] == nil {
			lost++
		}
	}
	for payload, m := range ids {
		if len(m) > 1 && payload != "warm" {
			twice++
		}
	}
	return lost, twice
}
