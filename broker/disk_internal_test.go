package broker

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

func TestDiskWatchWatermark(t *testing.T) {
	var free atomic.Int64
	free.Store(1000)
	read := func(string) (uint64, error) { return uint64(free.Load()), nil }
	d := newDiskWatch(t.TempDir(), 500, nil)
	d.setFree(read)
	if err := d.admit("jobs"); err != nil || d.low() {
		t.Fatalf("1000 free, watermark 500: admit %v, low %v", err, d.low())
	}
	free.Store(499)
	d.check()
	err := d.admit("jobs")
	if !errors.Is(err, queue.ErrStorageFull) || !d.low() {
		t.Fatalf("499 free: admit %v, low %v; want ErrStorageFull", err, d.low())
	}
	if got := d.freeBytes.Load(); got != 499 {
		t.Fatalf("free bytes %d, want 499", got)
	}
	free.Store(500) // at the watermark is enough
	d.check()
	if err := d.admit("jobs"); err != nil {
		t.Fatalf("500 free: %v", err)
	}

	// A failed reading keeps the last state.
	free.Store(10)
	d.check()
	d.setFree(func(string) (uint64, error) { return 0, errors.New("statfs: EIO") })
	if !d.low() || d.freeBytes.Load() != -1 {
		t.Fatalf("failed reading: low %v, free %d; want still low, free -1", d.low(), d.freeBytes.Load())
	}
	// Unknown platform: never refuses.
	d.setFree(func(string) (uint64, error) { return 0, errFreeUnknown })
	if d.low() {
		t.Fatal("unknown free space must not refuse")
	}
}

func TestDiskWatchZeroMinNeverRefuses(t *testing.T) {
	d := newDiskWatch(t.TempDir(), 0, nil)
	d.setFree(func(string) (uint64, error) { return 0, nil })
	if d.low() || d.admit("jobs") != nil {
		t.Fatal("min_free_bytes 0 must turn the check off")
	}
}

// The timer picks up a change by itself, within a few intervals.
func TestDiskWatchTimerRecovers(t *testing.T) {
	var free atomic.Int64
	d := newDiskWatch(t.TempDir(), 100, nil)
	d.setFree(func(string) (uint64, error) { return uint64(free.Load()), nil })
	if !d.low() {
		t.Fatal("0 free must be low")
	}
	d.start(5 * time.Millisecond)
	defer d.close()
	free.Store(1 << 20)
	deadline := time.Now().Add(2 * time.Second)
	for d.low() {
		if time.Now().After(deadline) {
			t.Fatal("still low 2s after space returned")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFreeSpaceOfTempDir(t *testing.T) {
	n, err := freeSpace(t.TempDir())
	if errors.Is(err, errFreeUnknown) {
		t.Skip("free space unknown on this platform")
	}
	if err != nil || n == 0 {
		t.Fatalf("freeSpace: %d, %v", n, err)
	}
}
