package queuetest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// RunStoreSuite runs the conformance suite of queue.Store against the stores
// open returns. Every case calls open with a fresh directory and again with
// the same directory to reopen it; the suite closes the stores itself, so
// open must not register their Close. Cases that need a failing Write run
// only when the store implements FaultInjector.
func RunStoreSuite(t *testing.T, open func(t *testing.T, dir string) queue.Store) {
	cases := []struct {
		name string
		run  func(h *harness)
	}{
		{"AppendReadAllFields", testAppendReadAllFields},
		{"ReadRangeOrderAndPrefixes", testReadRange},
		{"BoundsTrackAppendsAndDeletes", testBounds},
		{"RangeDeleteIsExact", testRangeDelete},
		{"PartsOfOneWrite", testPartsOfOneWrite},
		{"GroupStateRoundTrip", testGroupState},
		{"DropGroups", testDropGroups},
		{"QueueMeta", testQueueMeta},
		{"DropQueues", testDropQueues},
		{"DedupIDs", testDedups},
		{"InvalidBatchChangesNothing", testInvalidBatch},
		{"FailedWriteChangesNothing", testFailedWrite},
		{"CloseKeepsWrites", func(h *harness) { testReopen(h, false) }},
		{"SyncedWritesSurviveReopen", func(h *harness) { testReopen(h, true) }},
		{"ConcurrentReadWrite", testConcurrentReadWrite},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(newHarness(t, open)) })
	}
}

// fullMessage sets every field of a message; each call returns a fresh one.
func fullMessage(off uint64) *queue.Message {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	return &queue.Message{
		Offset:     off,
		Key:        "order-42",
		Subject:    "eu/orders/created",
		EnqueuedAt: time.Date(2025, 1, 2, 3, 4, 5, 678_901_234, zone),
		NotBefore:  time.Date(2025, 1, 2, 3, 5, 0, 1_000_000, zone),
		ExpiresAt:  time.Date(2025, 1, 3, 3, 4, 5, 999_999_999, time.UTC),
		Headers: queue.Headers{
			ContentType:     "application/json; charset=utf-8",
			ResponseTopic:   "replies/client-7",
			CorrelationData: []byte{0, 1, 2, 0xfe, 0xff, 0},
			PayloadFormat:   1,
			ExpiryInterval:  86400,
			User: []queue.Property{
				{Name: "trace", Value: "a1"},
				{Name: "tenant", Value: "acme"},
				{Name: "trace", Value: "b2"}, // duplicate names keep their order
				{Name: "", Value: ""},
				{Name: "ünïcødé", Value: "日本語"},
			},
		},
		Payload: []byte("{\"id\":42}\x00\xff"),
	}
}

