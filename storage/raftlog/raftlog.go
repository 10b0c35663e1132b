// Package raftlog stores the raft state of a node's raft groups (one group
// per queue partition) in one Badger database, so that one commit, and one
// fsync, covers the writes of many groups.
//
// A group's state is its HardState, ConfState, log entries, snapshot point
// (the index and term the log was compacted to), last applied index and
// the caller's opaque metadata.
package raftlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Badger settings: small memtables, as the raft log holds little live data.
const (
	memTableSize     = 8 << 20
	numMemtables     = 2
	valueThreshold   = 1 << 10 // entries of 1 KiB or more live in the value log
	blockCacheSize   = 4 << 20
	valueLogFileSize = 64 << 20 // value-log GC rewrites whole files
	numCompactors    = 2

	gcInterval     = time.Minute
	gcDiscardRatio = 0.5
)

var errClosed = errors.New("raftlog: store closed")

// Options configure Open.
type Options struct {
	// Dir is the directory of the Badger database; it is created if missing.
	Dir string
	// Logger receives Badger's warnings and errors and the store's own;
	// Badger's info and debug messages are dropped. nil means slog.Default().
	Logger *slog.Logger
	// SyncWrites asks for commits that fsync before they return, so that
	// Save, Compact and Drop are durable when they return nil. That is what
	// the store always does, so that the zero Options are safe: false does
	// not turn it off.
	SyncWrites bool
}

// Store is the raft log of all of a node's groups. Its methods are safe for
// concurrent use; Save, Compact and Drop run one at a time.
type Store struct {
	db  *badger.DB
	log *slog.Logger

	// closeMu guards closed: every method holds it for reading, Close for
	// writing.
	closeMu sync.RWMutex
	closed  bool

	// wmu serializes the writers and guards the fields below.
	wmu sync.Mutex
	// last is the highest stored entry index of a group, 0 when it has no
	// entries; a group not in it is not known yet.
	last map[string]uint64
	// known are the groups whose marker key is stored.
	known map[string]bool
	// commits counts Badger commits made by the writers.
	commits uint64

	stopGC chan struct{}
	gcDone chan struct{}
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
}

// Open opens, or creates, the store in o.Dir.
func Open(o Options) (*Store, error) {
	if o.Dir == "" {
		return nil, errors.New("raftlog: no directory given")
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "raftlog")
	bo := badger.DefaultOptions(o.Dir).
		WithSyncWrites(true).       // whatever o.SyncWrites says: see Options
		WithDetectConflicts(false). // wmu serializes the writers
		WithNumVersionsToKeep(1).
		WithCompression(options.None).
		WithMemTableSize(memTableSize).
		WithNumMemtables(numMemtables).
		WithValueThreshold(valueThreshold).
		WithBlockCacheSize(blockCacheSize).
		WithValueLogFileSize(valueLogFileSize).
		WithNumCompactors(numCompactors).
		WithMetricsEnabled(false).
		WithLogger(badgerLogger{log})
	db, err := badger.Open(bo)
	if err != nil {
		return nil, fmt.Errorf("raftlog: opening %s: %w", o.Dir, err)
	}
	s := &Store{
		db:     db,
		log:    log,
		last:   map[string]uint64{},
		known:  map[string]bool{},
		stopGC: make(chan struct{}),
		gcDone: make(chan struct{}),
	}
	groups, err := s.groups()
	if err != nil {
		_ = db.Close() // the read's error is the one worth reporting
		return nil, fmt.Errorf("raftlog: opening %s: %w", o.Dir, err)
	}
	for _, g := range groups {
		s.known[g] = true
	}
	go s.runGC()
	return s, nil
}

// Close stops the store and closes the database. Later calls return nil;
// other methods return an error once Close has begun.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.stopGC)
	<-s.gcDone
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("raftlog: closing: %w", err)
	}
	return nil
}

// Groups returns the names of the groups with stored state, sorted.
func (s *Store) Groups() ([]string, error) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	groups, err := s.groups()
	if err != nil {
		return nil, fmt.Errorf("raftlog: listing groups: %w", err)
	}
	return groups, nil
}

// groups lists the group markers; key order is the names' sorted order.
func (s *Store) groups() ([]string, error) {
	var groups []string
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := []byte{kindGroup}
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			groups = append(groups, string(it.Item().Key()[1:]))
		}
		return nil
	})
	return groups, err
}

