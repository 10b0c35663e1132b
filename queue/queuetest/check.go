package queuetest

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// harness owns the store a suite case works on and reopens it on the same
// directory.
type harness struct {
	t     *testing.T
	open  func(t *testing.T, dir string) queue.Store
	dir   string
	store queue.Store
	n     int // shard count
}

func newHarness(t *testing.T, open func(t *testing.T, dir string) queue.Store) *harness {
	t.Helper()
	h := &harness{t: t, open: open, dir: t.TempDir()}
	h.store = open(t, h.dir)
	h.n = len(h.store.Shards())
	if h.n == 0 {
		t.Fatal("store has no shards")
	}
	t.Cleanup(func() {
		if h.store != nil {
			if err := h.store.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return h
}

// shard returns shard i modulo the shard count.
func (h *harness) shard(i int) queue.Shard { return h.store.Shards()[i%h.n] }

// reopen closes the store and opens it again on the same directory.
func (h *harness) reopen() {
	h.t.Helper()
	st := h.store
	h.store = nil
	if err := st.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.store = h.open(h.t, h.dir)
	if n := len(h.store.Shards()); n != h.n {
		h.t.Fatalf("reopened store has %d shards, want %d", n, h.n)
	}
}

func (h *harness) write(s queue.Shard, b *queue.Batch, sync bool) {
	h.t.Helper()
	if err := s.Write(b, sync); err != nil {
		h.t.Fatalf("Write(%d writes): %v", b.Len(), err)
	}
}

// readAll returns every stored message of the partition.
func (h *harness) readAll(s queue.Shard, q string, p int) []*queue.Message {
	h.t.Helper()
	return h.read(s, q, p, 0, math.MaxUint64, math.MaxInt32)
}

func (h *harness) read(s queue.Shard, q string, p int, from, to uint64, max int) []*queue.Message {
	h.t.Helper()
	msgs, err := s.Read(q, p, from, to, max)
	if err != nil {
		h.t.Fatalf("Read(%s, %d, %d, %d, %d): %v", q, p, from, to, max, err)
	}
	return msgs
}

func (h *harness) checkOffsets(s queue.Shard, q string, p int, want ...uint64) {
	h.t.Helper()
	msgs := h.readAll(s, q, p)
	if got := offsetsOf(msgs); !slices.Equal(got, want) {
		h.t.Fatalf("%s/%d holds offsets %v, want %v", q, p, got, want)
	}
	for _, m := range msgs {
		if want := payloadFor(q, p, m.Offset); !bytes.Equal(m.Payload, want) {
			h.t.Fatalf("%s/%d offset %d has payload %q, want %q", q, p, m.Offset, m.Payload, want)
		}
	}
}

func (h *harness) checkBounds(s queue.Shard, q string, p int, wantFirst, wantNext uint64) {
	h.t.Helper()
	first, next, err := s.Bounds(q, p)
	if err != nil {
		h.t.Fatalf("Bounds(%s, %d): %v", q, p, err)
	}
	if first != wantFirst || next != wantNext {
		h.t.Fatalf("Bounds(%s, %d) = (%d, %d), want (%d, %d)", q, p, first, next, wantFirst, wantNext)
	}
}

func (h *harness) checkGroups(s queue.Shard, q string, p int, want ...queue.GroupState) {
	h.t.Helper()
	got, err := s.Groups(q, p)
	if err != nil {
		h.t.Fatalf("Groups(%s, %d): %v", q, p, err)
	}
	if !sameGroups(got, want) {
		h.t.Fatalf("Groups(%s, %d) =\n  %s\nwant\n  %s", q, p, formatGroups(got), formatGroups(want))
	}
}

func (h *harness) checkQueues(s queue.Shard, want ...queue.QueueMeta) {
	h.t.Helper()
	got, err := s.Queues()
	if err != nil {
		h.t.Fatalf("Queues: %v", err)
	}
	sortMetas := func(m []queue.QueueMeta) {
		slices.SortFunc(m, func(a, b queue.QueueMeta) int { return strings.Compare(a.Name, b.Name) })
	}
	got, want = slices.Clone(got), slices.Clone(want)
	sortMetas(got)
	sortMetas(want)
	if len(got) != len(want) {
		h.t.Fatalf("Queues = %s, want %s", formatMetas(got), formatMetas(want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			h.t.Fatalf("Queues = %s, want %s", formatMetas(got), formatMetas(want))
		}
	}
}

// payloadFor is the payload the suite gives the message at an offset, so
// that a message read from the wrong partition shows.
func payloadFor(q string, p int, off uint64) []byte {
	return fmt.Appendf(nil, "%s|%d|%d", q, p, off)
}

var suiteEpoch = time.Date(2025, 3, 14, 15, 9, 26, 535_897_932, time.UTC)

// message builds the suite's plain message for an offset.
func message(q string, p int, off uint64) *queue.Message {
	return &queue.Message{
		Offset:     off,
		Key:        fmt.Sprintf("key-%d", off%5),
		EnqueuedAt: suiteEpoch.Add(time.Duration(off) * time.Millisecond),
		Payload:    payloadFor(q, p, off),
	}
}

// appends returns Appends of the suite's plain messages.
func appends(q string, p int, offs ...uint64) []queue.Append {
	out := make([]queue.Append, len(offs))
	for i, off := range offs {
		out[i] = queue.Append{Queue: q, Partition: p, Message: message(q, p, off)}
	}
	return out
}

// span returns the offsets from..to-1.
func span(from, to uint64) []uint64 {
	var out []uint64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

func offsetsOf(msgs []*queue.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Offset
	}
	return out
}

// diffMessage lists the fields in which got differs from want. Times are
// compared at millisecond precision; nil and empty byte slices are equal.
func diffMessage(want, got *queue.Message) []string {
	var d []string
	add := func(field string, w, g any) {
		d = append(d, fmt.Sprintf("%s: got %v, want %v", field, g, w))
	}
	if want.Offset != got.Offset {
		add("Offset", want.Offset, got.Offset)
	}
	if want.Key != got.Key {
		add("Key", want.Key, got.Key)
	}
	if want.Subject != got.Subject {
		add("Subject", want.Subject, got.Subject)
	}
	for _, tm := range []struct {
		name   string
		w, got time.Time
	}{
		{"EnqueuedAt", want.EnqueuedAt, got.EnqueuedAt},
		{"NotBefore", want.NotBefore, got.NotBefore},
		{"ExpiresAt", want.ExpiresAt, got.ExpiresAt},
	} {
		if !sameMillis(tm.w, tm.got) {
			add(tm.name, tm.w, tm.got)
		}
	}
	wh, gh := want.Headers, got.Headers
	if wh.ContentType != gh.ContentType {
		add("Headers.ContentType", wh.ContentType, gh.ContentType)
	}
	if wh.ResponseTopic != gh.ResponseTopic {
		add("Headers.ResponseTopic", wh.ResponseTopic, gh.ResponseTopic)
	}
	if !bytes.Equal(wh.CorrelationData, gh.CorrelationData) {
		add("Headers.CorrelationData", wh.CorrelationData, gh.CorrelationData)
	}
	if wh.PayloadFormat != gh.PayloadFormat {
		add("Headers.PayloadFormat", wh.PayloadFormat, gh.PayloadFormat)
	}
	if wh.ExpiryInterval != gh.ExpiryInterval {
		add("Headers.ExpiryInterval", wh.ExpiryInterval, gh.ExpiryInterval)
	}
	if len(wh.User) != 0 || len(gh.User) != 0 {
		if !slices.Equal(wh.User, gh.User) {
			add("Headers.User", wh.User, gh.User)
		}
	}
	if !bytes.Equal(want.Payload, got.Payload) {
		add("Payload", fmt.Sprintf("%d bytes", len(want.Payload)), fmt.Sprintf("%d bytes", len(got.Payload)))
	}
	switch {
	case (want.DeadLetter == nil) != (got.DeadLetter == nil):
		add("DeadLetter", want.DeadLetter, got.DeadLetter)
	case want.DeadLetter != nil && *want.DeadLetter != *got.DeadLetter:
		add("DeadLetter", *want.DeadLetter, *got.DeadLetter)
	}
	return d
}

func checkMessages(t *testing.T, got, want []*queue.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("read %d messages (offsets %v), want %d (offsets %v)",
			len(got), offsetsOf(got), len(want), offsetsOf(want))
	}
	for i := range want {
		if d := diffMessage(want[i], got[i]); len(d) > 0 {
			t.Errorf("message %d (offset %d):\n  %s", i, want[i].Offset, strings.Join(d, "\n  "))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func sameMillis(a, b time.Time) bool {
	return a.Truncate(time.Millisecond).Equal(b.Truncate(time.Millisecond))
}

func sameGroups(got, want []queue.GroupState) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Group != w.Group || g.Floor != w.Floor || g.Filter != w.Filter || !slices.Equal(g.Settled, w.Settled) ||
			len(g.Deliveries) != len(w.Deliveries) {
			return false
		}
		for off, n := range w.Deliveries {
			if gn, ok := g.Deliveries[off]; !ok || gn != n {
				return false
			}
		}
	}
	return true
}

func formatGroups(gs []queue.GroupState) string {
	if len(gs) == 0 {
		return "(none)"
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		keys := make([]uint64, 0, len(g.Deliveries))
		for off := range g.Deliveries {
			keys = append(keys, off)
		}
		slices.Sort(keys)
		var dl []string
		for _, off := range keys {
			dl = append(dl, fmt.Sprintf("%d:%d", off, g.Deliveries[off]))
		}
		parts[i] = fmt.Sprintf("%q floor=%d filter=%q settled=%v deliveries={%s}", g.Group, g.Floor, g.Filter, g.Settled, strings.Join(dl, " "))
	}
	return strings.Join(parts, "\n  ")
}

func formatMetas(ms []queue.QueueMeta) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		decl := "nil"
		if m.Declared != nil {
			decl = fmt.Sprintf("%+v", *m.Declared)
		}
		parts[i] = fmt.Sprintf("{%q partitions=%d declared=%s}", m.Name, m.Partitions, decl)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
