// Package raftlog keeps the raft logs of a node's replicated partitions:
// every group's entries, hard state, configuration, applied index and
// compaction point, in one append-only log of segment files, so that one
// write and one fsync cover the entries of many groups.
//
// A segment is a sequence of records, each [length u32][crc32c u32][body];
// a body is [kind][group name][payload]. Every write (one per Save) starts
// with a batch record giving the length of what follows it in that write,
// so that Open can tell a write the process never finished from damage to
// one it finished:
//
//   - A write cut short (its batch runs past the end of the last segment,
//     or only zeros follow the last complete write) was never synced and
//     never answered: it is cut off.
//   - Anything else that does not read back (a checksum mismatch, a
//     record cut short inside a complete write, a bad record in any
//     segment but the last) is damage to data that may have been synced
//     and acknowledged to raft peers. Open refuses it with a *DamageError
//     naming the file and offset, unless Options.Salvage is set: then the
//     log is cut at the damaged write, what followed is set aside in
//     files ending in .damaged, and the store reports itself recovering
//     (Recovering) until its user says otherwise. A replica that lost
//     entries it acknowledged must not vote until it has them again.
//
// A group's state
// lives in memory; its entries are read from the files when the group is
// loaded, by the positions of its entry records. When the active segment
// grows past its size, a new one starts with a checkpoint of every group's
// state, and the older segments whose entries every group has compacted
// are deleted.
package raftlog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Record kinds.
const (
	recEntries   byte = 1 // uvarint count, then each entry: uvarint length, bytes
	recHardState byte = 2
	recConfState byte = 3
	recApplied   byte = 4 // uvarint
	recMeta      byte = 5
	recCompact   byte = 6 // uvarint index, uvarint term
	recDrop      byte = 7
	// recBatch starts every write: uvarint length of the records that
	// follow it in that write.
	recBatch byte = 8
	// recRecovering marks a group that must not vote: one byte, 1 or 0.
	recRecovering byte = 9
)

// frameGap is the room a write keeps in front of its records for its
// batch record: an 8-byte head and a body of at most maxBatchBody.
const (
	maxBatchBody = 1 + 1 + binary.MaxVarintLen64
	frameGap     = 8 + maxBatchBody
)

// recoveringFile, present in the directory, says the store was salvaged:
// groups it does not know may have lost what they acknowledged.
const recoveringFile = "RECOVERING"

// segmentSize is the size past which a new segment starts.
const segmentSize = 64 << 20

// maxGroupName bounds a group's name.
const maxGroupName = 1 << 10

var (
	errClosed = errors.New("raftlog: store closed")
	crcTable  = crc32.MakeTable(crc32.Castagnoli)
)

// Options configure a store.
type Options struct {
	// Dir holds the segments. Required.
	Dir    string
	Logger *slog.Logger
	// SegmentSize overrides the size past which a new segment starts.
	SegmentSize int64
	// Salvage opens a damaged log by cutting it at the damaged write (see
	// the package doc) instead of refusing it.
	Salvage bool
}

// DamageError reports data of a segment that does not read back and was
// not the end of an unfinished write.
type DamageError struct {
	File   string
	Offset int64  // where the damaged record starts
	Cut    int64  // where a salvage cuts the file: the start of the write holding the damage
	Cause  string // what is wrong there
}

func (e *DamageError) Error() string {
	return fmt.Sprintf("raftlog: %s is damaged at offset %d (%s): it holds raft state this node may have acknowledged, "+
		"so it is not cut off silently; start the node with its raft log salvaged (it then takes no part in elections "+
		"until its peers have given it back every entry) or restore its data directory", e.File, e.Offset, e.Cause)
}

// State is what is stored of a group.
type State struct {
	HardState *raftpb.HardState // nil when none stored
	ConfState *raftpb.ConfState // nil when none stored
	// Snapshot is the index and term the log was compacted to (its entries
	// start after it), nil when none.
	Snapshot *raftpb.SnapshotMetadata
	Entries  []*raftpb.Entry // in index order, all stored ones
	Applied  uint64          // last applied index recorded
	Meta     []byte          // the bytes stored with Write.Meta, nil when none
	// Recovering is the flag last stored with Write.Recovering.
	Recovering bool
}

