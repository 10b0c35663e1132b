package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// BenchmarkRetainedPublish measures retained publishes in a cluster of
// three, each acknowledged once etcd recorded it (cluster/retained.go),
// against plain publishes without retain in the same run: 8 clients on
// node a, each publishing b.N QoS 1 messages, one at a time, to topics of
// its own. Run with
//
//	go test ./cluster -run '^$' -bench 'RetainedPublish$' -benchtime 500x
//
// It reports each kind's publishes per second and PUBACK p50 and p99, and
// the retained throughput as a ratio of the plain one.
func BenchmarkRetainedPublish(b *testing.B) {
	c := newCluster(b, infoLog)
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	const clients = 8
	cls := make([]*client, clients)
	for i := range cls {
		cls[i] = dial(b, c.nodes["a"].mqtt, fmt.Sprint("ret-", i), 32)
	}
	run := func(retain bool) (rate float64, p50, p99 time.Duration) {
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			lat []time.Duration
		)
		start := time.Now()
		for i, cl := range cls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := make([]time.Duration, 0, b.N)
				for j := range b.N {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					t0 := time.Now()
					_, err := cl.c.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("dev/%d/%d", i, j%100), QoS: 1, Retain: retain, Payload: []byte("state")})
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		slices.Sort(lat)
		if len(lat) == 0 {
			b.Fatal("nothing published")
		}
		return float64(len(lat)) / elapsed.Seconds(), lat[len(lat)/2], lat[len(lat)*99/100]
	}
	b.ResetTimer()
	plainRate, plainP50, plainP99 := run(false)
	rate, p50, p99 := run(true)
	b.StopTimer()
	b.ReportMetric(plainRate, "plain-publishes/s")
	b.ReportMetric(float64(plainP50.Microseconds())/1000, "plain-p50-ms")
	b.ReportMetric(float64(plainP99.Microseconds())/1000, "plain-p99-ms")
	b.ReportMetric(rate, "retained-publishes/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "retained-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "retained-p99-ms")
	b.ReportMetric(rate/plainRate, "retained/plain")
}
