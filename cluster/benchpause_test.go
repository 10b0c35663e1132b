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
//	go test ./cluster -run '^$' -bench FailoverPause -benchtime 5x -timeout 30m
//
// For every partition the victim led it takes the time from the pause to
// the PUBACK 0x00 of the first publish sent after it, and reports p50,
// p99 and max of those in seconds, and the publishes answered otherwise
// than 0x00 by the healthy nodes.
func BenchmarkFailoverPause(b *testing.B) {
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
					code, err := cl.publish("$queue/orders", keys[p], []byte(fmt.Sprintf("%d-%d-%d", i, p, j)))
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
		c.nodes[victim].signal(syscall.SIGSTOP)
		time.Sleep(12 * time.Second)
		c.nodes[victim].signal(syscall.SIGCONT)
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
		c.nodes[victim].waitReady(b, 30*time.Second)
		for _, id := range ids {
			untilInSync(b, c, "orders", id, 60*time.Second)
		}
	}
	b.StopTimer()
	slices.Sort(took)
	b.Logf("resumed after: %v; not 0x00: %s", took, strings.Join(refused, ", "))
	q := func(p float64) float64 { return took[int(float64(len(took)-1)*p)].Seconds() }
	b.ReportMetric(q(0.5), "resume-p50-s")
	b.ReportMetric(q(0.99), "resume-p99-s")
	b.ReportMetric(q(1), "resume-max-s")
	b.ReportMetric(float64(len(refused)), "kinds-not-0x00")
}
