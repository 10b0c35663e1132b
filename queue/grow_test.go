package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/shardq/shardq/queue"
)

// grow declares q with n partitions, its other settings as they are.
func grow(t *testing.T, h *harness, n int) error {
	t.Helper()
	o := h.m.Queue("q").Options()
	o.Partitions = n
	_, _, err := h.m.Declare(context.Background(), "q", o)
	return err
}

// TestQueueGrow (SPEC 7, partition count): a queue's partitions grow
// online; a key whose partition changes is delivered in order across the
// change: its messages published after it wait, per group, until the
// group settled the partitions its keys came from up to the cut. The
// count survives a crash, with the cuts; it never shrinks.
func TestQueueGrow(t *testing.T) {
	one := func(o *queue.Options) { o.Partitions = 1 }
	// moved goes to partition 1 of 2; stays to partition 0.
	moved, stays := keyIn(2, 1), keyIn(2, 0)
	t.Run("a moved key waits for its group to settle the old partition", func(t *testing.T) {
		h := newHarness(t, one)
		h.mustPublish("q", kmsg(stays, "s1"), kmsg(moved, "m1"))
		h.subscribe("q", "c", sub{prefetch: 10})
		got := h.expect("s1#1", "m1#1")
		if err := grow(t, h, 2); err != nil {
			t.Fatal(err)
		}
		h.mustPublish("q", kmsg(moved, "m2"), kmsg(stays, "s2"))
		h.tick(0)
		h.expect() // m2 waits for m1 and s1 (the cut of partition 0); s2 for s1, its key's
		h.mustSettle(got[1], acked)
		h.tick(0)
		h.expect() // s1, before the cut, is not settled yet
		h.mustSettle(got[0], acked)
		h.tick(0)
		h.expect("m2#1", "s2#1")
	})
	t.Run("the count and the cuts survive a crash", func(t *testing.T) {
		h := newHarness(t, one)
		h.mustPublish("q", kmsg(moved, "m1"))
		if err := grow(t, h, 2); err != nil {
			t.Fatal(err)
		}
		h.mustPublish("q", kmsg(moved, "m2"))
		h.crash()
		if n := h.m.Queue("q").Partitions(); n != 2 {
			t.Fatalf("after a crash the queue has %d partitions, not 2", n)
		}
		h.subscribe("q", "c", sub{prefetch: 10})
		got := h.expect("m1#1")
		h.mustSettle(got[0], acked)
		h.tick(0)
		h.expect("m2#1")
	})
	t.Run("a group made after the growth waits too; one starting at latest does not", func(t *testing.T) {
		h := newHarness(t, one)
		h.mustPublish("q", kmsg(moved, "m1"))
		if err := grow(t, h, 2); err != nil {
			t.Fatal(err)
		}
		h.mustPublish("q", kmsg(moved, "m2"))
		h.subscribe("q", "c", sub{prefetch: 10})
		got := h.expect("m1#1")
		h.subscribe("q", "late", sub{group: "late", start: queue.StartLatest, prefetch: 10})
		h.mustPublish("q", kmsg(moved, "m3"))
		h.expect("late:m3#1")
		h.mustSettle(got[0], acked)
		h.tick(0)
		got = h.expect("m2#1")
		h.mustSettle(got[0], acked)
		h.expect("m3#1")
	})
	t.Run("from 2 to 3, keys move between old partitions too", func(t *testing.T) {
		h := newHarness(t, func(o *queue.Options) { o.Partitions = 2 })
		// k: partition 0 of 2, partition 1 of 3 (an old partition).
		k := ""
		for i := 0; k == ""; i++ {
			if c := fmt.Sprint("k", i); queue.PartitionFor(c, 2) == 0 && queue.PartitionFor(c, 3) == 1 {
				k = c
			}
		}
		h.mustPublish("q", kmsg(k, "k1"))
		h.subscribe("q", "c", sub{prefetch: 10})
		got := h.expect("k1#1")
		if err := grow(t, h, 3); err != nil {
			t.Fatal(err)
		}
		h.mustPublish("q", kmsg(k, "k2"))
		h.tick(0)
		h.expect()
		h.mustSettle(got[0], acked)
		h.tick(0)
		h.expect("k2#1")
	})
	t.Run("never fewer", func(t *testing.T) {
		h := newHarness(t, func(o *queue.Options) { o.Partitions = 2 })
		h.mustPublish("q", kmsg("k", "x"))
		if err := grow(t, h, 1); !errors.Is(err, queue.ErrPartitionsChanged) {
			t.Fatalf("shrinking to 1: %v, want %v", err, queue.ErrPartitionsChanged)
		}
	})
}

