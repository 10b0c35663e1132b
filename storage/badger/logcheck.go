package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strconv"
)

// Badger's log files: the write-ahead log of each memtable (NNNNN.mem) and
// the value log (NNNNNN.vlog), which holds values of ValueThreshold bytes
// or more while the memtable's log holds a pointer to them. Both have one
// layout (badger/v4 memtable.go, logFile):
//
//	header: key id u64 BE (0: not encrypted), base IV (12 bytes)
//	entry:  meta u8, user meta u8, uvarint key length, uvarint value
//	        length, uvarint expiry, key, value, CRC-32C (Castagnoli,
//	        big-endian) of everything before it in the entry
//
// A file is created sparse at twice its size limit and written through a
// memory map, so its unused part reads as zeros. A key ends with its
// version, u64 BE math.MaxUint64 - commit timestamp. The entries of a
// transaction carry metaTxn and are followed by one metaFinTxn entry whose
// key is !badger!txn and whose value is the commit timestamp in decimal.
// An entry with metaValuePointer holds, as its value, a value pointer into
// the value log: fid, length, offset, u32 each, in the machine's byte
// order.
//
// On open, Badger replays each memtable log, and the newest value-log
// file, up to the end of the last whole transaction before the first entry
// that does not read back, and cuts the file there, whatever follows
// (memTable.UpdateSkipList, valueLog.open): damage in the middle of a log
// silently drops every write after it. checkLog reads a log the same way
// and tells what Badger would cut: nothing but zeros (a clean end), a
// write cut short (a torn tail), or damage.
const (
	logHeaderSize  = 20
	maxEntryHeader = 22 // meta, user meta and three uvarints
	maxLogKey      = 1 << 16
	vptrLen        = 12

	metaValuePointer byte = 1 << 1
	metaTxn          byte = 1 << 6
	metaFinTxn       byte = 1 << 7

	// logWindow is how much of a log file is read at once.
	logWindow = 4 << 20
	// resyncReach bounds how far past a damaged entry checkLog looks for
	// an entry that reads back.
	resyncReach = 8 << 20
)

// logReader reads a log file through a window.
type logReader struct {
	r    io.ReaderAt
	size int64
	// data returns where the next bytes that may be nonzero begin, at or
	// after off (size for none): holes of a sparse file need not be read.
	// nil reads everything.
	data func(off int64) (int64, error)
	// window is how much is read at once; 0 means logWindow.
	window int

	buf []byte
	at  int64 // the file offset of buf[0]
}

// bytes returns the file from off on: at least n bytes unless the file
// ends first. The slice is valid until the next call.
func (r *logReader) bytes(off int64, n int) ([]byte, error) {
	if off >= r.at && min(off+int64(n), r.size) <= r.at+int64(len(r.buf)) {
		return r.buf[off-r.at:], nil
	}
	want := int64(max(n, r.window, 1))
	if r.window == 0 {
		want = int64(max(n, logWindow))
	}
	want = min(want, r.size-off)
	if want <= 0 {
		return nil, nil
	}
	if int64(cap(r.buf)) < want {
		r.buf = make([]byte, want)
	}
	r.buf = r.buf[:want]
	r.at = off
	k, err := r.r.ReadAt(r.buf, off)
	if int64(k) == want {
		return r.buf, nil
	}
	r.buf = r.buf[:0]
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // the file shrank while it was read
	}
	return nil, err
}

// firstNonzero returns the offset of the first nonzero byte in
// [from, to), -1 if there is none.
func (r *logReader) firstNonzero(from, to int64) (int64, error) {
	to = min(to, r.size)
	for off := from; off < to; {
		if r.data != nil {
			d, err := r.data(off)
			if err != nil {
				return 0, err
			}
			off = max(off, d)
			if off >= to {
				break
			}
		}
		b, err := r.bytes(off, 1)
		if err != nil {
			return 0, err
		}
		b = b[:min(int64(len(b)), to-off)]
		if i := nonzeroIndex(b); i >= 0 {
			return off + int64(i), nil
		}
		off += int64(len(b))
	}
	return -1, nil
}

