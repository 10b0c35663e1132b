package broker_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/shardq/shardq/bench"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// startMochi runs a vanilla mochi broker (no queue hooks) on loopback: the
// reference every shardq figure is quoted against.
func startMochi(tb testing.TB) string {
	tb.Helper()
	s := mqtt.New(&mqtt.Options{InlineClient: false})
	s.Options.Capabilities.Compatibilities.NoInheritedPropertiesOnAck = true
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.AddListener(listeners.NewNet("ref", ln)); err != nil {
		tb.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		// mochi's Close can deadlock against a client leaving at the same
		// moment (see docs/DESIGN.md): give it a few seconds.
		done := make(chan struct{})
		go func() { _ = s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
		}
	})
	return ln.Addr().String()
}

func runLoad(b *testing.B, cfg bench.Config) *bench.Result {
	b.Helper()
	res, err := bench.Run(context.Background(), cfg)
	if err != nil {
		b.Fatalf("%s against %s: %v", cfg.Scenario, cfg.Broker, err)
	}
	if !res.Valid || res.Missing > 0 || res.Throughput == nil {
		b.Fatalf("%s against %s: %s (missing %d)", cfg.Scenario, cfg.Broker, res.Status, res.Missing)
	}
	return res
}

// BenchmarkCycle measures the durable full cycle through the broker: QoS 1
// publishes acknowledged after fsync, delivered to one consumer and
// PUBACKed by it; 4 producers with 64 publishes in flight each, 64-byte
// payloads. Rounds alternate with vanilla mochi's plain QoS 1 pub/sub under
// the same client load, and the median ratio is reported as x-mochi
// (machines here are shared: only ratios measured in one run mean
// anything). p99-puback-ms@half is the publish-to-PUBACK p99 at half of the
// measured throughput. Every message is checked for loss and duplicates.
//
//	go test -run '^$' -bench BenchmarkCycle -benchtime 3x ./broker/
func BenchmarkCycle(b *testing.B) {
	ref := startMochi(b)
	load := cycleLoad
	for _, ordering := range []queue.Ordering{queue.OrderNone, queue.OrderKey} {
		b.Run(fmt.Sprintf("ordering=%s,keys=64,shards=2", ordering), func(b *testing.B) {
			sq := startBroker(b, b.TempDir(), func(c *config.Config) {
				c.Queues.Defaults.Ordering = ordering
				c.Queues.Defaults.Prefetch = 1024
			})
			var ratios, ours, theirs []float64
			var last *bench.Result
			for i := 0; i < b.N; i++ {
				m := runLoad(b, load(bench.ScenarioPubSub, ref))
				cfg := load(bench.ScenarioCycle, sq.MQTTAddr())
				cfg.ReceiveMaximum = 1024
				last = runLoad(b, cfg)
				ours, theirs = append(ours, *last.Throughput), append(theirs, *m.Throughput)
				ratios = append(ratios, *last.Throughput / *m.Throughput)
			}
			half := load(bench.ScenarioCycle, sq.MQTTAddr())
			half.ReceiveMaximum = 1024
			half.Rate = median(ours) / 2
			h := runLoad(b, half)
			b.ReportMetric(median(ours), "msgs/s")
			b.ReportMetric(median(theirs), "mochi-msgs/s")
			b.ReportMetric(median(ratios), "x-mochi")
			b.ReportMetric(last.E2EP99Ms, "p99-e2e-ms")
			b.ReportMetric(h.PubAckP99Ms, "p99-puback-ms@half")
		})
	}
}

// BenchmarkCycleShards runs the durable cycle (ordering none) with 1, 2, 4
// and 8 storage shards, each round beside vanilla mochi, to choose the
// default shard count.
//
//	go test -run '^$' -bench BenchmarkCycleShards -benchtime 3x ./broker/
func BenchmarkCycleShards(b *testing.B) {
	ref := startMochi(b)
	for _, shards := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			sq := startBroker(b, b.TempDir(), func(c *config.Config) {
				c.Storage.Shards = shards
				c.Queues.Defaults.Ordering = queue.OrderNone
				c.Queues.Defaults.Prefetch = 1024
			})
			var ratios, ours []float64
			for i := 0; i < b.N; i++ {
				m := runLoad(b, cycleLoad(bench.ScenarioPubSub, ref))
				cfg := cycleLoad(bench.ScenarioCycle, sq.MQTTAddr())
				cfg.ReceiveMaximum = 1024
				r := runLoad(b, cfg)
				ours = append(ours, *r.Throughput)
				ratios = append(ratios, *r.Throughput / *m.Throughput)
			}
			b.ReportMetric(median(ours), "msgs/s")
			b.ReportMetric(median(ratios), "x-mochi")
		})
	}
}

// cycleLoad is the client load of the full-cycle benchmarks.
func cycleLoad(scenario bench.Scenario, broker string) bench.Config {
	c := bench.DefaultConfig()
	c.Scenario, c.Broker = scenario, broker
	c.Producers, c.Consumers, c.Size, c.Window = 4, 1, 64, 64
	c.Duration, c.Warmup, c.Drain = 4*time.Second, time.Second, 20*time.Second
	return c
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
