package raftlog

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Key kinds: the first byte of every key. The other kinds are followed by
// the group name alone; entries by the name, 0x00 and the big-endian index,
// so that a prefix scan returns one group's entries in index order.
const (
	kindGroup     byte = 'g' // marker: the group has stored state; empty value
	kindHardState byte = 'h' // raftpb.HardState
	kindConfState byte = 'c' // raftpb.ConfState
	kindSnapshot  byte = 's' // raftpb.SnapshotMetadata with index and term only
	kindApplied   byte = 'a' // big-endian uint64
	kindMeta      byte = 'm' // the caller's bytes
	kindEntry     byte = 'e' // raftpb.Entry
)

// stateKinds are the kinds with one key per group, the marker last.
var stateKinds = []byte{kindHardState, kindConfState, kindSnapshot, kindApplied, kindMeta, kindGroup}

// maxGroupLen bounds a group name, well below Badger's key size limit.
const maxGroupLen = 1 << 10

// checkGroup reports whether group can name a group.
func checkGroup(group string) error {
	switch {
	case group == "":
		return fmt.Errorf("raftlog: empty group name")
	case len(group) > maxGroupLen:
		return fmt.Errorf("raftlog: group name of %d bytes, more than %d", len(group), maxGroupLen)
	case strings.IndexByte(group, 0) >= 0:
		return fmt.Errorf("raftlog: group name %q contains a 0x00 byte", group)
	}
	return nil
}

// stateKey is the key of one of the group's single values.
func stateKey(kind byte, group string) []byte {
	k := make([]byte, 0, 1+len(group))
	k = append(k, kind)
	return append(k, group...)
}

// entryPrefix is the prefix of the group's entry keys.
func entryPrefix(group string) []byte {
	k := make([]byte, 0, 2+len(group)+8)
	k = append(k, kindEntry)
	k = append(k, group...)
	return append(k, 0)
}

// entryKey is the key of the group's entry at index.
func entryKey(group string, index uint64) []byte {
	return binary.BigEndian.AppendUint64(entryPrefix(group), index)
}

// entryIndex is the index an entry key ends with.
func entryIndex(key []byte) uint64 {
	if len(key) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(key[len(key)-8:])
}
