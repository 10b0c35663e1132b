package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 12, seek: a group moved to a point has every message before it
// settled and the retained ones from it on delivered again, their
// delivery counts starting over; refused while it has consumers unless
// forced, which takes their leases back. A new group may start at a time.
func TestQueueSeek(t *testing.T) {
	earliest, latest := queue.SeekTo{Earliest: true}, queue.SeekTo{Latest: true}
	between := t0.Add(30 * time.Second)
	// "keep", a group that reads nothing, keeps what g acks retained.
	keep := sub{group: "keep", prefetch: 1}
	runScripts(t, []script{
		{
			name: "to earliest, the group gets again what it acked, counted from one",
			subs: map[string]sub{"k": keep},
			steps: []step{
				{sub: "k"},
				{close: "k"},
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c", want: []string{"c:m1#1", "c:m2#1"}},
				{op: ack, of: "c:m1"},
				{op: nack, of: "c:m2", tick: 2 * time.Second, want: []string{"c:m2#2"}},
				{close: "c", seek: &seekStep{to: earliest}},
				{sub: "c2", want: []string{"c2:m1#1", "c2:m2#1"}},
			},
		},
		{
			name: "to latest, the group skips its backlog",
			steps: []step{
				{sub: "c"},
				{close: "c"},
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, seek: &seekStep{to: latest}},
				{pub: []msg{kmsg("c", "m3")}, sub: "c2", want: []string{"c2:m3#1"}},
			},
		},
		{
			name: "to a time between two batches, the group gets exactly the later one",
			subs: map[string]sub{"k": keep},
			steps: []step{
				{sub: "k"},
				{close: "k"},
				{sub: "c"},
				{close: "c"},
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, tick: time.Minute},
				{pub: []msg{kmsg("c", "m3"), kmsg("d", "m4")}, seek: &seekStep{to: queue.SeekTo{Time: between}}},
				{sub: "c2", want: []string{"c2:m3#1", "c2:m4#1"}},
			},
		},
		{
			name: "to a partition's offset",
			steps: []step{
				{sub: "c"},
				{close: "c"},
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3")}, seek: &seekStep{to: queue.SeekTo{OnePartition: true, Partition: 0, Offset: 2}}},
				{sub: "c2", want: []string{"c2:m3#1"}},
				{seek: &seekStep{to: queue.SeekTo{OnePartition: true, Partition: 1}, err: queue.ErrBadPartitions}},
			},
		},
		{
			name: "refused while the group has a consumer; forced, its lease is taken back",
			subs: map[string]sub{"k": keep},
			steps: []step{
				{sub: "k"},
				{close: "k"},
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{op: ack, of: "c:m1"},
				{pub: []msg{kmsg("b", "m2")}, want: []string{"c:m2#1"}},
				{seek: &seekStep{to: earliest, err: queue.ErrGroupActive}},
				// m2's lease taken back, both go out again, counted from one.
				{seek: &seekStep{to: earliest, force: true}, want: []string{"c:m1#1", "c:m2#1"}},
				{op: ack, of: "c:m1"},
				{op: ack, of: "c:m2", depth: depth(2)},
			},
		},
		{
			name: "a group not there",
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, seek: &seekStep{group: "nope", to: earliest, err: queue.ErrNoSuchGroup}},
			},
		},
		{
			name: "a new group starting at a time gets what was enqueued from then on",
			subs: map[string]sub{"c": {start: queue.Start(between.Format(time.RFC3339))}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, tick: time.Minute},
				{pub: []msg{kmsg("b", "m2")}, sub: "c", want: []string{"c:m2#1"}},
			},
		},
	})
}

// A seek is on disk when it returns: after a crash the group stands where
// it was moved, its earlier settlements past that point gone.
func TestQueueSeekSurvivesACrash(t *testing.T) {
	h := newHarness(t, nil)
	h.close(h.subscribe("q", "k", sub{group: "keep", prefetch: 1}))
	h.mustPublish("q", kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3"))
	c := h.subscribe("q", "c", defaultSub)
	// m2 and m3 settled above the floor (m1 is not): marks on disk.
	for _, d := range h.newDeliveries(3)[1:] {
		h.mustSettle(d, acked)
	}
	h.tick(0)
	h.close(c)
	if _, err := h.m.Queue("q").Seek(context.Background(), "g", queue.SeekTo{OnePartition: true, Offset: 1}, false, false); err != nil {
		t.Fatal(err)
	}
	h.crashNow()
	h.subscribe("q", "c2", defaultSub)
	if got := h.newDeliveries(2); !matchDeliveries(got, []string{"c2:m2#1", "c2:m3#1"}) {
		t.Fatalf("after the seek and a crash: %v, want m2 and m3 again", got)
	}
}

// SPEC 12, retention time: a queue keeps its messages for max_age whether
// groups settled them or not, so a group made later reads them all and a
// group moved back reads them again; max_age and a drop-oldest limit
// still delete them, without dead-lettering any.
func TestQueueRetentionTime(t *testing.T) {
	stream := func(o *queue.Options) { o.Retention = queue.RetentionTime; o.MaxAge = time.Hour }
	late := sub{group: "late", prefetch: 10}
	runScripts(t, []script{
		{
			name: "a group made after another acked everything gets all of it",
			opts: stream,
			subs: map[string]sub{"l": late},
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c", want: []string{"c:m1#1", "c:m2#1"}},
				{op: ack, of: "c:m1"},
				{op: ack, of: "c:m2", retain: true, depth: depth(2)},
				{sub: "l", want: []string{"l:m1#1", "l:m2#1"}},
			},
		},
		{
			name: "moved back to earliest, a group reads again what it acked",
			opts: stream,
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{op: ack, of: "c:m1", retain: true},
				{close: "c", seek: &seekStep{to: queue.SeekTo{Earliest: true}}},
				{sub: "c2", want: []string{"c2:m1#1"}},
			},
		},
		{
			name: "max_age deletes on time, read or not, and the dead-letter queue gets none",
			opts: stream,
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{op: ack, of: "c:m1"},
				{close: "c"},
				{pub: []msg{kmsg("b", "m2")}, tick: 2 * time.Hour, retain: true, depth: depth(0)},
				{sub: "c2"},
				{pub: []msg{kmsg("c", "m3")}, want: []string{"c2:m3#1"}},
			},
		},
		{
			name: "with the default, a group made later misses what every group acked",
			subs: map[string]sub{"l": late},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{op: ack, of: "c:m1", retain: true, depth: depth(0)},
				{pub: []msg{kmsg("b", "m2")}, sub: "l", want: []string{"c:m2#1", "l:m2#1"}},
			},
		},
		{
			name: "over max_messages with drop-oldest, the oldest goes, not dead-lettered",
			opts: func(o *queue.Options) {
				stream(o)
				o.MaxMessages, o.Overflow = 2, queue.OverflowDropOldest
			},
			subs: map[string]sub{"l": late},
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3")}, retain: true, depth: depth(2)},
				{sub: "l", want: []string{"l:m2#1", "l:m3#1"}},
			},
		},
	})
}
