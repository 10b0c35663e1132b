package badger

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// payloadAt is the payload of the test message at off, version v.
func payloadAt(q string, p int, off uint64, v int) []byte {
	return fmt.Appendf(nil, "%s/%d/%d v%d", q, p, off, v)
}

func appendsAt(q string, p int, v int, offs ...uint64) []queue.Append {
	out := make([]queue.Append, len(offs))
	for i, off := range offs {
		out[i] = queue.Append{Queue: q, Partition: p, Message: &queue.Message{Offset: off, Payload: payloadAt(q, p, off, v)}}
	}
	return out
}

func mustWrite(t *testing.T, sh queue.Shard, b *queue.Batch) {
	t.Helper()
	if err := sh.Write(b, true); err != nil {
		t.Fatal(err)
	}
}

// checkRead reads [from, to) with max and checks the offsets and, for
// every message, that its payload is version v (or vs[offset]).
func checkRead(t *testing.T, sh queue.Shard, q string, p int, from, to uint64, max int, want []uint64, vs map[uint64]int) {
	t.Helper()
	msgs, err := sh.Read(q, p, from, to, max)
	if err != nil {
		t.Fatalf("Read(%s/%d, %d, %d, %d): %v", q, p, from, to, max, err)
	}
	got := make([]uint64, len(msgs))
	for i, m := range msgs {
		got[i] = m.Offset
		if !bytes.Equal(m.Payload, payloadAt(q, p, m.Offset, vs[m.Offset])) {
			t.Fatalf("Read(%s/%d): offset %d has payload %q", q, p, m.Offset, m.Payload)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Read(%s/%d, %d, %d, %d) = %v, want %v", q, p, from, to, max, got, want)
	}
}

func checkSpans(t *testing.T, sh *Shard, q string, p uint32, want ...[2]uint64) {
	t.Helper()
	if got := entrySpans(t, sh, q, p); !slices.Equal(got, want) {
		t.Fatalf("%s/%d holds entries %v, want %v", q, p, got, want)
	}
}

func trimOf(t *testing.T, sh *Shard, q string, p uint32) uint64 {
	t.Helper()
	txn := sh.db.NewTransaction(false)
	defer txn.Discard()
	tp, err := getTrim(txn, q, p)
	if err != nil {
		t.Fatal(err)
	}
	return tp.at
}

// TestStoreEntryLayout follows a partition's entries on disk through
// appends, deletes that end inside an entry, a hole, an overwrite and an
// append below the trim point.
func TestStoreEntryLayout(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(1))
	defer func() { st.Close() }()
	sh := st.Shard(0)

	// Two partitions and another queue, interleaved and out of order.
	b := &queue.Batch{}
	b.Appends = append(b.Appends, appendsAt("r", 0, 0, 3, 1, 2)...)
	b.Appends = append(b.Appends, appendsAt("q", 0, 0, span(0, 1500)...)...)
	b.Appends = append(b.Appends, appendsAt("q", 1, 0, 9, 5, 6)...)
	b.Appends = append(b.Appends, appendsAt("q", 0, 0, span(1500, 3000)...)...)
	b.Appends = append(b.Appends, appendsAt("q", 1, 1, 5)...) // the later append of 5 wins
	mustWrite(t, sh, b)
	checkSpans(t, sh, "q", 0, [2]uint64{0, 1023}, [2]uint64{1024, 2047}, [2]uint64{2048, 2999})
	checkSpans(t, sh, "q", 1, [2]uint64{5, 6}, [2]uint64{9, 9})
	checkSpans(t, sh, "r", 0, [2]uint64{1, 3})
	checkRead(t, sh, "q", 1, 0, math.MaxUint64, 10, []uint64{5, 6, 9}, map[uint64]int{5: 1})
	checkRead(t, sh, "q", 0, 1020, 1030, 100, span(1020, 1030), nil) // across two entries
	checkRead(t, sh, "q", 0, 500, 2000, 3, span(500, 503), nil)      // max inside an entry

	// Retention: the entry holding To stays, hidden below the trim point.
	mustWrite(t, sh, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 0, To: 1500}}})
	checkSpans(t, sh, "q", 0, [2]uint64{1024, 2047}, [2]uint64{2048, 2999})
	if got := trimOf(t, sh, "q", 0); got != 1500 {
		t.Fatalf("trim point %d, want 1500", got)
	}
	checkRead(t, sh, "q", 0, 0, math.MaxUint64, 3, span(1500, 1503), nil)
	checkRead(t, sh, "q", 0, 1400, 1600, 1000, span(1500, 1600), nil)
	checkRead(t, sh, "q", 0, 0, 1500, 1000, nil, nil)
	if first, next, err := sh.Bounds("q", 0); err != nil || first != 1500 || next != 3000 {
		t.Fatalf("Bounds = (%d, %d), %v; want (1500, 3000)", first, next, err)
	}

	// A delete ending on an entry's end leaves no entry to hide.
	mustWrite(t, sh, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 1500, To: 2048}}})
	checkSpans(t, sh, "q", 0, [2]uint64{2048, 2999})
	if got := trimOf(t, sh, "q", 0); got != 1500 {
		t.Fatalf("trim point %d, want 1500", got)
	}

	// A hole: the cut entry is written again around it.
	mustWrite(t, sh, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 2100, To: 2200}}})
	checkSpans(t, sh, "q", 0, [2]uint64{2048, 2099}, [2]uint64{2200, 2999})
	checkRead(t, sh, "q", 0, 2090, 2210, 1000, append(span(2090, 2100), span(2200, 2210)...), nil)

	// An overwrite inside an entry.
	mustWrite(t, sh, &queue.Batch{Appends: appendsAt("q", 0, 2, 2050, 2099, 2100)})
	checkSpans(t, sh, "q", 0, [2]uint64{2048, 2100}, [2]uint64{2200, 2999})
	vs := map[uint64]int{2050: 2, 2099: 2, 2100: 2}
	checkRead(t, sh, "q", 0, 2048, 2102, 1000, span(2048, 2101), vs)

	// Retention past the hole, then an append below the trim point: the
	// trim point goes, and the records it hid with it.
	mustWrite(t, sh, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 2048, To: 2300}}})
	checkSpans(t, sh, "q", 0, [2]uint64{2200, 2999})
	if got := trimOf(t, sh, "q", 0); got != 2300 {
		t.Fatalf("trim point %d, want 2300", got)
	}
	if err := st.Close(); err != nil { // Open forgets the partitions' tails
		t.Fatal(err)
	}
	st = openTest(t, dir, testOptions(1))
	sh = st.Shard(0)
	mustWrite(t, sh, &queue.Batch{Appends: appendsAt("q", 0, 3, 7)})
	checkSpans(t, sh, "q", 0, [2]uint64{7, 7}, [2]uint64{2300, 2999})
	if got := trimOf(t, sh, "q", 0); got != 0 {
		t.Fatalf("trim point %d, want none", got)
	}
	checkRead(t, sh, "q", 0, 0, 2302, 1000, []uint64{7, 2300, 2301}, map[uint64]int{7: 3})
	if first, next, err := sh.Bounds("q", 0); err != nil || first != 2300 || next != 3000 {
		t.Fatalf("Bounds = (%d, %d), %v; want (2300, 3000)", first, next, err)
	}
}

