package queuetest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq/queue"
)

var (
	// ErrClosed is returned by a MemStore handle after Close.
	ErrClosed = errors.New("queuetest: store closed")
	// ErrInvalidWrite is returned for a batch that names no queue, a queue or
	// group holding U+0000, a partition outside 0..2^32-1 or a nil message.
	ErrInvalidWrite = errors.New("queuetest: invalid write")
)

// FaultInjector is a store whose writes can be made to fail. RunStoreSuite
// runs its fault cases only against stores that implement it.
type FaultInjector interface {
	// FailWrites makes every Write and Sync return err until it is called
	// with nil. A failed Write changes nothing.
	FailWrites(err error)
}

// MemStats counts what a MemStore handle was asked to do.
type MemStats struct {
	Writes     int // successful Write calls
	SyncWrites int // successful Write calls with sync set
	Syncs      int // successful Sync calls
	Failed     int // Write and Sync calls that returned an error
}

// MemStore is an in-memory queue.Store for tests. It is safe for concurrent
// use; its shards may be written and read from any goroutine.
type MemStore struct {
	shards []queue.Shard
	data   []*memData

	mu       sync.Mutex // guards the fields below
	closed   bool
	failErr  error
	failLeft int // writes left to fail; -1 means until FailWrites(nil)
	stats    MemStats
	// held, while not nil, is closed when writes may go on (HoldWrites).
	held chan struct{}
}

var (
	_ queue.Store   = (*MemStore)(nil)
	_ FaultInjector = (*MemStore)(nil)
)

// NewMemStore returns an empty store with the given number of shards (at
// least one).
func NewMemStore(shards int) *MemStore {
	data := make([]*memData, max(shards, 1))
	for i := range data {
		data[i] = newMemData()
	}
	return newMemHandle(data)
}

func newMemHandle(data []*memData) *MemStore {
	s := &MemStore{data: data}
	s.shards = make([]queue.Shard, len(data))
	for i, d := range data {
		s.shards[i] = &memShard{store: s, data: d}
	}
	return s
}

// Shards returns the store's shards.
func (s *MemStore) Shards() []queue.Shard { return slices.Clone(s.shards) }

// Close closes this handle; the data stays for Reopen.
func (s *MemStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.held != nil { // a held write fails as closed
		close(s.held)
		s.held = nil
	}
	return nil
}

// Reopen returns a new, open handle on the same data, as reopening a data
// directory would. Faults and stats start afresh.
func (s *MemStore) Reopen() *MemStore { return newMemHandle(s.data) }

// FailWrites makes every Write and Sync of every shard return err until it
// is called again with nil.
func (s *MemStore) FailWrites(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failErr, s.failLeft = err, -1
	if err == nil {
		s.failLeft = 0
	}
}

// FailNextWrites makes the next n calls of Write or Sync, on any shard,
// return err; later calls succeed again.
func (s *MemStore) FailNextWrites(n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failErr, s.failLeft = err, n
}

// HoldWrites makes every Write and Sync that starts from now on wait
// until ReleaseWrites: a disk that stalls.
func (s *MemStore) HoldWrites() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = make(chan struct{})
	}
}

// ReleaseWrites lets the writes HoldWrites held go on.
func (s *MemStore) ReleaseWrites() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
}