// nonzeroIndex returns the index of the first nonzero byte of b, or -1.
func nonzeroIndex(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

// logEntry is an entry of a log file as readEntry reads it.
type logEntry struct {
	head  entryHead
	key   []byte // valid until the next read
	value []byte // nil unless at most maxInlineValue bytes; valid until the next read
}

// maxInlineValue is the longest value readEntry returns: long enough for a
// value pointer, a transaction's end and a shard's commit number.
const maxInlineValue = 64

// entryHead is an entry's header as decoded, the bytes after the end of
// the file read as zeros.
type entryHead struct {
	meta       byte
	hlen       int    // the header's length
	klen, vlen uint32 // as Badger reads them: truncated to 32 bits
	ok         bool   // the header decodes and the key length is one Badger reads
}

// size is the entry's length as its header says: header, key, value and
// checksum.
func (h *entryHead) size() int64 { return int64(h.hlen) + int64(h.klen) + int64(h.vlen) + crc32.Size }

func (h *entryHead) decode(b []byte) {
	if len(b) < maxEntryHeader {
		var pad [maxEntryHeader]byte
		copy(pad[:], b)
		b = pad[:]
	}
	*h = entryHead{meta: b[0]}
	if b[2] < 0x80 && b[3] < 0x80 && b[4] < 0x80 { // short key, value and expiry
		h.hlen, h.klen, h.vlen, h.ok = 5, uint32(b[2]), uint32(b[3]), true
		return
	}
	h.hlen = 2
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(b[h.hlen:maxEntryHeader])
		if n <= 0 {
			return
		}
		vals[i] = v
		h.hlen += n
	}
	h.klen, h.vlen = uint32(vals[0]), uint32(vals[1])
	h.ok = h.klen <= maxLogKey
}

// entryStatus tells whether readEntry read an entry.
type entryStatus int

const (
	entryOK    entryStatus = iota
	entryShort             // the file ends inside the entry
	entryBad               // the header does not decode or the checksum does not match
)

// readEntry reads the entry at off into e. Its header is set whatever the
// status; its key and value only with entryOK.
func (r *logReader) readEntry(off int64, e *logEntry) (entryStatus, error) {
	b, err := r.bytes(off, maxEntryHeader)
	if err != nil {
		return 0, err
	}
	h := &e.head
	h.decode(b)
	e.key, e.value = nil, nil
	switch {
	case !h.ok:
		return entryBad, nil
	case off+h.size() > r.size:
		return entryShort, nil
	}
	size := h.size()
	body := size - crc32.Size
	kend := h.hlen + int(h.klen)
	vend := kend + int(min(h.vlen, maxInlineValue))
	if int64(len(b)) >= size { // the whole entry is in the window
		if crc32.Checksum(b[:body], castagnoli) != binary.BigEndian.Uint32(b[body:]) {
			return entryBad, nil
		}
	} else {
		var sum uint32
		for done := int64(0); done < body; {
			b, err := r.bytes(off+done, int(min(body-done, logWindow)))
			if err != nil {
				return 0, err
			}
			chunk := b[:min(int64(len(b)), body-done)]
			sum = crc32.Update(sum, castagnoli, chunk)
			done += int64(len(chunk))
		}
		tail, err := r.bytes(off+body, crc32.Size)
		if err != nil {
			return 0, err
		}
		if binary.BigEndian.Uint32(tail) != sum {
			return entryBad, nil
		}
		if b, err = r.bytes(off, vend); err != nil {
			return 0, err
		}
	}
	e.key = b[h.hlen:kend]
	if h.vlen <= maxInlineValue {
		e.value = b[kend:vend]
	}
	return entryOK, nil
}

// vptr is a value pointer into the value log, and where the entry holding
// it is.
type vptr struct {
	fid, len, offset uint32
	from             int64 // the offset of the log entry holding it
}

func (p vptr) end() int64 { return int64(p.offset) + int64(p.len) }

// logCheck is what checkLog found in a log file that is not damaged.
type logCheck struct {
	// kept is where Badger cuts the file: the end of the last whole
	// transaction before the first entry that does not read back.
	kept int64
	// torn: nonzero bytes follow kept, a write cut short (entries of a
	// transaction without its end, then at most one entry cut short, then
	// zeros).
	torn bool
	// vptrs holds, for each value-log file the kept entries point into,
	// the pointer reaching furthest.
	vptrs map[uint32]vptr
}

// logDamage is where and why a log file is damaged.
type logDamage struct {
	offset int64
	cause  string
}

