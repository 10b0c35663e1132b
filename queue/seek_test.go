package queue_test

import (
	"context"
	"errors"
	"strings"
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

// smsg is a message of key published to subject.
func smsg(key, subject, payload string) msg { return msg{key: key, subject: subject, payload: payload} }

// SPEC 12, subject filters: a group takes only the messages whose subject
// its filter matches, set by its first subscription and kept across a
// crash; the others are settled for it and counted, not lost for other
// groups; a subscription with another filter is refused naming the
// group's.
func TestQueueSubjectFilter(t *testing.T) {
	eu := sub{subjects: "eu/#", prefetch: 10}
	all := sub{group: "all", prefetch: 10}
	runScripts(t, []script{
		{
			name: "a group takes exactly the subjects its filter matches; another group gets them all",
			subs: map[string]sub{"c": eu, "a": all},
			steps: []step{
				{sub: "c"},
				{pub: []msg{smsg("k1", "eu/de", "m1"), smsg("k2", "us/ny", "m2"), smsg("k3", "eu", "m3"), smsg("k4", "", "m4"), smsg("k5", "eu/fr/paris", "m5")},
					want: []string{"c:m1#1", "c:m3#1", "c:m5#1"}},
				{sub: "a", want: []string{"a:m1#1", "a:m2#1", "a:m3#1", "a:m4#1", "a:m5#1"}},
			},
		},
		{
			name: "a message left out does not hold its key back",
			subs: map[string]sub{"c": eu},
			steps: []step{
				{sub: "c"},
				{pub: []msg{smsg("k", "us", "m1"), smsg("k", "eu/de", "m2")}, want: []string{"c:m2#1"}},
			},
		},
	})
	h := newHarness(t, nil)
	h.subscribe("q", "c", eu)
	if _, err := h.trySubscribe("q", "d", sub{subjects: "us/#"}); !errors.Is(err, queue.ErrFilterMismatch) || !strings.Contains(err.Error(), "subjects eu/#") {
		t.Fatalf("a second filter for the group: %v, want ErrFilterMismatch naming eu/#", err)
	}
	if _, err := h.trySubscribe("q", "e", sub{}); !errors.Is(err, queue.ErrFilterMismatch) {
		t.Fatalf("no filter for a filtered group: %v, want ErrFilterMismatch", err)
	}
	h.mustPublish("q", smsg("k1", "us", "m1"), smsg("k2", "eu/de", "m2"))
	got := h.newDeliveries(1)
	if !matchDeliveries(got, []string{"c:m2#1"}) {
		t.Fatalf("deliveries %v", got)
	}
	h.mustSettle(got[0], acked)
	if g, _ := h.m.Queue("q").Info().Group("g"); g.Filter != "eu/#" || g.Counts.Filtered != 1 {
		t.Fatalf("group g: filter %q, %d filtered; want eu/# and 1", g.Filter, g.Counts.Filtered)
	}
	// Kept with the group: after a crash, it still takes eu only.
	h.crash()
	if _, err := h.trySubscribe("q", "f", sub{subjects: "us/#"}); !errors.Is(err, queue.ErrFilterMismatch) {
		t.Fatalf("after a crash, another filter: %v, want ErrFilterMismatch", err)
	}
	h.subscribe("q", "c2", eu)
	h.mustPublish("q", smsg("k3", "us", "m3"), smsg("k4", "eu/it", "m4"))
	if got := h.newDeliveries(1); !matchDeliveries(got, []string{"c2:m4#1"}) {
		t.Fatalf("after a crash: deliveries %v, want only m4", got)
	}
}
