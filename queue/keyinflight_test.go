package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 5, key_inflight: with ordering key and key_inflight N, up to N
// messages of one key are unsettled at once, all with one consumer, in
// publish order; when one of them is nacked or its lease ends, the later
// ones of its key that consumer holds are taken back (their late PUBACKs
// change nothing) and the key is delivered again from that message on,
// in order.
func TestQueueKeyInflight(t *testing.T) {
	three := func(o *queue.Options) { o.Partitions, o.KeyInflight = 1, 3 }
	a := func(payloads ...string) []msg {
		var ms []msg
		for _, p := range payloads {
			ms = append(ms, kmsg(p[:1], p))
		}
		return ms
	}
	runScripts(t, []script{
		{
			name: "up to key_inflight of a key are out at once",
			opts: three,
			steps: []step{
				{pub: a("a1", "a2", "a3", "a4", "a5", "b1"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1", "b1#1"}},
				{op: ack, of: "a1", want: []string{"a4#1"}},
				{op: ack, of: "a3", want: []string{"a5#1"}}, // out of order: a room, whichever is acked
				{op: ack, of: "a2"},
				{op: ack, of: "a4"},
				{op: ack, of: "a5"},
				{op: ack, of: "b1"},
				{pub: a("a6"), want: []string{"a6#1"}},
			},
		},
		{
			name: "key_inflight 1 is one at a time",
			opts: func(o *queue.Options) { o.Partitions = 1 },
			steps: []step{
				{pub: a("a1", "a2", "b1"), sub: "c", want: []string{"a1#1", "b1#1"}},
				{op: ack, of: "a1", want: []string{"a2#1"}},
			},
		},
		{
			name: "a nack takes the later ones back; the key comes again from it, in order",
			opts: three,
			steps: []step{
				{pub: a("a1", "a2", "a3", "a4"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1"}},
				{op: nack, of: "a2"},
				{op: ack, of: "a3", opErr: queue.ErrNotLeased}, // taken back: its late PUBACK changes nothing
				{op: ack, of: "a1"},
				{tick: time.Second, want: []string{"a2#2"}},
				{op: ack, of: "a2", want: []string{"a3#2"}},
				{op: ack, of: "a3", want: []string{"a4#1"}},
			},
		},
		{
			name: "a lost lease takes the later ones back",
			opts: three,
			steps: []step{
				{pub: a("a1", "a2", "a3"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1"}},
				{tick: pastLease, want: []string{"a1#2"}},
				{op: ack, of: "a1", want: []string{"a2#2"}},
				{op: ack, of: "a2", want: []string{"a3#2"}},
			},
		},
		{
			name: "a closed consumer's messages come back in order",
			opts: three,
			steps: []step{
				{pub: a("a1", "a2", "a3"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1"}},
				{close: "c", sub: "d", want: []string{"d:a1#2"}},
				{op: ack, of: "d:a1", want: []string{"d:a2#2"}},
				{op: ack, of: "d:a2", want: []string{"d:a3#2"}},
			},
		},
		{
			// With max_deliveries 1, a taken-back delivery counted would
			// dead-letter a2 and a3 as they come again.
			name: "taken back is not counted toward max_deliveries",
			opts: func(o *queue.Options) { o.Partitions, o.KeyInflight, o.MaxDeliveries = 1, 3, 1 },
			steps: []step{
				{pub: a("a1", "a2", "a3"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1"}},
				{op: release, of: "a1", want: []string{"a1#2"}},
				{op: ack, of: "a3", opErr: queue.ErrNotLeased},
				{op: ack, of: "a1", want: []string{"a2#2"}},
				{op: ack, of: "a2", want: []string{"a3#2"}},
				{op: ack, of: "a3"},
			},
		},
		{
			name: "a message dead-lettered after its nacks lets its key go on, in order",
			opts: func(o *queue.Options) { o.Partitions, o.KeyInflight, o.MaxDeliveries = 1, 3, 2 },
			steps: []step{
				{pub: a("a1", "a2", "a3"), sub: "c", want: []string{"a1#1", "a2#1", "a3#1"}},
				{op: nack, of: "a1"},
				{tick: time.Second, want: []string{"a1#2"}},
				// Its second ended delivery: dead-lettered, and once the copy
				// is stored the key goes on with a2 (waiting for it, not
				// checking for nothing in between: the copy is stored apart).
				{op: nack, of: "a1", want: []string{"a2#2"}},
				{op: ack, of: "a2", want: []string{"a3#2"}},
				{op: ack, of: "a3"},
			},
			dlq: []deadLetter{{payload: "a1", reason: queue.ReasonMaxDeliveries, id: "0-0", topic: "$queue/q", count: 2, group: "g"}},
		},
	})
}

// With key_inflight, a key's next message goes to the consumer its key is
// out with, whichever consumer the group's round robin offers it to.
func TestQueueKeyInflightFollowsTheKeysConsumer(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Partitions, o.KeyInflight = 1, 3 })
	h.subscribe("q", "c", sub{prefetch: 10})
	h.subscribe("q", "d", sub{prefetch: 10})
	var ms []msg
	for i := 1; i <= 3; i++ {
		for _, k := range []string{"a", "b", "e"} {
			ms = append(ms, kmsg(k, fmt.Sprint(k, i)))
		}
	}
	h.mustPublish("q", ms...)
	got := h.newDeliveries(len(ms))
	if len(got) != len(ms) {
		t.Fatalf("%d deliveries out at once, want %d (3 keys, key_inflight 3): %v", len(got), len(ms), got)
	}
	to := map[string]string{}
	next := map[string]int{}
	for _, d := range got {
		if c, ok := to[d.key]; ok && c != d.to {
			t.Fatalf("key %s went to %s and %s: %v", d.key, c, d.to, got)
		}
		to[d.key] = d.to
		if next[d.key]++; d.payload != fmt.Sprint(d.key, next[d.key]) {
			t.Fatalf("key %s out of order: %v", d.key, got)
		}
	}
}
