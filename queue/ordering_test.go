package queue_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 5, ordering key: within a group the messages of one key are
// delivered in publish order, one unsettled at a time; a nack, a lost
// lease or a disconnect redelivers that message before any later message
// of its key, and other keys go on meanwhile.
func TestQueueOrderingKey(t *testing.T) {
	// a1 a2 b1 b2 are published; the consumer gets a1 and b1, then b2 once
	// b1 is acked while a2 waits for a1.
	start := []step{
		{pub: []msg{kmsg("a", "a1"), kmsg("a", "a2"), kmsg("b", "b1"), kmsg("b", "b2")}, sub: "c", want: []string{"a1#1", "b1#1"}},
		{op: ack, of: "b1", want: []string{"b2#1"}},
		{op: ack, of: "b2"},
	}
	then := func(steps ...step) []step { return append(slices.Clone(start), steps...) }
	runScripts(t, []script{
		{
			name: "an ack lets the next message of the key go",
			steps: then(
				step{op: ack, of: "a1", want: []string{"a2#1"}},
				step{op: ack, of: "a2", tick: time.Hour},
			),
		},
		{
			name: "a nacked message comes back before the next of its key",
			steps: then(
				step{op: nack, of: "a1"},
				step{tick: time.Second - time.Millisecond},
				step{tick: time.Millisecond, want: []string{"a1#2"}},
				step{op: ack, of: "a1", want: []string{"a2#1"}},
			),
		},
		{
			name: "a message of a lost lease comes back before the next of its key",
			steps: then(
				step{tick: pastLease, want: []string{"a1#2"}},
				step{op: ack, of: "a1", want: []string{"a2#1"}},
			),
		},
		{
			name: "a message of a closed consumer comes back before the next of its key",
			steps: then(
				step{close: "c", sub: "c", want: []string{"a1#2"}},
				step{op: ack, of: "a1", want: []string{"a2#1"}},
			),
		},
		{
			name: "a rejected message lets the next of its key go",
			steps: then(
				step{op: reject, of: "a1", want: []string{"a2#1"}},
			),
			dlq: []deadLetter{{payload: "a1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "g"}},
		},
		{
			name: "other keys go on while a key waits for its retry",
			steps: then(
				step{op: nack, of: "a1"},
				step{pub: []msg{kmsg("b", "b3"), kmsg("a", "a3"), kmsg("c", "c1")}, want: []string{"b3#1", "c1#1"}},
				step{op: ack, of: "b3"},
				step{tick: time.Second, want: []string{"a1#2"}},
				step{op: ack, of: "a1", want: []string{"a2#1"}},
				step{op: ack, of: "a2", want: []string{"a3#1"}},
			),
		},
		{
			name: "each group holds a key on its own",
			subs: map[string]sub{"d": {group: "other", prefetch: 10}},
			steps: then(
				step{sub: "d", want: []string{"d:a1#1", "d:b1#1"}},
				step{op: ack, of: "d:a1", want: []string{"d:a2#1"}},
				step{op: ack, of: "c:a1", want: []string{"c:a2#1"}},
			),
		},
	})
}

// SPEC 5: different keys go to any consumer in parallel, whatever
// partitions they are in; one key never has two messages out.
func TestQueueOrderingKeyParallel(t *testing.T) {
	for _, partitions := range []int{1, 4} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) { o.Partitions = partitions })
			keys := []string{"a", "b", "c", "d"}
			for i := 1; i <= 3; i++ {
				for _, k := range keys {
					h.mustPublish("q", kmsg(k, fmt.Sprintf("%s%d", k, i)))
				}
			}
			for _, name := range []string{"x", "y"} {
				h.subscribe("q", name, sub{prefetch: 2})
			}
			for round := 1; round <= 3; round++ {
				got := h.newDeliveries(4)
				per := map[string]int{}
				var payloads []string
				for _, d := range got {
					per[d.to]++
					payloads = append(payloads, d.payload)
				}
				slices.Sort(payloads)
				want := []string{fmt.Sprint("a", round), fmt.Sprint("b", round), fmt.Sprint("c", round), fmt.Sprint("d", round)}
				if !slices.Equal(payloads, want) || per["x"] != 2 || per["y"] != 2 {
					t.Fatalf("round %d: deliveries %v, want %v two to each consumer", round, got, want)
				}
				for _, d := range got {
					h.mustSettle(d, acked)
				}
			}
			h.tick(time.Hour)
			h.expect()
		})
	}
}

