package queue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// bigMsg is message i of key, with a payload of size bytes that names it.
func bigMsg(key string, i, size int) msg {
	name := fmt.Sprintf("%s-%d:", key, i)
	return kmsg(key, name+strings.Repeat("x", size-len(name)))
}

// payloadName is the name bigMsg gave a payload.
func payloadName(payload string) string { return payload[:strings.IndexByte(payload, ':')] }

// A cursor reads from storage what its consumers will take next, but no
// more than ReadAheadBytes of payload at a time: a count alone made a
// group of a queue of large messages hold hundreds of them in memory.
// Every message still reaches the consumer, in order.
func TestReadAheadIsBoundedInBytes(t *testing.T) {
	const size, n = 64 << 10, 200 // 12.5 MiB: most of it past the ring
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
	for i := range n {
		h.mustPublish("q", bigMsg("k", i, size))
	}
	h.subscribe("q", "c", sub{prefetch: 1})
	d := h.newDeliveries(1)[0]
	waitFor(t, "a read-ahead", func() bool { ra, _, _ := queue.HeldBytes(h.m, "q", "g"); return ra > 0 })
	if ra, _, _ := queue.HeldBytes(h.m, "q", "g"); ra > queue.ReadAheadBytes+size {
		t.Fatalf("the cursor holds %d bytes read ahead, more than %d and one message", ra, queue.ReadAheadBytes)
	}
	for i := 0; ; i++ {
		if got, want := payloadName(d.payload), fmt.Sprintf("k-%d", i); got != want {
			t.Fatalf("delivery %d is %s, want %s", i, got, want)
		}
		h.mustSettle(d, acked)
		if i == n-1 {
			break
		}
		d = h.newDeliveries(1)[0]
		if ra, _, _ := queue.HeldBytes(h.m, "q", "g"); ra > queue.ReadAheadBytes+size {
			t.Fatalf("after %d deliveries the cursor holds %d bytes read ahead, more than %d and one message", i+1, ra, queue.ReadAheadBytes)
		}
	}
}

// Behind a key whose message is out (ordering key), a cursor parks the
// key's next messages while it looks for messages of other keys, but no
// more than MaxParkedBytes of payload (its read-ahead, bounded in bytes
// too, keeps it well below here): the message of another key past them
// waits until the key moves on, and nothing is lost or reordered. A
// cursor bounded by counts alone parked 16 MiB here.
func TestParkedMessagesAreBoundedInBytes(t *testing.T) {
	const size, n = 256 << 10, 100 // 25 MiB of one key, then another key
	h := newHarness(t, nil)
	for i := range n {
		h.mustPublish("q", bigMsg("a", i, size))
	}
	h.mustPublish("q", bigMsg("b", 0, size))
	h.subscribe("q", "c", sub{prefetch: 8})
	ds := h.newDeliveries(1)
	waitFor(t, "parked messages", func() bool { _, parked, _ := queue.HeldBytes(h.m, "q", "g"); return parked > 0 })
	seen := map[string]int{"a": 0, "b": 0}
	for len(ds) > 0 {
		if _, parked, _ := queue.HeldBytes(h.m, "q", "g"); parked > queue.MaxParkedBytes+size {
			t.Fatalf("the cursor holds %d bytes parked behind key a, more than %d and one message", parked, queue.MaxParkedBytes)
		}
		for _, d := range ds {
			if got, want := payloadName(d.payload), fmt.Sprintf("%s-%d", d.key, seen[d.key]); got != want {
				t.Fatalf("got %s, want %s next of key %s", got, want, d.key)
			}
			seen[d.key]++
			h.mustSettle(d, acked)
		}
		if seen["a"] == n && seen["b"] == 1 {
			return
		}
		ds = h.newDeliveries(1)
	}
	t.Fatalf("deliveries stopped after %v", seen)
}

// A group whose consumers all left holds no message in memory: neither
// what its cursors read ahead nor what the consumers gave back. A consumer
// that comes later gets every unsettled message, in order, those delivered
// before once more (delivery-count 2), the others for the first time.
func TestGroupWithoutConsumersHoldsNothing(t *testing.T) {
	for _, ordering := range []queue.Ordering{queue.OrderNone, queue.OrderKey} {
		t.Run(string(ordering), func(t *testing.T) {
			const size, n = 32 << 10, 200 // 6.25 MiB: past the partition's ring
			h := newHarness(t, func(o *queue.Options) { o.Ordering = ordering })
			for i := range n {
				h.mustPublish("q", bigMsg(fmt.Sprint("k", i%3), i, size))
			}
			c := h.subscribe("q", "c", sub{prefetch: 8})
			first := h.newDeliveries(1)
			h.mustSettle(first[0], acked)
			first = append(first[1:], h.newDeliveries(1)...)
			waitFor(t, "messages held", func() bool { ra, _, _ := queue.HeldBytes(h.m, "q", "g"); return ra > 0 })
			h.close(c) // its unsettled deliveries go back to the group
			if ra, _, waiting := queue.HeldBytes(h.m, "q", "g"); ra != 0 || waiting != 0 {
				t.Fatalf("a group without consumers holds %d bytes read ahead and %d waiting, want none", ra, waiting)
			}
			out := map[string]bool{}
			for _, d := range first {
				out[payloadName(d.payload)] = true
			}
			h.subscribe("q", "c2", sub{prefetch: 8})
			next := map[string]int{}
			for got := 1; got < n; {
				ds := h.newDeliveries(1)
				if len(ds) == 0 {
					t.Fatalf("deliveries stopped after %d of %d", got, n)
				}
				for _, d := range ds {
					name := payloadName(d.payload)
					var i int
					fmt.Sscanf(name[strings.IndexByte(name, '-')+1:], "%d", &i)
					if ordering == queue.OrderKey && i < next[d.key] {
						t.Fatalf("%s of key %s after %d", name, d.key, next[d.key])
					}
					next[d.key] = i
					want := uint32(1)
					if out[name] {
						want = 2
					}
					if d.count != want {
						t.Fatalf("%s delivered with count %d, want %d", name, d.count, want)
					}
					h.mustSettle(d, acked)
					got++
				}
			}
		})
	}
}

