package badger

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/shardq/shardq/queue"
)

// An entry holds the message records of a run of consecutive offsets of
// one partition, first to last, under the key m 0 queue 0 partition first
// last. Version 1 value:
//
//	version(1) crc(4) {length(uvarint) record}...
//
// with one record (EncodeMessage) per offset from first to last, in order.
// crc is the CRC-32C (Castagnoli), big-endian, of the whole key followed by
// the records part: a value that is damaged, cut short or stored under
// another key does not check out, and the key's offsets give the number of
// records, so that a length field damaged in a way the checksum misses
// still cannot shift a record to another offset.
const (
	entryVersion   byte = 1
	entryHeaderLen      = 5

	// An entry ends after entryMaxMessages records, or before the record
	// that would take its value past entryMaxBytes (a single larger record
	// has an entry to itself): reading one message of a cold partition
	// decodes at most that much, and a value stays below Badger's smallest
	// value-log file (Options.ValueLogFileSize), which bounds it.
	entryMaxMessages = 1024
	entryMaxBytes    = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeros [binary.MaxVarintLen64]byte

// entryWriter cuts records, given in offset order one partition after
// another, into entries and hands each to set. Keys and values are encoded
// into two buffers that grow by appending: a slice handed to set is never
// written again, so a transaction may hold on to it until it commits.
type entryWriter struct {
	set func(k, v []byte) error

	keys, vals []byte

	q     string
	p     uint32
	first uint64 // the open entry's first offset
	last  uint64 // and its last so far
	n     int    // records in the open entry; 0 when none is open
	start int    // where the open entry's value starts in vals
}

// partition flushes the open entry and directs the next records to
// partition p of queue q.
func (e *entryWriter) partition(q string, p uint32) error {
	err := e.flush()
	e.q, e.p = q, p
	return err
}

// addMessage adds the record of m at m.Offset.
func (e *entryWriter) addMessage(m *queue.Message) error {
	hint := recordSizeHint(m)
	room := uvarintLen(uint64(hint))
	if err := e.open(m.Offset, room+hint); err != nil {
		return err
	}
	// Room for the length of the longest record m can have; the record
	// moves back over what its actual length does not need.
	at := len(e.vals)
	e.vals = append(e.vals, zeros[:room]...)
	e.vals = appendMessage(e.vals, m)
	var lenBuf [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(lenBuf[:], uint64(len(e.vals)-at-room))
	if n < room {
		copy(e.vals[at+n:], e.vals[at+room:])
		e.vals = e.vals[:len(e.vals)-(room-n)]
	}
	copy(e.vals[at:], lenBuf[:n])
	return nil
}

// addRecord adds a record read from a stored entry at off.
func (e *entryWriter) addRecord(off uint64, rec []byte) error {
	if err := e.open(off, uvarintLen(uint64(len(rec)))+len(rec)); err != nil {
		return err
	}
	e.vals = binary.AppendUvarint(e.vals, uint64(len(rec)))
	e.vals = append(e.vals, rec...)
	return nil
}

// open makes room in an entry for the record at off, of at most size bytes
// with its length: the open entry if off continues it and the record fits,
// a new one otherwise.
func (e *entryWriter) open(off uint64, size int) error {
	if e.n > 0 {
		continues := e.last != math.MaxUint64 && off == e.last+1
		if !continues || e.n == entryMaxMessages || len(e.vals)-e.start+size > entryMaxBytes {
			if err := e.flush(); err != nil {
				return err
			}
		}
	}
	if e.n == 0 {
		e.first, e.start = off, len(e.vals)
		e.vals = append(e.vals, entryVersion, 0, 0, 0, 0)
	}
	e.last = off
	e.n++
	return nil
}

// flush seals the open entry, if any, and hands it to set.
func (e *entryWriter) flush() error {
	if e.n == 0 {
		return nil
	}
	e.n = 0
	k0 := len(e.keys)
	e.keys = appendEntryKey(e.keys, e.q, e.p, e.first, e.last)
	key := e.keys[k0:len(e.keys):len(e.keys)]
	val := e.vals[e.start:len(e.vals):len(e.vals)]
	binary.BigEndian.PutUint32(val[1:entryHeaderLen], entryCRC(key, val[entryHeaderLen:]))
	return e.set(key, val)
}

func entryCRC(key, records []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, records)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// entryRecords checks the entry v stored under key, whose partition prefix
// is prefixLen bytes long, and returns its records in recs[:0] (grown when
// too small), record i being the one of offset first+i. The records are
// slices of v. An entry that
// does not check out yields an error wrapping ErrCorruptRecord; entryRecords
// never panics.
func entryRecords(key []byte, prefixLen int, v []byte, recs [][]byte) ([][]byte, error) {
	first, last, ok := entrySpan(key, prefixLen)
	if !ok {
		return recs, badEntryKey(key)
	}
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: entry of offsets %d to %d: %s", ErrCorruptRecord, first, last, fmt.Sprintf(format, args...))
	}
	if len(v) < entryHeaderLen {
		return recs, corrupt("%d-byte value", len(v))
	}
	if v[0] != entryVersion {
		return recs, corrupt("unknown version %d", v[0])
	}
	body := v[entryHeaderLen:]
	if want, got := binary.BigEndian.Uint32(v[1:entryHeaderLen]), entryCRC(key, body); got != want {
		return recs, corrupt("checksum %08x, want %08x", got, want)
	}
	// Each record takes at least its one-byte length: bound the count
	// before allocating for it.
	if last-first >= uint64(len(body)) {
		return recs, corrupt("%d records in %d bytes", last-first+1, len(body))
	}
	count := int(last-first) + 1
	if cap(recs) < count {
		recs = make([][]byte, 0, count)
	}
	recs = recs[:0]
	for i := range count {
		n, k := binary.Uvarint(body)
		if k <= 0 || n > uint64(len(body)-k) {
			return recs, corrupt("record %d of %d truncated", i+1, count)
		}
		recs = append(recs, body[k:k+int(n)])
		body = body[k+int(n):]
	}
	if len(body) > 0 {
		return recs, corrupt("%d trailing bytes", len(body))
	}
	return recs, nil
}