func testAppendReadAllFields(h *harness) {
	s := h.shard(0)
	build := func() []*queue.Message {
		minimal := &queue.Message{Offset: 1}

		big := fullMessage(2)
		big.Payload = bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
		big.Headers.CorrelationData = []byte{}
		big.Headers.User = nil

		dead := fullMessage(3)
		dead.EnqueuedAt = time.Date(1969, 7, 20, 20, 17, 40, 500_000_000, time.UTC) // before 1970
		dead.NotBefore = time.Time{}
		dead.ExpiresAt = time.Date(2500, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
		dead.DeadLetter = &queue.DeadLetter{
			Reason:        queue.ReasonMaxDeliveries,
			OriginalID:    "3-1234",
			OriginalTopic: "$queue/orders/eu",
			Deliveries:    5,
			Group:         "billing",
		}
		return []*queue.Message{fullMessage(0), minimal, big, dead}
	}
	in := build()
	b := &queue.Batch{}
	for _, m := range in {
		b.Appends = append(b.Appends, queue.Append{Queue: "orders", Partition: 3, Message: m})
	}
	h.write(s, b, true)

	// The store keeps its own copy: changing what was written changes nothing.
	in[0].Payload[0] = 'X'
	in[0].Headers.User[0].Name = "changed"
	in[0].Headers.CorrelationData[1] = 9
	in[3].DeadLetter.Reason = "changed"

	want := build()
	got := h.readAll(s, "orders", 3)
	checkMessages(h.t, got, want)
	if m := got[1]; m.DeadLetter != nil || !m.EnqueuedAt.IsZero() || !m.NotBefore.IsZero() || !m.ExpiresAt.IsZero() {
		h.t.Fatalf("zero fields did not read back as zero: %+v", m)
	}

	// Nor does changing what was read.
	got[0].Payload[0] = 'Y'
	got[0].Headers.User[1].Value = "changed"
	got[3].DeadLetter.Group = "changed"
	checkMessages(h.t, h.readAll(s, "orders", 3), want)

	h.reopen()
	checkMessages(h.t, h.readAll(h.shard(0), "orders", 3), want)
}

func testReadRange(h *harness) {
	s := h.shard(0)
	// Queue names that are prefixes of one another, partitions whose
	// decimal forms are prefixes of one another.
	queues := []string{"a", "a.b", "a/$dlq", "ab", "a-"}
	parts := []int{0, 1, 10, 256}
	const n = 12
	for off := uint64(0); off < n; off++ {
		b := &queue.Batch{}
		for _, q := range queues {
			for _, p := range parts {
				b.Appends = append(b.Appends, appends(q, p, off)...)
			}
		}
		h.write(s, b, false)
	}
	for _, q := range queues {
		for _, p := range parts {
			h.checkOffsets(s, q, p, span(0, n)...)
		}
	}

	ranges := []struct {
		from, to uint64
		max      int
		want     []uint64
	}{
		{3, 7, 100, span(3, 7)},
		{3, 7, 2, span(3, 5)},
		{0, math.MaxUint64, 5, span(0, 5)},
		{11, math.MaxUint64, 100, []uint64{11}},
		{n, math.MaxUint64, 100, nil},
		{7, 3, 100, nil},
		{5, 5, 100, nil},
		{0, math.MaxUint64, 0, nil},
	}
	for _, r := range ranges {
		got := offsetsOf(h.read(s, "a", 1, r.from, r.to, r.max))
		if !slices.Equal(got, r.want) {
			h.t.Fatalf("Read(a, 1, %d, %d, %d) = %v, want %v", r.from, r.to, r.max, got, r.want)
		}
	}
	for _, unknown := range []struct {
		q string
		p int
	}{{"a.c", 1}, {"a", 2}, {"b", 0}} {
		if got := h.readAll(s, unknown.q, unknown.p); len(got) != 0 {
			h.t.Fatalf("Read of unknown %s/%d returned %v", unknown.q, unknown.p, offsetsOf(got))
		}
	}

	// A partition number whose big-endian bytes spell ".b\0\0": a key
	// layout without a separator after the queue name would mix queue "a"
	// partition 0x2e620000 with queue "a.b".
	const dotB = 0x2e620000
	h.write(s, &queue.Batch{Appends: appends("a", dotB, 0, 1)}, false)
	h.checkOffsets(s, "a", dotB, 0, 1)
	h.checkOffsets(s, "a.b", 0, span(0, n)...)
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a", Partition: dotB, From: 0, To: n}}}, false)
	h.checkOffsets(s, "a.b", 0, span(0, n)...)
	h.checkOffsets(s, "a.b", 1, span(0, n)...)

	// Offsets that sort wrong as decimal strings or little-endian bytes,
	// written out of order.
	sparse := []uint64{1 << 40, 256, 9, 65536, 1, 255, 1 << 32, 10, 65535, 2}
	h.write(s, &queue.Batch{Appends: appends("sparse", 7, sparse...)}, false)
	h.checkOffsets(s, "sparse", 7, 1, 2, 9, 10, 255, 256, 65535, 65536, 1<<32, 1<<40)
	got := offsetsOf(h.read(s, "sparse", 7, 10, 1<<32, 100))
	if want := []uint64{10, 255, 256, 65535, 65536}; !slices.Equal(got, want) {
		h.t.Fatalf("Read(sparse, 7, 10, 2^32) = %v, want %v", got, want)
	}
	h.checkBounds(s, "sparse", 7, 1, 1<<40+1)
}

func testBounds(h *harness) {
	s := h.shard(0)
	h.checkBounds(s, "q", 0, 0, 0)
	h.write(s, &queue.Batch{Appends: appends("q", 0, span(0, 10)...)}, false)
	h.checkBounds(s, "q", 0, 0, 10)
	// A partition whose log starts past zero.
	h.write(s, &queue.Batch{Appends: appends("q", 1, 100, 101, 102)}, false)
	h.checkBounds(s, "q", 1, 100, 103)

	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 0, To: 4}}}, false)
	h.checkBounds(s, "q", 0, 4, 10)
	h.checkOffsets(s, "q", 0, span(4, 10)...)

	// Deleting everything keeps next: the watermark records To.
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 4, To: 10}}}, false)
	h.checkBounds(s, "q", 0, 10, 10)
	h.checkOffsets(s, "q", 0)

	// An older, lower delete does not move the watermark back.
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 0, To: 3}}}, false)
	h.checkBounds(s, "q", 0, 10, 10)

	// A delete on a partition that never held a message records To.
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 5, From: 0, To: 7}}}, false)
	h.checkBounds(s, "q", 5, 7, 7)

	h.reopen()
	s = h.shard(0)
	h.checkBounds(s, "q", 0, 10, 10)
	h.checkBounds(s, "q", 1, 100, 103)
	h.checkBounds(s, "q", 5, 7, 7)
	h.checkBounds(s, "q", 2, 0, 0)

	h.write(s, &queue.Batch{Appends: appends("q", 0, 10, 11)}, false)
	h.checkBounds(s, "q", 0, 10, 12)
	h.checkOffsets(s, "q", 0, 10, 11)
}

