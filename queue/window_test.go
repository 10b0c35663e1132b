package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// A consumer's window: it starts at InitialWindow unsettled deliveries,
// doubles (up to prefetch) each time the consumer used all of it and
// settled every one of its messages within PromptSettle, halves (not below
// the initial one) when it settled most of them later than that, and starts
// over when it let a lease run out.
func TestConsumerWindowAdapts(t *testing.T) {
	// rounds runs a consumer through windows: each round it waits for
	// that many deliveries, all unsettled at once, lets held pass, then
	// settles them.
	type round struct {
		want int           // deliveries unsettled at once
		held time.Duration // before they are settled
	}
	cases := []struct {
		name     string
		prefetch int
		rounds   []round
		after    int // the window after the last round
	}{
		{"a prompt consumer doubles its window", 1024,
			[]round{{64, 0}, {128, 0}, {256, 0}}, 512},
		{"prefetch caps the window", 100,
			[]round{{64, 0}, {100, 0}, {100, 0}}, 100},
		{"a slow consumer halves it", 1024,
			[]round{{64, 0}, {128, 0}, {256, 2 * time.Second}}, 128},
		{"never below the initial window", 1024,
			[]round{{64, 2 * time.Second}, {64, 2 * time.Second}}, 64},
		{"a small prefetch is the whole window", 8,
			[]round{{8, 0}, {8, 2 * time.Second}}, 8},
		{"settled just in time still counts as prompt", 1024,
			[]round{{64, queue.PromptSettle}}, 128},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) {
				o.Ordering, o.Partitions, o.Prefetch = queue.OrderNone, 1, tc.prefetch
			})
			total := 0
			for _, r := range tc.rounds {
				total += r.want
			}
			publishN(h, "q", total+1) // one more: the consumer always has a message waiting
			c := h.subscribe("q", "c", sub{})
			for i, r := range tc.rounds {
				ds := h.newDeliveries(r.want)
				if len(ds) != r.want {
					t.Fatalf("round %d: %d deliveries unsettled at once, want %d", i+1, len(ds), r.want)
				}
				h.tick(r.held)
				for _, d := range ds {
					h.mustSettle(d, acked)
				}
			}
			if w := c.c.(*queue.Consumer).Window(); w != tc.after {
				t.Fatalf("window after the rounds: %d, want %d", w, tc.after)
			}
		})
	}

	t.Run("a lost lease starts the window over", func(t *testing.T) {
		h := newHarness(t, func(o *queue.Options) {
			o.Ordering, o.Partitions, o.AckTimeout = queue.OrderNone, 1, 10*time.Second
		})
		publishN(h, "q", 64+128+1)
		c := h.subscribe("q", "c", sub{})
		for _, d := range h.newDeliveries(64) {
			h.mustSettle(d, acked)
		}
		ds := h.newDeliveries(128)
		h.tick(11 * time.Second) // every lease runs out
		if w := c.c.(*queue.Consumer).Window(); w != queue.InitialWindow {
			t.Fatalf("window after its leases ran out: %d, want %d", w, queue.InitialWindow)
		}
		// The late PUBACKs free their slots; what comes next is one
		// initial window, redeliveries first.
		for _, d := range ds {
			if err := h.settle(d, acked); err == nil {
				t.Fatalf("a PUBACK after the lease ran out settled %s", d)
			}
		}
		if got := h.newDeliveries(64); len(got) != 64 || got[0].count != 2 {
			t.Fatalf("after the lost leases: %d deliveries, first %s; want 64, the first a redelivery", len(got), got[0])
		}
	})

	t.Run("a slow consumer leaves the backlog to a fast one", func(t *testing.T) {
		// Both start with 64; the fast one, settling promptly, is sent
		// the rest while the slow one holds its first 64.
		h := newHarness(t, func(o *queue.Options) { o.Ordering, o.Partitions = queue.OrderNone, 1 })
		publishN(h, "q", 1000)
		h.subscribe("q", "slow", sub{})
		h.subscribe("q", "fast", sub{})
		fast := 0
		for fast < 1000-64 {
			ds := h.newDeliveries(1)
			if len(ds) == 0 {
				break // nothing more comes
			}
			for _, d := range ds {
				if d.to == "fast" {
					h.mustSettle(d, acked)
					fast++
				}
			}
		}
		if slow := len(h.consumer("slow").all()); slow != 64 || fast != 1000-64 {
			t.Fatalf("the slow consumer got %d, the fast one %d; want 64 (its initial window) and the other %d", slow, fast, 1000-64)
		}
	})
}

// A prompt consumer of large messages: its window stops at about
// WindowBytes of their payloads instead of growing to its prefetch, and it
// shrinks to that (below the initial window, one message at least) once
// the consumer settled a window of them.
func TestConsumerWindowIsBoundedInBytes(t *testing.T) {
	cases := []struct {
		size, n, after int // n: messages published, enough for the rounds
	}{
		{64 << 10, 64 + 128 + 256 + 1, queue.WindowBytes / (64 << 10)}, // 256: one doubling short of 512
		{1 << 20, 64 + 16 + 1, queue.WindowBytes / (1 << 20)},          // 16, below the initial 64
		{64, 64 + 128 + 256 + 1, 512},                                  // unchanged: doubles, as TestConsumerWindowAdapts
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d bytes", tc.size), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) {
				o.Ordering, o.Partitions, o.Prefetch = queue.OrderNone, 1, 1024
			})
			for i := range tc.n {
				h.mustPublish("q", bigMsg("k", i, tc.size))
			}
			c := h.subscribe("q", "c", sub{})
			window := func() int { return c.c.(*queue.Consumer).Window() }
			for round := 0; window() < 512 && round < 3; round++ {
				w := window()
				ds := h.newDeliveries(w)
				if len(ds) != w {
					t.Fatalf("round %d: %d deliveries unsettled at once, want the window, %d", round+1, len(ds), w)
				}
				for _, d := range ds {
					h.mustSettle(d, acked)
				}
				if window() <= w {
					break
				}
			}
			if got := window(); got != tc.after {
				t.Fatalf("window of a prompt consumer of %d-byte messages: %d, want %d", tc.size, got, tc.after)
			}
		})
	}
}

// publishN publishes n messages with distinct keys to q.
func publishN(h *harness, q string, n int) {
	ms := make([]msg, n)
	for i := range ms {
		ms[i] = kmsg(fmt.Sprint("k", i), fmt.Sprint("m", i))
	}
	h.mustPublish(q, ms...)
}