// Write is one group's part of a Save.
type Write struct {
	Group     string
	HardState *raftpb.HardState // nil: unchanged
	ConfState *raftpb.ConfState // nil: unchanged
	// Entries, in increasing index order, replace every stored entry at the
	// index of the first one or above.
	Entries []*raftpb.Entry
	Applied uint64 // 0: unchanged
	Meta    []byte // nil: unchanged
	// Recovering, when set, stores whether the group must not vote.
	Recovering *bool
}

// Store is the raft log of a node's groups. Its methods are safe for
// concurrent use; writes are serialized.
type Store struct {
	dir     string
	log     *slog.Logger
	segSize int64

	mu      sync.Mutex
	closed  bool
	groups  map[string]*group
	segs    []*segment // in order; the last is the active one
	active  *os.File
	size    int64 // of the active segment
	dirty   bool  // the active segment has writes not synced
	scratch []byte
	// salvaged is the damage a salvaging Open cut off, nil when none.
	salvaged   *DamageError
	recovering bool // the recovering file is present
}

type segment struct {
	seq  uint64
	path string
	// last is, per group, the highest entry index the segment holds.
	last map[string]uint64
}

// group is what the store knows of one group.
type group struct {
	hs      *raftpb.HardState
	cs      *raftpb.ConfState
	snap    *raftpb.SnapshotMetadata
	applied uint64
	meta    []byte
	// recovering: the group must not vote (see Write.Recovering).
	recovering bool
	// runs are the entry records of the group not compacted away, in the
	// order written: where to read them again.
	runs []run
}

type run struct {
	seg         *segment
	off         int64 // of the record's body
	length      int
	first, last uint64
}

// Open opens, or creates, the store in o.Dir. A damaged log is refused
// with a *DamageError, or salvaged when o.Salvage is set.
func Open(o Options) (*Store, error) {
	if o.Dir == "" {
		return nil, errors.New("raftlog: no directory given")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "raftlog")
	s := &Store{dir: o.Dir, log: log, segSize: o.SegmentSize, groups: map[string]*group{}}
	if s.segSize <= 0 {
		s.segSize = segmentSize
	}
	err := s.load()
	var damage *DamageError
	if err == nil || !o.Salvage || !errors.As(err, &damage) {
		return s, err
	}
	// Set the damage aside and read what is left again from the start:
	// the records read before the damage in its write go too.
	if err := salvage(o.Dir, damage); err != nil {
		return nil, err
	}
	log.Error("raft log damaged: cut at the damaged write, what followed set aside; this node takes no part in elections until its peers have given it back every entry",
		"file", damage.File, "offset", damage.Offset, "cut", damage.Cut, "cause", damage.Cause)
	o.Salvage = false
	s, err = Open(o)
	if err != nil {
		return nil, err
	}
	s.salvaged = damage
	return s, nil
}

// load replays the segments and opens the last for writing.
func (s *Store) load() error {
	if _, err := os.Stat(filepath.Join(s.dir, recoveringFile)); err == nil {
		s.recovering = true
	}
	names, err := filepath.Glob(filepath.Join(s.dir, "*.wal"))
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	sort.Strings(names)
	for i, name := range names {
		var seq uint64
		if _, err := fmt.Sscanf(filepath.Base(name), "%016x.wal", &seq); err != nil {
			return fmt.Errorf("raftlog: unexpected file %s", name)
		}
		seg := &segment{seq: seq, path: name, last: map[string]uint64{}}
		s.segs = append(s.segs, seg)
		if err := s.replay(seg, i == len(names)-1); err != nil {
			return err
		}
	}
	if len(s.segs) == 0 {
		return s.startSegment(1)
	}
	last := s.segs[len(s.segs)-1]
	f, err := os.OpenFile(last.path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("raftlog: %w", err)
	}
	s.active, s.size = f, st.Size()
	return nil
}

