package badger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// logBuilder writes log files in Badger's layout (logcheck.go), as
// Badger's logFile.encodeEntry does, to test checkLog on files made to
// order.
type logBuilder struct {
	b    []byte
	ts   uint64
	txns [][2]int64 // where each whole transaction starts and ends
}

func newLogBuilder() *logBuilder {
	b := make([]byte, logHeaderSize)
	copy(b[8:], "base-iv-1234") // the base IV: random in Badger's files
	return &logBuilder{b: b}
}

// entry appends one entry and returns its offset.
func (l *logBuilder) entry(meta byte, key, value []byte) int64 {
	off := int64(len(l.b))
	start := len(l.b)
	l.b = append(l.b, meta, 0)
	l.b = binary.AppendUvarint(l.b, uint64(len(key)))
	l.b = binary.AppendUvarint(l.b, uint64(len(value)))
	l.b = binary.AppendUvarint(l.b, 0)
	l.b = append(l.b, key...)
	l.b = append(l.b, value...)
	l.b = binary.BigEndian.AppendUint32(l.b, crc32.Checksum(l.b[start:], castagnoli))
	return off
}

// versioned is key with the version Badger appends for commit ts.
func versioned(key string, ts uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(key), math.MaxUint64-ts)
}

// txn appends a transaction of n entries with values of vlen bytes, then
// its end, and returns the offsets of its entries, the end's last.
func (l *logBuilder) txn(n, vlen int) []int64 {
	l.ts++
	start := int64(len(l.b))
	var offs []int64
	for i := range n {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, vlen)
		offs = append(offs, l.entry(metaTxn, versioned(fmt.Sprintf("m/orders/%d/%d", i, l.ts), l.ts), v))
	}
	offs = append(offs, l.entry(metaFinTxn, versioned("!badger!txn", l.ts), []byte(strconv.FormatUint(l.ts, 10))))
	l.txns = append(l.txns, [2]int64{start, int64(len(l.b))})
	return offs
}

// pointerTxn appends a transaction of one entry pointing into the value
// log.
func (l *logBuilder) pointerTxn(fid, length, offset uint32) int64 {
	l.ts++
	start := int64(len(l.b))
	v := make([]byte, vptrLen)
	binary.NativeEndian.PutUint32(v[0:], fid)
	binary.NativeEndian.PutUint32(v[4:], length)
	binary.NativeEndian.PutUint32(v[8:], offset)
	off := l.entry(metaTxn|metaValuePointer, versioned("m/big", l.ts), v)
	l.entry(metaFinTxn, versioned("!badger!txn", l.ts), []byte(strconv.FormatUint(l.ts, 10)))
	l.txns = append(l.txns, [2]int64{start, int64(len(l.b))})
	return off
}

// file returns the log padded with zeros to size, as Badger preallocates
// it.
func (l *logBuilder) file(size int) []byte {
	out := make([]byte, max(size, len(l.b)))
	copy(out, l.b)
	return out
}

// checkBytes runs checkLog on b, read through a window of the given
// size (0 for logWindow).
func checkBytes(b []byte, window int) (logCheck, *logDamage, error) {
	return checkLog(&logReader{r: bytes.NewReader(b), size: int64(len(b)), window: window})
}

// txns10 appends 10 transactions of 3 entries and returns the offsets of
// their entries.
func (l *logBuilder) txns10() []int64 {
	var offs []int64
	for range 10 {
		offs = append(offs, l.txn(3, 40)...)
	}
	return offs
}

// checkLogWant is what TestCheckLog expects of checkLog.
type checkLogWant struct {
	kept   int64 // -1: the end of the log as built
	torn   bool
	damage int64 // -1: none
	cause  string
}

// cutLast builds a whole transaction and another of values of vlen bytes
// cut short where cut says, given the offsets of its entries, in a file
// of size bytes: a write cut short.
func cutLast(vlen int, cut func(offs []int64) int64, size int) func(l *logBuilder) ([]byte, checkLogWant) {
	return func(l *logBuilder) ([]byte, checkLogWant) {
		l.txn(3, 40)
		kept := int64(len(l.b))
		offs := l.txn(3, vlen)
		l.b = l.b[:cut(offs)]
		return l.file(size), checkLogWant{kept: kept, torn: true, damage: -1}
	}
}

