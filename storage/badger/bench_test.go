package badger

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// BenchmarkShardWrite measures Write of one batch of appends with sync set
// on one shard: every Write commits one transaction and one fsync. Each
// iteration is one Write; msgs/s counts messages, p99-us the slowest
// percent of Writes, cpu-ns/msg the CPU time of the whole process
// (Badger's goroutines included) per message: the figure fsync latency
// does not hide.
func BenchmarkShardWrite(b *testing.B) {
	for _, batch := range []int{1, 64, 1024} {
		for _, size := range []int{64, 256} {
			b.Run(fmt.Sprintf("batch=%d,size=%dB", batch, size), func(b *testing.B) {
				benchShardWrite(b, batch, size)
			})
		}
	}
}

func benchShardWrite(b *testing.B, batch, size int) {
	o := testOptions(1)
	o.MemTableSize = DefaultOptions().MemTableSize
	st, err := Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	sh := st.Shard(0)

	rng := rand.New(rand.NewPCG(1, 2))
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	msgs := make([]queue.Message, batch)
	bt := &queue.Batch{Appends: make([]queue.Append, batch)}
	for i := range msgs {
		msgs[i] = queue.Message{Key: fmt.Sprintf("key-%d", i%16), EnqueuedAt: time.Now(), Payload: payload}
		bt.Appends[i] = queue.Append{Queue: "bench", Partition: 0, Message: &msgs[i]}
	}

	var next uint64
	var lat []time.Duration
	b.ReportAllocs()
	b.SetBytes(int64(batch * size))
	cpu := processCPU()
	for b.Loop() {
		for i := range msgs {
			msgs[i].Offset = next
			next++
		}
		start := time.Now()
		if err := sh.Write(bt, true); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(next), "cpu-ns/msg")
	b.ReportMetric(float64(next)/b.Elapsed().Seconds(), "msgs/s")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")

	if first, n, err := sh.Bounds("bench", 0); err != nil || first != 0 || n != next {
		b.Fatalf("Bounds = (%d, %d), %v after writing %d messages", first, n, err, next)
	}
}

// BenchmarkStoreWrite writes batches of 64 256-byte messages to every shard
// at once, one writer per shard as the queue's committers do, to compare
// shard counts. Each iteration is one Write on every shard; the metrics
// are BenchmarkShardWrite's.
func BenchmarkStoreWrite(b *testing.B) {
	for _, shards := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("shards=%d,batch=64,size=256B", shards), func(b *testing.B) {
			benchStoreWrite(b, shards, 64, 256)
		})
	}
}

func benchStoreWrite(b *testing.B, shards, batch, size int) {
	st, err := Open(b.TempDir(), testOptions(shards))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	payload := make([]byte, size)
	b.ReportAllocs()
	b.SetBytes(int64(shards * batch * size))
	var total uint64
	cpu := processCPU()
	for b.Loop() {
		errs := make(chan error, shards)
		for i := range shards {
			go func() {
				bt := &queue.Batch{}
				for j := range batch {
					off := total/uint64(shards) + uint64(j)
					bt.Appends = append(bt.Appends, queue.Append{Queue: "bench", Partition: i,
						Message: &queue.Message{Offset: off, Payload: payload}})
				}
				errs <- st.Shard(i).Write(bt, true)
			}()
		}
		for range shards {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		total += uint64(shards * batch)
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(total), "cpu-ns/msg")
	b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "msgs/s")
	for i := range shards {
		if _, n, err := st.Shard(i).Bounds("bench", i); err != nil || n != total/uint64(shards) {
			b.Fatalf("shard %d: next = %d, %v; want %d", i, n, err, total/uint64(shards))
		}
	}
}

// BenchmarkShardRead measures Read of max 256-byte messages from a random
// offset of a partition of 65,536 messages, written batch per Write: a
// cold read, as when a group's cursor is behind the queue's ring. msgs/s
// counts messages read.
func BenchmarkShardRead(b *testing.B) {
	for _, batch := range []int{64, 1024} {
		for _, max := range []int{1, 64} {
			b.Run(fmt.Sprintf("batch=%d,max=%d,size=256B", batch, max), func(b *testing.B) {
				benchShardRead(b, batch, max)
			})
		}
	}
}

func benchShardRead(b *testing.B, batch, max int) {
	const n = 1 << 16
	st, err := Open(b.TempDir(), testOptions(1))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	sh := st.Shard(0)
	payload := make([]byte, 256)
	for off := 0; off < n; off += batch {
		bt := &queue.Batch{}
		for i := range batch {
			bt.Appends = append(bt.Appends, queue.Append{Queue: "bench", Partition: 0,
				Message: &queue.Message{Offset: uint64(off + i), Key: "k", EnqueuedAt: time.Now(), Payload: payload}})
		}
		if err := sh.Write(bt, false); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	read := 0
	b.ReportAllocs()
	cpu := processCPU()
	for b.Loop() {
		from := rng.Uint64N(n - uint64(max))
		msgs, err := sh.Read("bench", 0, from, n, max)
		if err != nil || len(msgs) != max || msgs[0].Offset != from {
			b.Fatalf("Read(%d, max %d) returned %d messages, %v", from, max, len(msgs), err)
		}
		read += len(msgs)
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(read), "cpu-ns/msg")
	b.ReportMetric(float64(read)/b.Elapsed().Seconds(), "msgs/s")
}
