package badger

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// deleteChunk is how many keys a range or prefix delete collects with one
// iterator before it deletes them.
const deleteChunk = 4096

// Shard is one Badger database holding whole partitions. Write must be
// called by one goroutine at a time; every other method is safe from any
// goroutine, concurrently with Write. Reads see the batches committed when
// they start.
type Shard struct {
	id  int
	db  *bdg.DB
	log *slog.Logger

	mu     sync.RWMutex // held shared by every operation, exclusively by close
	closed bool

	// writeMu is held by Write: the entries of a partition are written
	// knowing what the partition stores (tails), which takes one writer at
	// a time, as queue.Writer promises; the lock makes a broken promise
	// slow rather than a corruption. async: SyncWrites is off
	// (Options.AsyncWrites); writeMu then also orders syncs and value-log
	// GC so that a sync covers every write before it.
	async   bool
	writeMu sync.Mutex

	// tails bounds the offsets each partition written since Open stores
	// (see applyAppends). writeMu guards it.
	tails map[partKey]tail
	// lows bounds from above each partition's stored low watermark, for
	// the partitions whose watermark was read since Open: an append past
	// it needs no read of the watermark. writeMu guards it.
	lows map[partKey]uint64

	splits atomic.Int64  // commits past the first caused by ErrTxnTooBig
	writes atomic.Uint64 // Writes that committed something

	// seq is the number of the last transaction committed: each one sets
	// commitKey to its number (see witness.go). writeMu guards it.
	seq uint64
	// synced is the number of the last commit known synced, and witness
	// the file it is recorded in every Options.WitnessInterval while it
	// grows; grew tells the witness loop that it did.
	synced  atomic.Uint64
	grew    chan struct{}
	witness *witness
}

// setSynced records n as the last commit known synced.
func (s *Shard) setSynced(n uint64) {
	s.synced.Store(n)
	select {
	case s.grew <- struct{}{}:
	default:
	}
}

// witnessLoop records the last synced commit every interval while
// commits are synced, and sleeps while none is: an idle shard does not
// wake.
func (s *Shard) witnessLoop(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(interval)
	t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-s.grew:
		}
		t.Reset(interval)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		s.recordSynced()
	}
}

// acquire lets an operation run on an open shard. The caller must call
// s.mu.RUnlock when acquire returns nil.
func (s *Shard) acquire() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// Write applies b in one Badger transaction committed once; SyncWrites
// makes the commit fsync, so the batch is durable when Write returns nil
// whatever sync says. The writes apply in the order Queues, DropQueues, Erase, Appends,
// Deletes, Floors, Marks, Deliveries, DropGroups, and in slice order within
// each. A batch larger than one Badger transaction (15% of MemTableSize)
// is committed in several parts: each part is atomic, the batch is not.
func (s *Shard) Write(b *queue.Batch, sync bool) error {
	if err := validateBatch(b); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	// With async, nothing else may write between the commit and the sync
	// either: a memtable rotated in between would keep this batch in a
	// log DB.Sync skips.
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if b.Len() == 0 {
		if sync && s.async {
			return s.syncLocked()
		}
		return nil
	}
	w, err := s.newWriter()
	defer w.discard()
	if err == nil {
		err = s.apply(w, b)
	}
	if err = s.finish(w, err, sync); err != nil {
		return fmt.Errorf("storage: shard %d: write: %w", s.id, err)
	}
	s.writes.Add(1)
	if w.parts > 1 {
		s.splits.Add(int64(w.parts - 1))
		s.log.Debug("batch committed in parts", "parts", w.parts, "writes", b.Len())
	}
	return nil
}

// newWriter starts the shard's next commit. writeMu must be held.
func (s *Shard) newWriter() (*txnWriter, error) {
	w := &txnWriter{db: s.db, seq: s.seq}
	return w, w.begin()
}

// finish commits w unless err is set, counts the transactions committed,
// and, with AsyncWrites, syncs if sync is set. writeMu must be held.
func (s *Shard) finish(w *txnWriter, err error, sync bool) error {
	if err == nil {
		err = w.commit()
	}
	s.seq = w.seq
	switch {
	case !s.async:
		s.setSynced(s.seq) // every transaction committed was synced
	case err == nil && sync:
		err = s.syncLocked()
	}
	return err
}