func TestCheckLog(t *testing.T) {
	type want = checkLogWant
	cases := []struct {
		name  string
		build func(l *logBuilder) ([]byte, want)
	}{
		{"empty", func(l *logBuilder) ([]byte, want) {
			return l.file(1 << 16), want{kept: logHeaderSize, damage: -1}
		}},
		{"clean end", func(l *logBuilder) ([]byte, want) {
			for range 20 {
				l.txn(3, 40)
			}
			return l.file(1 << 16), want{kept: -1, damage: -1}
		}},
		{"ends at the file's end", func(l *logBuilder) ([]byte, want) {
			l.txn(3, 40)
			return l.file(0), want{kept: -1, damage: -1}
		}},
		{"transaction without its end", cutLast(40, func(offs []int64) int64 { return offs[3] }, 1<<16)},
		{"last entry cut short", cutLast(40, func(offs []int64) int64 { return offs[2] + 20 }, 1<<16)},
		{"last entry cut inside its header", cutLast(300, func(offs []int64) int64 { return offs[0] + 3 }, 1<<16)},
		{"file cut inside the last entry", cutLast(40, func(offs []int64) int64 { return offs[1] + 10 }, 0)},
		{"last entry cut before its head was written", func(l *logBuilder) ([]byte, want) {
			// Go's copy of a long entry writes from the first 32-byte
			// boundary after its start on, then its start, then its end.
			l.txn(3, 40)
			kept := int64(len(l.b))
			offs := l.txn(3, 600)
			cut := offs[1]
			boundary := cut | 31 + 1
			clear(l.b[cut:boundary])
			l.b = l.b[:boundary+200]
			return l.file(1 << 16), want{kept: kept, torn: true, damage: -1}
		}},
		{"zeros at an entry's start, entries after it", func(l *logBuilder) ([]byte, want) {
			offs := l.txns10()
			bad := offs[13]
			clear(l.b[bad : bad|31+1])
			return l.file(1 << 16), want{damage: bad, cause: "entries that read back follow"}
		}},
		{"checksum mismatch in the middle", func(l *logBuilder) ([]byte, want) {
			offs := l.txns10()
			bad := offs[13]
			l.b[bad+30] ^= 0x40
			return l.file(1 << 16), want{damage: bad, cause: "does not match its checksum; entries that read back follow"}
		}},
		{"zeros in the middle", func(l *logBuilder) ([]byte, want) {
			offs := l.txns10()
			clear(l.b[offs[13]+10 : offs[13]+74])
			return l.file(1 << 16), want{damage: offs[13], cause: "entries that read back follow"}
		}},
		{"damaged header claims a long entry", func(l *logBuilder) ([]byte, want) {
			offs := l.txns10()
			bad := offs[13]
			l.b[bad+3] = 0xff // value length: a varint running on
			l.b[bad+4] = 0xff
			return l.file(1 << 16), want{damage: bad, cause: "entries that read back follow"}
		}},
		{"whole last entry damaged", func(l *logBuilder) ([]byte, want) {
			l.txn(3, 40)
			offs := l.txn(3, 40)
			l.b[offs[3]+8] ^= 0x01
			l.b[len(l.b)-1] |= 1 // its checksum's last byte is not zero
			return l.file(1 << 16), want{damage: offs[3], cause: "does not match its checksum"}
		}},
		{"data after zeros", func(l *logBuilder) ([]byte, want) {
			l.txn(3, 40)
			end := int64(len(l.b))
			b := l.file(1 << 16)
			copy(b[40000:], "written later")
			return b, want{damage: end, cause: "data follows at offset 40000"}
		}},
		{"encrypted header", func(l *logBuilder) ([]byte, want) {
			l.txn(1, 10)
			l.b[7] = 1
			return l.file(1 << 12), want{damage: 0, cause: "encryption key 1"}
		}},
		{"commit inside another", func(l *logBuilder) ([]byte, want) {
			l.txn(2, 10)
			l.ts++
			l.entry(metaTxn, versioned("a", l.ts), []byte("x"))
			bad := l.entry(metaTxn, versioned("b", l.ts+1), []byte("y"))
			return l.file(1 << 12), want{damage: bad, cause: "sits inside commit"}
		}},
		{"end of another commit", func(l *logBuilder) ([]byte, want) {
			l.ts++
			l.entry(metaTxn, versioned("a", l.ts), []byte("x"))
			bad := l.entry(metaFinTxn, versioned("!badger!txn", l.ts), []byte("999"))
			return l.file(1 << 12), want{damage: bad, cause: "does not match its entries"}
		}},
		{"shorter than its header", func(l *logBuilder) ([]byte, want) {
			return l.b[:10], want{damage: 0, cause: "shorter than its 20-byte header"}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLogBuilder()
			b, w := c.build(l)
			if w.kept < 0 {
				w.kept = int64(len(l.b))
			}
			res, dmg, err := checkBytes(b, 0)
			if err != nil {
				t.Fatal(err)
			}
			if small, sdmg, err := checkBytes(b, 7); err != nil || small.kept != res.kept || small.torn != res.torn || (sdmg == nil) != (dmg == nil) {
				t.Fatalf("read through a 7-byte window: kept %d, torn %v, damage %v, %v; through the default window: %d, %v, %v",
					small.kept, small.torn, sdmg, err, res.kept, res.torn, dmg)
			}
			if w.damage >= 0 {
				if dmg == nil {
					t.Fatalf("no damage found (kept %d, torn %v); want damage at %d", res.kept, res.torn, w.damage)
				}
				if dmg.offset != w.damage || !strings.Contains(dmg.cause, w.cause) {
					t.Fatalf("damage at %d: %s\nwant at %d: ...%s...", dmg.offset, dmg.cause, w.damage, w.cause)
				}
				return
			}
			if dmg != nil {
				t.Fatalf("damage at %d: %s; want none", dmg.offset, dmg.cause)
			}
			if res.kept != w.kept || res.torn != w.torn {
				t.Fatalf("kept %d, torn %v; want %d, %v", res.kept, res.torn, w.kept, w.torn)
			}
		})
	}
}

