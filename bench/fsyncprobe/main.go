// Command fsyncprobe measures how long the disk takes to make a small
// append durable: it appends -size bytes to a fresh file in -dir and calls
// fdatasync (fsync where there is none), -n times, and prints the p50 and
// p99 of those calls in microseconds. Appending changes the file size, so
// every call also flushes the inode, as a write-ahead log does.
//
//	go run ./bench/fsyncprobe --dir /var/lib/shardq
//	fsync p50 88 us, p99 139 us (500 x 4096 B append+fdatasync in /var/lib/shardq)
//
// With --json it prints {"p50_us": ..., "p99_us": ..., ...} instead, for
// scripts/bench-compare.sh.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// probe is the outcome of one measurement.
type probe struct {
	Dir        string  `json:"dir"`
	Iterations int     `json:"iterations"`
	Size       int     `json:"size"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	MaxUs      float64 `json:"max_us"`
}

func main() {
	dir := flag.String("dir", os.TempDir(), "directory on the file system to measure")
	n := flag.Int("n", 500, "number of write+sync iterations")
	size := flag.Int("size", 4096, "bytes appended per iteration")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()
	if *n < 1 || *size < 1 {
		fmt.Fprintln(os.Stderr, "fsyncprobe: -n and -size must be positive")
		os.Exit(2)
	}

	p, err := measure(*dir, *n, *size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fsyncprobe:", err)
		os.Exit(1)
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(p); err != nil {
			fmt.Fprintln(os.Stderr, "fsyncprobe:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("fsync p50 %.0f us, p99 %.0f us (%d x %d B append+fdatasync in %s)\n",
		p.P50us, p.P99us, p.Iterations, p.Size, p.Dir)
}

// measure appends size bytes n times to a temporary file in dir, syncing
// after each, and returns the percentiles of write plus sync.
func measure(dir string, n, size int) (probe, error) {
	f, err := os.CreateTemp(dir, "fsyncprobe-*")
	if err != nil {
		return probe{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()

	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	took := make([]time.Duration, n)
	for i := range took {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			return probe{}, fmt.Errorf("write: %w", err)
		}
		if err := datasync(f); err != nil {
			return probe{}, fmt.Errorf("sync: %w", err)
		}
		took[i] = time.Since(start)
	}
	if err := f.Close(); err != nil {
		return probe{}, err
	}
	slices.Sort(took)
	return probe{
		Dir:        dir,
		Iterations: n,
		Size:       size,
		P50us:      us(took[percentileIndex(n, 0.50)]),
		P99us:      us(took[percentileIndex(n, 0.99)]),
		MaxUs:      us(took[n-1]),
	}, nil
}

// percentileIndex is the index of the q-th percentile in n sorted values
// (nearest rank).
func percentileIndex(n int, q float64) int {
	i := int(math.Ceil(float64(n)*q)) - 1
	return min(max(i, 0), n-1)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