// A message a consumer released ($release: its delivery does not count
// toward max_deliveries) keeps that in memory only: a group whose
// consumers left keeps what it holds, and the message comes again with
// its count, the releases not counted toward max_deliveries.
func TestGroupWithoutConsumersKeepsAReleasedMessage(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering, o.MaxDeliveries = queue.OrderNone, 2 })
	for i := range 3 {
		h.mustPublish("q", bigMsg("k", i, 64))
	}
	c := h.subscribe("q", "c", sub{prefetch: 1})
	for range 2 {
		h.mustSettle(h.newDeliveries(1)[0], released)
	}
	// Its third delivery ends as the consumer leaves: one counted of 3.
	h.newDeliveries(1)
	h.close(c)
	if _, _, waiting := queue.HeldBytes(h.m, "q", "g"); waiting == 0 {
		t.Fatalf("the released message was let go of")
	}
	h.subscribe("q", "c2", sub{prefetch: 1})
	d := h.newDeliveries(1)
	if len(d) != 1 || payloadName(d[0].payload) != "k-0" || d[0].count != 4 {
		t.Fatalf("after the consumer left: %v, want k-0 with delivery-count 4, not dead-lettered", d)
	}
}

// A message on its way to the dead-letter queue when its group's last
// consumer leaves stays out of circulation: the next consumer does not
// get it while its dead-letter copy is being stored.
func TestGroupWithoutConsumersKeepsADeadLettering(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
	h.mustPublish("q", kmsg("a", "m0"), kmsg("b", "m1"))
	c := h.subscribe("q", "c", sub{prefetch: 1})
	h.expect("m0#1")
	h.store.HoldWrites() // the dead-letter copy's write waits
	h.mustSettle(h.latest("m0"), rejected)
	h.expect("c:m1#1")
	h.close(c) // m1 goes back to the group
	h.subscribe("q", "c2", sub{prefetch: 8})
	h.expect("c2:m1#2")
	if got := h.newDeliveries(0); len(got) != 0 {
		t.Fatalf("while m0 was on its way to the dead-letter queue: %v", got)
	}
	h.store.ReleaseWrites()
	h.expectDeadLetters("q", deadLetter{payload: "m0", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "g"})
	if got := h.newDeliveries(0); len(got) != 0 {
		t.Fatalf("after m0 was dead-lettered: %v", got)
	}
}

// A nacked message waiting for its retry_backoff when its group's last
// consumer leaves still waits for it: the next consumer gets it then.
func TestGroupWithoutConsumersKeepsABackoff(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
	h.mustPublish("q", kmsg("a", "m0"))
	c := h.subscribe("q", "c", sub{prefetch: 1})
	h.expect("m0#1")
	h.mustSettle(h.latest("m0"), nacked) // back after retry_backoff (1s)
	h.close(c)
	h.subscribe("q", "c2", sub{prefetch: 1})
	if got := h.newDeliveries(0); len(got) != 0 {
		t.Fatalf("before its backoff ended: %v", got)
	}
	h.tick(time.Second)
	h.expect("c2:m0#2")
}

// A queue nobody consumes keeps none of its messages in memory: a
// partition's ring of newest messages, which lets a consumer at the tail
// take them without reading storage, fills only while the queue has a
// consumer, and empties when the last one leaves.
func TestQueueWithoutConsumersKeepsNoRing(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
	for i := range 100 {
		h.mustPublish("q", bigMsg("k", i, 1<<10))
	}
	if n := queue.RingBytes(h.m, "q"); n != 0 {
		t.Fatalf("a queue without consumers holds %d bytes in its ring", n)
	}
	c := h.subscribe("q", "c", sub{})
	next := 0
	settleAll := func(want int) {
		for next < want {
			ds := h.newDeliveries(1)
			if len(ds) == 0 {
				t.Fatalf("deliveries stopped at %d of %d", next, want)
			}
			for _, d := range ds {
				if got := payloadName(d.payload); got != fmt.Sprintf("k-%d", next) {
					t.Fatalf("got %s, want k-%d", got, next)
				}
				h.mustSettle(d, acked)
				next++
			}
		}
	}
	settleAll(100)
	for i := 100; i < 110; i++ {
		h.mustPublish("q", bigMsg("k", i, 1<<10))
	}
	if n := queue.RingBytes(h.m, "q"); n == 0 {
		t.Fatalf("a queue with a consumer at its tail keeps nothing in its ring")
	}
	settleAll(110)
	h.close(c)
	if n := queue.RingBytes(h.m, "q"); n != 0 {
		t.Fatalf("after its last consumer left the queue holds %d bytes in its ring", n)
	}
}
