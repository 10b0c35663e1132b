package badger

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// A partition's messages are stored as entries (entry.go), each holding a
// run of consecutive offsets. Two things keep reads simple: the entries of
// a partition never overlap, and every entry ends at or after the
// partition's trim point, below which stored records are deleted
// messages (see deleteMessages).

// partKey names a partition in memory.
type partKey struct {
	q string
	p uint32
}

// tail bounds what a partition stores: every entry ends at or before last,
// and the trim point is at most last+1. none: no entry and no trim point.
// An append past last overlaps nothing and is not hidden.
type tail struct {
	last uint64
	none bool
}

// after returns the tail once offsets up to last are stored.
func (t tail) after(last uint64) tail {
	if t.none || last > t.last {
		return tail{last: last}
	}
	return t
}

// applyAppends writes the appends of each partition as entries, one per
// run of consecutive offsets, cut at entryMaxMessages records or before
// entryMaxBytes. Appends past everything their partition stores, the only
// kind the queue makes, are encoded straight into two buffers: two
// allocations for the batch rather than two per message. Other appends go
// through mergeAppends. Of two appends of one offset the later wins.
// s.writeMu must be held.
func (s *Shard) applyAppends(w *txnWriter, appends []queue.Append) error {
	if len(appends) == 0 {
		return nil
	}
	appends = sortAppends(appends)
	size := 0
	for _, a := range appends {
		hint := recordSizeHint(a.Message)
		size += uvarintLen(uint64(hint)) + hint
	}
	e := &entryWriter{
		set:  w.set,
		keys: make([]byte, 0, 4*entryKeyLen(appends[0].Queue)),
		vals: make([]byte, 0, size+4*entryHeaderLen),
	}
	for len(appends) > 0 {
		n := 1
		for n < len(appends) && appends[n].Partition == appends[0].Partition && appends[n].Queue == appends[0].Queue {
			n++
		}
		run := appends[:n]
		appends = appends[n:]

		q, p := run[0].Queue, uint32(run[0].Partition)
		if err := e.partition(q, p); err != nil {
			return err
		}
		k := partKey{q, p}
		t, ok := s.tails[k]
		if !ok {
			var err error
			if t, err = loadTail(w.txn, q, p); err != nil {
				return err
			}
		}
		// Raised before anything is written: it must bound what is stored
		// even if the write fails half way.
		s.tails[k] = t.after(run[len(run)-1].Message.Offset)
		var err error
		if t.none || run[0].Message.Offset > t.last {
			err = addMessages(e, run)
			if err == nil {
				err = s.holesBelowLow(w, q, p, run[0].Message.Offset)
			}
		} else {
			err = mergeAppends(w, e, q, p, run)
		}
		if err != nil {
			return err
		}
	}
	return e.flush()
}

// addMessages adds the messages of appends sorted by offset to e.
func addMessages(e *entryWriter, run []queue.Append) error {
	for i, a := range run {
		if i+1 < len(run) && run[i+1].Message.Offset == a.Message.Offset {
			continue // the later append of the offset wins
		}
		if err := e.addMessage(a.Message); err != nil {
			return err
		}
	}
	return nil
}

func compareAppends(a, b queue.Append) int {
	if c := strings.Compare(a.Queue, b.Queue); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
		return c
	}
	return cmp.Compare(a.Message.Offset, b.Message.Offset)
}

// sortAppends returns the appends by queue, partition and offset, keeping
// the order of appends of one offset; a sorted slice is returned as it is.
func sortAppends(appends []queue.Append) []queue.Append {
	if slices.IsSortedFunc(appends, compareAppends) {
		return appends
	}
	sorted := slices.Clone(appends)
	slices.SortStableFunc(sorted, compareAppends)
	return sorted
}

