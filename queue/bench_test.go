package queue_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

// BenchmarkQueueCommit measures the commit path: concurrent publishers
// appending to one queue through the shard committers onto Badger with an
// fsync per batch, each waiting for its message to be durable before
// publishing the next (as a producer's window does). It reports msgs/s,
// the p99 of publish-to-durable, and the mean commit batch size.
//
//	go test -run '^$' -bench BenchmarkQueueCommit -benchtime 100000x ./queue/
func BenchmarkQueueCommit(b *testing.B) {
	for _, shards := range []int{1, 2, 4} {
		for _, publishers := range []int{64, 256} {
			b.Run(fmt.Sprintf("shards=%d,publishers=%d,size=64B", shards, publishers), func(b *testing.B) {
				o := badger.DefaultOptions()
				o.Shards = shards
				store, err := badger.Open(b.TempDir(), o)
				if err != nil {
					b.Fatal(err)
				}
				defer store.Close()
				var mu sync.Mutex
				var batches, writes int
				m := newManager(b, store, func(mo *queue.ManagerOptions) {
					mo.Defaults.Ordering = queue.OrderNone
					mo.OnCommit = func(s queue.CommitStats) {
						mu.Lock()
						batches++
						writes += s.Requests
						mu.Unlock()
					}
				})
				q, err := m.Open(context.Background(), "bench")
				if err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 64)
				lat := make([][]time.Duration, publishers)
				b.SetBytes(64)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for p := 0; p < publishers; p++ {
					wg.Add(1)
					go func(p int) {
						defer wg.Done()
						done := make(chan error, 1)
						for i := p; i < b.N; i += publishers {
							t0 := time.Now()
							q.Publish(&queue.Message{Key: fmt.Sprint(i), Payload: payload}, func(err error) { done <- err })
							if err := <-done; err != nil {
								b.Error(err)
								return
							}
							lat[p] = append(lat[p], time.Since(t0))
						}
					}(p)
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				all := slices.Concat(lat...)
				if len(all) != b.N {
					b.Fatalf("%d of %d publishes completed", len(all), b.N)
				}
				slices.Sort(all)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-us")
				mu.Lock()
				b.ReportMetric(float64(writes)/float64(max(batches, 1)), "msgs/batch")
				mu.Unlock()
			})
		}
	}
}
