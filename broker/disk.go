package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardq/shardq/queue"
)

// diskCheckEvery is how often the free space of the data directory is
// read: often enough to refuse publishes well before Badger runs out of
// room, never on the publish path.
const diskCheckEvery = 500 * time.Millisecond

// errFreeUnknown is what freeSpace answers where the free space cannot be
// read (not Linux): the watermark is then not enforced.
var errFreeUnknown = errors.New("free space unknown on this platform")

// diskFullError is the refusal of a publish below storage.min_free_bytes;
// errors.Is(err, queue.ErrStorageFull) holds, so the hooks' table answers
// PUBACK 0x97.
type diskFullError struct{ free, min int64 }

func (e *diskFullError) Error() string {
	return fmt.Sprintf("storage full: %d bytes free, below storage.min_free_bytes %d", e.free, e.min)
}

func (e *diskFullError) Unwrap() error { return queue.ErrStorageFull }

// diskWatch keeps the free space of the data directory's file system, read
// on a timer and cached, and refuses publishes while it is below the
// watermark (storage.min_free_bytes). Settlements and deletes do not ask
// it, so consumers drain the queues and retention frees space; once the
// space is back, the next check admits publishes again.
type diskWatch struct {
	dir string
	min int64 // 0: no check
	log *slog.Logger

	// free reads the free bytes of dir's file system (freeSpace; tests
	// inject theirs, the fault seam).
	free atomic.Pointer[func(dir string) (uint64, error)]
	// mu serialises checks (the timer's and the tests').
	mu sync.Mutex
	// freeBytes is the latest reading, -1 while unknown; refusal is what
	// admit answers, nil while there is room.
	freeBytes atomic.Int64
	refusal   atomic.Pointer[diskFullError]

	stop chan struct{}
	done chan struct{}
}

// newDiskWatch reads the free space once, so that a node started on a full
// disk refuses publishes from its first one.
func newDiskWatch(dir string, min int64, log *slog.Logger) *diskWatch {
	d := &diskWatch{dir: dir, min: min, log: log}
	f := freeSpace
	d.free.Store(&f)
	d.freeBytes.Store(-1)
	d.check()
	return d
}

// start checks every interval until close.
func (d *diskWatch) start(every time.Duration) {
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-d.stop:
				return
			case <-t.C:
				d.check()
			}
		}
	}()
}

// close stops the timer and waits for it.
func (d *diskWatch) close() {
	if d.stop == nil {
		return
	}
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	<-d.done
}

// setFree replaces the free-space reader and checks at once.
func (d *diskWatch) setFree(f func(dir string) (uint64, error)) {
	d.free.Store(&f)
	d.check()
}

// check reads the free space and updates the refusal; it logs when the
// node crosses the watermark either way.
func (d *diskWatch) check() {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, err := (*d.free.Load())(d.dir)
	if err != nil {
		// Unknown: keep the last state rather than guess, except that an
		// unknown platform never refuses.
		d.freeBytes.Store(-1)
		if errors.Is(err, errFreeUnknown) {
			d.refusal.Store(nil)
		} else if d.log != nil {
			d.log.Warn("cannot read the free space of the data directory", "data_dir", d.dir, "err", err)
		}
		return
	}
	free := int64(min(n, uint64(1<<63-1)))
	d.freeBytes.Store(free)
	was := d.refusal.Load() != nil
	if d.min > 0 && free < d.min {
		d.refusal.Store(&diskFullError{free: free, min: d.min})
		if !was && d.log != nil {
			d.log.Error("data directory below storage.min_free_bytes: publishes refused (0x97), node not ready until space returns",
				"data_dir", d.dir, "free_bytes", free, "min_free_bytes", d.min)
		}
		return
	}
	d.refusal.Store(nil)
	if was && d.log != nil {
		d.log.Info("data directory has room again: publishes taken, node ready", "data_dir", d.dir, "free_bytes", free, "min_free_bytes", d.min)
	}
}

// admit is the manager's Admit: nil while there is room.
func (d *diskWatch) admit(string) error {
	if e := d.refusal.Load(); e != nil {
		return e
	}
	return nil
}

// low reports whether the disk is below the watermark.
func (d *diskWatch) low() bool { return d.refusal.Load() != nil }

// collector is shardq_storage_free_bytes.
func (d *diskWatch) collector(node prometheus.Labels) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "shardq_storage_free_bytes",
		Help:        "Free bytes of the data directory's file system, read every 500ms (-1: unknown); below storage.min_free_bytes publishes are refused with 0x97.",
		ConstLabels: node,
	}, func() float64 { return float64(d.freeBytes.Load()) })
}
