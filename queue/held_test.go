package queue_test

import (
	"fmt"
	"strings"
	"testing"

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
	waitFor(t, "a read-ahead", func() bool { ra, _ := queue.HeldBytes(h.m, "q", "g"); return ra > 0 })
	if ra, _ := queue.HeldBytes(h.m, "q", "g"); ra > queue.ReadAheadBytes+size {
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
		if ra, _ := queue.HeldBytes(h.m, "q", "g"); ra > queue.ReadAheadBytes+size {
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
	waitFor(t, "parked messages", func() bool { _, parked := queue.HeldBytes(h.m, "q", "g"); return parked > 0 })
	seen := map[string]int{"a": 0, "b": 0}
	for len(ds) > 0 {
		if _, parked := queue.HeldBytes(h.m, "q", "g"); parked > queue.MaxParkedBytes+size {
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
