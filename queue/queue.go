package queue

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Queue is one durable queue: its partitions and consumer groups. Each
// partition has its own lock (see doc.go); mu guards what spans
// partitions, and lockAll takes it with every partition's lock for the
// rare changes of that (groups, consumers, settings, admin operations).
// Storage writes happen outside every lock, in the partitions' logs.
type Queue struct {
	m     *Manager
	name  string
	owner string // see Owner; set when built
	// parts are the queue's partitions, replaced (grown) only with every
	// lock of the queue held; read it with partitions().
	parts atomic.Pointer[[]*partition]
	// growths are the queue's growths (Growth), oldest first; written with
	// every lock held. growWait is set while it grows: publishes wait for
	// the channel to close.
	growths  []Growth
	growWait atomic.Pointer[chan struct{}]
	// consumers counts the consumers of all its groups; written with
	// every lock of the queue held, read under any one.
	consumers int
	// dlq is the queue's dead-letter queue; nil for a dead-letter queue.
	dlq *Queue

	// mu, with every partition's lock (lockAll), guards writes of opts,
	// groups (and their consumers) and closed; any one of those locks
	// guards reads.
	mu     sync.Mutex
	opts   Options
	groups map[string]*group
	closed bool

	dedupMu sync.Mutex // guards dedup; taken after a partition's lock
	dedup   dedupIndex

	evicting atomic.Bool
	evictAt  atomic.Int64 // Unix ns before which no message is old enough to evict
	// retention mirrors what of opts the timer's retention looks at, so
	// that a queue with nothing to retain costs it no lock (setOptions);
	// dedups is set while the dedup index may hold ids (under dedupMu).
	retention atomic.Pointer[retentionLimits]
	dedups    atomic.Bool
	bytes     atomic.Int64 // sum of the partitions' bytes
	depth     atomic.Int64 // messages retained: sum of next - first

	stats Stats
}

// lockAll takes the queue's lock and every partition's, in partition order.
func (q *Queue) lockAll() {
	q.mu.Lock()
	for _, p := range q.partitions() {
		p.mu.Lock()
	}
}

func (q *Queue) unlockAll() {
	for _, p := range q.partitions() {
		p.mu.Unlock()
	}
	q.mu.Unlock()
}