// loadTail reads a partition's tail from storage.
func loadTail(txn *bdg.Txn, q string, p uint32) (tail, error) {
	t0, err := getTrim(txn, q, p)
	if err != nil {
		return tail{}, err
	}
	trim := t0.at
	t := tail{none: true}
	if trim > 0 {
		t = tail{last: trim - 1}
	}
	prefix := partitionPrefix(kindMessage, q, p)
	k, ok := edgeKey(txn, prefix, entryKey(q, p, math.MaxUint64, math.MaxUint64), true)
	if !ok {
		return t, nil
	}
	_, last, ok := entrySpan(k, len(prefix))
	if !ok {
		return tail{}, badEntryKey(k)
	}
	return t.after(last), nil
}

// mergeAppends writes appends, sorted by offset, at offsets the partition
// may store already or below its trim point, which the queue never does:
// the entries they overlap are read and written again with the new
// records in place of the old. An append below the trim point would be
// hidden by it: the trim point is then removed, and the records below it
// with it. e is directed at the partition; the caller flushes it.
func mergeAppends(w *txnWriter, e *entryWriter, q string, p uint32, run []queue.Append) error {
	lo, hi := run[0].Message.Offset, run[len(run)-1].Message.Offset
	tp, err := getTrim(w.txn, q, p)
	if err != nil {
		return err
	}
	trim := tp.at
	dropTrim := trim > lo
	if dropTrim {
		lo, hi = 0, max(hi, trim-1)
	}
	keys, err := entriesIn(w.txn, q, p, lo, hi)
	if err != nil {
		return err
	}
	var old []storedRecord
	for _, k := range keys {
		recs, err := readEntry(w.txn, k, partitionPrefixLen(q))
		if err == nil {
			err = w.del(k)
		}
		if err != nil {
			return err
		}
		old = append(old, recs...)
	}
	if dropTrim {
		old = slices.DeleteFunc(old, func(r storedRecord) bool { return r.off < trim })
	}
	if err := markHoles(w, q, p, dropTrim); err != nil {
		return err
	}
	i := 0
	for j, a := range run {
		off := a.Message.Offset
		if j+1 < len(run) && run[j+1].Message.Offset == off {
			continue
		}
		for ; i < len(old) && old[i].off < off; i++ {
			if err := e.addRecord(old[i].off, old[i].rec); err != nil {
				return err
			}
		}
		if i < len(old) && old[i].off == off {
			i++ // replaced
		}
		if err := e.addMessage(a.Message); err != nil {
			return err
		}
	}
	for ; i < len(old); i++ {
		if err := e.addRecord(old[i].off, old[i].rec); err != nil {
			return err
		}
	}
	return nil
}

// storedRecord is a record read from an entry, with its offset.
type storedRecord struct {
	off uint64
	rec []byte
}

// readEntry reads and checks the entry stored under key; the records are
// copies.
func readEntry(txn *bdg.Txn, key []byte, prefixLen int) ([]storedRecord, error) {
	item, err := txn.Get(key)
	if err != nil {
		return nil, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	recs, err := entryRecords(key, prefixLen, v, 0, math.MaxUint64, nil)
	if err != nil {
		return nil, err
	}
	first, _, _ := entrySpan(key, prefixLen)
	out := make([]storedRecord, len(recs))
	for i, r := range recs {
		out[i] = storedRecord{off: first + uint64(i), rec: r}
	}
	return out, nil
}

// entriesIn returns the keys of the partition's entries that hold an
// offset in [lo, hi], in order.
func entriesIn(txn *bdg.Txn, q string, p uint32, lo, hi uint64) ([][]byte, error) {
	prefix := partitionPrefix(kindMessage, q, p)
	start := entryKey(q, p, lo, 0)
	// The entry holding lo, if any, is the last one starting at or before it.
	if k, ok := edgeKey(txn, prefix, entryKey(q, p, lo, math.MaxUint64), true); ok {
		_, last, ok := entrySpan(k, len(prefix))
		if !ok {
			return nil, badEntryKey(k)
		}
		if last >= lo {
			start = k
		}
	}
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix})
	defer it.Close()
	var keys [][]byte
	for it.Seek(start); it.Valid(); it.Next() {
		k := it.Item().Key()
		first, _, ok := entrySpan(k, len(prefix))
		if !ok {
			return nil, badEntryKey(k)
		}
		if first > hi {
			break
		}
		keys = append(keys, it.Item().KeyCopy(nil))
	}
	return keys, nil
}