// SPEC 5: what each ordering lets through at once, and what a nack holds
// back: key holds the later messages of the key, none and partition hold
// nothing back.
func TestQueueOrderingModes(t *testing.T) {
	pub := []msg{kmsg("a", "a1"), kmsg("a", "a2"), kmsg("a", "a3"), kmsg("b", "b1")}
	for _, tc := range []struct {
		ordering queue.Ordering
		first    []string // what a consumer with room for ten gets at once
	}{
		{queue.OrderKey, []string{"a1#1", "b1#1"}},
		{queue.OrderNone, []string{"a1#1", "a2#1", "a3#1", "b1#1"}},
		{queue.OrderPartition, []string{"a1#1", "a2#1", "a3#1", "b1#1"}},
	} {
		t.Run(string(tc.ordering), func(t *testing.T) {
			runScript(t, script{
				opts: func(o *queue.Options) { o.Ordering = tc.ordering },
				steps: []step{
					{pub: pub, sub: "c", want: tc.first},
					{op: nack, of: "a1"},
					{tick: time.Second, want: []string{"a1#2"}},
				},
			})
		})
	}
	// With room for one message, a nack lets a later message of the key
	// through at once unless the ordering is key.
	for _, tc := range []struct {
		ordering queue.Ordering
		steps    []step
	}{
		{queue.OrderKey, []step{
			{op: nack, of: "a1"},
			{tick: time.Second, want: []string{"a1#2"}},
			{op: ack, of: "a1", want: []string{"a2#1"}},
		}},
		{queue.OrderNone, []step{
			{op: nack, of: "a1", want: []string{"a2#1"}},
			{op: ack, of: "a2", want: []string{"a3#1"}},
			{tick: time.Second},
			{op: ack, of: "a3", want: []string{"a1#2"}},
		}},
	} {
		t.Run(string(tc.ordering)+"/prefetch=1", func(t *testing.T) {
			runScript(t, script{
				opts: func(o *queue.Options) { o.Ordering = tc.ordering },
				subs: map[string]sub{"c": {prefetch: 1}},
				steps: append([]step{
					{pub: []msg{kmsg("a", "a1"), kmsg("a", "a2"), kmsg("a", "a3")}, sub: "c", want: []string{"a1#1"}},
				}, tc.steps...),
			})
		})
	}
}

// owners publishes one message to each partition of q, acks the
// deliveries and returns which consumer got each partition's message (""
// for none).
func owners(t *testing.T, h *harness, partitions int, round int) map[int]string {
	t.Helper()
	for p := 0; p < partitions; p++ {
		h.mustPublish("q", kmsg(keyIn(partitions, p), fmt.Sprintf("r%d-p%d", round, p)))
	}
	got := h.newDeliveries(partitions)
	own := map[int]string{}
	for _, d := range got {
		if prev, ok := own[d.partition]; ok && prev != d.to {
			t.Fatalf("partition %d delivered to %s and %s", d.partition, prev, d.to)
		}
		own[d.partition] = d.to
		h.mustSettle(d, acked)
	}
	h.expect()
	return own
}