// Stats are a queue's running totals.
type Stats struct {
	Enqueued, Delivered, Redelivered, Acked, Nacked, Rejected atomic.Uint64
	DeadLettered, Expired, LeasesLost, Deduplicated           atomic.Uint64
	// Dropped counts messages a dead-letter queue evicted (it has no
	// dead-letter queue of its own).
	Dropped atomic.Uint64
	// Released counts messages consumers gave back with $release.
	Released atomic.Uint64
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// Options returns the queue's settings. Declare may change them: do not
// call it with the queue's lock held.
func (q *Queue) Options() Options {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.opts
}

// partitions returns the queue's partitions. A queue grows (Grow): a
// caller that holds no lock of the queue may see the partitions before
// the last growth, and one that picks a partition by key checks, with
// that partition's lock, that the count has not changed meanwhile.
func (q *Queue) partitions() []*partition { return *q.parts.Load() }

// DLQ returns the queue's dead-letter queue, or nil for a dead-letter queue.
func (q *Queue) DLQ() *Queue { return q.dlq }

// Stats returns the queue's running totals.
func (q *Queue) Stats() *Stats { return &q.stats }

// PartitionFor returns the partition of key: FNV-1a-64 of its bytes mod n.
func PartitionFor(key string, n int) int {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}

// Publish appends msg to its key's partition; done (which may be nil) runs
// once the message is stored as the queue's durability says, or failed.
// done runs on a goroutine of the log and must not block.
func (q *Queue) Publish(msg *Message, done func(error)) {
	if q.m.opts.MaxPayload > 0 && len(msg.Payload) > q.m.opts.MaxPayload {
		finish(done, TooLarge(len(msg.Payload), q.m.opts.MaxPayload))
		return
	}
	if msg.ReplayFor != "" {
		for {
			q.lockAll()
			if w := q.growWait.Load(); w != nil {
				q.unlockAll()
				<-*w
				continue
			}
			break
		}
		err := q.appendReplayLocked(msg, msg.ReplayFor, done)
		q.unlockAll()
		if err != nil {
			finish(done, err)
		}
		return
	}
again:
	parts := q.partitions()
	p := parts[PartitionFor(msg.Key, len(parts))]
	now := q.m.now()
	size := msg.Size()
	p.mu.Lock()
	if q.limitedLocked() {
		// Making room takes every partition's lock.
		p.mu.Unlock()
		if q.full(size) {
			finish(done, ErrQueueFull)
			return
		}
		p.mu.Lock()
	}
	if q.waitGrowth(p) {
		goto again
	}
	if len(q.partitions()) != len(parts) {
		p.mu.Unlock() // grown meanwhile: the key's partition may be another
		goto again
	}
	if err := p.servingLocked(); err != nil {
		p.mu.Unlock()
		finish(done, err)
		return
	}
	if err := p.movedLocked(msg.Key); err != nil {
		p.mu.Unlock()
		finish(done, err)
		return
	}
	dedup := msg.DedupID != "" && q.opts.DedupWindow > 0
	var entry *dedupEntry
	if dedup {
		q.dedupMu.Lock()
		if e := q.dedup.get(msg.DedupID, now, q.opts.DedupWindow); e != nil {
			q.stats.Deduplicated.Add(1)
			if !e.done {
				e.waiters = append(e.waiters, done) // answered with the original
				done = nil
			}
			q.dedupMu.Unlock()
			p.mu.Unlock()
			finish(done, nil)
			return
		}
		if msg.EnqueuedAt.IsZero() {
			msg.EnqueuedAt = now
		}
		entry = q.dedup.add(msg.DedupID, p.index, msg.EnqueuedAt)
		q.dedups.Store(true)
		q.dedupMu.Unlock()
	}
	q.appendLocked(p, msg, size, now)
	var state *Batch
	if dedup {
		state = &Batch{Dedups: []DedupMark{{Queue: q.name, Partition: p.index, ID: msg.DedupID, At: msg.EnqueuedAt}}}
		producer := done
		done = func(err error) {
			finish(producer, err)
			q.dedupMu.Lock()
			waiters := q.dedup.complete(msg.DedupID, entry, err)
			q.dedupMu.Unlock()
			for _, w := range waiters {
				finish(w, err)
			}
		}
	}
	p.log.Append(p.epoch, msg, state, q.opts.Durability == DurabilityFsync, done)
	p.mu.Unlock()
}

// appendLocked gives msg the partition's next offset; the caller appends
// it to the partition's log before releasing the partition's lock, so that
// a partition's appends reach its log in offset order. Offsets are
// assigned here only. The partition's lock must be held.
func (q *Queue) appendLocked(p *partition, msg *Message, size int, now time.Time) {
	if msg.EnqueuedAt.IsZero() {
		msg.EnqueuedAt = now
	}
	if msg.ExpiresAt.IsZero() && msg.Headers.ExpiryInterval > 0 {
		msg.ExpiresAt = msg.EnqueuedAt.Add(time.Duration(msg.Headers.ExpiryInterval) * time.Second)
	}
	msg.Offset = p.next
	p.next++
	p.add(size)
	q.bytes.Add(int64(size))
	q.depth.Add(1)
}

func finish(done func(error), err error) {
	if done != nil {
		done(err)
	}
}

// limitedLocked reports whether the queue is at one of its limits, so that
// a publish must check for room first. Any of the queue's locks must be held.
func (q *Queue) limitedLocked() bool {
	return q.opts.MaxMessages > 0 && q.depth.Load() >= q.opts.MaxMessages ||
		q.opts.MaxBytes > 0 && q.bytes.Load() >= q.opts.MaxBytes-int64(q.m.opts.MaxPayload)
}

// full reports whether a new publish of size bytes must be refused; see
// fullLocked.
func (q *Queue) full(size int) bool {
	q.lockAll()
	defer q.unlockAll()
	return q.fullLocked(size)
}

// fullLocked reports whether a new publish of size bytes must be refused:
// the queue holds max_messages or would pass max_bytes, and its overflow
// policy is reject. With drop-oldest the publish is taken and the oldest
// messages are evicted. Every lock of the queue must be held (lockAll).
func (q *Queue) fullLocked(size int) bool {
	full := func() bool {
		// Messages every group acked are gone for the user, even those
		// that wait above a floor for retention (acked out of order).
		var acked, ackedBytes int64
		if q.opts.Retention != RetentionTime { // kept, settled or not: they count
			for _, p := range q.partitions() {
				n, b := p.settledByAllLocked()
				acked, ackedBytes = acked+n, ackedBytes+b
			}
		}
		return q.opts.MaxMessages > 0 && q.depth.Load()-acked >= q.opts.MaxMessages ||
			q.opts.MaxBytes > 0 && q.bytes.Load()-ackedBytes+int64(size) > q.opts.MaxBytes
	}
	if !full() {
		return false
	}
	// Retention runs on a timer: delete what every group has settled since,
	// so that acked messages do not count against the limits.
	for _, p := range q.partitions() {
		b := new(Batch)
		p.flushStateLocked(b)
		p.retainLocked(b)
		p.flushLocked(b)
	}
	if !full() {
		return false
	}
	if q.opts.Overflow == OverflowDropOldest {
		q.startEvictionLocked(q.m.now())
		return false
	}
	return true
}

// Subscribe adds a consumer to group, creating the group if it is new: a
// new group starts at the oldest retained message.
func (q *Queue) Subscribe(group string, r Receiver, o ConsumerOptions) (*Consumer, error) {
	var k kicks
	start := o.Start
	if start == "" {
		start = q.Options().Start
	}
	var at map[int]uint64
	if t, err := start.time(); err != nil {
		return nil, CheckStart(start)
	} else if !t.IsZero() && !q.hasGroup(group) {
		// Where the group would start, read before taking the locks; a
		// group made meanwhile by another subscription wins.
		if at, err = q.offsetsAt(t); err != nil {
			return nil, err
		}
	}
	q.lockAll()
	defer k.run()
	defer q.unlockAll()
	if q.closed {
		return nil, ErrClosed
	}
	prefetch := q.opts.Prefetch
	if o.Prefetch > 0 && o.Prefetch < prefetch {
		prefetch = o.Prefetch
	}
	if err := q.checkPartitionsLocked(q.groups[group], group, o.Partitions); err != nil {
		return nil, err
	}
	if err := q.checkGroupLocked(group, o); err != nil {
		return nil, err
	}
	g := q.groupLocked(group, start, at, o.Subjects)
	c := &Consumer{q: q, g: g, r: r, explicit: o.Explicit, remote: o.Remote, partitions: slices.Clone(o.Partitions), shared: o.Credit,
		window: newWindow(prefetch)}
	c.credit.Store(int64(c.window.Size()))
	g.joinSharding(c, o.Sharding)
	g.addConsumer(c)
	q.dispatchAllLocked(q.m.now())
	return c, nil
}

// CheckSubscription reports whether a consumer of group may subscribe
// with the options o: the group has o's subject filter (or does not exist
// yet), the partitions o claims exist and no other consumer of the group
// holds them, and o's sharding is valid and that of the group's sharded
// consumers.
func (q *Queue) CheckSubscription(group string, o ConsumerOptions) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.checkGroupLocked(group, o)
}

