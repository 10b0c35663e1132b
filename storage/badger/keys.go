package badger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// Key kinds: the first byte of every key. See doc.go for the layout.
const (
	kindMessage  byte = 'm' // m 0 queue 0 partition first last -> entry (entry.go)
	kindLow      byte = 'l' // l 0 queue 0 partition -> low watermark (u64)
	kindTrim     byte = 't' // t 0 queue 0 partition -> trim point (u64)
	kindFloor    byte = 'g' // g 0 queue 0 partition group -> ack floor (u64) [delivered mark (u64)]
	kindSettled  byte = 's' // s 0 queue 0 partition group 0 offset -> empty
	kindDelivery byte = 'r' // r 0 queue 0 partition group 0 offset -> count (u32)
	kindQueue    byte = 'q' // q 0 queue -> queue meta (JSON)
	kindFormat   byte = 'v' // v 0 -> the shard's layout version (u32)
	kindCommit   byte = 'n' // n 0 -> the number of the shard's last commit (u64, witness.go)
	// kindSession (sessions.go): c 0 record owner 0 name, shard 0 only

	sep byte = 0x00 // ends every variable-length name
)

// checkQueue refuses queue names a key cannot hold unambiguously.
func checkQueue(q string) error {
	if q == "" || strings.IndexByte(q, sep) >= 0 {
		return fmt.Errorf("%w: queue name %q", ErrInvalidWrite, q)
	}
	return nil
}

// checkGroup refuses group names holding the separator.
func checkGroup(g string) error {
	if strings.IndexByte(g, sep) >= 0 {
		return fmt.Errorf("%w: group name %q", ErrInvalidWrite, g)
	}
	return nil
}

// checkPartition returns p as the key's fixed-width u32.
func checkPartition(p int) (uint32, error) {
	if p < 0 || uint64(p) > math.MaxUint32 {
		return 0, fmt.Errorf("%w: partition %d", ErrInvalidWrite, p)
	}
	return uint32(p), nil
}

// partitionPrefixLen is the length of appendPartitionPrefix's output.
func partitionPrefixLen(q string) int { return 2 + len(q) + 1 + 4 }

// appendPartitionPrefix appends kind 0 queue 0 partition: the prefix shared
// by every key of that kind on the partition. No key of another queue or
// partition starts with it: queue names hold no 0x00 and the partition is
// fixed width.
func appendPartitionPrefix(dst []byte, kind byte, q string, p uint32) []byte {
	dst = append(dst, kind, sep)
	dst = append(dst, q...)
	dst = append(dst, sep)
	return binary.BigEndian.AppendUint32(dst, p)
}

func partitionPrefix(kind byte, q string, p uint32) []byte {
	return appendPartitionPrefix(make([]byte, 0, partitionPrefixLen(q)), kind, q, p)
}

// entryKeyLen is the length of an entry key of queue q.
func entryKeyLen(q string) int { return partitionPrefixLen(q) + 16 }

// appendEntryKey appends the key of the entry holding offsets first to
// last. Big-endian offsets make keys sort by first offset; entries of a
// partition never overlap, so they sort by last offset too.
func appendEntryKey(dst []byte, q string, p uint32, first, last uint64) []byte {
	dst = appendPartitionPrefix(dst, kindMessage, q, p)
	dst = binary.BigEndian.AppendUint64(dst, first)
	return binary.BigEndian.AppendUint64(dst, last)
}

func entryKey(q string, p uint32, first, last uint64) []byte {
	return appendEntryKey(make([]byte, 0, entryKeyLen(q)), q, p, first, last)
}

// entrySpan returns the offsets an entry key ends with; ok is false when
// k, whose partition prefix is prefixLen bytes long, is no entry key.
func entrySpan(k []byte, prefixLen int) (first, last uint64, ok bool) {
	if len(k) != prefixLen+16 {
		return 0, 0, false
	}
	first = binary.BigEndian.Uint64(k[prefixLen:])
	last = binary.BigEndian.Uint64(k[prefixLen+8:])
	return first, last, first <= last
}