// deleteRange deletes the messages in [r.From, r.To) and raises the low
// watermark to r.To. It sees the appends of its own batch.
func deleteRange(w *txnWriter, r queue.RangeDelete) error {
	p := uint32(r.Partition)
	if r.From < r.To {
		if err := deleteMessages(w, r.Queue, p, r.From, r.To); err != nil {
			return err
		}
	}
	lk := lowKey(r.Queue, p)
	low, found, err := getUint64(w.txn, lk)
	if err != nil || (found && low >= r.To) {
		return err
	}
	if r.From >= r.To {
		// The watermark moves past messages it does not delete.
		if err := markHoles(w, r.Queue, p, false); err != nil {
			return err
		}
	}
	return w.set(lk, putU64(r.To))
}

// deleteMessages deletes the partition's messages in [from, to).
//
// When no message below from is left, as whenever retention deletes, it
// deletes the entries that end below to, keys only, one tombstone per
// entry. An entry holding to and offsets below it stays on disk: the trim
// point, raised to to, hides its records below to from Read.
//
// A delete that leaves messages below from (a hole, which the queue never
// makes) deletes the entries inside the range and writes the one or two it
// cuts again without the deleted records.
func deleteMessages(w *txnWriter, q string, p uint32, from, to uint64) error {
	prefix := partitionPrefix(kindMessage, q, p)
	k, ok, err := frontEntry(w.lookup(), q, p)
	if err != nil || !ok {
		return err
	}
	first, _, ok := entrySpan(k, len(prefix))
	if !ok {
		return badEntryKey(k)
	}
	if first < from {
		t, err := getTrim(w.txn, q, p)
		if err != nil {
			return err
		}
		// Every entry ends at or after the trim point: the first message
		// left is at the later of the two.
		if max(first, t.at) < from {
			return cutHole(w, q, p, from, to, t.at)
		}
	}
	return trimTo(w, q, p, k, to)
}

// trimTo deletes the entries that end below to and, if an entry holds to
// and offsets below it, raises the trim point to to.
func trimTo(w *txnWriter, q string, p uint32, start []byte, to uint64) error {
	prefix := partitionPrefix(kindMessage, q, p)
	for {
		keys, straddle, err := entriesBelow(w.lookup(), prefix, start, to)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := w.del(k); err != nil {
				return err
			}
		}
		if straddle != nil || len(keys) < deleteChunk {
			t, err := getTrim(w.txn, q, p)
			if err != nil {
				return err
			}
			old := t
			if t.holes {
				// Started from the partition's first key: nothing is left
				// below to, and to reaches the low watermark.
				low, _, err := getUint64(w.txn, lowKey(q, p))
				if err != nil {
					return err
				}
				t.holes = to < low
			}
			switch {
			case to < t.at:
				// Below the trim point: the entry recorded as straddling it
				// is still there, and what lies below it is hidden.
			case straddle != nil:
				t.first, t.last, _ = entrySpan(straddle, len(prefix))
				t.at, t.straddle = to, true
			default:
				t.straddle = false // the entry it named, if any, is deleted
			}
			if t == old {
				return nil
			}
			return w.set(trimKey(q, p), t.encode())
		}
		// The smallest key after the last one.
		start = append(bytes.Clone(keys[len(keys)-1]), 0)
	}
}

// entriesBelow returns the keys of up to deleteChunk entries, from start
// on, that end below to, and whether the entry after them holds to and
// offsets below it. Its iterator is closed when it returns: a part of the
// batch may then be committed.
func entriesBelow(txn *bdg.Txn, prefix, start []byte, to uint64) (keys [][]byte, straddle []byte, err error) {
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix}) // keys only
	defer it.Close()
	for it.Seek(start); it.Valid() && len(keys) < deleteChunk; it.Next() {
		k := it.Item().Key()
		first, last, ok := entrySpan(k, len(prefix))
		if !ok {
			return nil, nil, badEntryKey(k)
		}
		if last >= to {
			if first < to {
				straddle = it.Item().KeyCopy(nil)
			}
			return keys, straddle, nil
		}
		keys = append(keys, it.Item().KeyCopy(nil))
	}
	return keys, nil, nil
}