func testRangeDelete(h *harness) {
	s := h.shard(0)
	queues := []string{"a", "a.b", "a/$dlq"}
	parts := []int{1, 10}
	b := &queue.Batch{}
	for _, q := range queues {
		for _, p := range parts {
			b.Appends = append(b.Appends, appends(q, p, span(0, 20)...)...)
		}
	}
	h.write(s, b, false)

	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a", Partition: 1, From: 0, To: 5}}}, false)
	h.checkOffsets(s, "a", 1, span(5, 20)...)
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a", Partition: 1, From: 8, To: 12}}}, false)
	h.checkOffsets(s, "a", 1, append([]uint64{5, 6, 7}, span(12, 20)...)...)

	// Two deletes in one batch, one reaching far past the last offset.
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{
		{Queue: "a", Partition: 1, From: 12, To: 1000},
		{Queue: "a.b", Partition: 10, From: 0, To: 3},
	}}, false)
	h.checkOffsets(s, "a", 1, 5, 6, 7)
	h.checkOffsets(s, "a.b", 10, span(3, 20)...)

	// Neighbours by name or partition number are untouched.
	h.checkOffsets(s, "a", 10, span(0, 20)...)
	h.checkOffsets(s, "a.b", 1, span(0, 20)...)
	h.checkOffsets(s, "a/$dlq", 1, span(0, 20)...)
	h.checkOffsets(s, "a/$dlq", 10, span(0, 20)...)

	// Appends and a delete of the same partition in one batch: appends first.
	h.write(s, &queue.Batch{
		Appends: appends("a/$dlq", 1, 20, 21, 22),
		Deletes: []queue.RangeDelete{{Queue: "a/$dlq", Partition: 1, From: 0, To: 21}},
	}, false)
	h.checkOffsets(s, "a/$dlq", 1, 21, 22)
	h.checkBounds(s, "a/$dlq", 1, 21, 23)
}