// salvage cuts the damaged segment at d.Cut, moves what followed (and
// every later segment) into .damaged files, and leaves the recovering
// file, all durably.
func salvage(dir string, d *DamageError) error {
	data, err := os.ReadFile(d.File)
	if err != nil {
		return fmt.Errorf("raftlog: salvaging: %w", err)
	}
	aside := fmt.Sprintf("%s.%d.damaged", d.File, d.Cut)
	if err := writeFileSync(aside, data[d.Cut:]); err != nil {
		return err
	}
	if err := os.Truncate(d.File, d.Cut); err != nil {
		return fmt.Errorf("raftlog: salvaging: %w", err)
	}
	if err := syncFile(d.File); err != nil {
		return err
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	for _, name := range names {
		if name > d.File {
			if err := os.Rename(name, name+".damaged"); err != nil {
				return fmt.Errorf("raftlog: salvaging: %w", err)
			}
		}
	}
	if err := writeFileSync(filepath.Join(dir, recoveringFile), []byte(d.Error()+"\n")); err != nil {
		return err
	}
	return syncDir(dir)
}

func writeFileSync(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return syncFile(path)
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("raftlog: syncing %s: %w", path, err)
	}
	return nil
}

// replay reads a segment's records into the groups' state. The end of
// the last segment may be a write cut short, which is cut off; anything
// else that does not read back is a *DamageError.
func (s *Store) replay(seg *segment, last bool) error {
	f, err := os.Open(seg.path)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	size := fi.Size()
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	// The write being read: from batchStart to batchEnd; framed is set
	// once the segment showed a batch record (segments written before
	// batches existed have none).
	batchStart, batchEnd := int64(-1), int64(-1)
	framed := false
	var head [8]byte
	for off < size {
		if off == batchEnd {
			batchStart, batchEnd = -1, -1
		}
		rd := rdamage{seg: seg, last: last, off: off, batchStart: batchStart}
		if size-off < 8 {
			return s.damaged(rd, "record head cut short", batchEnd < 0)
		}
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return fmt.Errorf("raftlog: reading %s: %w", seg.path, err)
		}
		n := int64(binary.LittleEndian.Uint32(head[:4]))
		if off+8+n > size || (batchEnd >= 0 && off+8+n > batchEnd) {
			// A batch head is small: a long record where one is due is
			// damage, not a write cut short.
			return s.damaged(rd, "record runs past the end of its write", batchEnd < 0 && (n <= maxBatchBody || !framed))
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return fmt.Errorf("raftlog: reading %s: %w", seg.path, err)
		}
		if n == 0 || crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(head[4:]) {
			return s.damaged(rd, "checksum mismatch", false)
		}
		off += 8 + n
		if body[0] == recBatch {
			if batchEnd >= 0 {
				return s.damaged(rd, "a write begins inside another", false)
			}
			length, k := binary.Uvarint(body[2:])
			if len(body) < 3 || body[1] != 0 || k <= 0 {
				return s.damaged(rd, "bad batch record", false)
			}
			framed = true
			batchStart, batchEnd = rd.off, off+int64(length)
			if batchEnd > size {
				// The process stopped in the middle of this write: it was
				// never synced, nothing was answered for it.
				rd.batchStart = batchStart
				return s.damaged(rd, "write cut short", true)
			}
			continue
		}
		if framed && batchEnd < 0 {
			return s.damaged(rd, "record outside any write", false)
		}
		if err := s.apply(seg, rd.off+8, body); err != nil {
			return s.damaged(rd, err.Error(), false)
		}
	}
	return nil
}

// rdamage is where replay found a record that does not read back.
type rdamage struct {
	seg        *segment
	last       bool
	off        int64
	batchStart int64 // -1: between writes
}

// damaged decides whether what replay found is the end of a write the
// process never finished (cut off, nil returned) or damage. unfinished
// tells that it looks like a write cut short: a batch record, or a record
// between writes, running past the end of the file.
func (s *Store) damaged(d rdamage, cause string, unfinished bool) error {
	cut := d.off
	if d.batchStart >= 0 {
		cut = d.batchStart
	}
	torn := false
	if d.last {
		torn = unfinished
		if !torn && d.batchStart < 0 {
			// Zeros after the last complete write: room the file system
			// gave a write whose data never reached it.
			zero, err := zeroFrom(d.seg.path, d.off)
			if err != nil {
				return err
			}
			torn = zero
		}
	}
	if !torn {
		return &DamageError{File: d.seg.path, Offset: d.off, Cut: cut, Cause: cause}
	}
	s.log.Warn("raft log ends with a write cut short, cut off", "file", d.seg.path, "offset", cut, "cause", cause)
	if err := os.Truncate(d.seg.path, cut); err != nil {
		return fmt.Errorf("raftlog: cutting %s: %w", d.seg.path, err)
	}
	return nil
}