// Load returns what is stored of a group: zero values when nothing.
func (s *Store) Load(group string) (State, error) {
	if err := checkGroup(group); err != nil {
		return State{}, err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return State{}, errClosed
	}
	var st State
	err := s.db.View(func(txn *badger.Txn) error {
		var err error
		if st.HardState, err = getMessage[raftpb.HardState](txn, stateKey(kindHardState, group)); err != nil {
			return err
		}
		if st.ConfState, err = getMessage[raftpb.ConfState](txn, stateKey(kindConfState, group)); err != nil {
			return err
		}
		if st.Snapshot, err = getMessage[raftpb.SnapshotMetadata](txn, stateKey(kindSnapshot, group)); err != nil {
			return err
		}
		if v, err := getValue(txn, stateKey(kindApplied, group)); err != nil {
			return err
		} else if v != nil {
			if len(v) != 8 {
				return fmt.Errorf("applied index of %d bytes", len(v))
			}
			st.Applied = binary.BigEndian.Uint64(v)
		}
		if st.Meta, err = getValue(txn, stateKey(kindMeta, group)); err != nil {
			return err
		}
		st.Entries, err = loadEntries(txn, group, st.Snapshot.GetIndex()+1)
		return err
	})
	if err != nil {
		return State{}, fmt.Errorf("raftlog: loading group %q: %w", group, err)
	}
	return st, nil
}

// loadEntries returns the group's entries from index from on. Entries at
// or below the snapshot point, which a compaction interrupted in the middle
// may leave, are skipped that way.
func loadEntries(txn *badger.Txn, group string, from uint64) ([]*raftpb.Entry, error) {
	prefix := entryPrefix(group)
	opts := badger.DefaultIteratorOptions // prefetches values
	opts.Prefix = prefix
	it := txn.NewIterator(opts)
	defer it.Close()
	var ents []*raftpb.Entry
	for it.Seek(entryKey(group, from)); it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		e := new(raftpb.Entry)
		// Unmarshal copies the bytes it keeps, so the value need not outlive
		// the callback.
		if err := item.Value(func(v []byte) error { return proto.Unmarshal(v, e) }); err != nil {
			return nil, fmt.Errorf("entry %d: %w", entryIndex(item.Key()), err)
		}
		ents = append(ents, e)
	}
	return ents, nil
}