// testPartsOfOneWrite reads and deletes parts of what one Write appended:
// a store may keep a Write's appends to a partition together.
func testPartsOfOneWrite(h *harness) {
	s := h.shard(0)
	// Two partitions, interleaved; offsets of q/1 skip every third.
	const n = 3000
	b := &queue.Batch{}
	var skipping []uint64
	for off := uint64(0); off < n; off++ {
		b.Appends = append(b.Appends, appends("q", 0, off)...)
		if off%100 == 0 {
			o := off / 100 * 3
			b.Appends = append(b.Appends, appends("q", 1, o, o+1)...)
			skipping = append(skipping, o, o+1)
		}
	}
	h.write(s, b, true)
	h.checkOffsets(s, "q", 0, span(0, n)...)
	h.checkOffsets(s, "q", 1, skipping...)
	h.checkBounds(s, "q", 1, 0, skipping[len(skipping)-1]+1)

	ranges := []struct {
		from, to uint64
		max      int
		want     []uint64
	}{
		{1500, n, 7, span(1500, 1507)},      // from the middle, fewer than stored
		{1020, 1030, 100, span(1020, 1030)}, // a short range
		{0, n, 2000, span(0, 2000)},         // more than a thousand
		{2990, math.MaxUint64, 100, span(2990, n)},
	}
	for _, r := range ranges {
		if got := offsetsOf(h.read(s, "q", 0, r.from, r.to, r.max)); !slices.Equal(got, r.want) {
			h.t.Fatalf("Read(q, 0, %d, %d, %d) = %v, want %v", r.from, r.to, r.max, got, r.want)
		}
	}
	if got := offsetsOf(h.read(s, "q", 1, 2, 10, 3)); !slices.Equal(got, []uint64{3, 4, 6}) {
		h.t.Fatalf("Read(q, 1, 2, 10, 3) = %v, want [3 4 6]", got)
	}

	// Deletes ending inside what one Write appended: nothing below To is
	// read again, whatever the range asked for.
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{
		{Queue: "q", Partition: 0, From: 0, To: 1500},
		{Queue: "q", Partition: 1, From: 0, To: 4},
	}}, true)
	h.checkOffsets(s, "q", 0, span(1500, n)...)
	h.checkBounds(s, "q", 0, 1500, n)
	h.checkOffsets(s, "q", 1, skipping[3:]...)
	h.checkBounds(s, "q", 1, 4, skipping[len(skipping)-1]+1)
	if got := offsetsOf(h.read(s, "q", 0, 1000, 1600, 5)); !slices.Equal(got, span(1500, 1505)) {
		h.t.Fatalf("Read(q, 0, 1000, 1600, 5) = %v, want %v", got, span(1500, 1505))
	}
	if got := h.read(s, "q", 0, 0, 1500, 100); len(got) != 0 {
		h.t.Fatalf("Read below the deleted range returned %v", offsetsOf(got))
	}

	h.write(s, &queue.Batch{
		Appends: appends("q", 0, span(n, n+10)...),
		Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 1500, To: 2999}},
	}, false)
	h.checkOffsets(s, "q", 0, span(2999, n+10)...)
	h.reopen()
	s = h.shard(0)
	h.checkOffsets(s, "q", 0, span(2999, n+10)...)
	h.checkBounds(s, "q", 0, 2999, n+10)
	h.write(s, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "q", Partition: 0, From: 2999, To: n + 5}}}, false)
	h.checkOffsets(s, "q", 0, span(n+5, n+10)...)
	h.checkBounds(s, "q", 0, n+5, n+10)
	h.checkOffsets(s, "q", 1, skipping[3:]...)
}