// zeroFrom reports whether the file holds only zero bytes from off on.
func zeroFrom(path string, off int64) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("raftlog: %w", err)
	}
	defer f.Close()
	r := bufio.NewReader(io.NewSectionReader(f, off, 1<<62))
	for {
		b, err := r.ReadByte()
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("raftlog: %w", err)
		}
		if b != 0 {
			return false, nil
		}
	}
}

// apply records one record's effect in memory; off is where its body
// starts in seg.
func (s *Store) apply(seg *segment, off int64, body []byte) error {
	if len(body) < 1 {
		return errors.New("empty record")
	}
	kind := body[0]
	nameLen, k := binary.Uvarint(body[1:])
	if k <= 0 || uint64(len(body)-1-k) < nameLen {
		return errors.New("bad group name")
	}
	name := string(body[1+k : 1+k+int(nameLen)])
	payload := body[1+k+int(nameLen):]
	g := s.groups[name]
	if g == nil && kind != recDrop {
		g = &group{}
		s.groups[name] = g
	}
	switch kind {
	case recEntries:
		first, last, err := entrySpan(payload)
		if err != nil {
			return err
		}
		g.truncateFrom(first)
		g.runs = append(g.runs, run{seg: seg, off: off, length: len(body), first: first, last: last})
		seg.last[name] = max(seg.last[name], last)
	case recHardState:
		hs := new(raftpb.HardState)
		if err := proto.Unmarshal(payload, hs); err != nil {
			return err
		}
		g.hs = hs
	case recConfState:
		cs := new(raftpb.ConfState)
		if err := proto.Unmarshal(payload, cs); err != nil {
			return err
		}
		g.cs = cs
	case recApplied:
		v, n := binary.Uvarint(payload)
		if n <= 0 {
			return errors.New("bad applied index")
		}
		g.applied = v
	case recMeta:
		g.meta = slices.Clone(payload)
	case recCompact:
		index, n := binary.Uvarint(payload)
		term, m := binary.Uvarint(payload[max(n, 0):])
		if n <= 0 || m <= 0 {
			return errors.New("bad compaction point")
		}
		g.compact(index, term)
	case recRecovering:
		if len(payload) != 1 {
			return errors.New("bad recovering flag")
		}
		g.recovering = payload[0] == 1
	case recDrop:
		delete(s.groups, name)
	default:
		return fmt.Errorf("unknown record kind %d", kind)
	}
	return nil
}

// entrySpan returns the first and last index of an entries payload.
func entrySpan(payload []byte) (first, last uint64, err error) {
	ents, err := decodeEntries(payload)
	if err != nil {
		return 0, 0, err
	}
	if len(ents) == 0 {
		return 0, 0, errors.New("empty entries record")
	}
	return ents[0].GetIndex(), ents[len(ents)-1].GetIndex(), nil
}

func decodeEntries(payload []byte) ([]*raftpb.Entry, error) {
	count, n := binary.Uvarint(payload)
	if n <= 0 {
		return nil, errors.New("bad entry count")
	}
	payload = payload[n:]
	ents := make([]*raftpb.Entry, 0, count)
	for i := uint64(0); i < count; i++ {
		l, n := binary.Uvarint(payload)
		if n <= 0 || uint64(len(payload)-n) < l {
			return nil, errors.New("bad entry length")
		}
		e := new(raftpb.Entry)
		if err := proto.Unmarshal(payload[n:n+int(l)], e); err != nil {
			return nil, err
		}
		ents = append(ents, e)
		payload = payload[n+int(l):]
	}
	return ents, nil
}

// truncateFrom forgets the entries at index first and above: a later
// write replaces them.
func (g *group) truncateFrom(first uint64) {
	for i := len(g.runs) - 1; i >= 0; i-- {
		if g.runs[i].first >= first {
			g.runs = g.runs[:i]
			continue
		}
		if g.runs[i].last >= first {
			g.runs[i].last = first - 1
		}
		break
	}
}

// compact drops the runs wholly at or below index.
func (g *group) compact(index, term uint64) {
	if g.snap != nil && g.snap.GetIndex() >= index {
		return
	}
	g.snap = &raftpb.SnapshotMetadata{Index: proto.Uint64(index), Term: proto.Uint64(term)}
	kept := g.runs[:0]
	for _, r := range g.runs {
		if r.last > index {
			kept = append(kept, r)
		}
	}
	g.runs = kept
}

