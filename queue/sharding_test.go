package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/shardq/shardq/queue"
)

// keyOfShard returns the n-th key (from 0) whose messages are in shard s
// of count when sharded by key, and, when partition names one, in
// partition partition[0] of partition[1]. (Sharded by key into as many
// shards as partitions, shard s is partition s: one hash of the key.)
func keyOfShard(s, count, n int, partition ...int) string {
	for i := 0; ; i++ {
		k := "k" + strconv.Itoa(i)
		if queue.MessageShard(&queue.Message{Key: k}, []string{queue.ShardByKey}, count) != s ||
			len(partition) == 2 && queue.PartitionFor(k, partition[1]) != partition[0] {
			continue
		}
		if n == 0 {
			return k
		}
		n--
	}
}

// SPEC 12, consumer-side sharding: a consumer with shard-count N and
// shards takes only the messages whose FNV-1a-64 of the shard-by values
// mod N is one of its shards; the group's consumers together share the
// work, a message whose shard nobody takes waits for one, and per-key
// order holds within a shard.
func TestQueueSharding(t *testing.T) {
	shard := func(ids ...int) sub {
		return sub{prefetch: 10, sharding: &queue.Sharding{Count: 2, Shards: ids}}
	}
	// a's keys are in shard 0, b's in shard 1.
	a, b := keyOfShard(0, 2, 0), keyOfShard(1, 2, 0)
	a2, b2 := keyOfShard(0, 2, 1), keyOfShard(1, 2, 1)
	keyed := func(o *queue.Options) { o.Partitions, o.Ordering = 1, queue.OrderKey }
	none := func(o *queue.Options) { o.Partitions, o.Ordering = 2, queue.OrderNone }
	runScripts(t, []script{
		{
			name: "each message goes to the consumer of its shard",
			opts: none,
			subs: map[string]sub{"zero": shard(0), "one": shard(1)},
			steps: []step{
				{sub: "zero"},
				{sub: "one", pub: []msg{kmsg(a, "a1"), kmsg(b, "b1"), kmsg(a2, "c1"), kmsg(b, "b2")}, want: []string{"zero:a1", "one:b1", "zero:c1", "one:b2"}},
			},
		},
		{
			name: "a shard nobody takes waits, and goes to the consumer that joins for it",
			opts: keyed,
			subs: map[string]sub{"zero": shard(0), "one": shard(1)},
			steps: []step{
				{sub: "zero", pub: []msg{kmsg(b, "b1"), kmsg(a, "a1"), kmsg(b, "b2"), kmsg(a, "a2")}, want: []string{"zero:a1#1"}},
				{op: ack, of: "a1", want: []string{"zero:a2#1"}},
				{sub: "one", want: []string{"one:b1#1"}},
				{op: ack, of: "b1", want: []string{"one:b2#1"}},
			},
		},
		{
			name: "a consumer without sharding takes every shard",
			opts: none,
			subs: map[string]sub{"zero": shard(0), "all": {prefetch: 10}},
			steps: []step{
				{sub: "zero", pub: []msg{kmsg(b, "b1"), kmsg(a, "a1")}, want: []string{"zero:a1"}},
				{sub: "all", want: []string{"all:b1"}},
			},
		},
		{
			name: "a shard's message waits for its consumer's credit, not for another's",
			opts: keyed,
			subs: map[string]sub{"zero": shard(0), "one": {prefetch: 1, sharding: &queue.Sharding{Count: 2, Shards: []int{1}}}},
			steps: []step{
				{sub: "zero"},
				{sub: "one", pub: []msg{kmsg(b, "b1"), kmsg(b2, "b2"), kmsg(a, "a1")}, want: []string{"one:b1#1", "zero:a1#1"}},
				{pub: []msg{kmsg(a2, "a2")}, want: []string{"zero:a2#1"}},
				{op: ack, of: "b1", want: []string{"one:b2#1"}},
			},
		},
		{
			name: "credit given back on one partition delivers what waits on another",
			opts: func(o *queue.Options) { o.Partitions, o.Ordering = 4, queue.OrderNone },
			subs: map[string]sub{"zero": shard(0), "one": {prefetch: 1, sharding: &queue.Sharding{Count: 2, Shards: []int{1}}}},
			steps: []step{
				// Published one after the other: two partitions' first
				// deliveries wait for their own marks, stored in no set
				// order, so either could take the one credit first.
				{sub: "zero"},
				{sub: "one", pub: []msg{kmsg(keyOfShard(1, 2, 0, 1, 4), "p0")}, want: []string{"one:p0#1"}},
				{pub: []msg{kmsg(keyOfShard(1, 2, 0, 3, 4), "p1")}, want: []string{}},
				{op: ack, of: "p0", want: []string{"one:p1#1"}},
			},
		},
		{
			name: "what a leaving consumer held goes to another consumer of its shard",
			opts: none,
			subs: map[string]sub{"one": shard(1), "also": shard(1, 0)},
			steps: []step{
				{sub: "one", pub: []msg{kmsg(b, "b1")}, want: []string{"one:b1#1"}},
				{sub: "also"},
				{close: "one", want: []string{"also:b1#2"}},
			},
		},
		{
			name: "with the last sharded consumer gone, the group is not sharded",
			opts: func(o *queue.Options) { o.Partitions = 1 },
			subs: map[string]sub{"zero": shard(0), "plain": {prefetch: 10}},
			steps: []step{
				{sub: "zero", pub: []msg{kmsg(b, "b1"), kmsg(a, "a1")}, want: []string{"zero:a1"}},
				{close: "zero", want: []string{}},
				{sub: "plain", want: []string{"plain:b1#1", "plain:a1#2"}},
			},
		},
	})
}