// getValue returns a copy of key's value, nil when key is absent and an
// empty slice when its value is empty.
func getValue(txn *badger.Txn, key []byte) ([]byte, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// getMessage unmarshals key's value into a new M, nil when key is absent.
func getMessage[M any, PM interface {
	*M
	proto.Message
}](txn *badger.Txn, key []byte) (*M, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := PM(new(M))
	if err := item.Value(func(v []byte) error { return proto.Unmarshal(v, m) }); err != nil {
		return nil, fmt.Errorf("%c record: %w", key[0], err)
	}
	return m, nil
}

// op is one key's change in a commit.
type op struct {
	key, val []byte
	del      bool
}

// Save applies many groups' writes atomically and durably: one synced
// Badger commit, split into several, each synced before the next, only when
// the batch exceeds Badger's transaction size limit. Within a group the
// replaced entries are deleted first and the HardState written after the
// entries, so that a crash between parts leaves a valid, possibly shorter,
// log. Writes of the same group apply in order.
func (s *Store) Save(ws []Write) error {
	groups, merged, err := coalesce(ws)
	if err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()

	var ops []op
	err = s.db.View(func(txn *badger.Txn) error {
		for _, g := range groups {
			var err error
			if ops, err = s.appendWriteOps(ops, txn, merged[g]); err != nil {
				return fmt.Errorf("group %q: %w", g, err)
			}
		}
		return nil
	})
	if err == nil {
		err = s.commit(ops)
	}
	if err != nil {
		for _, g := range groups {
			delete(s.last, g) // unknown until read again
		}
		return fmt.Errorf("raftlog: saving %d groups: %w", len(groups), err)
	}
	for _, g := range groups {
		w := merged[g]
		if n := len(w.Entries); n > 0 {
			s.last[g] = w.Entries[n-1].GetIndex()
		}
		if !isEmpty(w) {
			s.known[g] = true
		}
	}
	return nil
}

// coalesce checks ws and merges the writes of each group into one, in the
// order of the groups' first writes.
func coalesce(ws []Write) ([]string, map[string]*Write, error) {
	var groups []string
	merged := make(map[string]*Write, len(ws))
	for i := range ws {
		w := &ws[i]
		if err := checkWrite(w); err != nil {
			return nil, nil, err
		}
		m, ok := merged[w.Group]
		if !ok {
			c := *w
			merged[w.Group] = &c
			groups = append(groups, w.Group)
			continue
		}
		if w.HardState != nil {
			m.HardState = w.HardState
		}
		if w.ConfState != nil {
			m.ConfState = w.ConfState
		}
		if w.Applied != 0 {
			m.Applied = w.Applied
		}
		if w.Meta != nil {
			m.Meta = w.Meta
		}
		if len(w.Entries) > 0 {
			first := w.Entries[0].GetIndex()
			k := sort.Search(len(m.Entries), func(j int) bool { return m.Entries[j].GetIndex() >= first })
			// The full slice expression keeps append off the caller's array.
			m.Entries = append(m.Entries[:k:k], w.Entries...)
		}
	}
	return groups, merged, nil
}

// checkWrite reports whether w can be saved.
func checkWrite(w *Write) error {
	if err := checkGroup(w.Group); err != nil {
		return err
	}
	var prev uint64
	for i, e := range w.Entries {
		if e == nil {
			return fmt.Errorf("raftlog: group %q: entry %d of the write is nil", w.Group, i)
		}
		idx := e.GetIndex()
		if idx == 0 || idx <= prev {
			return fmt.Errorf("raftlog: group %q: entry index %d after %d: indexes must increase from 1", w.Group, idx, prev)
		}
		prev = idx
	}
	return nil
}

// isEmpty reports whether w changes nothing.
func isEmpty(w *Write) bool {
	return w.HardState == nil && w.ConfState == nil && len(w.Entries) == 0 && w.Applied == 0 && w.Meta == nil
}

// appendWriteOps appends the changes of w to ops: the deletion of the
// stored entries it replaces, its entries, then its single values. txn
// reads the committed state. s.wmu is held.
func (s *Store) appendWriteOps(ops []op, txn *badger.Txn, w *Write) ([]op, error) {
	if isEmpty(w) {
		return ops, nil
	}
	g := w.Group
	if !s.known[g] {
		ops = append(ops, op{key: stateKey(kindGroup, g), val: []byte{}})
	}
	if len(w.Entries) > 0 {
		first := w.Entries[0].GetIndex()
		if last, ok := s.last[g]; !ok || last >= first {
			var err error
			if ops, err = appendTruncateOps(ops, txn, g, w.Entries); err != nil {
				return nil, err
			}
		}
		for _, e := range w.Entries {
			b, err := proto.Marshal(e)
			if err != nil {
				return nil, fmt.Errorf("encoding entry %d: %w", e.GetIndex(), err)
			}
			ops = append(ops, op{key: entryKey(g, e.GetIndex()), val: b})
		}
	}
	for _, m := range []struct {
		kind byte
		msg  proto.Message
	}{{kindConfState, w.ConfState}, {kindHardState, w.HardState}} {
		if m.msg == nil || !m.msg.ProtoReflect().IsValid() {
			continue
		}
		b, err := proto.Marshal(m.msg)
		if err != nil {
			return nil, fmt.Errorf("encoding %c record: %w", m.kind, err)
		}
		ops = append(ops, op{key: stateKey(m.kind, g), val: b})
	}
	if w.Applied != 0 {
		ops = append(ops, op{key: stateKey(kindApplied, g), val: binary.BigEndian.AppendUint64(nil, w.Applied)})
	}
	if w.Meta != nil {
		ops = append(ops, op{key: stateKey(kindMeta, g), val: append([]byte{}, w.Meta...)})
	}
	return ops, nil
}

// appendTruncateOps appends the deletion of the group's stored entries at
// the first index of ents or above that ents do not overwrite.
func appendTruncateOps(ops []op, txn *badger.Txn, group string, ents []*raftpb.Entry) ([]op, error) {
	prefix := entryPrefix(group)
	opts := badger.DefaultIteratorOptions
	opts.PrefetchValues = false
	opts.Prefix = prefix
	it := txn.NewIterator(opts)
	defer it.Close()
	j := 0 // ents[j] is the first new entry not below the stored one
	for it.Seek(entryKey(group, ents[0].GetIndex())); it.ValidForPrefix(prefix); it.Next() {
		idx := entryIndex(it.Item().Key())
		for j < len(ents) && ents[j].GetIndex() < idx {
			j++
		}
		if j < len(ents) && ents[j].GetIndex() == idx {
			continue // overwritten
		}
		ops = append(ops, op{key: it.Item().KeyCopy(nil), del: true})
	}
	return ops, nil
}

// commit writes ops in order in one Badger transaction, or in several
// consecutive ones when they exceed its size limit. s.wmu is held.
func (s *Store) commit(ops []op) error {
	txn := s.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	n := 0 // ops in txn
	for i := 0; i < len(ops); {
		var err error
		if ops[i].del {
			err = txn.Delete(ops[i].key)
		} else {
			err = txn.Set(ops[i].key, ops[i].val)
		}
		if errors.Is(err, badger.ErrTxnTooBig) && n > 0 {
			if err := txn.Commit(); err != nil {
				return fmt.Errorf("committing: %w", err)
			}
			s.commits++
			txn = s.db.NewTransaction(true)
			n = 0
			continue
		}
		if err != nil {
			return fmt.Errorf("writing key %q: %w", ops[i].key, err)
		}
		n++
		i++
	}
	if n == 0 {
		return nil
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	s.commits++
	return nil
}

// Compact deletes the group's entries with index <= index and records
// index and term as its snapshot point (State.Snapshot), durably. It does
// nothing when the group is already compacted to index or beyond.
//
// The snapshot point is recorded before the entries are deleted: should the
// deletion span several commits and be interrupted, Load still returns only
// the entries after the point, and the next Compact deletes the rest.
func (s *Store) Compact(group string, index, term uint64) error {
	if err := checkGroup(group); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()

	var ops []op
	err := s.db.View(func(txn *badger.Txn) error {
		snap, err := getMessage[raftpb.SnapshotMetadata](txn, stateKey(kindSnapshot, group))
		if err != nil {
			return err
		}
		if snap != nil && snap.GetIndex() >= index {
			return nil
		}
		b, err := proto.Marshal(&raftpb.SnapshotMetadata{Index: proto.Uint64(index), Term: proto.Uint64(term)})
		if err != nil {
			return fmt.Errorf("encoding snapshot point: %w", err)
		}
		if !s.known[group] {
			ops = append(ops, op{key: stateKey(kindGroup, group), val: []byte{}})
		}
		ops = append(ops, op{key: stateKey(kindSnapshot, group), val: b})
		prefix := entryPrefix(group)
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			if entryIndex(it.Item().Key()) > index {
				break
			}
			ops = append(ops, op{key: it.Item().KeyCopy(nil), del: true})
		}
		return nil
	})
	if err == nil {
		err = s.commit(ops)
	}
	if err != nil {
		delete(s.last, group)
		return fmt.Errorf("raftlog: compacting group %q to %d: %w", group, index, err)
	}
	if len(ops) > 0 {
		s.known[group] = true
		if last, ok := s.last[group]; ok && last <= index {
			s.last[group] = 0
		}
	}
	return nil
}

// Drop deletes everything of the group, durably. Its marker goes last:
// should the deletion span several commits and be interrupted, Groups still
// lists the group and Drop can be called again.
func (s *Store) Drop(group string) error {
	if err := checkGroup(group); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()

	var ops []op
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := entryPrefix(group)
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			ops = append(ops, op{key: it.Item().KeyCopy(nil), del: true})
		}
		return nil
	})
	for _, kind := range stateKinds {
		ops = append(ops, op{key: stateKey(kind, group), del: true})
	}
	if err == nil {
		err = s.commit(ops)
	}
	if err != nil {
		delete(s.last, group)
		return fmt.Errorf("raftlog: dropping group %q: %w", group, err)
	}
	s.last[group] = 0
	delete(s.known, group)
	return nil
}

// runGC rewrites value-log files that are mostly deleted entries, every
// gcInterval until Close.
func (s *Store) runGC() {
	defer close(s.gcDone)
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopGC:
			return
		case <-t.C:
		}
		for {
			select {
			case <-s.stopGC:
				return
			default:
			}
			err := s.db.RunValueLogGC(gcDiscardRatio)
			if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
				break
			}
			if err != nil {
				s.log.Warn("value log GC failed", "err", err)
				break
			}
		}
	}
}

// badgerLogger passes Badger's warnings and errors to slog and drops its
// info and debug messages.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(format string, args ...any)   { l.emit(slog.LevelError, format, args) }
func (l badgerLogger) Warningf(format string, args ...any) { l.emit(slog.LevelWarn, format, args) }
func (badgerLogger) Infof(string, ...any)                  {}
func (badgerLogger) Debugf(string, ...any)                 {}

func (l badgerLogger) emit(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if l.log.Enabled(ctx, level) {
		l.log.Log(ctx, level, strings.TrimRight(fmt.Sprintf(format, args...), "\n"))
	}
}
