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

// Queue is one durable queue: its partitions and consumer groups. One mutex
// guards all of its in-memory state; storage writes happen outside it, in
// the shard committers.
type Queue struct {
	m     *Manager
	name  string
	opts  Options
	parts []*partition
	// dlq is the queue's dead-letter queue; nil for a dead-letter queue.
	dlq *Queue

	mu       sync.Mutex
	groups   map[string]*group
	closed   bool
	dedup    dedupIndex
	evicting bool
	bytes    int64 // sum of the partitions' bytes

	stats Stats
}

// Stats are a queue's running totals.
type Stats struct {
	Enqueued, Delivered, Redelivered, Acked, Nacked, Rejected atomic.Uint64
	DeadLettered, Expired, LeasesLost, Deduplicated           atomic.Uint64
	// Dropped counts messages a dead-letter queue evicted (it has no
	// dead-letter queue of its own).
	Dropped atomic.Uint64
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
// done runs on a committer goroutine and must not block.
func (q *Queue) Publish(msg *Message, done func(error)) {
	if q.m.opts.MaxPayload > 0 && len(msg.Payload) > q.m.opts.MaxPayload {
		finish(done, ErrTooLarge)
		return
	}
	p := q.parts[PartitionFor(msg.Key, len(q.parts))]
	now := q.m.now()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		finish(done, ErrClosed)
		return
	}
	if msg.DedupID != "" && q.opts.DedupWindow > 0 {
		if e := q.dedup.get(msg.DedupID, now, q.opts.DedupWindow); e != nil {
			q.stats.Deduplicated.Add(1)
			if e.done {
				q.mu.Unlock()
				finish(done, nil)
				return
			}
			e.waiters = append(e.waiters, done) // answered with the original
			q.mu.Unlock()
			return
		}
	}
	size := msg.Size()
	if q.fullLocked(size) {
		q.mu.Unlock()
		finish(done, ErrQueueFull)
		return
	}
	if msg.EnqueuedAt.IsZero() {
		msg.EnqueuedAt = now
	}
	if msg.ExpiresAt.IsZero() && msg.Headers.ExpiryInterval > 0 {
		msg.ExpiresAt = msg.EnqueuedAt.Add(time.Duration(msg.Headers.ExpiryInterval) * time.Second)
	}
	msg.Offset = p.next
	p.next++
	p.add(size)
	q.bytes += int64(size)
	req := commitReq{
		app:  Append{Queue: q.name, Partition: p.index, Message: msg},
		sync: q.opts.Durability == DurabilityFsync,
		done: func(err error) {
			q.appended(p, msg, err)
			finish(done, err)
		},
	}
	if msg.DedupID != "" && q.opts.DedupWindow > 0 {
		e := q.dedup.add(msg.DedupID, p.index, msg.EnqueuedAt)
		req.batch = &Batch{Dedups: []DedupMark{{Queue: q.name, Partition: p.index, ID: msg.DedupID, At: msg.EnqueuedAt}}}
		req.done = func(err error) {
			q.appended(p, msg, err)
			finish(done, err)
			q.mu.Lock()
			waiters := q.dedup.complete(msg.DedupID, e, err)
			q.mu.Unlock()
			for _, w := range waiters {
				finish(w, err)
			}
		}
	}
	p.c.submit(req)
	q.mu.Unlock()
}

func finish(done func(error), err error) {
	if done != nil {
		done(err)
	}
}

// fullLocked reports whether a new publish of size bytes must be refused:
// the queue holds max_messages or would pass max_bytes, and its overflow
// policy is reject. With drop-oldest the publish is taken and the oldest
// messages are evicted.
func (q *Queue) fullLocked(size int) bool {
	full := func() bool {
		return q.opts.MaxMessages > 0 && q.depthLocked() >= q.opts.MaxMessages ||
			q.opts.MaxBytes > 0 && q.bytes+int64(size) > q.opts.MaxBytes
	}
	if !full() {
		return false
	}
	// Retention runs on a timer: delete what every group has settled since,
	// so that acked messages do not count against the limits.
	b := new(Batch)
	q.flushStateLocked(b)
	q.retainLocked(b)
	q.flushLocked(b)
	if !full() {
		return false
	}
	if q.opts.Overflow == OverflowDropOldest {
		q.startEvictionLocked(q.m.now())
		return false
	}
	return true
}