// checkLog reads a log file as Badger replays it and returns what Badger
// would keep, or the damage: an entry that does not read back or a
// transaction that does not hold together, followed by anything but the
// rest of one entry and zeros. A file shorter than its header is damage
// unless it holds only zeros.
func checkLog(r *logReader) (logCheck, *logDamage, error) {
	res := logCheck{kept: logHeaderSize, vptrs: map[uint32]vptr{}}
	if r.size < logHeaderSize {
		nz, err := r.firstNonzero(0, r.size)
		if err != nil || nz < 0 {
			return logCheck{kept: r.size}, nil, err
		}
		return res, &logDamage{0, fmt.Sprintf("the file is %d bytes, shorter than its %d-byte header", r.size, logHeaderSize)}, nil
	}
	head, err := r.bytes(0, logHeaderSize)
	if err != nil {
		return res, nil, err
	}
	if id := binary.BigEndian.Uint64(head); id != 0 {
		return res, &logDamage{0, fmt.Sprintf("the header names encryption key %d, but shardq does not encrypt", id)}, nil
	}

	off := int64(logHeaderSize)
	var txn uint64 // the commit timestamp of the open transaction, 0 for none
	var pending []vptr
	var e logEntry
	for {
		st, err := r.readEntry(off, &e)
		if err != nil {
			return res, nil, err
		}
		why := ""
		switch {
		case st == entryShort && off == r.size:
			return res, nil, r.tornAfter(&res)
		case st == entryShort:
			why = "the file ends inside the entry there"
		case st == entryBad && !e.head.ok:
			why = "the entry there has a header that does not decode"
		case st == entryBad:
			why = "the entry there does not match its checksum"
		case len(e.key) == 0:
			return res, &logDamage{off, "the entry there has an empty key"}, nil
		case e.head.meta&metaTxn != 0:
			ts := keyVersion(e.key)
			if txn == 0 {
				txn = ts
			}
			if ts != txn {
				return res, &logDamage{off, fmt.Sprintf("an entry of commit %d sits inside commit %d", ts, txn)}, nil
			}
			if p, ok := pointer(&e, off); ok {
				pending = append(pending, p)
			}
		case e.head.meta&metaFinTxn != 0:
			ts, err := strconv.ParseUint(string(e.value), 10, 64)
			if err != nil || ts != txn {
				return res, &logDamage{off, fmt.Sprintf("the end of commit %q does not match its entries (commit %d)", e.value, txn)}, nil
			}
			txn = 0
			res.kept = off + e.head.size()
			for _, p := range pending {
				res.keepPointer(p)
			}
			pending = pending[:0]
		default:
			if txn != 0 {
				return res, &logDamage{off, fmt.Sprintf("an entry outside any transaction sits inside commit %d", txn)}, nil
			}
			res.kept = off + e.head.size()
			if p, ok := pointer(&e, off); ok {
				res.keepPointer(p)
			}
		}
		if why != "" {
			dmg, err := r.judgeStop(&res, off, e.head, why)
			return res, dmg, err
		}
		off += e.head.size()
	}
}

// judgeStop decides what the entry at off that did not read back is: the
// start of a write cut short, with zeros after it, or damage.
func (r *logReader) judgeStop(res *logCheck, off int64, h entryHead, why string) (*logDamage, error) {
	if cut, err := r.cutBeforeHead(off); err != nil || cut {
		return nil, errors.Join(err, r.tornAfter(res))
	}
	// A write cut short leaves at most what its header says the entry
	// holds, and zeros where it did not get to: an entry that ends in a
	// nonzero byte was written to its end. A header that does not decode
	// was not written by Badger.
	end := off
	whole := false
	if h.ok {
		end = min(off+h.size(), r.size)
		if off+h.size() <= r.size {
			b, err := r.bytes(end-1, 1)
			if err != nil {
				return nil, err
			}
			whole = b[0] != 0
		}
	}
	nz, err := r.firstNonzero(end, r.size)
	if err != nil {
		return nil, err
	}
	// A damaged header may claim a long entry: look for entries that read
	// back inside it, and past it for the report.
	reach := end
	if nz >= 0 || whole {
		reach = min(off+resyncReach, r.size)
	}
	resume, err := r.resync(off+1, reach)
	if err != nil {
		return nil, err
	}
	switch {
	case resume >= 0:
		why += fmt.Sprintf("; entries that read back follow at offset %d", resume)
	case nz >= 0:
		why += fmt.Sprintf("; data follows at offset %d", nz)
	case whole:
		why += "; it was written to its end, so it is no write cut short"
	default:
		return nil, r.tornAfter(res)
	}
	last, err := r.lastNonzero(res.kept)
	if err != nil {
		return nil, err
	}
	why += fmt.Sprintf("; Badger would cut the file at offset %d and drop the %d bytes after it", res.kept, last+1-res.kept)
	return &logDamage{off, why}, nil
}

