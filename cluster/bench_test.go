package cluster_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkPublishLatency measures the PUBACK latency of QoS 1 publishes,
// one at a time, to a one-partition queue: sent to the node that owns the
// partition, and to a node that forwards them to it. Run with
//
//	go test ./cluster -run '^$' -bench PublishLatency -benchtime 3000x
//
// It reports p50 and p99 of each and their ratios.
func BenchmarkPublishLatency(b *testing.B) {
	cfg := filepath.Join(b.TempDir(), "shardq.yaml")
	if err := os.WriteFile(cfg, []byte("queues:\n  declared:\n    lat:\n      partitions: 1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	c := newCluster(b, "--config", cfg)
	c.start("a")
	c.start("b")
	owned := c.waitOwned("lat", 1, 10*time.Second, "a", "b")
	owner, other := c.nodes["a"], c.nodes["b"]
	if owned[0].Owner == "b" {
		owner, other = other, owner
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
		slices.Sort(lat)
		return lat
	}
	// Alternate, so that both see the same machine.
	var own, fwd []time.Duration
	b.ResetTimer()
	for round := 0; round < 2; round++ {
		own = append(own, measure(po)...)
		fwd = append(fwd, measure(pf)...)
	}
	b.StopTimer()
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