// counts returns how many partitions each of names owns, largest first.
func counts(own map[int]string, names []string) []int {
	per := map[string]int{}
	for _, n := range own {
		per[n]++
	}
	var out []int
	for _, n := range names {
		out = append(out, per[n])
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// SPEC 5, ordering partition: each partition goes to exactly one consumer
// of the group, in offset order, and the partitions are balanced.
func TestQueueOrderingPartitionAssignment(t *testing.T) {
	for _, tc := range []struct {
		partitions, consumers int
		want                  []int // partitions per consumer, largest first
	}{
		{4, 1, []int{4}},
		{4, 2, []int{2, 2}},
		{4, 3, []int{2, 1, 1}},
		{4, 4, []int{1, 1, 1, 1}},
		{4, 6, []int{1, 1, 1, 1, 0, 0}},
		{7, 3, []int{3, 2, 2}},
	} {
		t.Run(fmt.Sprintf("partitions=%d,consumers=%d", tc.partitions, tc.consumers), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) {
				o.Partitions = tc.partitions
				o.Ordering = queue.OrderPartition
			})
			var names []string
			for i := 0; i < tc.consumers; i++ {
				names = append(names, fmt.Sprint("c", i))
				h.subscribe("q", names[i], sub{prefetch: 100})
			}
			// Three messages a partition: each partition's go to one
			// consumer, in offset order, all at once (nothing holds them).
			for p := 0; p < tc.partitions; p++ {
				for i := 0; i < 3; i++ {
					h.mustPublish("q", kmsg(keyIn(tc.partitions, p), fmt.Sprintf("p%d-%d", p, i)))
				}
			}
			got := h.newDeliveries(3 * tc.partitions)
			own := map[int]string{}
			next := map[int]int{}
			for _, d := range got {
				if prev, ok := own[d.partition]; ok && prev != d.to {
					t.Fatalf("partition %d delivered to %s and %s", d.partition, prev, d.to)
				}
				own[d.partition] = d.to
				if want := fmt.Sprintf("p%d-%d", d.partition, next[d.partition]); d.payload != want {
					t.Fatalf("partition %d: got %s, want %s", d.partition, d.payload, want)
				}
				next[d.partition]++
			}
			if len(got) != 3*tc.partitions {
				t.Fatalf("%d deliveries, want %d", len(got), 3*tc.partitions)
			}
			if c := counts(own, names); !slices.Equal(c, tc.want) {
				t.Fatalf("partitions per consumer %v, want %v (%v)", c, tc.want, own)
			}
		})
	}
}

// SPEC 5, ordering partition: assignment is sticky: a consumer joining
// takes only the partitions it gets, a consumer leaving gives only its
// own; the rest stay where they were, balanced all along.
func TestQueueOrderingPartitionSticky(t *testing.T) {
	for _, tc := range []struct{ partitions, consumers int }{
		{4, 1}, {4, 2}, {4, 3}, {6, 2}, {8, 3}, {3, 5},
	} {
		t.Run(fmt.Sprintf("partitions=%d,consumers=%d", tc.partitions, tc.consumers), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) {
				o.Partitions = tc.partitions
				o.Ordering = queue.OrderPartition
			})
			var names []string
			for i := 0; i < tc.consumers; i++ {
				names = append(names, fmt.Sprint("c", i))
				h.subscribe("q", names[i], sub{prefetch: 100})
			}
			balanced := func(stage string, own map[int]string, names []string) {
				t.Helper()
				c := counts(own, names)
				if len(own) != tc.partitions || c[0]-c[len(c)-1] > 1 {
					t.Fatalf("%s: partitions per consumer %v: not balanced (%v)", stage, c, own)
				}
			}
			before := owners(t, h, tc.partitions, 0)
			balanced("before", before, names)

			joiner := h.subscribe("q", "new", sub{prefetch: 100})
			joined := owners(t, h, tc.partitions, 1)
			balanced("after a join", joined, append(slices.Clone(names), "new"))
			for p, c := range joined {
				if c != before[p] && c != "new" {
					t.Fatalf("after a join partition %d moved from %s to %s, not to the new consumer", p, before[p], c)
				}
			}

			h.close(joiner)
			left := owners(t, h, tc.partitions, 2)
			balanced("after a leave", left, names)
			for p, c := range left {
				if c != joined[p] && joined[p] != "new" {
					t.Fatalf("after a leave partition %d moved from %s to %s, though %s stayed", p, joined[p], c, joined[p])
				}
			}
			if tc.consumers >= tc.partitions && !maps.Equal(left, before) {
				t.Fatalf("owners %v after the join and leave, were %v", left, before)
			}
		})
	}
}