// cutBeforeHead reports whether the entry at off is a copy cut short
// before its first bytes were written. Go copies more than 256 bytes into
// the mapped file in this order (runtime memmove, avxUnaligned): from the
// first 32-byte boundary after the entry's start up to its last 128
// bytes, then its first 32 bytes, then its last 128. A process killed
// during that copy leaves zeros from the entry's start to that boundary,
// its header among them, and the entry's data from the boundary on,
// nonzero within its first 128 bytes (the key starts there); and since the
// log is written in order, no entry after it reads back. In a memtable
// log every entry has a nonzero first byte (a transaction bit of its
// meta), so those zeros never start a whole entry; in the value log, where
// Badger clears those bits, what is cut is checked through the memtable
// logs' pointers into it (checkPointer).
func (r *logReader) cutBeforeHead(off int64) (bool, error) {
	boundary := off | 31 + 1
	nz, err := r.firstNonzero(off, r.size)
	if err != nil || nz < boundary || nz >= boundary+128 {
		return false, err
	}
	resume, err := r.resync(off+1, min(off+resyncReach, r.size))
	return err == nil && resume < 0, err
}

// tornAfter sets res.torn when anything but zeros follows res.kept.
func (r *logReader) tornAfter(res *logCheck) error {
	nz, err := r.firstNonzero(res.kept, r.size)
	res.torn = nz >= 0
	return err
}

// resync returns the offset of the first entry in [from, to) that reads
// back and has a key, -1 if there is none.
func (r *logReader) resync(from, to int64) (int64, error) {
	for off := from; off < to; off++ {
		// An entry with a key has a nonzero byte where its key length
		// starts: runs of zeros are skipped.
		nz, err := r.firstNonzero(off+2, to+2)
		if err != nil || nz < 0 {
			return -1, err
		}
		off = max(off, nz-2)
		if off >= to {
			break
		}
		var e logEntry
		st, err := r.readEntry(off, &e)
		if err != nil {
			return -1, err
		}
		if st == entryOK && len(e.key) > 0 {
			return off, nil
		}
	}
	return -1, nil
}

// lastNonzero returns the offset of the last nonzero byte at or after
// from, -1 if there is none. It reads the whole rest of the file: it is
// only called on damage.
func (r *logReader) lastNonzero(from int64) (int64, error) {
	last := int64(-1)
	for off := from; ; {
		nz, err := r.firstNonzero(off, r.size)
		if err != nil || nz < 0 {
			return last, err
		}
		b, err := r.bytes(nz, 1)
		if err != nil {
			return last, err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != 0 {
				last = nz + int64(i)
				break
			}
		}
		off = nz + int64(len(b))
	}
}

// keepPointer records p as a pointer of a kept entry.
func (res *logCheck) keepPointer(p vptr) {
	if q, ok := res.vptrs[p.fid]; !ok || p.end() > q.end() {
		res.vptrs[p.fid] = p
	}
}

// pointer returns the value pointer e holds, if it holds one.
func pointer(e *logEntry, off int64) (vptr, bool) {
	if e.head.meta&metaValuePointer == 0 || len(e.value) != vptrLen {
		return vptr{}, false
	}
	return vptr{
		fid:    binary.NativeEndian.Uint32(e.value[0:]),
		len:    binary.NativeEndian.Uint32(e.value[4:]),
		offset: binary.NativeEndian.Uint32(e.value[8:]),
		from:   off,
	}, true
}

// keyVersion returns the commit timestamp a Badger key ends with
// (y.ParseTs).
func keyVersion(key []byte) uint64 {
	if len(key) <= 8 {
		return 0
	}
	return math.MaxUint64 - binary.BigEndian.Uint64(key[len(key)-8:])
}