func testGroupState(h *harness) {
	s := h.shard(0)
	h.checkGroups(s, "q", 0)
	h.write(s, &queue.Batch{
		Floors: []queue.FloorWrite{
			{Queue: "q", Group: "g1", Partition: 0, Floor: 4},
			{Queue: "q", Group: "g1", Partition: 0, Floor: 5}, // the later write wins
			{Queue: "q", Group: "g2", Partition: 0, Floor: 3},
			{Queue: "q", Group: "eu", Partition: 0, Floor: 2, Filter: "eu/+/temp"},
			{Queue: "q", Group: "eu-marked", Partition: 0, Floor: 2, Delivered: 9, Filter: "ü/#"},
			{Queue: "q", Group: "g1", Partition: 1, Floor: 100},
			{Queue: "q.x", Group: "g1", Partition: 0, Floor: 77},
			{Queue: "q", Group: "grüppe 1 ✓", Partition: 0, Floor: 0},
		},
		Marks: []queue.SettleMark{
			{Queue: "q", Group: "g1", Partition: 0, Offset: 12, Set: true},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 7, Set: true},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 9, Set: true},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 256, Set: true},
			{Queue: "q", Group: "g", Partition: 0, Offset: 7, Set: true}, // a prefix of g1
			{Queue: "q", Group: "g1", Partition: 10, Offset: 7, Set: true},
		},
		Deliveries: []queue.DeliveryMark{
			{Queue: "q", Group: "g1", Partition: 0, Offset: 6, Count: 2},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 8, Count: 1},
			{Queue: "q", Group: "only-deliveries", Partition: 0, Offset: 1, Count: math.MaxUint32},
		},
	}, false)
	h.checkGroups(s, "q", 0,
		queue.GroupState{Group: "eu", Floor: 2, Filter: "eu/+/temp"},
		queue.GroupState{Group: "eu-marked", Floor: 2, Delivered: 9, Filter: "ü/#"},
		queue.GroupState{Group: "g", Settled: []uint64{7}},
		queue.GroupState{Group: "g1", Floor: 5, Settled: []uint64{7, 9, 12, 256}, Deliveries: map[uint64]uint32{6: 2, 8: 1}},
		queue.GroupState{Group: "g2", Floor: 3},
		queue.GroupState{Group: "grüppe 1 ✓"},
		queue.GroupState{Group: "only-deliveries", Deliveries: map[uint64]uint32{1: math.MaxUint32}},
	)
	h.checkGroups(s, "q", 1, queue.GroupState{Group: "g1", Floor: 100})
	h.checkGroups(s, "q", 10, queue.GroupState{Group: "g1", Settled: []uint64{7}})
	h.checkGroups(s, "q.x", 0, queue.GroupState{Group: "g1", Floor: 77})
	h.checkGroups(s, "q", 2)

	h.write(s, &queue.Batch{
		Floors: []queue.FloorWrite{{Queue: "q", Group: "g1", Partition: 0, Floor: 8}},
		Marks: []queue.SettleMark{
			{Queue: "q", Group: "g1", Partition: 0, Offset: 7},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 300, Set: true},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 300}, // set then forgotten in one batch
			{Queue: "q", Group: "g", Partition: 0, Offset: 7},    // g is left without records
		},
		Deliveries: []queue.DeliveryMark{
			{Queue: "q", Group: "g1", Partition: 0, Offset: 6},
			{Queue: "q", Group: "g1", Partition: 0, Offset: 8, Count: 3},
			{Queue: "q", Group: "only-deliveries", Partition: 0, Offset: 1},
		},
	}, false)
	want := []queue.GroupState{
		{Group: "eu", Floor: 2, Filter: "eu/+/temp"},
		{Group: "eu-marked", Floor: 2, Delivered: 9, Filter: "ü/#"},
		{Group: "g1", Floor: 8, Settled: []uint64{9, 12, 256}, Deliveries: map[uint64]uint32{8: 3}},
		{Group: "g2", Floor: 3},
		{Group: "grüppe 1 ✓"},
	}
	h.checkGroups(s, "q", 0, want...)
	h.reopen()
	h.checkGroups(h.shard(0), "q", 0, want...)
	h.checkGroups(h.shard(0), "q.x", 0, queue.GroupState{Group: "g1", Floor: 77})
}

func testDropGroups(h *harness) {
	s := h.shard(0)
	state := func(q, g string, p int, floor uint64) *queue.Batch {
		return &queue.Batch{
			Floors:     []queue.FloorWrite{{Queue: q, Group: g, Partition: p, Floor: floor}},
			Marks:      []queue.SettleMark{{Queue: q, Group: g, Partition: p, Offset: floor + 2, Set: true}},
			Deliveries: []queue.DeliveryMark{{Queue: q, Group: g, Partition: p, Offset: floor, Count: 1}},
		}
	}
	full := func(g string, floor uint64) queue.GroupState {
		return queue.GroupState{Group: g, Floor: floor, Settled: []uint64{floor + 2}, Deliveries: map[uint64]uint32{floor: 1}}
	}
	for _, w := range []struct {
		q, g  string
		p     int
		floor uint64
	}{
		{"q", "g1", 0, 10}, {"q", "g2", 0, 20}, {"q", "g", 0, 30}, {"q", "g1x", 0, 40},
		{"q", "g1", 1, 50}, {"q.b", "g1", 0, 60},
	} {
		h.write(s, state(w.q, w.g, w.p, w.floor), false)
	}
	h.write(s, &queue.Batch{DropGroups: []queue.GroupRef{{Queue: "q", Group: "g1", Partition: 0}}}, false)
	h.checkGroups(s, "q", 0, full("g", 30), full("g1x", 40), full("g2", 20))
	h.checkGroups(s, "q", 1, full("g1", 50))
	h.checkGroups(s, "q.b", 0, full("g1", 60))

	// Dropping is applied after the batch's other group writes.
	b := state("q", "g2", 0, 21)
	b.DropGroups = []queue.GroupRef{{Queue: "q", Group: "g2", Partition: 0}, {Queue: "q", Group: "none", Partition: 0}}
	h.write(s, b, false)
	h.checkGroups(s, "q", 0, full("g", 30), full("g1x", 40))

	h.reopen()
	h.checkGroups(h.shard(0), "q", 0, full("g", 30), full("g1x", 40))
	h.checkGroups(h.shard(0), "q", 1, full("g1", 50))
}