// cutHole deletes the messages in [from, to) of a partition that keeps
// messages below from: the entries inside the range are deleted, those it
// cuts written again without the deleted records and those below the trim
// point.
func cutHole(w *txnWriter, q string, p uint32, from, to, trim uint64) error {
	keys, err := entriesIn(w.txn, q, p, from, to-1)
	if err != nil {
		return err
	}
	prefixLen := partitionPrefixLen(q)
	e := &entryWriter{set: w.set}
	if err := e.partition(q, p); err != nil {
		return err
	}
	for _, k := range keys {
		if first, last, _ := entrySpan(k, prefixLen); first >= from && last < to {
			if err := w.del(k); err != nil {
				return err
			}
			continue
		}
		recs, err := readEntry(w.txn, k, prefixLen)
		if err == nil {
			err = w.del(k)
		}
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.off >= trim && (r.off < from || r.off >= to) {
				if err := e.addRecord(r.off, r.rec); err != nil {
					return err
				}
			}
		}
	}
	if err := e.flush(); err != nil {
		return err
	}
	return markHoles(w, q, p, false)
}

// holesBelowLow marks holes (see trimPoint) when an append at first lands
// below the low watermark, which a delete past the last message can leave
// behind (the queue's deletes never reach past its committed offset).
func (s *Shard) holesBelowLow(w *txnWriter, q string, p uint32, first uint64) error {
	k := partKey{q, p}
	if low, ok := s.lows[k]; ok && first >= low {
		return nil
	}
	low, _, err := getUint64(w.txn, lowKey(q, p))
	if err != nil {
		return err
	}
	s.lows[k] = low
	if first >= low {
		return nil
	}
	return markHoles(w, q, p, false)
}

// markHoles records that entries may lie below the low watermark (see
// trimPoint); dropTrim also lets the records below the trim point show.
func markHoles(w *txnWriter, q string, p uint32, dropTrim bool) error {
	t, err := getTrim(w.txn, q, p)
	if err != nil {
		return err
	}
	if dropTrim {
		t = trimPoint{}
	}
	t.holes, t.straddle = true, false
	return w.set(trimKey(q, p), t.encode())
}

// Read returns up to max messages of the partition with from <= offset < to,
// in offset order, from one snapshot. Messages below the trim point are
// deleted ones, never returned.
func (s *Shard) Read(q string, partition int, from, to uint64, max int) ([]*queue.Message, error) {
	return s.ReadBytes(q, partition, from, to, max, 0)
}

// ReadBytes is Read that also stops at the message whose payload brings
// the payloads read to maxBytes (0: no such bound).
func (s *Shard) ReadBytes(q string, partition int, from, to uint64, max int, maxBytes int64) ([]*queue.Message, error) {
	p, err := checkRef(q, "", partition)
	if err != nil || max <= 0 || from >= to {
		return nil, err
	}
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	r := &reader{q: q, p: p, prefixLen: partitionPrefixLen(q), from: from, to: to, max: max, maxBytes: maxBytes}
	if err := r.read(txn); err != nil {
		return nil, fmt.Errorf("storage: shard %d: read %s/%d: %w", s.id, q, p, err)
	}
	return r.out, nil
}

// reader is one Read.
type reader struct {
	q         string
	p         uint32
	prefixLen int
	from, to  uint64
	max       int
	maxBytes  int64 // 0: none

	out   []*queue.Message
	bytes int64    // payload bytes in out
	recs  [][]byte // reused for every entry
	end   bool     // an entry reached to
}