// checkGroupLocked is CheckSubscription with q.mu held.
func (q *Queue) checkGroupLocked(group string, o ConsumerOptions) error {
	g := q.groups[group]
	if g != nil && g.filter != o.Subjects {
		return filterMismatch(q.name, group, g.filter, o.Subjects)
	}
	if err := q.checkPartitionsLocked(g, group, o.Partitions); err != nil {
		return err
	}
	return checkShardingLocked(q.name, g, group, q.opts.Ordering, o.Sharding)
}

func (q *Queue) checkPartitionsLocked(g *group, name string, ps []int) error {
	if err := CheckPartitionsOf(len(q.partitions()), ps); err != nil {
		return err
	}
	for _, p := range ps {
		if g != nil && g.claimed[p] != nil {
			return fmt.Errorf("%w: partition %d is taken by another consumer of group %s", ErrBadPartitions, p, name)
		}
	}
	return nil
}

// hasGroup reports whether the queue has group name.
func (q *Queue) hasGroup(name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.groups[name] != nil
}

// groupLocked returns the group, creating and persisting it if it is new,
// at start (at: the offsets a start at a time found). Every lock of the
// queue must be held.
func (q *Queue) groupLocked(name string, start Start, at map[int]uint64, filter string) *group {
	if g := q.groups[name]; g != nil {
		return g
	}
	g := newGroup(q, name)
	g.filter = filter
	q.groups[name] = g
	for _, cur := range g.cursors {
		if !cur.p.owned {
			continue
		}
		off, moved := cur.p.next, start == StartLatest
		if a, ok := at[cur.p.index]; ok {
			off, moved = min(max(a, cur.p.first), cur.p.next), true
		}
		if moved {
			// Everything before it counts as settled for it.
			cur.floor, cur.next, cur.delivered, cur.savedDelivered, cur.mark, cur.asked = off, off, off, off, off, off
			cur.floorSeen.Store(off)
		}
		cur.p.flushLocked(&Batch{Floors: []FloorWrite{{Queue: q.name, Group: name, Partition: cur.p.index, Floor: cur.floor, Filter: g.filter}}})
		cur.savedFloor = cur.floor
	}
	q.m.log.Info("consumer group created", "queue", q.name, "group", name)
	return g
}