func testQueueMeta(h *harness) {
	s := h.shard(0)
	h.checkQueues(s)
	declared := queue.DefaultOptions()
	declared.Partitions = 3
	declared.Ordering = queue.OrderNone
	declared.MaxBytes = 1 << 30
	declared.AckTimeout = 1500 * time.Millisecond
	h.write(s, &queue.Batch{Queues: []queue.QueueMeta{
		{Name: "orders", Partitions: 3, Declared: &declared},
		{Name: "orders/$dlq", Partitions: 1},
		{Name: "a", Partitions: 8},
	}}, false)
	wantDeclared := declared
	declared.Partitions = 99 // the store keeps its own copy
	h.checkQueues(s,
		queue.QueueMeta{Name: "a", Partitions: 8},
		queue.QueueMeta{Name: "orders", Partitions: 3, Declared: &wantDeclared},
		queue.QueueMeta{Name: "orders/$dlq", Partitions: 1},
	)

	replaced := queue.DefaultOptions()
	replaced.Partitions = 16
	h.write(s, &queue.Batch{Queues: []queue.QueueMeta{{Name: "a", Partitions: 16, Declared: &replaced}}}, false)
	want := []queue.QueueMeta{
		{Name: "a", Partitions: 16, Declared: &replaced},
		{Name: "orders", Partitions: 3, Declared: &wantDeclared},
		{Name: "orders/$dlq", Partitions: 1},
	}
	h.checkQueues(s, want...)
	h.reopen()
	h.checkQueues(h.shard(0), want...)
	if h.n > 1 {
		h.checkQueues(h.shard(1))
	}
}

func testDropQueues(h *harness) {
	s := h.shard(0)
	h.write(s, &queue.Batch{Queues: []queue.QueueMeta{
		{Name: "a", Partitions: 2},
		{Name: "a/$dlq", Partitions: 2},
		{Name: "b", Partitions: 1},
	}}, true)
	// Dropping a queue the catalog does not hold is no error.
	h.write(s, &queue.Batch{DropQueues: []string{"a", "a/$dlq", "never"}}, true)
	h.checkQueues(s, queue.QueueMeta{Name: "b", Partitions: 1})
	h.reopen()
	h.checkQueues(h.shard(0), queue.QueueMeta{Name: "b", Partitions: 1})
	// Recorded again after a drop, a queue is back with its new metadata.
	s = h.shard(0)
	h.write(s, &queue.Batch{DropQueues: []string{"b"}}, true)
	h.write(s, &queue.Batch{Queues: []queue.QueueMeta{{Name: "b", Partitions: 4}}}, true)
	h.checkQueues(s, queue.QueueMeta{Name: "b", Partitions: 4})
}

// seedBatch writes a little of everything, so that a failed batch can be
// shown to have changed none of it.
func seedBatch() *queue.Batch {
	return &queue.Batch{
		Appends: appends("q", 0, 0, 1, 2),
		Floors:  []queue.FloorWrite{{Queue: "q", Group: "g", Partition: 0, Floor: 1}},
		Queues:  []queue.QueueMeta{{Name: "q", Partitions: 1}},
	}
}

// changeBatch touches everything seedBatch wrote.
func changeBatch() *queue.Batch {
	return &queue.Batch{
		Appends:    appends("q", 0, 3, 4),
		Deletes:    []queue.RangeDelete{{Queue: "q", Partition: 0, From: 0, To: 2}},
		Floors:     []queue.FloorWrite{{Queue: "q", Group: "g", Partition: 0, Floor: 2}, {Queue: "q", Group: "h", Partition: 0, Floor: 9}},
		Marks:      []queue.SettleMark{{Queue: "q", Group: "g", Partition: 0, Offset: 3, Set: true}},
		Deliveries: []queue.DeliveryMark{{Queue: "q", Group: "g", Partition: 0, Offset: 2, Count: 1}},
		Queues:     []queue.QueueMeta{{Name: "q", Partitions: 2}, {Name: "r", Partitions: 1}},
		DropGroups: []queue.GroupRef{{Queue: "q", Group: "h", Partition: 0}},
	}
}

func (h *harness) checkSeedOnly(s queue.Shard) {
	h.t.Helper()
	h.checkOffsets(s, "q", 0, 0, 1, 2)
	h.checkBounds(s, "q", 0, 0, 3)
	h.checkGroups(s, "q", 0, queue.GroupState{Group: "g", Floor: 1})
	h.checkQueues(s, queue.QueueMeta{Name: "q", Partitions: 1})
}