// read looks for the entry holding from with a reverse iterator, as the
// last one starting at or before it, and reads it; only if more is wanted
// does it read the entries after it with a forward iterator.
func (r *reader) read(txn *bdg.Txn) error {
	t, err := getTrim(txn, r.q, r.p)
	if err != nil {
		return err
	}
	r.from = max(r.from, t.at)
	if r.from >= r.to {
		return nil
	}
	r.out = make([]*queue.Message, 0, min(r.max, 64))
	prefix := partitionPrefix(kindMessage, r.q, r.p)
	// Reading from the oldest live entry on, start there with a forward
	// iterator: a reverse one would step back over retention's tombstones.
	front, ok, err := frontEntry(txn, r.q, r.p)
	if err != nil || !ok {
		return err
	}
	if _, last, ok := entrySpan(front, r.prefixLen); ok && r.from <= last {
		it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(front); it.Valid() && !r.done(); it.Next() {
			if err := r.take(it.Item()); err != nil {
				return err
			}
		}
		return nil
	}
	next := entryKey(r.q, r.p, r.from, 0)
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix, Reverse: true})
	it.Seek(entryKey(r.q, r.p, r.from, math.MaxUint64))
	if it.Valid() {
		item := it.Item()
		_, last, ok := entrySpan(item.Key(), r.prefixLen)
		if !ok {
			it.Close()
			return badEntryKey(item.Key())
		}
		if last >= r.from {
			err = r.take(item)
			if last == math.MaxUint64 {
				r.end = true
			}
			next = entryKey(r.q, r.p, last+1, 0)
		}
	}
	it.Close()
	if err != nil || r.done() {
		return err
	}
	it = txn.NewIterator(bdg.IteratorOptions{Prefix: prefix})
	defer it.Close()
	for it.Seek(next); it.Valid() && !r.done(); it.Next() {
		if err := r.take(it.Item()); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) done() bool { return r.end || len(r.out) >= r.max }

// take decodes the messages of an entry that Read returns.
func (r *reader) take(item *bdg.Item) error {
	key := item.Key()
	first, _, ok := entrySpan(key, r.prefixLen)
	if !ok {
		return badEntryKey(key)
	}
	if first >= r.to {
		r.end = true
		return nil
	}
	// The offsets wanted from this entry: lo to hi.
	lo := max(r.from, first)
	hi := r.to - 1
	if want := uint64(r.max - len(r.out)); lo+want-1 >= lo { // no overflow
		hi = min(hi, lo+want-1)
	}
	return item.Value(func(v []byte) error {
		recs, err := entryRecords(key, r.prefixLen, v, lo, hi, r.recs)
		r.recs = recs
		if err != nil {
			return err
		}
		for i, rec := range recs {
			m, err := DecodeMessage(rec, lo+uint64(i))
			if err != nil {
				return err
			}
			r.out = append(r.out, m)
			if r.bytes += int64(len(m.Payload)); r.maxBytes > 0 && r.bytes >= r.maxBytes {
				r.end = true
				break
			}
		}
		if len(recs) > 0 && lo+uint64(len(recs)) > r.to-1 {
			r.end = true
		}
		return nil
	})
}

// Bounds returns max(low watermark, first offset) and max(last offset + 1,
// low watermark), from one snapshot. The first offset is the first entry's
// even when the trim point hides it: the watermark is at or above the trim
// point.
func (s *Shard) Bounds(q string, partition int) (first, next uint64, err error) {
	p, err := checkRef(q, "", partition)
	if err != nil {
		return 0, 0, err
	}
	if err := s.acquire(); err != nil {
		return 0, 0, err
	}
	defer s.mu.RUnlock()
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	first, next, err = bounds(txn, q, p)
	if err != nil {
		return 0, 0, fmt.Errorf("storage: shard %d: bounds of %s/%d: %w", s.id, q, p, err)
	}
	return first, next, nil
}

func bounds(txn *bdg.Txn, q string, p uint32) (first, next uint64, err error) {
	low, _, err := getUint64(txn, lowKey(q, p))
	if err != nil {
		return 0, 0, err
	}
	prefix := partitionPrefix(kindMessage, q, p)
	firstKey, ok, err := frontEntry(txn, q, p)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return low, low, nil
	}
	lastKey, _ := edgeKey(txn, prefix, entryKey(q, p, math.MaxUint64, math.MaxUint64), true)
	f, _, ok := entrySpan(firstKey, len(prefix))
	if !ok {
		return 0, 0, badEntryKey(firstKey)
	}
	_, l, ok := entrySpan(lastKey, len(prefix))
	if !ok {
		return 0, 0, badEntryKey(lastKey)
	}
	first = max(low, f)
	if l < math.MaxUint64 {
		next = max(low, l+1)
	} else {
		next = math.MaxUint64
	}
	return first, next, nil
}