// appended makes a committed message visible to consumers. Appends of a
// partition complete in offset order.
func (q *Queue) appended(p *partition, msg *Message, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		p.put(msg.Offset, nil)
		return
	}
	q.stats.Enqueued.Add(1)
	p.put(msg.Offset, msg)
	if len(q.groups) > 0 {
		q.dispatchLocked(q.m.now())
	}
}

// Subscribe adds a consumer to group, creating the group if it is new: a
// new group starts at the oldest retained message.
func (q *Queue) Subscribe(group string, r Receiver, o ConsumerOptions) (*Consumer, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	g := q.groupLocked(group)
	prefetch := q.opts.Prefetch
	if o.Prefetch > 0 && o.Prefetch < prefetch {
		prefetch = o.Prefetch
	}
	for _, p := range o.Partitions {
		if p < 0 || p >= len(q.parts) {
			return nil, fmt.Errorf("%w: partition %d (the queue has %d)", ErrBadPartitions, p, len(q.parts))
		}
		if other := g.claimed[p]; other != nil {
			return nil, fmt.Errorf("%w: partition %d is taken by another consumer of group %s", ErrBadPartitions, p, group)
		}
	}
	c := &Consumer{q: q, g: g, r: r, credit: prefetch, leases: map[*Lease]struct{}{},
		explicit: o.Explicit, partitions: slices.Clone(o.Partitions), shared: o.Credit}
	g.addConsumer(c)
	q.dispatchLocked(q.m.now())
	return c, nil
}

// CheckPartitions reports whether a consumer of group may claim the
// partitions ps: they exist and no other consumer of the group holds them.
func (q *Queue) CheckPartitions(group string, ps []int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.groups[group]
	for _, p := range ps {
		if p < 0 || p >= len(q.parts) {
			return fmt.Errorf("%w: partition %d (the queue has %d)", ErrBadPartitions, p, len(q.parts))
		}
		if g != nil && g.claimed[p] != nil {
			return fmt.Errorf("%w: partition %d is taken by another consumer of group %s", ErrBadPartitions, p, group)
		}
	}
	return nil
}

// groupLocked returns the group, creating and persisting it if it is new.
func (q *Queue) groupLocked(name string) *group {
	if g := q.groups[name]; g != nil {
		return g
	}
	g := newGroup(q, name)
	q.groups[name] = g
	b := new(Batch)
	for _, cur := range g.cursors {
		b.Floors = append(b.Floors, FloorWrite{Queue: q.name, Group: name, Partition: cur.p.index, Floor: cur.floor})
		cur.savedFloor = cur.floor
	}
	q.flushLocked(b)
	q.m.log.Info("consumer group created", "queue", q.name, "group", name)
	return g
}

func (q *Queue) settle(l *Lease, o Outcome) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := l.consumer
	now := q.m.now()
	if l.slot {
		q.freeSlotLocked(l)
	}
	if !l.active {
		q.dispatchLocked(now)
		return ErrNotLeased
	}
	l.active = false
	delete(c.leases, l)
	l.cur.leased--
	delete(l.cur.out, l.m.Offset)
	b := new(Batch)
	switch o {
	case Ack:
		q.stats.Acked.Add(1)
		if f := q.m.opts.OnAck; f != nil {
			f(q.name, l.m.EnqueuedAt)
		}
		l.cur.doneLocked(l.m, b)
	case Nack:
		q.stats.Nacked.Add(1)
		q.endDeliveryLocked(l, b, now, true)
	case Reject:
		q.stats.Rejected.Add(1)
		q.deadLetterLocked(l.cur, l.m, l.deliveries, ReasonRejected, now)
	}
	q.flushLocked(b)
	q.dispatchLocked(now)
	return nil
}