// TestQueueGrowUnderLoad: publishes of many keys go on while the queue
// grows twice; every one is stored once, and one consumer gets each key's
// messages in publish order, one at a time (ordering key).
func TestQueueGrowUnderLoad(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Partitions, o.Prefetch = 2, 1000 })
	if _, err := h.m.Open(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	const keys, per = 16, 60
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if err := h.publish("q", kmsg(fmt.Sprint("key", k), fmt.Sprintf("%d/%d", k, i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for _, n := range []int{4, 6} {
		if err := grow(t, h, n); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h.subscribe("q", "c", sub{prefetch: 1000})
	last := map[int]int{}
	seen := 0
	for seen < keys*per {
		h.tick(0)
		got := h.newDeliveries(1)
		if len(got) == 0 {
			t.Fatalf("%d of %d delivered, then nothing", seen, keys*per)
		}
		out := map[int]bool{} // keys with a delivery not settled yet
		for _, d := range got {
			var k, i int
			fmt.Sscanf(d.payload, "%d/%d", &k, &i)
			if out[k] {
				t.Fatalf("key %d: %d delivered while an earlier message of the key was not settled", k, i)
			}
			out[k] = true
			if prev, ok := last[k]; ok && i != prev+1 {
				t.Fatalf("key %d: %d after %d", k, i, prev)
			} else if !ok && i != 0 {
				t.Fatalf("key %d starts at %d", k, i)
			}
			last[k] = i
			seen++
			h.mustSettle(d, acked)
		}
	}
}

// TestQueueKeySegments: where a key's messages are after growths, newest
// first.
func TestQueueKeySegments(t *testing.T) {
	end := uint64(math.MaxUint64)
	key := func(of2, of3, of6 int) string {
		for i := 0; ; i++ {
			if c := fmt.Sprint("k", i); queue.PartitionFor(c, 2) == of2 && queue.PartitionFor(c, 3) == of3 && queue.PartitionFor(c, 6) == of6 {
				return c
			}
		}
	}
	moving, staying := key(0, 1, 4), key(1, 1, 1)
	growths := []queue.Growth{{From: 2, To: 3, Cuts: []uint64{10, 20}}, {From: 3, To: 6, Cuts: []uint64{30, 40, 50}}}
	cases := []struct {
		name       string
		key        string
		partitions int
		growths    []queue.Growth
		want       []queue.KeySegment
	}{
		{"never grown", moving, 2, nil, []queue.KeySegment{{Partition: 0, To: end}}},
		{"moved to an old partition", moving, 3, growths[:1], []queue.KeySegment{{Partition: 1, From: 20, To: end}, {Partition: 0, To: 10}}},
		{"moved twice, to a new partition", moving, 6, growths, []queue.KeySegment{{Partition: 4, To: end}, {Partition: 1, From: 20, To: 40}, {Partition: 0, To: 10}}},
		{"kept its partition", staying, 6, growths, []queue.KeySegment{{Partition: 1, To: end}}},
	}
	for _, c := range cases {
		if got := queue.KeySegments(c.key, c.partitions, c.growths); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestQueueGrowByConfig: a queue declared in the config file grows when
// the node starts with more partitions for it, keeping each key's order
// and its settings the config's (not set at run time).
func TestQueueGrowByConfig(t *testing.T) {
	o := testOptions()
	o.Partitions = 1
	h := newHarness(t, nil)
	h.mo.Declared = map[string]queue.Options{"q": o}
	h.crash()
	moved := keyIn(2, 1)
	h.mustPublish("q", kmsg(moved, "m1"))
	o.Partitions = 2
	h.mo.Declared = map[string]queue.Options{"q": o}
	h.crash()
	if n := h.m.Queue("q").Partitions(); n != 2 {
		t.Fatalf("started with 2 partitions in the config, the queue has %d", n)
	}
	if at, err := h.m.DeclaredAtRuntime(); err != nil || at["q"] {
		t.Fatalf("grown by the config, q counts as declared at run time (%v)", err)
	}
	h.mustPublish("q", kmsg(moved, "m2"))
	h.subscribe("q", "c", sub{prefetch: 10})
	got := h.expect("m1#1")
	h.mustSettle(got[0], acked)
	h.tick(0)
	h.expect("m2#1")
	o.Partitions = 1
	h.mo.Declared = map[string]queue.Options{"q": o}
	queue.WaitWritten(h.m)
	_ = h.store.Close()
	h.store = h.store.Reopen()
	h.mo.Store = h.store
	if _, err := queue.NewManager(h.mo); !errors.Is(err, queue.ErrPartitionsChanged) {
		t.Fatalf("starting with fewer partitions in the config: %v, want %v", err, queue.ErrPartitionsChanged)
	}
}