// apply adds the writes of b to w. b is valid.
func (s *Shard) apply(w *txnWriter, b *queue.Batch) error {
	for _, q := range b.Queues {
		v, err := EncodeQueueMeta(q)
		if err == nil {
			err = w.set(queueKey(q.Name), v)
		}
		if err != nil {
			return err
		}
	}
	for _, name := range b.DropQueues {
		if err := w.del(queueKey(name)); err != nil {
			return err
		}
	}
	for _, id := range b.Erase {
		delete(s.lows, partKey{id.Queue, uint32(id.Partition)})
		if err := erasePartition(w, id.Queue, uint32(id.Partition)); err != nil {
			return err
		}
	}
	if err := s.applyAppends(w, b.Appends); err != nil {
		return err
	}
	// A delete looks its partition's entries up in a snapshot taken before
	// the batch when nothing of the batch came before it in that
	// partition: an iterator of the write transaction sorts all of the
	// batch's writes every time it is made, and retention's deletes add a
	// tombstone per entry.
	touched := map[partKey]bool{}
	for _, a := range b.Appends {
		touched[partKey{a.Queue, uint32(a.Partition)}] = true
	}
	for _, r := range b.Deletes {
		k := partKey{r.Queue, uint32(r.Partition)}
		w.useSnap = !touched[k]
		touched[k] = true
		if low, ok := s.lows[k]; ok {
			// Raised before the write, so that it stays a bound if the
			// write fails.
			s.lows[k] = max(low, r.To)
		}
		if err := deleteRange(w, r); err != nil {
			return err
		}
	}
	for _, f := range b.Floors {
		if err := w.set(floorKey(f.Queue, uint32(f.Partition), f.Group), putFloor(f.Floor, f.Delivered, f.Filter)); err != nil {
			return err
		}
	}
	for _, m := range b.Marks {
		k := markKey(kindSettled, m.Queue, uint32(m.Partition), m.Group, m.Offset)
		var err error
		if m.Set {
			err = w.set(k, nil)
		} else {
			err = w.del(k)
		}
		if err != nil {
			return err
		}
	}
	for _, d := range b.Deliveries {
		k := markKey(kindDelivery, d.Queue, uint32(d.Partition), d.Group, d.Offset)
		var err error
		if d.Count == 0 {
			err = w.del(k)
		} else {
			err = w.set(k, putU32(d.Count))
		}
		if err != nil {
			return err
		}
	}
	for _, g := range b.DropGroups {
		p := uint32(g.Partition)
		err := w.del(floorKey(g.Queue, p, g.Group))
		if err == nil {
			err = deletePrefix(w, markPrefix(kindSettled, g.Queue, p, g.Group))
		}
		if err == nil {
			err = deletePrefix(w, markPrefix(kindDelivery, g.Queue, p, g.Group))
		}
		if err != nil {
			return err
		}
	}
	return applyDedups(w, b.Dedups)
}

// erasePartitionKinds are the key kinds a partition's data is kept under.
var erasePartitionKinds = []byte{kindMessage, kindLow, kindTrim, kindFloor, kindSettled, kindDelivery, kindDedup}

// erasePartition deletes every key of the partition.
func erasePartition(w *txnWriter, q string, p uint32) error {
	for _, kind := range erasePartitionKinds {
		if err := deletePrefix(w, partitionPrefix(kind, q, p)); err != nil {
			return err
		}
	}
	return nil
}

// deletePrefix deletes every key starting with prefix.
func deletePrefix(w *txnWriter, prefix []byte) error {
	return deleteKeys(w, prefix, prefix, nil)
}

// deleteKeys deletes the keys with the prefix from start up to end
// (excluded; nil for no end), deleteChunk keys per iterator: an iterator
// must be closed before a part of the batch is committed.
func deleteKeys(w *txnWriter, prefix, start, end []byte) error {
	for {
		keys := collectKeys(w.txn, prefix, start, end)
		for _, k := range keys {
			if err := w.del(k); err != nil {
				return err
			}
		}
		if len(keys) < deleteChunk {
			return nil
		}
		// The smallest key after the last one.
		start = append(bytes.Clone(keys[len(keys)-1]), 0)
	}
}

func collectKeys(txn *bdg.Txn, prefix, start, end []byte) [][]byte {
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: prefix})
	defer it.Close()
	var keys [][]byte
	for it.Seek(start); it.Valid() && len(keys) < deleteChunk; it.Next() {
		item := it.Item()
		if end != nil && bytes.Compare(item.Key(), end) >= 0 {
			break
		}
		keys = append(keys, item.KeyCopy(nil))
	}
	return keys
}