func (q *Queue) settle(l *Lease, o Outcome) error {
	p := l.cur.p
	var k kicks
	p.mu.Lock()
	now := q.m.now()
	if l.slot {
		p.freeSlotLocked(l, o != Returned, &k)
		if o != Returned && o != Unsent {
			l.consumer.resize(l.consumer.window.settledAfter(now.Sub(l.at), len(l.m.Payload)), &k)
		}
	}
	if !l.active {
		p.mu.Unlock()
		k.run()
		return ErrNotLeased
	}
	p.endLeaseLocked(l)
	var b Batch
	switch o {
	case Ack:
		q.stats.Acked.Add(1)
		l.cur.g.stats.Acked.Add(1)
		if f := q.m.opts.OnAck; f != nil {
			f(q.name, l.m.EnqueuedAt)
		}
		l.cur.doneLocked(l.m, &b)
	case Nack:
		q.stats.Nacked.Add(1)
		l.cur.g.stats.Nacked.Add(1)
		q.endDeliveryLocked(l, &b, now, true, &k)
	case Reject:
		q.stats.Rejected.Add(1)
		l.cur.g.stats.Rejected.Add(1)
		q.deadLetterLocked(l.cur, l.m, l.deliveries, ReasonRejected, now)
	case Unsent, Returned:
		l.cur.returnLocked(l, &pending{m: l.m, deliveries: l.deliveries - 1, released: l.released}, &k)
	case Release:
		// Its delivery ended (the next carries DUP) but does not count
		// toward max_deliveries; nothing is written.
		q.stats.Released.Add(1)
		l.cur.g.stats.Released.Add(1)
		l.cur.returnLocked(l, &pending{m: l.m, deliveries: l.deliveries, released: l.released + 1}, &k)
	}
	p.flushLocked(&b)
	l.cur.dispatchLocked(now)
	p.mu.Unlock()
	k.run()
	return nil
}

// endDeliveryLocked handles a delivery that ended without an ack: the
// message goes to the dead-letter queue after max_deliveries, else back to
// the group, after a backoff when the consumer asked for it (nack). The
// partition's lock must be held.
func (q *Queue) endDeliveryLocked(l *Lease, b *Batch, now time.Time, backoff bool, k *kicks) {
	cur, ended := l.cur, l.deliveries
	if int(ended-l.released) >= q.opts.MaxDeliveries && q.dlq != nil {
		q.deadLetterLocked(cur, l.m, ended, ReasonMaxDeliveries, now)
		return
	}
	cur.counts[l.m.Offset] = ended
	b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: q.name, Group: cur.g.name, Partition: cur.p.index, Offset: l.m.Offset, Count: ended})
	pd := &pending{m: l.m, deliveries: ended, released: l.released}
	if backoff {
		pd.at = now.Add(q.backoff(ended))
	}
	cur.returnLocked(l, pd, k)
}

// backoff is retry_backoff doubled per ended delivery, up to retry_backoff_max.
func (q *Queue) backoff(ended uint32) time.Duration {
	d := q.opts.RetryBackoff
	for i := uint32(1); i < ended && d < q.opts.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, q.opts.RetryBackoffMax)
}

// deadLetterCopy is the message that stands for m, of partition
// partition, in the dead-letter queue. It is built here only.
func (q *Queue) deadLetterCopy(partition int, m *Message, dl DeadLetter) *Message {
	dl.OriginalID = MessageID(partition, m.Offset)
	dl.OriginalTopic = TopicName(q.name, m.Subject)
	dm := &Message{Key: m.Key, Headers: m.Headers, Payload: m.Payload, DeadLetter: &dl}
	dm.Headers.ExpiryInterval = 0
	return dm
}