// SPEC 5, ordering partition: a partition moves to a new consumer only once
// its in-flight messages are settled or released; until then neither the
// old nor the new consumer gets more of it.
func TestQueueOrderingPartitionMovesAfterInFlight(t *testing.T) {
	k0, k1 := keyIn(2, 0), keyIn(2, 1)
	// c owns both partitions and holds m1a of partition 1 when d joins:
	// partition 1 is to move to d, partition 0 stays with c.
	start := []step{
		{pub: []msg{kmsg(k0, "m0a"), kmsg(k1, "m1a")}, sub: "c", want: []string{"c:m0a#1", "c:m1a#1"}},
		{op: ack, of: "m0a"},
		{sub: "d"},
		{pub: []msg{kmsg(k1, "m1b")}},
		{pub: []msg{kmsg(k0, "m0b")}, want: []string{"c:m0b#1"}},
		{op: ack, of: "m0b"},
		{tick: ackTimeout - time.Millisecond},
	}
	opts := func(o *queue.Options) { o.Partitions, o.Ordering = 2, queue.OrderPartition }
	then := func(steps ...step) []step { return append(slices.Clone(start), steps...) }
	runScripts(t, []script{
		{
			name: "acked",
			opts: opts,
			steps: then(
				step{op: ack, of: "m1a", want: []string{"d:m1b#1"}},
				step{pub: []msg{kmsg(k0, "m0c"), kmsg(k1, "m1c")}, want: []string{"c:m0c#1", "d:m1c#1"}},
			),
		},
		{
			name: "lease lost",
			opts: opts,
			steps: then(
				step{tick: 2 * time.Millisecond, want: []string{"d:m1a#2", "d:m1b#1"}},
				step{pub: []msg{kmsg(k0, "m0c"), kmsg(k1, "m1c")}, want: []string{"c:m0c#1", "d:m1c#1"}},
			),
		},
		{
			name: "consumer closed",
			opts: opts,
			steps: then(
				step{close: "c", want: []string{"d:m1a#2", "d:m1b#1"}},
				step{pub: []msg{kmsg(k0, "m0c"), kmsg(k1, "m1c")}, want: []string{"d:m0c#1", "d:m1c#1"}},
			),
		},
	})
}

// SPEC 3, subscription property partitions: a consumer that names
// partitions takes only those, the group's other consumers share the
// rest, and a partition another consumer of the group named, or one the
// queue does not have, is refused.
func TestQueueClaimedPartitions(t *testing.T) {
	for _, ordering := range []queue.Ordering{queue.OrderKey, queue.OrderPartition, queue.OrderNone} {
		t.Run(string(ordering), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) { o.Partitions, o.Ordering = 4, ordering })
			h.subscribe("q", "c", sub{prefetch: 10, partitions: []int{1, 3}})
			h.subscribe("q", "d", sub{prefetch: 10})
			for _, tc := range []struct {
				name       string
				partitions []int
			}{
				{"taken by another consumer", []int{3}},
				{"not in the queue", []int{4}},
				{"negative", []int{-1}},
			} {
				if _, err := h.trySubscribe("q", "x", sub{partitions: tc.partitions}); !errors.Is(err, queue.ErrBadPartitions) {
					t.Errorf("partitions %v (%s): %v, want ErrBadPartitions", tc.partitions, tc.name, err)
				}
			}
			own := owners(t, h, 4, 0)
			want := map[int]string{0: "d", 1: "c", 2: "d", 3: "c"}
			if !maps.Equal(own, want) {
				t.Fatalf("owners %v, want %v", own, want)
			}
			// Another group may name the same partitions.
			if _, err := h.trySubscribe("q", "e", sub{group: "other", partitions: []int{3}}); err != nil {
				t.Fatalf("partition 3 in another group: %v", err)
			}
		})
	}
}