// getUint64 reads an 8-byte value; found is false when the key is absent.
func getUint64(txn *bdg.Txn, key []byte) (v uint64, found bool, err error) {
	item, err := txn.Get(key)
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err == nil {
		err = item.Value(func(b []byte) error {
			v, err = getU64(b)
			return err
		})
	}
	return v, err == nil, err
}

// txnWriter adds writes to a Badger transaction and, when the transaction
// is full, commits it and goes on in a new one. Each transaction sets
// commitKey to its number.
type txnWriter struct {
	db    *bdg.DB
	txn   *bdg.Txn
	parts int    // transactions committed
	seq   uint64 // the number of the last transaction committed

	// useSnap: a delete iterates over entries in snap, a read-only view of
	// the shard before the batch, not in txn (see Shard.apply).
	useSnap bool
	snap    *bdg.Txn
}

// snapshot returns the read-only view of the shard before the batch.
func (w *txnWriter) snapshot() *bdg.Txn {
	if w.snap == nil {
		w.snap = w.db.NewTransaction(false)
	}
	return w.snap
}

func (w *txnWriter) set(k, v []byte) error {
	err := w.txn.Set(k, v)
	if errors.Is(err, bdg.ErrTxnTooBig) {
		if err = w.next(); err == nil {
			err = w.txn.Set(k, v)
		}
	}
	return err
}

func (w *txnWriter) del(k []byte) error {
	err := w.txn.Delete(k)
	if errors.Is(err, bdg.ErrTxnTooBig) {
		if err = w.next(); err == nil {
			err = w.txn.Delete(k)
		}
	}
	return err
}

// begin starts a transaction, numbered after the last one committed.
func (w *txnWriter) begin() error {
	w.txn = w.db.NewTransaction(true)
	return w.txn.Set(commitKey, putU64(w.seq+1))
}

// next commits the full transaction and starts another.
func (w *txnWriter) next() error {
	if err := w.commit(); err != nil {
		return err
	}
	return w.begin()
}

func (w *txnWriter) commit() error {
	w.parts++
	if err := w.txn.Commit(); err != nil {
		return err
	}
	w.seq++
	return nil
}

// discard ends the transaction; it does nothing after a commit.
func (w *txnWriter) discard() {
	w.txn.Discard()
	if w.snap != nil {
		w.snap.Discard()
	}
}

// Sync syncs the shard's write-ahead and value logs. With SyncWrites on,
// every Write already did.
func (s *Shard) Sync() error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if s.async {
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
	}
	return s.syncLocked()
}

// syncLocked syncs the logs. With async, writeMu must be held.
func (s *Shard) syncLocked() error {
	if err := s.db.Sync(); err != nil {
		return fmt.Errorf("storage: shard %d: sync: %w", s.id, err)
	}
	if s.async {
		s.setSynced(s.seq)
	}
	return nil
}