// freeSlotLocked returns the lease's credit slot to its consumer.
func (q *Queue) freeSlotLocked(l *Lease) {
	l.slot = false
	if !l.active {
		delete(l.consumer.leases, l)
	}
	if !l.consumer.closed {
		l.consumer.credit++
	}
	l.consumer.shared.give()
}

// releaseLocked ends an active lease without a settlement (lost lease or
// consumer gone): the message is available again at once.
func (q *Queue) releaseLocked(l *Lease, b *Batch, now time.Time) {
	l.active = false
	l.cur.leased--
	delete(l.cur.out, l.m.Offset)
	q.endDeliveryLocked(l, b, now, false)
}

// endDeliveryLocked handles a delivery that ended without an ack: the
// message goes to the dead-letter queue after max_deliveries, else back to
// the group, after a backoff when the consumer asked for it (nack).
func (q *Queue) endDeliveryLocked(l *Lease, b *Batch, now time.Time, backoff bool) {
	cur, ended := l.cur, l.deliveries
	if int(ended) >= q.opts.MaxDeliveries && q.dlq != nil {
		q.deadLetterLocked(cur, l.m, ended, ReasonMaxDeliveries, now)
		return
	}
	cur.counts[l.m.Offset] = ended
	b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: q.name, Group: cur.g.name, Partition: cur.p.index, Offset: l.m.Offset, Count: ended})
	pd := &pending{m: l.m, cur: cur, deliveries: ended}
	if backoff {
		pd.at = now.Add(q.backoff(ended))
		heap.Push(&cur.g.retries, pd)
		return
	}
	heap.Push(&cur.ready, pd)
}

// backoff is retry_backoff doubled per ended delivery, up to retry_backoff_max.
func (q *Queue) backoff(ended uint32) time.Duration {
	d := q.opts.RetryBackoff
	for i := uint32(1); i < ended && d < q.opts.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, q.opts.RetryBackoffMax)
}

// deadLetterLocked moves m out of the group's circulation into the
// dead-letter queue. The message (and, with ordering key, its key) stays
// held until the dead-letter copy is stored; if storing fails it is
// delivered again. A dead-letter queue has no dead-letter queue of its own:
// its messages are retried after a backoff instead.
func (q *Queue) deadLetterLocked(cur *cursor, m *Message, deliveries uint32, reason string, now time.Time) {
	if q.dlq == nil {
		heap.Push(&cur.g.retries, &pending{m: m, cur: cur, deliveries: deliveries, at: now.Add(q.backoff(deliveries))})
		return
	}
	dm := &Message{
		Key:     m.Key,
		Headers: m.Headers,
		Payload: m.Payload,
		DeadLetter: &DeadLetter{
			Reason:        reason,
			OriginalID:    MessageID(cur.p.index, m.Offset),
			OriginalTopic: TopicName(q.name, m.Subject),
			Deliveries:    deliveries,
			Group:         cur.g.name,
		},
	}
	dm.Headers.ExpiryInterval = 0
	// The outcome is handled on its own goroutine: Publish may fail at once
	// (dead-letter queue closed or full), and this runs with q.mu held.
	q.dlq.Publish(dm, func(err error) { go q.deadLettered(cur, m, deliveries, err) })
}

// deadLettered settles m once its dead-letter copy is stored, or puts it
// back for delivery when storing failed.
func (q *Queue) deadLettered(cur *cursor, m *Message, deliveries uint32, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		q.m.log.Error("dead-lettering failed; message stays in the queue", "queue", q.name, "group", cur.g.name,
			"msg_id", MessageID(cur.p.index, m.Offset), "err", err)
		heap.Push(&cur.ready, &pending{m: m, cur: cur, deliveries: deliveries})
	} else {
		q.stats.DeadLettered.Add(1)
		b := new(Batch)
		cur.doneLocked(m, b)
		q.flushLocked(b)
	}
	q.dispatchLocked(q.m.now())
}

// flushLocked submits the state writes in b to the committers of the
// partitions they concern. It does not wait: settlements are persisted
// asynchronously (at-least-once after a crash).
func (q *Queue) flushLocked(b *Batch) {
	if b.Len() == 0 {
		return
	}
	for c, x := range q.perShard(b) {
		c.submit(commitReq{batch: x})
	}
}