// startSegment creates segment seq, makes it the active one and writes a
// checkpoint of every group's state into it.
func (s *Store) startSegment(seq uint64) error {
	path := filepath.Join(s.dir, fmt.Sprintf("%016x.wal", seq))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	if s.active != nil {
		// A segment is complete on disk before the next one starts.
		if s.dirty {
			if err := s.active.Sync(); err != nil {
				_ = f.Close()
				_ = os.Remove(path)
				return fmt.Errorf("raftlog: syncing: %w", err)
			}
			s.dirty = false
		}
		_ = s.active.Close()
	}
	seg := &segment{seq: seq, path: path, last: map[string]uint64{}}
	s.segs = append(s.segs, seg)
	s.active, s.size = f, 0
	buf := s.buffer()
	for _, name := range s.sortedGroups() {
		g := s.groups[name]
		if g.snap != nil {
			buf = appendRecord(buf, recCompact, name, binary.AppendUvarint(binary.AppendUvarint(nil, g.snap.GetIndex()), g.snap.GetTerm()))
		}
		if g.cs != nil {
			buf = appendProto(buf, recConfState, name, g.cs)
		}
		if g.hs != nil {
			buf = appendProto(buf, recHardState, name, g.hs)
		}
		if g.applied > 0 {
			buf = appendRecord(buf, recApplied, name, binary.AppendUvarint(nil, g.applied))
		}
		if g.meta != nil {
			buf = appendRecord(buf, recMeta, name, g.meta)
		}
		if g.recovering {
			buf = appendRecord(buf, recRecovering, name, []byte{1})
		}
	}
	if _, err := s.write(buf, true); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	s.keepScratch(buf)
	return nil
}

// scratchMax is the largest write buffer kept for the next write: one
// that grew past it for a write of large entries goes.
const scratchMax = 1 << 20

// keepScratch keeps buf for the next write, unless it grew past
// scratchMax: kept, one write of large entries held its size in memory
// for good.
func (s *Store) keepScratch(buf []byte) {
	if cap(buf) > scratchMax {
		s.scratch = nil
		return
	}
	s.scratch = buf[:0]
}

// buffer returns the scratch buffer, empty but for the room of a batch
// record (see write).
func (s *Store) buffer() []byte {
	buf := append(s.scratch[:0], make([]byte, frameGap)...)
	return buf
}

// write appends the records of buf (from buffer, records from frameGap
// on) to the active segment as one write led by its batch record, and
// syncs it when sync is set. It returns the file offset of buf[frameGap].
// A write that fails is cut off again, so that the next one does not
// follow an unfinished one.
func (s *Store) write(buf []byte, sync bool) (int64, error) {
	if len(buf) == frameGap {
		return s.size, nil
	}
	var frame [frameGap]byte
	head := appendRecord(frame[:0], recBatch, "", binary.AppendUvarint(nil, uint64(len(buf)-frameGap)))
	start := frameGap - len(head)
	copy(buf[start:], head)
	if _, err := s.active.Write(buf[start:]); err != nil {
		_ = s.active.Truncate(s.size)
		return 0, fmt.Errorf("raftlog: writing: %w", err)
	}
	if sync {
		if err := s.active.Sync(); err != nil {
			return 0, fmt.Errorf("raftlog: syncing: %w", err)
		}
	}
	base := s.size + int64(len(head))
	s.dirty = !sync
	s.size += int64(len(buf) - start)
	return base, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftlog: syncing %s: %w", dir, err)
	}
	return nil
}

func appendRecord(buf []byte, kind byte, group string, payload []byte) []byte {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0, kind)
	buf = binary.AppendUvarint(buf, uint64(len(group)))
	buf = append(buf, group...)
	buf = append(buf, payload...)
	body := buf[start+8:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(body, crcTable))
	return buf
}

func appendProto(buf []byte, kind byte, group string, m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	return appendRecord(buf, kind, group, b)
}

func checkGroup(name string) error {
	switch {
	case name == "":
		return errors.New("raftlog: empty group name")
	case len(name) > maxGroupName:
		return fmt.Errorf("raftlog: group name of %d bytes, the limit is %d", len(name), maxGroupName)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("raftlog: group name %q holds a 0 byte", name)
	}
	return nil
}