// Queues returns the queue metadata the shard holds, sorted by name.
func (s *Shard) Queues() ([]queue.QueueMeta, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	var out []queue.QueueMeta
	err := scan(txn, queuePrefix, true, func(_, v []byte) error {
		m, err := DecodeQueueMeta(v)
		out = append(out, m)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("storage: shard %d: queues: %w", s.id, err)
	}
	return out, nil
}

// Groups returns the state of every group on the partition, sorted by
// group name, from one snapshot.
func (s *Shard) Groups(q string, partition int) ([]queue.GroupState, error) {
	p, err := checkRef(q, "", partition)
	if err != nil {
		return nil, err
	}
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	txn := s.db.NewTransaction(false)
	defer txn.Discard()

	groups, err := scanGroups(txn, q, p)
	if err != nil {
		return nil, fmt.Errorf("storage: shard %d: groups of %s/%d: %w", s.id, q, p, err)
	}
	out := make([]queue.GroupState, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out, nil
}

// scanGroups reads the floors and marks of every group on a partition.
func scanGroups(txn *bdg.Txn, q string, p uint32) (map[string]*queue.GroupState, error) {
	groups := map[string]*queue.GroupState{}
	group := func(name string) *queue.GroupState {
		g := groups[name]
		if g == nil {
			g = &queue.GroupState{Group: name}
			groups[name] = g
		}
		return g
	}
	prefix := partitionPrefix(kindFloor, q, p)
	err := scan(txn, prefix, true, func(k, v []byte) error {
		g := group(string(k[len(prefix):]))
		var err error
		g.Floor, g.Delivered, g.Filter, err = getFloor(v)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Mark keys sort by group, then offset: Settled comes out sorted.
	prefix = partitionPrefix(kindSettled, q, p)
	err = scan(txn, prefix, false, func(k, _ []byte) error {
		name, off, ok := splitMarkKey(k[len(prefix):])
		if !ok {
			return fmt.Errorf("%w: settle mark key %q", ErrCorruptRecord, k)
		}
		g := group(name)
		g.Settled = append(g.Settled, off)
		return nil
	})
	if err != nil {
		return nil, err
	}
	prefix = partitionPrefix(kindDelivery, q, p)
	err = scan(txn, prefix, true, func(k, v []byte) error {
		name, off, ok := splitMarkKey(k[len(prefix):])
		if !ok {
			return fmt.Errorf("%w: delivery mark key %q", ErrCorruptRecord, k)
		}
		n, err := getU32(v)
		g := group(name)
		if g.Deliveries == nil {
			g.Deliveries = map[uint64]uint32{}
		}
		g.Deliveries[off] = n
		return err
	})
	if err != nil {
		return nil, err
	}
	return groups, nil
}

// scan calls fn for every key with the prefix, in key order, with its value
// when values is set. key and value are valid only during the call.
func scan(txn *bdg.Txn, prefix []byte, values bool, fn func(key, value []byte) error) error {
	opts := bdg.DefaultIteratorOptions
	opts.Prefix = prefix
	opts.PrefetchValues = values
	it := txn.NewIterator(opts)
	defer it.Close()
	for it.Seek(prefix); it.Valid(); it.Next() {
		item := it.Item()
		var err error
		if values {
			err = item.Value(func(v []byte) error { return fn(item.Key(), v) })
		} else {
			err = fn(item.Key(), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// runGC rewrites value-log files until none is worth it.
func (s *Shard) runGC(ratio float64, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if s.async {
			s.writeMu.Lock()
		}
		err := s.db.RunValueLogGC(ratio)
		if s.async {
			s.writeMu.Unlock()
		}
		switch {
		case err == nil:
			s.log.Debug("value log file rewritten")
		case errors.Is(err, bdg.ErrNoRewrite), errors.Is(err, bdg.ErrRejected):
			return
		default:
			s.log.Warn("value log GC failed", "err", err)
			return
		}
	}
}

// close closes the database once no operation is running, then records
// its last synced commit.
func (s *Shard) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.db.Close()
	if err == nil {
		s.recordSynced()
	}
	if werr := s.witness.close(); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("storage: closing shard %d: %w", s.id, err)
	}
	return nil
}

// checkRef validates the names and partition of one write or read.
func checkRef(q, group string, partition int) (uint32, error) {
	if err := checkQueue(q); err != nil {
		return 0, err
	}
	if err := checkGroup(group); err != nil {
		return 0, err
	}
	return checkPartition(partition)
}

// validateBatch checks every write of b before any is applied, so that an
// invalid batch changes nothing.
func validateBatch(b *queue.Batch) error {
	for _, q := range b.Queues {
		if err := checkQueue(q.Name); err != nil {
			return err
		}
	}
	for _, name := range b.DropQueues {
		if err := checkQueue(name); err != nil {
			return err
		}
	}
	for _, id := range b.Erase {
		if err := checkQueue(id.Queue); err != nil {
			return err
		}
		if _, err := checkPartition(id.Partition); err != nil {
			return err
		}
	}
	for _, a := range b.Appends {
		if _, err := checkRef(a.Queue, "", a.Partition); err != nil {
			return err
		}
		if a.Message == nil {
			return fmt.Errorf("%w: nil message for %s/%d", ErrInvalidWrite, a.Queue, a.Partition)
		}
	}
	for _, r := range b.Deletes {
		if _, err := checkRef(r.Queue, "", r.Partition); err != nil {
			return err
		}
	}
	for _, f := range b.Floors {
		if _, err := checkRef(f.Queue, f.Group, f.Partition); err != nil {
			return err
		}
	}
	for _, m := range b.Marks {
		if _, err := checkRef(m.Queue, m.Group, m.Partition); err != nil {
			return err
		}
	}
	for _, d := range b.Deliveries {
		if _, err := checkRef(d.Queue, d.Group, d.Partition); err != nil {
			return err
		}
	}
	for _, g := range b.DropGroups {
		if _, err := checkRef(g.Queue, g.Group, g.Partition); err != nil {
			return err
		}
	}
	return validateDedups(b.Dedups)
}
