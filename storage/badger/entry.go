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
//	version(1) {length(uvarint) crc(4) record}...
//
// with one record (EncodeMessage) per offset from first to last, in order.
// A record's crc is the CRC-32C (Castagnoli), big-endian, of the key's
// partition prefix, the record's offset (u64, big-endian) and the record:
// a record that is damaged, cut short, or read at another offset or
// partition, as when its length or the key is damaged, does not check out.
// The key's offsets give the number of records, and every length is
// checked against the value's end. A read checks the whole layout but only
// the checksums of the records it returns: reading a few messages of an
// entry does not checksum all of it.
const entryVersion byte = 1

const (
	entryHeaderLen = 1
	recordCRCLen   = 4

	// An entry ends after entryMaxMessages records, or before the record
	// that would take its value past entryMaxBytes (a single larger record
	// has an entry to itself): a value stays below Badger's smallest
	// value-log file (Options.ValueLogFileSize), which bounds it, and a
	// rewrite of an entry (a hole or an overwrite) stays small.
	entryMaxMessages = 1024
	entryMaxBytes    = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeros [binary.MaxVarintLen64]byte

// entryWriter cuts records, given in offset order one partition after
// another (partition names each before its records), into entries and
// hands each to set. Keys and values are encoded into two buffers that
// grow by appending: a slice handed to set is never written again, so a
// transaction may hold on to it until it commits.
type entryWriter struct {
	set func(k, v []byte) error

	keys, vals []byte

	q     string
	p     uint32
	seed  uint32 // the CRC-32C of the partition prefix
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
	e.seed = crc32.Checksum(partitionPrefix(kindMessage, q, p), castagnoli)
	return err
}

// addMessage adds the record of m at m.Offset.
func (e *entryWriter) addMessage(m *queue.Message) error {
	hint := recordSizeHint(m)
	room := uvarintLen(uint64(hint))
	if err := e.open(m.Offset, room+recordCRCLen+hint); err != nil {
		return err
	}
	// Room for the length of the longest record m can have; the checksum
	// and record move back over what its actual length does not need.
	at := len(e.vals)
	e.vals = append(e.vals, zeros[:room+recordCRCLen]...)
	e.vals = appendMessage(e.vals, m)
	var lenBuf [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(lenBuf[:], uint64(len(e.vals)-at-room-recordCRCLen))
	if n < room {
		copy(e.vals[at+n:], e.vals[at+room:])
		e.vals = e.vals[:len(e.vals)-(room-n)]
	}
	copy(e.vals[at:], lenBuf[:n])
	crc := recordCRC(e.seed, m.Offset, e.vals[at+n+recordCRCLen:])
	binary.BigEndian.PutUint32(e.vals[at+n:], crc)
	return nil
}

// addRecord adds a record read from a stored entry at off.
func (e *entryWriter) addRecord(off uint64, rec []byte) error {
	if err := e.open(off, uvarintLen(uint64(len(rec)))+recordCRCLen+len(rec)); err != nil {
		return err
	}
	e.vals = binary.AppendUvarint(e.vals, uint64(len(rec)))
	e.vals = binary.BigEndian.AppendUint32(e.vals, recordCRC(e.seed, off, rec))
	e.vals = append(e.vals, rec...)
	return nil
}

// open makes room in an entry for the record at off, of at most size bytes
// with its length and checksum: the open entry if off continues it and the record fits,
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
		e.vals = append(e.vals, entryVersion)
	}
	e.last = off
	e.n++
	return nil
}

// flush hands the open entry, if any, to set.
func (e *entryWriter) flush() error {
	if e.n == 0 {
		return nil
	}
	e.n = 0
	k0 := len(e.keys)
	e.keys = appendEntryKey(e.keys, e.q, e.p, e.first, e.last)
	key := e.keys[k0:len(e.keys):len(e.keys)]
	return e.set(key, e.vals[e.start:len(e.vals):len(e.vals)])
}

// recordCRC is the checksum of the record at off of the partition whose
// prefix has the CRC-32C seed.
func recordCRC(seed uint32, off uint64, rec []byte) uint32 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], off)
	return crc32.Update(crc32.Update(seed, castagnoli, b[:]), castagnoli, rec)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// entryRecords checks the layout of the entry v stored under key, whose
// partition prefix is prefixLen bytes long, and returns in recs[:0] the
// records of the offsets from lo to hi that it holds, in order, after
// checking their checksums. The records are slices of v. An entry that
// does not check out yields an error wrapping ErrCorruptRecord;
// entryRecords never panics.
func entryRecords(key []byte, prefixLen int, v []byte, lo, hi uint64, recs [][]byte) ([][]byte, error) {
	recs = recs[:0]
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
	// Each record takes at least its length and checksum: bound the
	// count before walking or allocating for it.
	if last-first >= uint64(len(body)/(1+recordCRCLen)) {
		return recs, corrupt("%d records in %d bytes", last-first+1, len(body))
	}
	lo, hi = max(lo, first), min(hi, last)
	if lo <= hi && cap(recs) < int(hi-lo)+1 {
		recs = make([][]byte, 0, hi-lo+1)
	}
	seed := crc32.Checksum(key[:prefixLen], castagnoli)
	for off := first; ; off++ {
		n, k := binary.Uvarint(body)
		if k <= 0 || len(body)-k < recordCRCLen || n > uint64(len(body)-k-recordCRCLen) {
			return recs[:0], corrupt("record of offset %d truncated", off)
		}
		rec := body[k+recordCRCLen : k+recordCRCLen+int(n)]
		if lo <= off && off <= hi {
			if want := binary.BigEndian.Uint32(body[k:]); recordCRC(seed, off, rec) != want {
				return recs[:0], corrupt("record of offset %d fails its checksum", off)
			}
			recs = append(recs, rec)
		}
		body = body[k+recordCRCLen+int(n):]
		if off == last {
			break
		}
	}
	if len(body) > 0 {
		return recs[:0], corrupt("%d trailing bytes", len(body))
	}
	return recs, nil
}