// badEntryKey is the error for a key of a partition's message prefix that
// entrySpan refuses.
func badEntryKey(k []byte) error {
	return fmt.Errorf("%w: message key %q is no entry key", ErrCorruptRecord, k)
}

func lowKey(q string, p uint32) []byte { return partitionPrefix(kindLow, q, p) }

func trimKey(q string, p uint32) []byte { return partitionPrefix(kindTrim, q, p) }

// formatKey holds the shard's layout version and commitKey the number of
// its last commit. They belong to the Badger database, not to a
// partition: a migration does not copy them.
var (
	formatKey = []byte{kindFormat, sep}
	commitKey = []byte{kindCommit, sep}
)

func isDatabaseKey(k []byte) bool { return bytes.Equal(k, formatKey) || bytes.Equal(k, commitKey) }

// floorKey is the partition's floor prefix followed by the group name; the
// name ends the key, so it needs no separator.
func floorKey(q string, p uint32, group string) []byte {
	k := make([]byte, 0, partitionPrefixLen(q)+len(group))
	k = appendPartitionPrefix(k, kindFloor, q, p)
	return append(k, group...)
}

// markPrefix is the prefix of every settle (kindSettled) or delivery
// (kindDelivery) mark of one group on a partition.
func markPrefix(kind byte, q string, p uint32, group string) []byte {
	k := make([]byte, 0, partitionPrefixLen(q)+len(group)+1+8)
	k = appendPartitionPrefix(k, kind, q, p)
	k = append(k, group...)
	return append(k, sep)
}

func markKey(kind byte, q string, p uint32, group string, off uint64) []byte {
	return binary.BigEndian.AppendUint64(markPrefix(kind, q, p, group), off)
}

func queueKey(q string) []byte {
	k := make([]byte, 0, 2+len(q))
	k = append(k, kindQueue, sep)
	return append(k, q...)
}

// queuePrefix is the prefix of every queue meta key.
var queuePrefix = []byte{kindQueue, sep}

// keyOffset returns the offset that ends a mark key, or a message key of
// formatMessages.
func keyOffset(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }

// splitMarkKey splits the part of a mark key after its partition prefix
// into group name and offset.
func splitMarkKey(rest []byte) (group string, off uint64, ok bool) {
	if len(rest) < 9 || rest[len(rest)-9] != sep {
		return "", 0, false
	}
	return string(rest[:len(rest)-9]), keyOffset(rest), true
}

// putU64 and putU32 encode values of floor, watermark and delivery keys.
func putU64(v uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), v) }
func putU32(v uint32) []byte { return binary.BigEndian.AppendUint32(make([]byte, 0, 4), v) }

// putFloor encodes a group's floor and, when recorded, its delivered mark
// and its subject filter: 8 bytes, 16 with the mark, and the filter's
// bytes after those 16.
func putFloor(floor, delivered uint64, filter string) []byte {
	v := putU64(floor)
	if delivered > 0 || filter != "" {
		v = binary.BigEndian.AppendUint64(v, delivered)
	}
	return append(v, filter...)
}

// getFloor decodes putFloor's value; delivered is 0 when not recorded.
func getFloor(b []byte) (floor, delivered uint64, filter string, err error) {
	switch {
	case len(b) == 8:
		return binary.BigEndian.Uint64(b), 0, "", nil
	case len(b) >= 16:
		return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), string(b[16:]), nil
	}
	return 0, 0, "", fmt.Errorf("%w: %d-byte floor where 8 or 16 and more bytes were expected", ErrCorruptRecord, len(b))
}

func getU64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: %d-byte value where 8 bytes were expected", ErrCorruptRecord, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

func getU32(b []byte) (uint32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("%w: %d-byte value where 4 bytes were expected", ErrCorruptRecord, len(b))
	}
	return binary.BigEndian.Uint32(b), nil
}