func TestCheckLogPointers(t *testing.T) {
	l := newLogBuilder()
	l.txn(2, 10)
	l.pointerTxn(3, 100, 20)
	far := l.pointerTxn(3, 200, 5000)
	l.pointerTxn(2, 50, 20)
	l.ts++ // pointers of a transaction without its end are not kept
	v := make([]byte, vptrLen)
	binary.NativeEndian.PutUint32(v, 3)
	binary.NativeEndian.PutUint32(v[4:], 1<<20)
	l.entry(metaTxn|metaValuePointer, versioned("m/cut", l.ts), v)
	res, dmg, err := checkBytes(l.file(1<<14), 0)
	if err != nil || dmg != nil {
		t.Fatalf("checkLog: %v, %v", dmg, err)
	}
	if p := res.vptrs[3]; p.end() != 5200 || p.from != far {
		t.Errorf("furthest pointer into file 3: %+v, want to 5200 from %d", p, far)
	}
	if p := res.vptrs[2]; p.end() != 70 || len(res.vptrs) != 2 {
		t.Errorf("pointers: %+v", res.vptrs)
	}
}

// FuzzCheckLog damages a log of whole transactions, by flipping or zeroing
// bytes, and checks checkLog against what was done. The invariant: a log
// whose damage is followed by a whole transaction is reported damaged, at
// the entry holding the first byte that changed; a log reported undamaged
// keeps every transaction that ends before that byte.
func FuzzCheckLog(f *testing.F) {
	f.Add(uint64(1), uint16(500), uint16(64), byte(0xff))
	f.Add(uint64(2), uint16(3000), uint16(64), byte(0))
	f.Add(uint64(3), uint16(20), uint16(1), byte(0x80))
	f.Add(uint64(4), uint16(7000), uint16(9000), byte(0))
	f.Add(uint64(5), uint16(100), uint16(4), byte(0x01))
	f.Fuzz(func(t *testing.T, seed uint64, at, n uint16, flip byte) {
		rng := rand.New(rand.NewPCG(seed, 0))
		l := newLogBuilder()
		var entries []int64
		for range 1 + rng.IntN(30) {
			entries = append(entries, l.txn(1+rng.IntN(4), rng.IntN(200))...)
		}
		b := l.file(len(l.b) + rng.IntN(4096))
		orig := bytes.Clone(b)
		from := int64(at) % int64(len(b))
		to := min(from+int64(n), int64(len(b)))
		for i := from; i < to; i++ {
			if flip == 0 {
				b[i] = 0
			} else {
				b[i] ^= flip
			}
		}
		first := int64(-1) // the first byte that changed
		for i := range b {
			if b[i] != orig[i] {
				first = int64(i)
				break
			}
		}
		res, dmg, err := checkBytes(b, int(seed%97)) // windows cut entries anywhere
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 {
			if dmg != nil || res.kept != int64(len(l.b)) {
				t.Fatalf("undamaged log: kept %d, damage %+v", res.kept, dmg)
			}
			return
		}
		if first < logHeaderSize {
			return // the base IV is not checked; a key id is (TestCheckLog)
		}
		lastByte := first
		for i := range b {
			if b[i] != orig[i] {
				lastByte = int64(i)
			}
		}
		wholeAfter := false
		for _, tx := range l.txns {
			if tx[0] > lastByte {
				wholeAfter = true
			}
		}
		if dmg == nil {
			if wholeAfter {
				t.Fatalf("damage at %d..%d, a whole transaction after it, and none reported (kept %d)", first, lastByte, res.kept)
			}
			for _, tx := range l.txns {
				if tx[1] <= first && res.kept < tx[1] {
					t.Fatalf("damage from %d; kept %d drops the transaction %v before it", first, res.kept, tx)
				}
			}
			return
		}
		if first < int64(len(l.b)) {
			holder := entries[0]
			for _, e := range entries {
				if e <= first {
					holder = e
				}
			}
			if dmg.offset != holder {
				t.Fatalf("damage from %d, in the entry at %d, reported at %d: %s", first, holder, dmg.offset, dmg.cause)
			}
		}
	})
}