// Save applies many groups' writes at once, with one write and, when
// sync is set, one sync: durable when it returns. Without sync the writes
// are durable with the next synced one (raft needs no sync when only a
// commit index or an applied index changed). Entries replace every stored
// entry of their group at the index of the first one or above.
func (s *Store) Save(ws []Write, sync bool) error {
	for _, w := range ws {
		if err := checkGroup(w.Group); err != nil {
			return err
		}
		var prev uint64
		for i, e := range w.Entries {
			if e == nil {
				return fmt.Errorf("raftlog: group %s: nil entry", w.Group)
			}
			if e.GetIndex() == 0 || (i > 0 && e.GetIndex() <= prev) {
				return fmt.Errorf("raftlog: group %s: entry indexes must start at 1 or more and increase", w.Group)
			}
			prev = e.GetIndex()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if s.size >= s.segSize {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	buf := s.buffer()
	type pending struct {
		name        string
		off         int64
		length      int
		first, last uint64
	}
	var runs []pending
	for _, w := range ws {
		// Entries first: a hard state's commit may name them.
		if len(w.Entries) > 0 {
			payload := binary.AppendUvarint(nil, uint64(len(w.Entries)))
			for _, e := range w.Entries {
				b, err := proto.Marshal(e)
				if err != nil {
					return fmt.Errorf("raftlog: encoding an entry: %w", err)
				}
				payload = binary.AppendUvarint(payload, uint64(len(b)))
				payload = append(payload, b...)
			}
			start := len(buf)
			buf = appendRecord(buf, recEntries, w.Group, payload)
			runs = append(runs, pending{w.Group, int64(start-frameGap) + 8, len(buf) - start - 8,
				w.Entries[0].GetIndex(), w.Entries[len(w.Entries)-1].GetIndex()})
		}
		if w.ConfState != nil {
			buf = appendProto(buf, recConfState, w.Group, w.ConfState)
		}
		if w.HardState != nil {
			buf = appendProto(buf, recHardState, w.Group, w.HardState)
		}
		if w.Applied > 0 {
			buf = appendRecord(buf, recApplied, w.Group, binary.AppendUvarint(nil, w.Applied))
		}
		if w.Meta != nil {
			buf = appendRecord(buf, recMeta, w.Group, w.Meta)
		}
		if w.Recovering != nil {
			flag := byte(0)
			if *w.Recovering {
				flag = 1
			}
			buf = appendRecord(buf, recRecovering, w.Group, []byte{flag})
		}
	}
	base, err := s.write(buf, sync)
	if err != nil {
		return err
	}
	s.keepScratch(buf)
	seg := s.segs[len(s.segs)-1]
	for _, w := range ws {
		if w.ConfState == nil && w.HardState == nil && w.Applied == 0 && w.Meta == nil && w.Recovering == nil && len(w.Entries) == 0 {
			continue
		}
		g := s.groups[w.Group]
		if g == nil {
			g = &group{}
			s.groups[w.Group] = g
		}
		if w.ConfState != nil {
			g.cs = proto.Clone(w.ConfState).(*raftpb.ConfState)
		}
		if w.HardState != nil {
			g.hs = proto.Clone(w.HardState).(*raftpb.HardState)
		}
		if w.Applied > 0 {
			g.applied = w.Applied
		}
		if w.Meta != nil {
			g.meta = slices.Clone(w.Meta)
		}
		if w.Recovering != nil {
			g.recovering = *w.Recovering
		}
	}
	for _, r := range runs {
		g := s.groups[r.name]
		g.truncateFrom(r.first)
		g.runs = append(g.runs, run{seg: seg, off: base + r.off, length: r.length, first: r.first, last: r.last})
		seg.last[r.name] = max(seg.last[r.name], r.last)
	}
	return nil
}

// rotate starts a new segment and deletes the old ones no group needs.
func (s *Store) rotate() error {
	if err := s.startSegment(s.segs[len(s.segs)-1].seq + 1); err != nil {
		return err
	}
	kept := s.segs[:0]
	for i, seg := range s.segs {
		if i < len(s.segs)-1 && !s.needed(seg) {
			if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("raftlog: %w", err)
			}
			continue
		}
		kept = append(kept, seg)
	}
	s.segs = kept
	return nil
}

// needed reports whether a group still reads entries from seg.
func (s *Store) needed(seg *segment) bool {
	for _, g := range s.groups {
		for _, r := range g.runs {
			if r.seg == seg {
				return true
			}
		}
	}
	return false
}

// Compact deletes the group's entries with index <= index and records
// index and term as its snapshot point; the record is synced with the next
// Save (a point lost in a crash only keeps more entries). A point at or
// below the recorded one changes nothing.
func (s *Store) Compact(name string, index, term uint64) error {
	if err := checkGroup(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	g := s.groups[name]
	if g == nil {
		g = &group{}
		s.groups[name] = g
	}
	if g.snap != nil && g.snap.GetIndex() >= index {
		return nil
	}
	buf := appendRecord(s.buffer(), recCompact, name, binary.AppendUvarint(binary.AppendUvarint(nil, index), term))
	if _, err := s.write(buf, false); err != nil {
		return err
	}
	s.keepScratch(buf)
	g.compact(index, term)
	return nil
}

// Drop deletes everything of the group, durably.
func (s *Store) Drop(group string) error {
	if err := checkGroup(group); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if _, ok := s.groups[group]; !ok {
		return nil
	}
	buf := appendRecord(s.buffer(), recDrop, group, nil)
	if _, err := s.write(buf, true); err != nil {
		return err
	}
	s.keepScratch(buf)
	delete(s.groups, group)
	return nil
}

// Groups returns the names of the groups with stored state, sorted.
func (s *Store) Groups() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	return s.sortedGroups(), nil
}

func (s *Store) sortedGroups() []string {
	names := make([]string, 0, len(s.groups))
	for name := range s.groups {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Load returns what is stored of a group: zero values when nothing.
func (s *Store) Load(name string) (State, error) {
	if err := checkGroup(name); err != nil {
		return State{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return State{}, errClosed
	}
	g := s.groups[name]
	if g == nil {
		return State{}, nil
	}
	st := State{Applied: g.applied, Meta: slices.Clone(g.meta), Recovering: g.recovering}
	if g.hs != nil {
		st.HardState = proto.Clone(g.hs).(*raftpb.HardState)
	}
	if g.cs != nil {
		st.ConfState = proto.Clone(g.cs).(*raftpb.ConfState)
	}
	if g.snap != nil {
		st.Snapshot = proto.Clone(g.snap).(*raftpb.SnapshotMetadata)
	}
	files := map[*segment]*os.File{}
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	for _, r := range g.runs {
		f := files[r.seg]
		if f == nil {
			var err error
			if f, err = os.Open(r.seg.path); err != nil {
				return State{}, fmt.Errorf("raftlog: %w", err)
			}
			files[r.seg] = f
		}
		body := make([]byte, r.length)
		if _, err := f.ReadAt(body, r.off); err != nil {
			return State{}, fmt.Errorf("raftlog: reading %s: %w", r.seg.path, err)
		}
		_, k := binary.Uvarint(body[1:])
		ents, err := decodeEntries(body[1+k+len(name):])
		if err != nil {
			return State{}, fmt.Errorf("raftlog: %s: %w", r.seg.path, err)
		}
		for _, e := range ents {
			if e.GetIndex() > r.last || (g.snap != nil && e.GetIndex() <= g.snap.GetIndex()) {
				continue
			}
			st.Entries = append(st.Entries, e)
		}
	}
	return st, nil
}

// Salvaged returns the damage a salvaging Open cut off, nil when it found
// none.
func (s *Store) Salvaged() *DamageError { return s.salvaged }

// Recovering reports whether the store was salvaged and its user has not
// yet called Recovered: a group it holds nothing of may have lost what it
// acknowledged, like the groups flagged Recovering.
func (s *Store) Recovering() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recovering
}

// MarkRecovering records, durably, that the store may lack what its node
// acknowledged (its log was removed, or restored from an older copy), as
// a salvage does.
func (s *Store) MarkRecovering(why string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeFileSync(filepath.Join(s.dir, recoveringFile), []byte(why+"\n")); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	s.recovering = true
	return nil
}

// Recovered records, durably, that every group the salvage concerned has
// its entries back.
func (s *Store) Recovered() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recovering {
		return nil
	}
	if err := os.Remove(filepath.Join(s.dir, recoveringFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("raftlog: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	s.recovering = false
	return nil
}

// Close closes the store; it can be called twice.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.active != nil {
		var err error
		if s.dirty {
			err = s.active.Sync()
		}
		return errors.Join(err, s.active.Close())
	}
	return nil
}