// Stats returns what the handle counted so far.
func (s *MemStore) Stats() MemStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// admit decides whether a Write or Sync may go ahead and counts it.
func (s *MemStore) admit(write, sync bool) error {
	s.mu.Lock()
	for s.held != nil && !s.closed {
		held := s.held
		s.mu.Unlock()
		<-held
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.closed {
		s.stats.Failed++
		return ErrClosed
	}
	if s.failLeft != 0 && s.failErr != nil {
		if s.failLeft > 0 {
			s.failLeft--
		}
		s.stats.Failed++
		return s.failErr
	}
	switch {
	case write && sync:
		s.stats.Writes++
		s.stats.SyncWrites++
	case write:
		s.stats.Writes++
	default:
		s.stats.Syncs++
	}
	return nil
}

func (s *MemStore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// memData is the content of one shard, shared by every handle.
type memData struct {
	mu     sync.RWMutex // guards the maps and what they point to
	parts  map[partKey]*memPart
	groups map[partKey]map[string]*memGroup
	queues map[string]queue.QueueMeta
	dedups map[partKey]map[string]time.Time
}

type partKey struct {
	queue     string
	partition int
}

type memPart struct {
	msgs   []*queue.Message // sorted by offset, no duplicates
	low    uint64           // the highest RangeDelete.To so far
	hasLow bool
}

type memGroup struct {
	floor      uint64
	delivered  uint64
	filter     string
	hasFloor   bool
	settled    map[uint64]struct{}
	deliveries map[uint64]uint32
}

func (g *memGroup) empty() bool {
	return !g.hasFloor && len(g.settled) == 0 && len(g.deliveries) == 0
}

func newMemData() *memData {
	return &memData{
		parts:  map[partKey]*memPart{},
		groups: map[partKey]map[string]*memGroup{},
		queues: map[string]queue.QueueMeta{},
		dedups: map[partKey]map[string]time.Time{},
	}
}

// memShard is one shard seen through one MemStore handle.
type memShard struct {
	store *MemStore
	data  *memData
}

var _ queue.Shard = (*memShard)(nil)

// Write applies b atomically: it checks the whole batch before it changes
// anything. The order of application is Queues, DropQueues, Erase, Appends, Deletes, Floors,
// Marks, Deliveries, DropGroups, as in storage/badger.
func (s *memShard) Write(b *queue.Batch, sync bool) error {
	if err := validateBatch(b); err != nil {
		return err
	}
	if err := s.store.admit(true, sync); err != nil {
		return err
	}
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range b.Queues {
		d.queues[q.Name] = cloneMeta(q)
	}
	for _, name := range b.DropQueues {
		delete(d.queues, name)
	}
	for _, id := range b.Erase {
		k := partKey{id.Queue, id.Partition}
		delete(d.parts, k)
		delete(d.groups, k)
		delete(d.dedups, k)
	}
	for _, a := range b.Appends {
		d.part(a.Queue, a.Partition).put(cloneMessage(a.Message))
	}
	for _, r := range b.Deletes {
		p := d.part(r.Queue, r.Partition)
		p.deleteRange(r.From, r.To)
		if !p.hasLow || r.To > p.low {
			p.low, p.hasLow = r.To, true
		}
	}
	for _, f := range b.Floors {
		g := d.group(f.Queue, f.Partition, f.Group)
		g.floor, g.delivered, g.filter, g.hasFloor = f.Floor, f.Delivered, f.Filter, true
	}
	for _, m := range b.Marks {
		g := d.group(m.Queue, m.Partition, m.Group)
		if m.Set {
			g.settled[m.Offset] = struct{}{}
		} else {
			delete(g.settled, m.Offset)
		}
	}
	for _, m := range b.Deliveries {
		g := d.group(m.Queue, m.Partition, m.Group)
		if m.Count == 0 {
			delete(g.deliveries, m.Offset)
		} else {
			g.deliveries[m.Offset] = m.Count
		}
	}
	for _, r := range b.DropGroups {
		delete(d.groups[partKey{r.Queue, r.Partition}], r.Group)
	}
	for _, m := range b.Dedups {
		k := partKey{m.Queue, m.Partition}
		if m.At.IsZero() {
			delete(d.dedups[k], m.ID)
			continue
		}
		if d.dedups[k] == nil {
			d.dedups[k] = map[string]time.Time{}
		}
		d.dedups[k][m.ID] = m.At.UTC().Truncate(time.Millisecond)
	}
	d.pruneGroupsLocked()
	return nil
}

// Dedups returns the dedup-ids recorded on the partition.
func (s *memShard) Dedups(q string, partition int) (map[string]time.Time, error) {
	if s.store.isClosed() {
		return nil, ErrClosed
	}
	s.data.mu.RLock()
	defer s.data.mu.RUnlock()
	out := map[string]time.Time{}
	for id, at := range s.data.dedups[partKey{q, partition}] {
		out[id] = at
	}
	return out, nil
}

// Sync does nothing but honour injected faults: MemStore keeps every write.
func (s *memShard) Sync() error { return s.store.admit(false, false) }

// Read returns copies of the stored messages with from <= offset < to.
func (s *memShard) Read(q string, partition int, from, to uint64, max int) ([]*queue.Message, error) {
	return s.ReadBytes(q, partition, from, to, max, 0)
}

// ReadBytes is Read that also stops at the message whose payload brings
// the payloads read to maxBytes (0: no such bound).
func (s *memShard) ReadBytes(q string, partition int, from, to uint64, max int, maxBytes int64) ([]*queue.Message, error) {
	if s.store.isClosed() {
		return nil, ErrClosed
	}
	if max <= 0 || from >= to {
		return nil, nil
	}
	d := s.data
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.parts[partKey{q, partition}]
	if p == nil {
		return nil, nil
	}
	var out []*queue.Message
	var bytes int64
	for _, m := range p.msgs[p.search(from):] {
		if m.Offset >= to || len(out) == max || (maxBytes > 0 && bytes >= maxBytes) {
			break
		}
		out = append(out, cloneMessage(m))
		bytes += int64(len(m.Payload))
	}
	return out, nil
}

// Bounds returns max(low watermark, first offset) and max(last offset + 1,
// low watermark).
func (s *memShard) Bounds(q string, partition int) (first, next uint64, err error) {
	if s.store.isClosed() {
		return 0, 0, ErrClosed
	}
	d := s.data
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.parts[partKey{q, partition}]
	if p == nil {
		return 0, 0, nil
	}
	first, next = p.low, p.low
	if n := len(p.msgs); n > 0 {
		first = max(p.low, p.msgs[0].Offset)
		next = max(p.low, p.msgs[n-1].Offset+1)
	}
	return first, next, nil
}

// Queues returns the stored queue metadata sorted by name.
func (s *memShard) Queues() ([]queue.QueueMeta, error) {
	if s.store.isClosed() {
		return nil, ErrClosed
	}
	d := s.data
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]queue.QueueMeta, 0, len(d.queues))
	for _, q := range d.queues {
		out = append(out, cloneMeta(q))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Groups returns the groups of the partition sorted by name, each with its
// settled offsets in ascending order.
func (s *memShard) Groups(q string, partition int) ([]queue.GroupState, error) {
	if s.store.isClosed() {
		return nil, ErrClosed
	}
	d := s.data
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []queue.GroupState
	for name, g := range d.groups[partKey{q, partition}] {
		st := queue.GroupState{Group: name, Floor: g.floor, Delivered: g.delivered, Filter: g.filter}
		for off := range g.settled {
			st.Settled = append(st.Settled, off)
		}
		slices.Sort(st.Settled)
		if len(g.deliveries) > 0 {
			st.Deliveries = make(map[uint64]uint32, len(g.deliveries))
			for off, n := range g.deliveries {
				st.Deliveries[off] = n
			}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out, nil
}

// part returns the partition, creating it. Lock must be held.
func (d *memData) part(q string, partition int) *memPart {
	k := partKey{q, partition}
	p := d.parts[k]
	if p == nil {
		p = &memPart{}
		d.parts[k] = p
	}
	return p
}

// group returns the group's state, creating it. Lock must be held.
func (d *memData) group(q string, partition int, name string) *memGroup {
	k := partKey{q, partition}
	gs := d.groups[k]
	if gs == nil {
		gs = map[string]*memGroup{}
		d.groups[k] = gs
	}
	g := gs[name]
	if g == nil {
		g = &memGroup{settled: map[uint64]struct{}{}, deliveries: map[uint64]uint32{}}
		gs[name] = g
	}
	return g
}

// pruneGroupsLocked forgets groups left without any record, as a key-value
// store would hold no key for them. Lock must be held.
func (d *memData) pruneGroupsLocked() {
	for k, gs := range d.groups {
		for name, g := range gs {
			if g.empty() {
				delete(gs, name)
			}
		}
		if len(gs) == 0 {
			delete(d.groups, k)
		}
	}
}

// search returns the index of the first message with offset >= off.
func (p *memPart) search(off uint64) int {
	return sort.Search(len(p.msgs), func(i int) bool { return p.msgs[i].Offset >= off })
}

// put stores m, replacing a message with the same offset.
func (p *memPart) put(m *queue.Message) {
	if n := len(p.msgs); n == 0 || p.msgs[n-1].Offset < m.Offset {
		p.msgs = append(p.msgs, m)
		return
	}
	i := p.search(m.Offset)
	if i < len(p.msgs) && p.msgs[i].Offset == m.Offset {
		p.msgs[i] = m
		return
	}
	p.msgs = slices.Insert(p.msgs, i, m)
}

// deleteRange removes the messages with from <= offset < to.
func (p *memPart) deleteRange(from, to uint64) {
	if from >= to {
		return
	}
	i, j := p.search(from), p.search(to)
	p.msgs = slices.Delete(p.msgs, i, j)
}

// validateBatch applies the rules storage/badger's keys impose, so that a
// batch MemStore accepts is one the disk store accepts too.
func validateBatch(b *queue.Batch) error {
	for _, q := range b.Queues {
		if err := checkNames(q.Name, "", 0); err != nil {
			return err
		}
	}
	for _, name := range b.DropQueues {
		if err := checkNames(name, "", 0); err != nil {
			return err
		}
	}
	for _, a := range b.Appends {
		if err := checkNames(a.Queue, "", a.Partition); err != nil {
			return err
		}
		if a.Message == nil {
			return fmt.Errorf("%w: nil message for %s/%d", ErrInvalidWrite, a.Queue, a.Partition)
		}
	}
	for _, r := range b.Deletes {
		if err := checkNames(r.Queue, "", r.Partition); err != nil {
			return err
		}
	}
	for _, f := range b.Floors {
		if err := checkNames(f.Queue, f.Group, f.Partition); err != nil {
			return err
		}
	}
	for _, m := range b.Marks {
		if err := checkNames(m.Queue, m.Group, m.Partition); err != nil {
			return err
		}
	}
	for _, m := range b.Deliveries {
		if err := checkNames(m.Queue, m.Group, m.Partition); err != nil {
			return err
		}
	}
	for _, r := range b.DropGroups {
		if err := checkNames(r.Queue, r.Group, r.Partition); err != nil {
			return err
		}
	}
	for _, m := range b.Dedups {
		if err := checkNames(m.Queue, "g", m.Partition); err != nil {
			return err
		}
		if m.ID == "" {
			return fmt.Errorf("%w: empty dedup-id", ErrInvalidWrite)
		}
	}
	return nil
}

func checkNames(q, group string, partition int) error {
	switch {
	case q == "" || strings.IndexByte(q, 0) >= 0:
		return fmt.Errorf("%w: queue name %q", ErrInvalidWrite, q)
	case strings.IndexByte(group, 0) >= 0:
		return fmt.Errorf("%w: group name %q", ErrInvalidWrite, group)
	case partition < 0 || uint64(partition) > math.MaxUint32:
		return fmt.Errorf("%w: partition %d", ErrInvalidWrite, partition)
	}
	return nil
}

// cloneMessage deep-copies m, keeping times to the millisecond in UTC.
func cloneMessage(m *queue.Message) *queue.Message {
	c := *m
	c.EnqueuedAt = millis(m.EnqueuedAt)
	c.NotBefore = millis(m.NotBefore)
	c.ExpiresAt = millis(m.ExpiresAt)
	c.Headers.CorrelationData = bytes.Clone(m.Headers.CorrelationData)
	c.Headers.User = slices.Clone(m.Headers.User)
	c.Payload = bytes.Clone(m.Payload)
	if m.DeadLetter != nil {
		dl := *m.DeadLetter
		c.DeadLetter = &dl
	}
	return &c
}

// millis truncates t to the millisecond, in UTC, as storage/badger keeps
// it: the zero time, and the first millisecond of 1970 with it, read back as
// the zero time.
func millis(t time.Time) time.Time {
	ms := t.UnixMilli()
	if t.IsZero() || ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func cloneMeta(q queue.QueueMeta) queue.QueueMeta {
	if q.Declared != nil {
		o := *q.Declared
		q.Declared = &o
	}
	return q
}
