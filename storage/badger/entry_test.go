package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
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
	recs, err := entryRecords(e.key, n, e.val, nil)
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

func TestEntryCorrupt(t *testing.T) {
	good := sampleEntry()
	n := partitionPrefixLen("q")
	check := func(name string, key, val []byte) {
		t.Helper()
		_, err := entryRecords(key, n, val, nil)
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
	check("under a shorter span", entryKey("q", 3, 5, 6), good.val)
	check("under a longer span", entryKey("q", 3, 5, 8), good.val)
	check("under a reversed span", entryKey("q", 3, 7, 5), good.val)
	check("under an old message key", good.key[:n+8], good.val)

	// Bodies that pass the checksum but not the structure.
	seal := func(key []byte, body ...byte) []byte {
		v := append([]byte{entryVersion, 0, 0, 0, 0}, body...)
		binary.BigEndian.PutUint32(v[1:], entryCRC(key, body))
		return v
	}
	k := entryKey("q", 3, 0, 1)
	check("one record for two offsets", k, seal(k, 1, 'a'))
	check("three records for two offsets", k, seal(k, 1, 'a', 1, 'b', 1, 'c'))
	check("record past the end", k, seal(k, 1, 'a', 5, 'b'))
	check("bad length", k, seal(k, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01))
	huge := entryKey("q", 3, 0, 1<<62)
	check("a huge count", huge, seal(huge, 1, 'a'))
	v2 := seal(k, 1, 'a', 1, 'b')
	v2[0] = 2
	check("version 2", k, v2)
	if recs, err := entryRecords(k, n, seal(k, 1, 'a', 0), nil); err != nil || len(recs) != 2 || string(recs[0]) != "a" || len(recs[1]) != 0 {
		t.Errorf("a well-formed entry: %q, %v", recs, err)
	}
}

// FuzzDecodeEntry: entryRecords never panics, its errors wrap
// ErrCorruptRecord, and an entry it accepts holds one record per offset
// of its key and is written again by entryWriter into an entry that
// decodes to the same records. With seal set, the fuzzer's value gets a
// valid checksum first, so that what follows the header is explored.
func FuzzDecodeEntry(f *testing.F) {
	good := sampleEntry()
	n := partitionPrefixLen("q")
	f.Add(uint64(5), uint64(7), good.val, false)
	f.Add(uint64(5), uint64(7), good.val[entryHeaderLen:], true)
	f.Add(uint64(0), uint64(1), []byte{1, 'a', 0}, true)
	f.Add(uint64(0), uint64(0), []byte{}, false)
	f.Add(uint64(1), uint64(0), []byte{1, 'a'}, true)
	f.Fuzz(func(t *testing.T, first, last uint64, body []byte, seal bool) {
		key := entryKey("q", 3, first, last)
		val := body
		if seal {
			val = append([]byte{entryVersion, 0, 0, 0, 0}, body...)
			binary.BigEndian.PutUint32(val[1:], entryCRC(key, body))
		}
		recs, err := entryRecords(key, n, val, nil)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("error does not wrap ErrCorruptRecord: %v", err)
			}
			return
		}
		if uint64(len(recs)) != last-first+1 {
			t.Fatalf("%d records for offsets %d to %d", len(recs), first, last)
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
			rs, err := entryRecords(w.key, n, w.val, nil)
			if err != nil {
				t.Fatalf("re-encoded entry does not decode: %v", err)
			}
			again = append(again, rs...)
		}
		if len(again) != len(recs) {
			t.Fatalf("re-encoded entries hold %d records, want %d", len(again), len(recs))
		}
		for i := range recs {
			if !bytes.Equal(again[i], recs[i]) {
				t.Fatalf("record %d differs after re-encoding", i)
			}
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
