package broker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/bench"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// BenchmarkMetricsOverhead measures what metrics cost the durable full
// cycle (BenchmarkCycle's load: QoS 1 publishes acknowledged after fsync,
// delivered to one consumer and PUBACKed; 4 producers with 64 in flight
// each, 64-byte payloads). Two brokers run side by side, one with metrics
// on and /metrics scraped every second (15 times Prometheus's default
// rate), one with http.metrics: false; rounds alternate between them, in
// both orders, and the medians are compared: on/off is the throughput
// ratio, overhead-% what metrics cost. Machines here are shared: only the
// ratio of one run means anything.
//
//	go test -run '^$' -bench BenchmarkMetricsOverhead -benchtime 3x ./broker/
func BenchmarkMetricsOverhead(b *testing.B) {
	setup := func(metrics bool) func(*config.Config) {
		return func(c *config.Config) {
			c.Admin.Metrics = metrics
			c.Queues.Defaults.Ordering = queue.OrderNone
			c.Queues.Defaults.Prefetch = 1024
		}
	}
	on := startBroker(b, b.TempDir(), setup(true))
	off := startBroker(b, b.TempDir(), setup(false))
	load := func(broker string) bench.Config {
		c := bench.DefaultConfig()
		c.Scenario, c.Broker = bench.ScenarioCycle, broker
		c.Producers, c.Consumers, c.Size, c.Window = 4, 1, 64, 64
		c.ReceiveMaximum = 1024
		c.Duration, c.Warmup, c.Drain = 4*time.Second, time.Second, 20*time.Second
		return c
	}
	runOn := func() float64 {
		stop := scrapeEvery(b, on, time.Second)
		defer stop()
		return *runLoad(b, load(on.MQTTAddr())).Throughput
	}
	runOff := func() float64 { return *runLoad(b, load(off.MQTTAddr())).Throughput }

	var with, without, ratios []float64
	for i := 0; i < b.N; i++ {
		var x, y float64
		if i%2 == 0 {
			x = runOn()
			y = runOff()
		} else {
			y = runOff()
			x = runOn()
		}
		with, without = append(with, x), append(without, y)
		ratios = append(ratios, x/y)
		b.Logf("round %d: metrics on %.0f msgs/s, off %.0f msgs/s, on/off %.3f", i+1, x, y, x/y)
	}
	b.ReportMetric(median(with), "msgs/s-on")
	b.ReportMetric(median(without), "msgs/s-off")
	b.ReportMetric(median(ratios), "on/off")
	b.ReportMetric(100*(1-median(ratios)), "overhead-%")
}

// scrapeEvery reads /metrics every interval until stop is called.
func scrapeEvery(tb testing.TB, b *testBroker, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := scrapeOnce(ctx, b); err != nil && ctx.Err() == nil {
				tb.Errorf("scrape: %v", err)
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

func scrapeOnce(ctx context.Context, b *testBroker) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+b.HTTPAddr()+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// BenchmarkMetricsScrape measures one scrape of a node with 100 queues of
// 8 partitions, each with a consumer group holding a lease and a backlog.
//
//	go test -run '^$' -bench BenchmarkMetricsScrape ./broker/
func BenchmarkMetricsScrape(b *testing.B) {
	sq := startBroker(b, b.TempDir(), nil)
	m := sq.Manager()
	ctx := context.Background()
	for i := range 100 {
		q, err := m.Open(ctx, fmt.Sprintf("q%03d", i))
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for k := range 32 {
			wg.Add(1)
			q.Publish(&queue.Message{Key: fmt.Sprint(k), Payload: []byte("x")}, func(error) { wg.Done() })
		}
		wg.Wait()
		if _, err := q.Subscribe("g", holder{}, queue.ConsumerOptions{Prefetch: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := scrapeOnce(ctx, sq); err != nil {
			b.Fatal(err)
		}
	}
}

// holder is a consumer that keeps what it is given.
type holder struct{}

func (holder) Deliver(queue.Delivery) {}