func testInvalidBatch(h *harness) {
	s := h.shard(0)
	h.write(s, seedBatch(), false)
	bad := []struct {
		name  string
		spoil func(b *queue.Batch)
	}{
		{"negative partition", func(b *queue.Batch) { b.Appends = append(b.Appends, appends("q", -1, 5)...) }},
		{"partition past 2^32", func(b *queue.Batch) {
			b.Marks = append(b.Marks, queue.SettleMark{Queue: "q", Group: "g", Partition: 1 << 33, Offset: 1, Set: true})
		}},
		{"nil message", func(b *queue.Batch) { b.Appends = append(b.Appends, queue.Append{Queue: "q", Partition: 0}) }},
		{"empty queue name", func(b *queue.Batch) { b.Queues = append(b.Queues, queue.QueueMeta{Partitions: 1}) }},
		{"NUL in queue name", func(b *queue.Batch) {
			b.Deletes = append(b.Deletes, queue.RangeDelete{Queue: "q\x00", Partition: 0, From: 0, To: 1})
		}},
		{"NUL in group name", func(b *queue.Batch) {
			b.DropGroups = append(b.DropGroups, queue.GroupRef{Queue: "q", Group: "g\x00h", Partition: 0})
		}},
	}
	for _, c := range bad {
		b := changeBatch()
		c.spoil(b)
		if err := s.Write(b, true); err == nil {
			h.t.Fatalf("Write of a batch with a %s succeeded", c.name)
		}
		h.checkSeedOnly(s)
	}
}

func testFailedWrite(h *harness) {
	fi, ok := h.store.(FaultInjector)
	if !ok {
		h.t.Skipf("%T cannot inject faults", h.store)
	}
	s := h.shard(0)
	h.write(s, seedBatch(), true)
	boom := errors.New("disk on fire")
	fi.FailWrites(boom)
	if err := s.Write(changeBatch(), true); !errors.Is(err, boom) {
		h.t.Fatalf("Write with an injected fault returned %v, want %v", err, boom)
	}
	if err := s.Sync(); !errors.Is(err, boom) {
		h.t.Fatalf("Sync with an injected fault returned %v, want %v", err, boom)
	}
	h.checkSeedOnly(s)

	fi.FailWrites(nil)
	h.write(s, changeBatch(), true)
	h.checkOffsets(s, "q", 0, 2, 3, 4)
	h.checkBounds(s, "q", 0, 2, 5)
	h.checkGroups(s, "q", 0, queue.GroupState{Group: "g", Floor: 2, Settled: []uint64{3}, Deliveries: map[uint64]uint32{2: 1}})
	h.checkQueues(s, queue.QueueMeta{Name: "q", Partitions: 2}, queue.QueueMeta{Name: "r", Partitions: 1})
}

// testReopen writes a little of everything to each shard, reopens the
// store, and finds each shard holding its own data and nothing else.
func testReopen(h *harness, sync bool) {
	name := func(i int) string { return fmt.Sprintf("q%d", i) }
	for i := range h.n {
		s, q := h.shard(i), name(i)
		h.write(s, &queue.Batch{
			Appends: appends(q, i, span(0, 5)...),
			Deletes: []queue.RangeDelete{{Queue: q, Partition: i, From: 0, To: 1}},
			Floors:  []queue.FloorWrite{{Queue: q, Group: "g", Partition: i, Floor: 2}},
			Marks:   []queue.SettleMark{{Queue: q, Group: "g", Partition: i, Offset: 4, Set: true}},
			Queues:  []queue.QueueMeta{{Name: q, Partitions: h.n}},
		}, sync)
		b := &queue.Batch{
			Appends:    appends(q, i, 5),
			Deliveries: []queue.DeliveryMark{{Queue: q, Group: "g", Partition: i, Offset: 3, Count: 2}},
		}
		if sync {
			// A write without sync, made durable by Sync.
			h.write(s, b, false)
			if err := s.Sync(); err != nil {
				h.t.Fatalf("Sync: %v", err)
			}
		} else {
			h.write(s, b, false)
		}
	}
	h.reopen()
	for i := range h.n {
		s, q := h.shard(i), name(i)
		h.checkOffsets(s, q, i, span(1, 6)...)
		h.checkBounds(s, q, i, 1, 6)
		h.checkGroups(s, q, i, queue.GroupState{Group: "g", Floor: 2, Settled: []uint64{4}, Deliveries: map[uint64]uint32{3: 2}})
		h.checkQueues(s, queue.QueueMeta{Name: q, Partitions: h.n})
		for j := range h.n {
			if j != i {
				h.checkOffsets(s, name(j), j)
				h.checkBounds(s, name(j), j, 0, 0)
			}
		}
	}
	checkMessages(h.t, h.read(h.shard(0), "q0", 0, 5, 6, 1), []*queue.Message{message("q0", 0, 5)})
}