// deadLetterLocked moves m out of the group's circulation into the
// dead-letter queue. The message (and, with ordering key, its key) stays
// held until the dead-letter copy is stored; if storing fails it is
// delivered again. A dead-letter queue has no dead-letter queue of its own:
// its messages are retried after a backoff instead. The partition's lock
// must be held; the dead-letter queue's partition lock is taken after it.
func (q *Queue) deadLetterLocked(cur *cursor, m *Message, deliveries uint32, reason string, now time.Time) {
	if q.dlq == nil {
		cur.p.wantTickLocked()
		heap.Push(&cur.retries, &pending{m: m, deliveries: deliveries, at: now.Add(q.backoff(deliveries))})
		return
	}
	dm := q.deadLetterCopy(cur.p.index, m, DeadLetter{Reason: reason, Deliveries: deliveries, Group: cur.g.name})
	cur.p.deadLetters.Add(1) // until it is settled: Release waits for it
	cur.deadLettering++
	gen := cur.gen
	// The outcome is handled on its own goroutine: Publish may fail at once
	// (dead-letter queue closed or full), and this runs with the lock held.
	q.dlq.Publish(dm, func(err error) { go q.deadLettered(cur, gen, m, deliveries, err) })
}

// deadLetterRetry is how long a message whose dead-lettering failed waits
// before it is tried again.
const deadLetterRetry = 100 * time.Millisecond

// deadLettered settles m once its dead-letter copy is stored, or puts it
// back for delivery when storing failed. gen is the cursor's generation
// when m left circulation.
func (q *Queue) deadLettered(cur *cursor, gen uint64, m *Message, deliveries uint32, err error) {
	p := cur.p
	defer p.deadLetters.Done()
	var k kicks
	p.mu.Lock()
	cur.deadLettering--
	if now := cur.g.cursors[p.index]; now != cur || now.gen != gen {
		// The cursor was replaced (a seek) or purged meanwhile: its key
		// state is no longer m's, and what it holds of m came from storage
		// or the seek point. Stored, m is settled there if still ahead;
		// failed, the cursor finds m again where it was left.
		if err == nil {
			q.stats.DeadLettered.Add(1)
			cur.g.stats.DeadLettered.Add(1)
		}
		if err == nil && m.Offset >= now.floor {
			b := new(Batch)
			now.settleLocked(m.Offset, b)
			p.flushLocked(b)
		}
		now.dispatchLocked(q.m.now())
		p.mu.Unlock()
		return
	}
	if err != nil {
		q.m.log.Error("dead-lettering failed; message stays in the queue", "queue", q.name, "group", cur.g.name,
			"msg_id", MessageID(p.index, m.Offset), "err", err)
		// Tried again after a pause: at once, a dead-letter queue that
		// cannot take it (full, or its partition not served here yet)
		// would be asked again and again, a goroutine each time.
		cur.p.wantTickLocked()
		heap.Push(&cur.retries, &pending{m: m, deliveries: deliveries, at: q.m.now().Add(deadLetterRetry)})
	} else {
		q.stats.DeadLettered.Add(1)
		cur.g.stats.DeadLettered.Add(1)
		b := new(Batch)
		cur.doneLocked(m, b)
		p.flushLocked(b)
	}
	cur.dispatchLocked(q.m.now())
	p.mu.Unlock()
	k.run()
}

// closeLocked persists the settlements not yet written and refuses new
// work. Every lock of the queue must be held.
func (q *Queue) closeLocked() {
	for _, p := range q.partitions() {
		b := new(Batch)
		p.flushStateLocked(b)
		p.flushLocked(b)
	}
	q.closed = true
}

// dispatchAllLocked dispatches every partition. Every lock of the queue
// must be held.
func (q *Queue) dispatchAllLocked(now time.Time) {
	for _, p := range q.partitions() {
		p.dispatchLocked(now)
	}
}

// tick runs the timer's work on every partition of the queue (see
// partition.tick) and, when retain is set, the queue's (see retainTick).
// The manager's timer ticks only the partitions with work pending.
func (q *Queue) tick(now time.Time, retain bool) {
	for _, p := range q.partitions() {
		p.tick(now, retain)
	}
	if retain {
		q.retainTick(now)
	}
}

// retainTick starts an eviction pass when one may find something due and
// forgets the dedup-ids past the window.
func (q *Queue) retainTick(now time.Time) {
	if !q.mayRetain(now) {
		return
	}
	q.mu.Lock()
	q.startEvictionLocked(now)
	window := q.opts.DedupWindow
	q.mu.Unlock()
	q.dedupMu.Lock()
	var gone []*dedupEntry
	if len(q.dedup.order) > 0 {
		gone = q.dedup.expire(now, window)
	}
	if len(q.dedup.order) == 0 {
		q.dedups.Store(false)
	}
	q.dedupMu.Unlock()
	for _, e := range gone {
		p := q.partitions()[e.partition]
		p.mu.Lock()
		p.flushLocked(&Batch{Dedups: []DedupMark{{Queue: q.name, Partition: e.partition, ID: e.id}}})
		p.mu.Unlock()
	}
}