// TestQueueShardingKeyInflight: with key_inflight, the next message of a
// key goes to the consumer holding the key only if it takes that
// message's shard (sharded by a property, one key's messages may be in
// two shards); else it waits until the key is free.
func TestQueueShardingKeyInflight(t *testing.T) {
	by := []string{"p"}
	shardOf := func(v string) int {
		return queue.MessageShard(&queue.Message{Headers: queue.Headers{User: []queue.Property{{Name: "p", Value: v}}}}, by, 2)
	}
	x, y := "x", ""
	for i := 0; y == ""; i++ {
		if v := fmt.Sprint("y", i); shardOf(v) != shardOf(x) {
			y = v
		}
	}
	m := func(payload, v string) msg {
		return msg{key: "K", payload: payload, props: []queue.Property{{Name: "p", Value: v}}}
	}
	shards := func(v string) *queue.Sharding { return &queue.Sharding{By: by, Count: 2, Shards: []int{shardOf(v)}} }
	runScripts(t, []script{{
		name: "the key's next message waits for a consumer of its shard",
		opts: func(o *queue.Options) { o.Partitions, o.KeyInflight = 1, 3 },
		subs: map[string]sub{"xs": {prefetch: 10, sharding: shards(x)}, "ys": {prefetch: 10, sharding: shards(y)}},
		steps: []step{
			{sub: "xs"},
			{sub: "ys", pub: []msg{m("m1", x), m("m2", x), m("m3", y)}, want: []string{"xs:m1#1", "xs:m2#1"}},
			{op: ack, of: "m1", want: []string{}},
			{op: ack, of: "m2", want: []string{"ys:m3#1"}},
		},
	}})
}

// TestQueueShardingSpreads: with shard-by a user property, two consumers
// sharing two shards get every message once, each at the consumer
// MessageShard names, and in publish order for each value.
func TestQueueShardingSpreads(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Partitions, o.Ordering, o.Prefetch = 4, queue.OrderKey, 1000 })
	by := []string{"region", "kind"}
	cons := [2]*consumer{}
	for i := range cons {
		cons[i] = h.subscribe("q", fmt.Sprint("s", i), sub{prefetch: 1000, sharding: &queue.Sharding{By: by, Count: 2, Shards: []int{i}}})
	}
	want := map[string]int{}
	const n = 200
	for i := range n {
		m := msg{key: fmt.Sprint("k", i%7), payload: fmt.Sprint(i), props: []queue.Property{
			{Name: "region", Value: fmt.Sprint("r", i%5)}, {Name: "kind", Value: fmt.Sprint(i % 3)}}}
		want[m.payload] = queue.MessageShard(h.message(m), by, 2)
		h.mustPublish("q", m)
	}
	seen := map[string]bool{}
	last := map[string]int{} // by key: the last payload delivered
	for len(seen) < n {
		got := h.newDeliveries(1)
		if len(got) == 0 {
			t.Fatalf("%d of %d messages delivered, then nothing", len(seen), n)
		}
		for _, d := range got {
			if seen[d.payload] {
				t.Fatalf("%s delivered twice", d.payload)
			}
			seen[d.payload] = true
			if d.to != fmt.Sprint("s", want[d.payload]) {
				t.Fatalf("message %s, of shard %d, went to %s", d.payload, want[d.payload], d.to)
			}
			i, _ := strconv.Atoi(d.payload)
			if prev, ok := last[d.key]; ok && prev > i {
				t.Fatalf("key %s: %d delivered after %d", d.key, i, prev)
			}
			last[d.key] = i
			h.mustSettle(d, acked)
		}
	}
}

// TestQueueShardingRefused: a sharding other than the group's sharded
// consumers', or on a queue ordered by partition, is refused saying why;
// once they left, the group takes another.
func TestQueueShardingRefused(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Partitions = 2 })
	first := h.subscribe("q", "first", sub{sharding: &queue.Sharding{Count: 4, Shards: []int{0, 1}}})
	cases := []struct {
		name string
		s    queue.Sharding
		err  error
	}{
		{"another count", queue.Sharding{Count: 2, Shards: []int{0}}, queue.ErrShardingMismatch},
		{"another property", queue.Sharding{By: []string{"region"}, Count: 4, Shards: []int{2}}, queue.ErrShardingMismatch},
		{"a shard past the count", queue.Sharding{Count: 4, Shards: []int{4}}, queue.ErrBadSharding},
		{"no shard", queue.Sharding{Count: 4}, queue.ErrBadSharding},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.trySubscribe("q", "second", sub{sharding: &c.s})
			if !errors.Is(err, c.err) {
				t.Fatalf("subscribe: %v, want %v", err, c.err)
			}
			f := queue.Filter{Queue: "q", Group: "g"}
			if err := h.m.CheckSubscription(context.Background(), f, queue.ConsumerOptions{Sharding: &c.s}); !errors.Is(err, c.err) {
				t.Fatalf("CheckSubscription: %v, want %v", err, c.err)
			}
		})
	}
	h.subscribe("q", "same", sub{sharding: &queue.Sharding{By: []string{"key"}, Count: 4, Shards: []int{2, 3}}})
	h.close(first)
	h.close(h.consumer("same"))
	h.subscribe("q", "other", sub{sharding: &queue.Sharding{Count: 2, Shards: []int{0}}})

	p := newHarness(t, func(o *queue.Options) { o.Partitions, o.Ordering = 2, queue.OrderPartition })
	if _, err := p.trySubscribe("q", "c", sub{sharding: &queue.Sharding{Count: 2, Shards: []int{0}}}); !errors.Is(err, queue.ErrBadSharding) {
		t.Fatalf("sharded subscription to a queue ordered by partition: %v, want %v", err, queue.ErrBadSharding)
	}
}
