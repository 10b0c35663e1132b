package queue

import (
	"sync"
	"sync/atomic"
	"time"
)

// InitialWindow is how many unsettled deliveries a consumer may hold when
// it subscribes (or fewer, when its prefetch is smaller).
const InitialWindow = 64

// PromptSettle is how soon after its delivery a message must be settled
// for the settlement to count as prompt: a consumer's window grows only
// while it settles every message of a window promptly.
const PromptSettle = time.Second

// WindowBytes is about as many payload bytes as a consumer's window holds
// once it has settled a window's worth of messages: a window that would
// hold more, at the payload size of the messages it settled last, is cut
// down to it (to one message at least). A count alone let a fast consumer
// of 256 KiB messages hold 256 MiB unsettled, all of it in its node's
// memory on its way out.
const WindowBytes = 16 << 20

// window is a consumer's adaptive credit: how many unsettled deliveries it
// may hold, between InitialWindow and its prefetch. A consumer that used
// its whole window and settled each of a window's messages within
// PromptSettle of its delivery gets a window twice as large (slow start);
// one that settles most of a window's messages later than that gets half
// (never below the initial one), and one that lets a lease run out starts
// over. So a fast consumer is sent enough to cover the round trip of its
// PUBACKs at full speed, while a slow one holds about a second of its own
// work and leaves the rest of the group's messages to the others.
type window struct {
	mu      sync.Mutex
	size    atomic.Int64 // current window: written under mu, read anywhere
	initial int64
	max     int64 // prefetch
	settled int64 // settlements since the window last changed
	slow    int64 // of them, not prompt
	bytes   int64 // their payload bytes
	// full is set when a delivery took the consumer's last credit: only
	// a consumer that uses its whole window may need a larger one.
	full atomic.Bool
}

func newWindow(prefetch int) *window {
	n := int64(min(prefetch, InitialWindow))
	w := &window{initial: n, max: int64(prefetch)}
	w.size.Store(n)
	return w
}

// settledAfter counts one settlement of a message of size payload bytes,
// made held after its delivery. It returns by how much the window
// changed: the caller adds it to the consumer's credit.
func (w *window) settledAfter(held time.Duration, size int) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.settled++
	w.bytes += int64(size)
	if held > PromptSettle {
		w.slow++
	}
	cur := w.size.Load()
	if w.settled < cur {
		return 0
	}
	var d int64
	switch {
	case w.slow == 0 && w.full.Load():
		d = min(cur, w.max-cur)
	case w.slow > w.settled/2:
		d = max(w.initial, cur/2) - cur
	}
	if limit := max(1, WindowBytes*w.settled/max(w.bytes, 1)); cur+d > limit {
		d = limit - cur
	}
	w.size.Store(cur + d)
	w.settled, w.slow, w.bytes = 0, 0, 0
	w.full.Store(false)
	return d
}

// leaseLost starts the window over: the consumer let a lease run out.
func (w *window) leaseLost() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.initial - w.size.Load()
	w.size.Store(w.initial)
	w.settled, w.slow, w.bytes = 0, 0, 0
	return d
}

// Size returns the current window.
func (w *window) Size() int { return int(w.size.Load()) }