// TestStoreMatchesMemStore runs random batches against a shard and the
// queuetest in-memory store and compares what they read: appends mostly at
// the tail, sometimes past a gap, over stored or deleted offsets or out of
// order; deletes mostly from the first message, sometimes leaving a hole;
// reopens.
func TestStoreMatchesMemStore(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			testMatchesMemStore(t, seed)
		})
	}
}

func testMatchesMemStore(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(1))
	defer func() { st.Close() }()
	mem := queuetest.NewMemStore(1)
	const parts = 2
	var next [parts]uint64
	version := 0

	for step := range 300 {
		// The first message stored: where the queue's deletes start.
		var first [parts]uint64
		for p := range parts {
			first[p] = next[p]
			if msgs, _ := mem.Shards()[0].Read("q", p, 0, math.MaxUint64, 1); len(msgs) > 0 {
				first[p] = msgs[0].Offset
			}
		}
		// below returns an offset the partition stores or stored, rarely
		// one deleted by the queue's way of deleting.
		below := func(p int) uint64 {
			if rng.IntN(10) == 0 || first[p] == next[p] {
				return rng.Uint64N(next[p])
			}
			return first[p] + rng.Uint64N(next[p]-first[p])
		}
		b := &queue.Batch{}
		for p := range parts {
			if rng.IntN(3) == 0 {
				continue
			}
			var offs []uint64
			n := 1 + rng.IntN(40)
			if rng.IntN(20) == 0 {
				n = 1025 + rng.IntN(100)
			}
			for range n {
				switch r := rng.IntN(30); {
				case r == 0 && next[p] > 0:
					offs = append(offs, below(p))
				case r == 1: // past a gap
					next[p] += 1 + rng.Uint64N(3)
					fallthrough
				default:
					offs = append(offs, next[p])
					next[p]++
				}
			}
			if rng.IntN(15) == 0 && next[p] > 0 {
				offs = offs[:0]
				for range 1 + rng.IntN(3) {
					offs = append(offs, below(p))
				}
			}
			if rng.IntN(10) == 0 {
				rng.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
			}
			version++
			b.Appends = append(b.Appends, appendsAt("q", p, version, offs...)...)
		}
		for p := range parts {
			if rng.IntN(4) != 0 || next[p] == 0 {
				continue
			}
			from := first[p]
			if rng.IntN(8) == 0 { // a hole, or a delete below the first offset
				from = rng.Uint64N(next[p])
			}
			to := from + rng.Uint64N(next[p]-from+3)
			b.Deletes = append(b.Deletes, queue.RangeDelete{Queue: "q", Partition: p, From: from, To: to})
		}
		for _, s := range []queue.Shard{st.Shard(0), mem.Shards()[0]} {
			if err := s.Write(b, false); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		if rng.IntN(25) == 0 {
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st = openTest(t, dir, testOptions(1))
		}
		for p := range parts {
			compareShards(t, step, st.Shard(0), mem.Shards()[0], p, rng)
		}
	}
	for p := range parts {
		spans := entrySpans(t, st.Shard(0), "q", uint32(p))
		for i := 1; i < len(spans); i++ {
			if spans[i][0] <= spans[i-1][1] {
				t.Fatalf("partition %d: entries %v and %v overlap", p, spans[i-1], spans[i])
			}
		}
	}
}