func testConcurrentReadWrite(h *harness) {
	s := h.shard(0)
	const (
		batches  = 60
		perBatch = 8
		keep     = 20
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				first, next, err := s.Bounds("q", 0)
				if err != nil || first > next {
					h.t.Errorf("reader %d: Bounds = (%d, %d), %v", r, first, next, err)
					return
				}
				msgs, err := s.Read("q", 0, first, next, 64)
				if err != nil {
					h.t.Errorf("reader %d: Read: %v", r, err)
					return
				}
				for i, m := range msgs {
					if m.Offset < first || m.Offset >= next || (i > 0 && m.Offset <= msgs[i-1].Offset) {
						h.t.Errorf("reader %d: Read(%d, %d) returned offsets %v", r, first, next, offsetsOf(msgs))
						return
					}
					if !bytes.Equal(m.Payload, payloadFor("q", 0, m.Offset)) {
						h.t.Errorf("reader %d: offset %d has payload %q", r, m.Offset, m.Payload)
						return
					}
				}
				if _, err := s.Groups("q", 0); err != nil {
					h.t.Errorf("reader %d: Groups: %v", r, err)
					return
				}
				if _, err := s.Queues(); err != nil {
					h.t.Errorf("reader %d: Queues: %v", r, err)
					return
				}
			}
		})
	}
	var next uint64
	for i := range batches {
		b := &queue.Batch{Appends: appends("q", 0, span(next, next+perBatch)...)}
		next += perBatch
		if i%10 == 9 {
			b.Deletes = []queue.RangeDelete{{Queue: "q", Partition: 0, From: 0, To: next - keep}}
			b.Floors = []queue.FloorWrite{{Queue: "q", Group: "g", Partition: 0, Floor: next - keep}}
			b.Queues = []queue.QueueMeta{{Name: "q", Partitions: i}}
		}
		if err := s.Write(b, i%2 == 0); err != nil {
			h.t.Errorf("Write %d: %v", i, err)
			break
		}
	}
	close(done)
	wg.Wait()
	if h.t.Failed() {
		h.t.FailNow()
	}
	low := uint64(batches*perBatch - keep)
	h.checkBounds(s, "q", 0, low, batches*perBatch)
	h.checkOffsets(s, "q", 0, span(low, batches*perBatch)...)
	h.checkGroups(s, "q", 0, queue.GroupState{Group: "g", Floor: low})
}

func testDedups(h *harness) {
	s := h.shard(0)
	at := time.UnixMilli(1700000000123).UTC()
	h.write(s, &queue.Batch{Dedups: []queue.DedupMark{
		{Queue: "q", Partition: 0, ID: "a", At: at},
		{Queue: "q", Partition: 0, ID: "a/b\x00c", At: at.Add(time.Second)},
		{Queue: "q", Partition: 1, ID: "a", At: at},
		{Queue: "q.b", Partition: 0, ID: "x", At: at},
	}}, true)
	h.write(s, &queue.Batch{Dedups: []queue.DedupMark{{Queue: "q", Partition: 1, ID: "a"}}}, false)
	h.reopen()
	s = h.shard(0)
	got, err := s.Dedups("q", 0)
	if err != nil {
		h.t.Fatal(err)
	}
	if len(got) != 2 || !got["a"].Equal(at) || !got["a/b\x00c"].Equal(at.Add(time.Second)) {
		h.t.Fatalf("dedups of q/0 = %v", got)
	}
	if got, _ := s.Dedups("q", 1); len(got) != 0 {
		h.t.Fatalf("removed dedup-id still there: %v", got)
	}
	if got, _ := s.Dedups("q.b", 0); len(got) != 1 {
		h.t.Fatalf("dedups of q.b/0 = %v", got)
	}
}