// perShard splits the partition writes of b by the committer of their
// partition's shard; b itself comes back when they all share one.
func (q *Queue) perShard(b *Batch) map[*committer]*Batch {
	var one *committer
	mixed := false
	note := func(p int) {
		c := q.parts[p].c
		if one == nil {
			one = c
		} else if one != c {
			mixed = true
		}
	}
	for _, w := range b.Floors {
		note(w.Partition)
	}
	for _, w := range b.Marks {
		note(w.Partition)
	}
	for _, w := range b.Deliveries {
		note(w.Partition)
	}
	for _, w := range b.Deletes {
		note(w.Partition)
	}
	for _, w := range b.DropGroups {
		note(w.Partition)
	}
	for _, w := range b.Dedups {
		note(w.Partition)
	}
	if !mixed {
		if one == nil {
			return nil
		}
		return map[*committer]*Batch{one: b}
	}
	per := map[*committer]*Batch{}
	part := func(p int) *Batch {
		c := q.parts[p].c
		if per[c] == nil {
			per[c] = new(Batch)
		}
		return per[c]
	}
	for _, w := range b.Floors {
		x := part(w.Partition)
		x.Floors = append(x.Floors, w)
	}
	for _, w := range b.Marks {
		x := part(w.Partition)
		x.Marks = append(x.Marks, w)
	}
	for _, w := range b.Deliveries {
		x := part(w.Partition)
		x.Deliveries = append(x.Deliveries, w)
	}
	for _, w := range b.Deletes {
		x := part(w.Partition)
		x.Deletes = append(x.Deletes, w)
	}
	for _, w := range b.DropGroups {
		x := part(w.Partition)
		x.DropGroups = append(x.DropGroups, w)
	}
	for _, w := range b.Dedups {
		x := part(w.Partition)
		x.Dedups = append(x.Dedups, w)
	}
	return per
}

// closeLocked persists the settlements not yet written and refuses new work.
func (q *Queue) closeLocked() {
	b := new(Batch)
	q.flushStateLocked(b)
	q.flushLocked(b)
	q.closed = true
}

func (q *Queue) dispatchLocked(now time.Time) {
	for _, g := range q.groups {
		g.dispatchLocked(now)
	}
}

// tick expires leases, releases due retries and, when retain is set,
// deletes what every group has settled.
func (q *Queue) tick(now time.Time, retain bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := new(Batch)
	for _, g := range q.groups {
		for _, c := range g.consumers {
			for l := range c.leases {
				if l.active && now.After(l.deadline) {
					q.stats.LeasesLost.Add(1)
					q.releaseLocked(l, b, now)
					if l.explicit && l.received && l.slot {
						q.freeSlotLocked(l)
					}
				}
			}
		}
		for g.retries.Len() > 0 && !g.retries[0].at.After(now) {
			pd := heap.Pop(&g.retries).(*pending)
			heap.Push(&pd.cur.ready, pd)
		}
	}
	q.flushStateLocked(b)
	if retain {
		q.startEvictionLocked(now)
		q.retainLocked(b)
		for _, e := range q.dedup.expire(now, q.opts.DedupWindow) {
			b.Dedups = append(b.Dedups, DedupMark{Queue: q.name, Partition: e.partition, ID: e.id})
		}
	}
	q.flushLocked(b)
	q.dispatchLocked(now)
}

// flushStateLocked adds every group's unpersisted settlements to b.
func (q *Queue) flushStateLocked(b *Batch) {
	for _, g := range q.groups {
		for _, cur := range g.cursors {
			cur.flushStateLocked(b)
		}
	}
}

// retainLocked deletes each partition's messages below every group's floor.
// A queue without groups keeps its messages for the first group to come.
func (q *Queue) retainLocked(b *Batch) {
	if len(q.groups) == 0 {
		return
	}
	for i, p := range q.parts {
		low := p.committed
		for _, g := range q.groups {
			low = min(low, g.cursors[i].floor)
		}
		if low > p.first {
			b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: i, From: p.first, To: low})
			q.bytes -= p.advance(low)
		}
	}
}
