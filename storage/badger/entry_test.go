package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/shardq/shardq/queue"
)

// writtenEntry is an entry an entryWriter handed over.
type writtenEntry struct {
	key, val []byte
}

// collectEntries returns an entryWriter whose entries land in *out.
func collectEntries(out *[]writtenEntry) *entryWriter {
	return &entryWriter{set: func(k, v []byte) error {
		*out = append(*out, writtenEntry{k, v})
		return nil
	}}
}

// decodeEntry decodes every message of an entry of queue q.
func decodeEntry(t *testing.T, q string, e writtenEntry) []*queue.Message {
	t.Helper()
	n := partitionPrefixLen(q)
	recs, err := entryRecords(e.key, n, e.val, 0, math.MaxUint64, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := entrySpan(e.key, n)
	var out []*queue.Message
	for i, r := range recs {
		m, err := DecodeMessage(r, first+uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestEntryCutsRuns(t *testing.T) {
	var got []writtenEntry
	e := collectEntries(&got)
	var want []*queue.Message
	add := func(q string, p uint32, offs ...uint64) {
		t.Helper()
		if err := e.partition(q, p); err != nil {
			t.Fatal(err)
		}
		for _, off := range offs {
			m := sampleMessage()
			m.Offset = off
			m.Payload = fmt.Appendf(nil, "%s/%d/%d", q, p, off)
			if off%3 == 0 {
				m.DeadLetter = nil
			}
			if err := e.addMessage(m); err != nil {
				t.Fatal(err)
			}
			want = append(want, m)
		}
	}
	add("q", 0, span(0, 2500)...)                 // cut at 1,024 messages
	add("q", 1, 7, 8, 10, 11, 12, 1<<40)          // cut where offsets skip
	add("q", 2, 1<<63-1, 1<<63, 1<<64-2, 1<<64-1) // up to the last offset
	add("r", 2, 0)                                // another queue
	if err := e.flush(); err != nil {
		t.Fatal(err)
	}
	type entrySpanWant struct {
		q           string
		p           uint32
		first, last uint64
	}
	wantSpans := []entrySpanWant{
		{"q", 0, 0, 1023}, {"q", 0, 1024, 2047}, {"q", 0, 2048, 2499},
		{"q", 1, 7, 8}, {"q", 1, 10, 12}, {"q", 1, 1 << 40, 1 << 40},
		{"q", 2, 1<<63 - 1, 1 << 63}, {"q", 2, 1<<64 - 2, 1<<64 - 1},
		{"r", 2, 0, 0},
	}
	if len(got) != len(wantSpans) {
		t.Fatalf("%d entries, want %d", len(got), len(wantSpans))
	}
	var read []*queue.Message
	for i, w := range wantSpans {
		if k := entryKey(w.q, w.p, w.first, w.last); !bytes.Equal(got[i].key, k) {
			t.Fatalf("entry %d has key %q, want %q", i, got[i].key, k)
		}
		read = append(read, decodeEntry(t, w.q, got[i])...)
	}
	if !reflect.DeepEqual(read, want) {
		t.Fatal("decoded messages differ from the written ones")
	}
}

func TestEntryCutsBySize(t *testing.T) {
	var got []writtenEntry
	e := collectEntries(&got)
	if err := e.partition("q", 0); err != nil {
		t.Fatal(err)
	}
	sizes := []int{300 << 10, 300 << 10, 300 << 10, 300 << 10, 2 << 20, 10, 10}
	for i, n := range sizes {
		if err := e.addMessage(&queue.Message{Offset: uint64(i), Payload: bytes.Repeat([]byte{byte(i)}, n)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.flush(); err != nil {
		t.Fatal(err)
	}
	// Three of 300 KiB fit 1 MiB, the fourth does not; the 2 MiB message
	// is alone.
	want := [][2]uint64{{0, 2}, {3, 3}, {4, 4}, {5, 6}}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	n := partitionPrefixLen("q")
	for i, w := range want {
		first, last, _ := entrySpan(got[i].key, n)
		if first != w[0] || last != w[1] {
			t.Errorf("entry %d holds %d to %d, want %d to %d", i, first, last, w[0], w[1])
		}
		if len(got[i].val) > entryMaxBytes && first != last {
			t.Errorf("entry %d of %d messages has %d bytes", i, last-first+1, len(got[i].val))
		}
		for j, m := range decodeEntry(t, "q", got[i]) {
			if len(m.Payload) != sizes[int(first)+j] {
				t.Errorf("offset %d: %d-byte payload, want %d", m.Offset, len(m.Payload), sizes[int(first)+j])
			}
		}
	}
}

// sampleEntry returns an entry of offsets 5 to 7 of q/3.
func sampleEntry() writtenEntry {
	var got []writtenEntry
	e := collectEntries(&got)
	err := e.partition("q", 3)
	for off := uint64(5); off < 8 && err == nil; off++ {
		m := sampleMessage()
		m.Offset = off
		err = e.addMessage(m)
	}
	if err == nil {
		err = e.flush()
	}
	if err != nil || len(got) != 1 {
		panic(fmt.Sprintf("%d entries, %v", len(got), err))
	}
	return got[0]
}

// rawRecord is a record as an entry holds it, at off of partition q/3.
func rawRecord(off uint64, rec string) []byte {
	seed := crc32.Checksum(partitionPrefix(kindMessage, "q", 3), castagnoli)
	b := binary.AppendUvarint(nil, uint64(len(rec)))
	b = binary.BigEndian.AppendUint32(b, recordCRC(seed, off, []byte(rec)))
	return append(b, rec...)
}

func rawEntry(parts ...[]byte) []byte {
	return append([]byte{entryVersion}, bytes.Join(parts, nil)...)
}

func TestEntryCorrupt(t *testing.T) {
	good := sampleEntry()
	n := partitionPrefixLen("q")
	check := func(name string, key, val []byte) {
		t.Helper()
		_, err := entryRecords(key, n, val, 0, math.MaxUint64, nil)
		if !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: err = %v, want ErrCorruptRecord", name, err)
		}
	}
	for i := range len(good.val) {
		check(fmt.Sprintf("%d of %d bytes", i, len(good.val)), good.key, good.val[:i])
		flipped := bytes.Clone(good.val)
		flipped[i] ^= 0x10
		check(fmt.Sprintf("byte %d changed", i), good.key, flipped)
	}
	check("trailing byte", good.key, append(bytes.Clone(good.val), 0))
	check("under another partition's key", entryKey("q", 4, 5, 7), good.val)
	check("under other offsets", entryKey("q", 3, 6, 8), good.val)
	check("under a shorter span", entryKey("q", 3, 5, 6), good.val)
	check("under a longer span", entryKey("q", 3, 5, 8), good.val)
	check("under a reversed span", entryKey("q", 3, 7, 5), good.val)
	check("under an old message key", good.key[:n+8], good.val)

	// Records that check out, in values that do not.
	k := entryKey("q", 3, 0, 1)
	check("one record for two offsets", k, rawEntry(rawRecord(0, "a")))
	check("three records for two offsets", k, rawEntry(rawRecord(0, "a"), rawRecord(1, "b"), rawRecord(2, "c")))
	check("records swapped", k, rawEntry(rawRecord(1, "b"), rawRecord(0, "a")))
	check("record past the end", k, rawEntry(rawRecord(0, "a"), rawRecord(1, "bcdef")[:8]))
	check("bad length", k, rawEntry(rawRecord(0, "a"), []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 0, 0, 0}))
	check("a huge count", entryKey("q", 3, 0, 1<<62), rawEntry(rawRecord(0, "a"), rawRecord(1, "b")))
	v2 := rawEntry(rawRecord(0, "a"), rawRecord(1, "b"))
	v2[0] = 2
	check("version 2", k, v2)
	well := rawEntry(rawRecord(0, "a"), rawRecord(1, ""))
	if recs, err := entryRecords(k, n, well, 0, math.MaxUint64, nil); err != nil || len(recs) != 2 || string(recs[0]) != "a" || len(recs[1]) != 0 {
		t.Errorf("a well-formed entry: %q, %v", recs, err)
	}

	// A read checks the checksums of the records it returns only, and the
	// layout of them all.
	bad := rawEntry(rawRecord(0, "a"), rawRecord(1, "b"), rawRecord(2, "c"))
	bad[len(bad)-1] = 'x'
	k = entryKey("q", 3, 0, 2)
	if recs, err := entryRecords(k, n, bad, 0, 1, nil); err != nil || len(recs) != 2 {
		t.Errorf("reading the sound records of an entry: %q, %v", recs, err)
	}
	check("reading the damaged record", k, bad)
	if _, err := entryRecords(k, n, bad[:len(bad)-1], 0, 0, nil); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("reading one record of a cut entry: %v", err)
	}
}

// fixChecksums sets the checksum of every record of v, read as
// entryRecords reads it, for an entry of partition q/3 from first on, as
// far as its layout goes.
func fixChecksums(v []byte, first uint64) {
	if len(v) < entryHeaderLen {
		return
	}
	seed := crc32.Checksum(partitionPrefix(kindMessage, "q", 3), castagnoli)
	body := v[entryHeaderLen:]
	for off := first; ; off++ {
		n, k := binary.Uvarint(body)
		if k <= 0 || len(body)-k < recordCRCLen || n > uint64(len(body)-k-recordCRCLen) {
			return
		}
		rec := body[k+recordCRCLen : k+recordCRCLen+int(n)]
		binary.BigEndian.PutUint32(body[k:], recordCRC(seed, off, rec))
		body = body[k+recordCRCLen+int(n):]
	}
}

// FuzzDecodeEntry: entryRecords never panics, its errors wrap
// ErrCorruptRecord, and an entry it accepts holds one record per offset
// of its key and is written again by entryWriter into entries that decode
// to the same records; reading a window of it returns that part of them.
// With fix set, the records of the fuzzer's value get valid checksums
// first, so that the layout around them is explored.
func FuzzDecodeEntry(f *testing.F) {
	good := sampleEntry()
	n := partitionPrefixLen("q")
	f.Add(uint64(5), uint64(7), good.val, false, uint64(6), uint64(6))
	f.Add(uint64(5), uint64(7), good.val, true, uint64(0), uint64(100))
	f.Add(uint64(0), uint64(1), rawEntry(rawRecord(0, "a"), rawRecord(1, "")), false, uint64(1), uint64(1))
	f.Add(uint64(0), uint64(0), []byte{}, false, uint64(0), uint64(0))
	f.Add(uint64(1), uint64(0), []byte{entryVersion, 1, 0, 0, 0, 0, 'a'}, true, uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, first, last uint64, val []byte, fix bool, lo, hi uint64) {
		key := entryKey("q", 3, first, last)
		if fix {
			fixChecksums(val, first)
		}
		recs, err := entryRecords(key, n, val, 0, math.MaxUint64, nil)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("error does not wrap ErrCorruptRecord: %v", err)
			}
			return
		}
		if uint64(len(recs)) != last-first+1 {
			t.Fatalf("%d records for offsets %d to %d", len(recs), first, last)
		}
		window, err := entryRecords(key, n, val, lo, hi, nil)
		if err != nil {
			t.Fatalf("a window of an entry that checks out: %v", err)
		}
		wlo, whi := max(lo, first), min(hi, last)
		if wlo > whi {
			if len(window) != 0 {
				t.Fatalf("%d records outside the entry", len(window))
			}
		} else if !slices.EqualFunc(window, recs[wlo-first:whi-first+1], bytes.Equal) {
			t.Fatalf("window %d to %d differs from the whole entry's records", lo, hi)
		}

		var got []writtenEntry
		e := collectEntries(&got)
		if err := e.partition("q", 3); err != nil {
			t.Fatal(err)
		}
		for i, r := range recs {
			if err := e.addRecord(first+uint64(i), r); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.flush(); err != nil {
			t.Fatal(err)
		}
		var again [][]byte
		for _, w := range got {
			rs, err := entryRecords(w.key, n, w.val, 0, math.MaxUint64, nil)
			if err != nil {
				t.Fatalf("re-encoded entry does not decode: %v", err)
			}
			again = append(again, rs...)
		}
		if !slices.EqualFunc(again, recs, bytes.Equal) {
			t.Fatal("re-encoded entries hold other records")
		}
	})
}

// span returns the offsets from..to-1.
func span(from, to uint64) []uint64 {
	var out []uint64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}