// compareShards compares Bounds, a whole read and a few windows of one
// partition.
func compareShards(t *testing.T, step int, got, want queue.Shard, p int, rng *rand.Rand) {
	t.Helper()
	gf, gn, err := got.Bounds("q", p)
	if err != nil {
		t.Fatal(err)
	}
	wf, wn, _ := want.Bounds("q", p)
	if gf != wf || gn != wn {
		t.Fatalf("step %d: Bounds(q/%d) = (%d, %d), want (%d, %d)", step, p, gf, gn, wf, wn)
	}
	reads := [][3]uint64{{0, math.MaxUint64, math.MaxInt32}}
	for range 3 {
		from := rng.Uint64N(wn + 2)
		reads = append(reads, [3]uint64{from, from + rng.Uint64N(2000), 1 + rng.Uint64N(50)})
	}
	type bytesReader interface {
		ReadBytes(q string, partition int, from, to uint64, max int, maxBytes int64) ([]*queue.Message, error)
	}
	for i, r := range reads {
		// Every other read bounded in bytes too, from one byte (one
		// message whatever its size) up.
		maxBytes := int64(0)
		if i%2 == 1 {
			maxBytes = 1 + rng.Int64N(400)
		}
		g, err := got.(bytesReader).ReadBytes("q", p, r[0], r[1], int(r[2]), maxBytes)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		w, _ := want.(bytesReader).ReadBytes("q", p, r[0], r[1], int(r[2]), maxBytes)
		if len(g) != len(w) {
			t.Fatalf("step %d: ReadBytes(q/%d, %d, %d, %d, %d) returned %d messages, want %d", step, p, r[0], r[1], r[2], maxBytes, len(g), len(w))
		}
		for i := range w {
			if g[i].Offset != w[i].Offset || !bytes.Equal(g[i].Payload, w[i].Payload) {
				t.Fatalf("step %d: Read(q/%d, %d, %d, %d) message %d: offset %d %q, want %d %q",
					step, p, r[0], r[1], r[2], i, g[i].Offset, g[i].Payload, w[i].Offset, w[i].Payload)
			}
		}
	}
}

// TestStoreRetentionSeeksToTheFront runs the queue's pattern, batches
// appended at the tail and deleted from the front, and checks that every
// lookup of the oldest entry can seek straight to it: the trim record names
// the entry straddling the trim point and no holes, so nothing steps over
// the tombstones retention left before it.
func TestStoreRetentionSeeksToTheFront(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	defer st.Close()
	sh := st.Shard(0)
	var next, from uint64
	for round := range 50 {
		mustWrite(t, sh, &queue.Batch{Appends: appendsAt("q", 0, round, span(next, next+20)...)})
		next += 20
		to := next - 7 // inside the last batch: it straddles the new trim point
		mustWrite(t, sh, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: from, To: to}}})
		from = to
		txn := sh.db.NewTransaction(false)
		tp, err := getTrim(txn, "q", 0)
		front, ferr := frontKey(txn, "q", 0)
		txn.Discard()
		if err != nil || ferr != nil {
			t.Fatal(err, ferr)
		}
		if tp.holes || !tp.straddle || tp.at != to || tp.first != next-20 || tp.last != next-1 {
			t.Fatalf("round %d: trim record %+v, want the batch [%d, %d] straddling %d and no holes", round, tp, next-20, next-1, to)
		}
		if want := entryKey("q", 0, next-20, next-1); !bytes.Equal(front, want) {
			t.Fatalf("round %d: front key %x, want the straddling entry's %x", round, front, want)
		}
	}
	checkSpans(t, sh, "q", 0, [2]uint64{next - 20, next - 1})
	versions := map[uint64]int{}
	for _, off := range span(next-7, next) {
		versions[off] = 49
	}
	checkRead(t, sh, "q", 0, 0, math.MaxUint64, 100, span(next-7, next), versions)
	if first, last, err := sh.Bounds("q", 0); err != nil || first != next-7 || last != next {
		t.Fatalf("bounds (%d, %d) %v, want (%d, %d)", first, last, err, next-7, next)
	}
}