// edgeKey returns the first key with the prefix at or after seek, or with
// reverse the last at or before it. It reads keys only.
func edgeKey(txn *bdg.Txn, prefix, seek []byte, reverse bool) ([]byte, bool) {
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix, Reverse: reverse})
	defer it.Close()
	it.Seek(seek)
	if !it.Valid() {
		return nil, false
	}
	return it.Item().KeyCopy(nil), true
}

// trimPoint is a partition's trim point and, when an entry holds offsets
// on both sides of it, that entry's span. Knowing the straddling entry
// lets every lookup of the partition's oldest entry seek straight to it:
// the keys before it are deleted, and an iterator that started at the
// partition's first key would step over every tombstone retention left
// there since the last compaction (one per committed batch).
//
// holes is set once a write left entries below the low watermark (a
// delete that keeps messages below its range, an append below the trim
// point: the queue makes neither): lookups then scan from the partition's
// first key, until a delete from there leaves nothing below the watermark.
type trimPoint struct {
	at          uint64
	straddle    bool
	holes       bool
	first, last uint64 // the straddling entry, when straddle
}

// getTrim reads the trim record: 8 bytes, or 25 with flags and a
// straddling entry.
func getTrim(txn *bdg.Txn, q string, p uint32) (trimPoint, error) {
	item, err := txn.Get(trimKey(q, p))
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return trimPoint{}, nil
	}
	var t trimPoint
	if err == nil {
		err = item.Value(func(v []byte) error {
			switch len(v) {
			case 8:
				t.at = binary.BigEndian.Uint64(v)
			case 25:
				t.at = binary.BigEndian.Uint64(v)
				t.straddle, t.holes = v[8]&trimStraddle != 0, v[8]&trimHoles != 0
				t.first, t.last = binary.BigEndian.Uint64(v[9:]), binary.BigEndian.Uint64(v[17:])
			default:
				return fmt.Errorf("%w: %d-byte trim record", ErrCorruptRecord, len(v))
			}
			return nil
		})
	}
	return t, err
}

// Flags of a 25-byte trim record.
const (
	trimStraddle byte = 1 << iota
	trimHoles
)

func (t trimPoint) encode() []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 25), t.at)
	if !t.straddle && !t.holes {
		return v
	}
	var flags byte
	if t.straddle {
		flags |= trimStraddle
	}
	if t.holes {
		flags |= trimHoles
	}
	v = append(v, flags)
	v = binary.BigEndian.AppendUint64(v, t.first)
	return binary.BigEndian.AppendUint64(v, t.last)
}

// frontKey returns a key at or before the partition's oldest live entry
// and after every entry retention deleted: the straddling entry's, else
// the first possible key at the low watermark.
func frontKey(txn *bdg.Txn, q string, p uint32) ([]byte, error) {
	low, _, err := getUint64(txn, lowKey(q, p))
	if err != nil {
		return nil, err
	}
	t, err := getTrim(txn, q, p)
	if err != nil {
		return nil, err
	}
	switch {
	case t.holes:
		return partitionPrefix(kindMessage, q, p), nil
	case t.straddle && t.last >= low:
		return entryKey(q, p, t.first, t.last), nil
	}
	return entryKey(q, p, low, 0), nil
}

// frontEntry returns the key of the partition's oldest live entry.
func frontEntry(txn *bdg.Txn, q string, p uint32) ([]byte, bool, error) {
	start, err := frontKey(txn, q, p)
	if err != nil {
		return nil, false, err
	}
	k, ok := edgeKey(txn, partitionPrefix(kindMessage, q, p), start, false)
	return k, ok, nil
}

// lookup is the transaction a delete reads entries from: the write
// transaction, or the snapshot Shard.apply chose for it.
func (w *txnWriter) lookup() *bdg.Txn {
	if w.useSnap {
		return w.snapshot()
	}
	return w.txn
}
