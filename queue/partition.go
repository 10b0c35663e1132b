package queue

import (
	"container/heap"
	"sync"
	"time"
)

// partition is one partition of a queue and the unit of state and locking:
// its log position, the newest committed messages in memory, the cursor of
// every group on it, the leases of those cursors (in a deadline heap), their
// retries and delayed messages, and the bytes it holds. mu guards all of
// it; the fields above mu never change.
type partition struct {
	q     *Queue
	index int
	log   Log

	mu sync.Mutex

	// owned: acquired with epoch, serving (see ownership.go).
	owned bool
	epoch uint64

	// ticking: the partition is in the manager's list of partitions with
	// timer work pending (leases, retries, settlements to flush, messages
	// to delete); idle partitions cost the timer nothing.
	ticking bool

	// retained is when the timer last ran the partition's retention; only
	// the timer's goroutine touches it. Partitions start out of phase, so
	// that their deletes (a tombstone per stored batch) spread over the
	// retention interval instead of stalling one commit with all of them.
	retained time.Time

	// first is the oldest retained offset; next the offset the next append
	// gets; committed the offset below which every append has finished
	// (stored, or failed and left as a hole).
	first, next, committed uint64

	ring ring

	// sizes holds the size of each message in [first, next) (0 when not
	// known: recovered from disk while the queue had no max_bytes); bytes
	// is their sum.
	sizes []uint32
	bytes int64

	// leases holds the active leases of every group on the partition,
	// soonest deadline first; seq numbers them.
	leases leaseHeap
	seq    uint64
	// slotHeld: ended leases whose delivery still takes its consumer's
	// credit until the PUBACK comes, by seq, so that a PUBACK relayed
	// from another node (which names the lease, not holds it) frees it.
	slotHeld map[uint64]*Lease
	// deadLetters counts its messages on their way to the dead-letter
	// queue: each is settled once its copy is stored (deadLettered), and
	// Release waits for them. Added to under mu; a WaitGroup of its own.
	deadLetters sync.WaitGroup

	// cuts are the partition's cuts of its queue's growths in a cluster,
	// by the count grown to (Growth; cutLocked), and grownTo the largest
	// such count: a key that count gives another partition is refused
	// here. Written with every lock of the queue held.
	cuts    map[int]uint64
	grownTo int
}

// newPartition returns partition index of q, empty and not acquired; its
// log is set by the caller.
func newPartition(q *Queue, index int, o ringOptions) *partition {
	return &partition{q: q, index: index, ring: newRing(0, o)}
}

// put records a committed append (m nil for a failed one) at offset off.
// Commits complete in offset order within a partition. Lock must be held.
//
// The ring keeps it only while the queue has a consumer: a queue nobody
// consumes held its partitions' newest messages (up to RingBytes each)
// for nothing, 124 MB of heap for 8 queues of 20,000 1 KiB messages; a
// consumer that comes reads them from storage.
func (p *partition) put(off uint64, m *Message) {
	p.committed = off + 1
	if p.q.consumers == 0 {
		p.ring.pass(off + 1)
		return
	}
	p.ring.put(off, m)
}

// cached returns the message at off if the ring holds it. inRing reports
// whether off is within the ring's range at all (a nil message with inRing
// true is a hole). Lock must be held.
func (p *partition) cached(off uint64) (m *Message, inRing bool) {
	if off >= p.committed {
		return nil, false
	}
	return p.ring.get(off)
}

// add counts the size of the message appended at the next offset.
func (p *partition) add(size int) {
	p.sizes = append(p.sizes, uint32(size))
	p.bytes += int64(size)
}

// advance makes first the partition's first retained offset: the sizes of
// the messages below it leave the count and the ring lets go of them. It
// returns how many bytes left. Lock must be held.
func (p *partition) advance(first uint64) int64 {
	if first <= p.first {
		return 0
	}
	n := min(first-p.first, uint64(len(p.sizes)))
	var freed int64
	for _, sz := range p.sizes[:n] {
		freed += int64(sz)
	}
	p.sizes = p.sizes[n:]
	if len(p.sizes) == 0 {
		p.sizes = nil // let an idle partition's array go
	}
	p.bytes -= freed
	p.q.bytes.Add(-freed)
	p.q.depth.Add(-int64(first - p.first))
	p.first = first
	p.ring.trim(first)
	return freed
}

// loadSizes reads the sizes of the partition's retained messages from
// storage, for max_bytes. It reads every message once: a cost paid at start
// only by queues with max_bytes set.
func (p *partition) loadSizes() error {
	for from := p.first; from < p.next; {
		msgs, err := p.log.Read(from, p.next, 4096, 16<<20)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			sz := m.Size()
			p.sizes[m.Offset-p.first] = uint32(sz)
			p.bytes += int64(sz)
		}
		from = msgs[len(msgs)-1].Offset + 1
	}
	return nil
}

// appended makes the messages of one committed batch visible to consumers
// (or, err set, leaves their offsets as holes): one lock and one dispatch
// for the whole batch. Appends of a partition complete in offset order.
func (p *partition) appended(msgs []*Message, err error) {
	q := p.q
	p.mu.Lock()
	for _, m := range msgs {
		if err != nil {
			p.put(m.Offset, nil)
			continue
		}
		p.put(m.Offset, m)
	}
	if err == nil {
		q.stats.Enqueued.Add(uint64(len(msgs)))
	}
	if err == nil && len(q.groups) > 0 {
		p.dispatchLocked(q.m.now())
	}
	p.mu.Unlock()
}

// dispatchLocked leases deliverable messages of every group's cursor to
// consumers with credit. Lock must be held.
func (p *partition) dispatchLocked(now time.Time) {
	if !p.owned {
		return
	}
	for _, g := range p.q.groups {
		g.cursors[p.index].dispatchLocked(now)
	}
}

// wantTickLocked puts the partition in the manager's list of partitions
// with timer work. Lock must be held.
func (p *partition) wantTickLocked() {
	if !p.ticking {
		p.ticking = true
		p.q.m.addTicking(p)
	}
}

// tick expires the partition's leases, releases its due retries and
// delayed messages, persists its settlements and, when retain is set,
// deletes what every group has settled. It reports whether timer work is
// still pending.
func (p *partition) tick(now time.Time, retain bool) (busy bool) {
	q := p.q
	var k kicks
	var b Batch // on the stack: flushLocked copies what it submits
	p.mu.Lock()
	if !p.owned || len(q.groups) == 0 {
		p.ticking = false
		p.mu.Unlock()
		return false
	}
	for p.leases.Len() > 0 && now.After(p.leases[0].deadline) {
		l := p.leases[0]
		q.stats.LeasesLost.Add(1)
		l.cur.g.stats.LeasesLost.Add(1)
		l.consumer.resize(l.consumer.window.leaseLost(), &k)
		p.releaseLocked(l, &b, now, &k)
		if l.explicit && l.received && l.slot {
			p.freeSlotLocked(l, true, &k)
		}
	}
	for _, g := range q.groups {
		cur := g.cursors[p.index]
		for cur.retries.Len() > 0 && !cur.retries[0].at.After(now) {
			pd := heap.Pop(&cur.retries).(*pending)
			heap.Push(&cur.ready, pd)
		}
		cur.flushStateLocked(&b)
	}
	if retain {
		p.retainLocked(&b)
	}
	p.flushLocked(&b)
	p.dispatchLocked(now)
	busy = p.leases.Len() > 0 || p.pendingLocked()
	p.ticking = busy
	p.mu.Unlock()
	k.run()
	return busy
}

// pendingLocked reports whether a cursor of the partition has timer work
// left: retries or delays, settlements to flush, a starved dispatch, or
// settled messages for retention to delete. Lock must be held.
func (p *partition) pendingLocked() bool {
	low := p.committed
	for _, g := range p.q.groups {
		c := g.cursors[p.index]
		if c.retries.Len() > 0 || c.dirty || c.starved.Load() || !c.fetchErr.IsZero() || c.gated {
			return true
		}
		low = min(low, c.floor)
	}
	return low > p.first
}

// flushStateLocked adds the unpersisted settlements of every group's
// cursor to b. Lock must be held.
func (p *partition) flushStateLocked(b *Batch) {
	for _, g := range p.q.groups {
		g.cursors[p.index].flushStateLocked(b)
	}
}

// retainLocked deletes the messages below every group's floor. A queue
// without groups keeps its messages for the first group to come. Lock
// must be held.
func (p *partition) retainLocked(b *Batch) {
	q := p.q
	if len(q.groups) == 0 || q.opts.Retention == RetentionTime {
		return // kept for max_age: eviction deletes it (retention.go)
	}
	low := p.committed
	for _, g := range q.groups {
		low = min(low, g.cursors[p.index].floor)
	}
	if low > p.first {
		b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: p.index, From: p.first, To: low})
		p.advance(low)
	}
}

// settledByAllLocked counts the retained messages that every group has
// settled (above some group's floor, so retention has not deleted them)
// and their bytes. Lock must be held.
func (p *partition) settledByAllLocked() (n, bytes int64) {
	var least *cursor
	for _, g := range p.q.groups {
		if c := g.cursors[p.index]; least == nil || len(c.settled) < len(least.settled) {
			least = c
		}
	}
	if least == nil {
		return 0, 0
	}
	for off := range least.settled {
		if off < p.first || off >= p.committed {
			continue
		}
		all := true
		for _, g := range p.q.groups {
			if !g.cursors[p.index].isSettled(off) {
				all = false
				break
			}
		}
		if all {
			n++
			if i := off - p.first; i < uint64(len(p.sizes)) {
				bytes += int64(p.sizes[i])
			}
		}
	}
	return n, bytes
}

// flushLocked appends the state writes in b to the partition's log.
// It does not wait: settlements are persisted asynchronously
// (at-least-once after a crash).
func (p *partition) flushLocked(b *Batch) {
	if b.Len() == 0 {
		return
	}
	p.wantTickLocked() // retention may follow
	x := new(Batch)    // b may live on the caller's stack
	*x = *b
	p.log.Append(p.epoch, nil, x, false, nil)
}

// releaseLocked ends an active lease without a settlement (lost lease or
// consumer gone): the message is available again at once. Lock must be held.
func (p *partition) releaseLocked(l *Lease, b *Batch, now time.Time, k *kicks) {
	p.endLeaseLocked(l)
	p.q.endDeliveryLocked(l, b, now, false, k)
}

// endLeaseLocked takes an active lease out of circulation.
func (p *partition) endLeaseLocked(l *Lease) {
	l.active = false
	l.ended.Store(true)
	if l.slot {
		if p.slotHeld == nil {
			p.slotHeld = map[uint64]*Lease{}
		}
		p.slotHeld[l.seq] = l
	}
	if l.hidx >= 0 {
		heap.Remove(&p.leases, l.hidx)
	}
	l.cur.leased--
	delete(l.cur.out, l.m.Offset)
	if p.q.opts.Ordering == OrderKey {
		if ks := l.cur.keys[l.m.Key]; ks != nil && ks.out > 0 {
			ks.out--
		}
	}
}

// freeSlotLocked returns the lease's credit slot to its consumer, and to
// its connection's shared credit when shared; the groups that may now
// deliver more go to k.
func (p *partition) freeSlotLocked(l *Lease, shared bool, k *kicks) {
	l.slot = false
	delete(p.slotHeld, l.seq)
	c := l.consumer
	if !c.closed {
		c.credit.Add(1)
		k.add(c.g)
	}
	if shared && c.shared != nil {
		c.shared.give(k)
	}
}

// ringOptions bound a partition's in-memory ring.
type ringOptions struct {
	slots int   // at most this many messages
	bytes int64 // at most this many payload bytes
}

// ring holds a partition's newest committed messages: slot off%len(slots)
// holds offset off when low <= off < committed. A nil slot or one holding
// another offset is a hole. It starts small and doubles up to its bound,
// so that an idle partition costs a few words, and it lets its oldest
// messages go (they stay in storage) past its byte bound.
type ring struct {
	slots []*Message
	low   uint64 // no offset below is in the ring
	next  uint64 // one past the newest put
	bytes int64
	o     ringOptions
}

func newRing(next uint64, o ringOptions) ring {
	return ring{low: next, next: next, o: o}
}

// ringMinSlots is the size of a ring's first array.
const ringMinSlots = 8

func (r *ring) get(off uint64) (*Message, bool) {
	if off < r.low || off >= r.next {
		return nil, false
	}
	m := r.slots[off%uint64(len(r.slots))]
	if m != nil && m.Offset != off {
		return nil, true
	}
	return m, true
}

func (r *ring) put(off uint64, m *Message) {
	if off < r.next {
		return
	}
	if off > r.next { // a gap: what the ring held is older than it needs
		r.evict(int(r.next - r.low))
		r.low, r.next = off, off
	}
	if r.o.slots <= 0 {
		r.low, r.next = off+1, off+1
		return
	}
	if len(r.slots) == 0 {
		r.slots = make([]*Message, min(ringMinSlots, r.o.slots))
	}
	if off-r.low >= uint64(len(r.slots)) {
		if len(r.slots) < r.o.slots {
			r.grow()
		} else {
			r.evict(1)
		}
	}
	r.slots[off%uint64(len(r.slots))] = m
	r.next = off + 1
	if m != nil {
		r.bytes += int64(len(m.Payload))
		for r.o.bytes > 0 && r.bytes > r.o.bytes && r.low < off {
			r.evict(1)
		}
	}
}

// grow doubles the ring, up to its bound.
func (r *ring) grow() {
	n := min(2*len(r.slots), r.o.slots)
	slots := make([]*Message, n)
	for off := r.low; off < r.next; off++ {
		if m := r.slots[off%uint64(len(r.slots))]; m != nil && m.Offset == off {
			slots[off%uint64(n)] = m
		}
	}
	r.slots = slots
}

// evict lets the n oldest offsets of the ring go; an emptied ring lets its
// array go too.
func (r *ring) evict(n int) {
	for ; n > 0 && r.low < r.next; n-- {
		i := r.low % uint64(len(r.slots))
		if m := r.slots[i]; m != nil && m.Offset == r.low {
			r.bytes -= int64(len(m.Payload))
		}
		r.slots[i] = nil
		r.low++
	}
	if r.low == r.next {
		r.slots, r.bytes = nil, 0
	}
}

// pass lets go of everything the ring holds and moves it on to next: it
// holds nothing below.
func (r *ring) pass(next uint64) {
	if next < r.next {
		next = r.next
	}
	r.evict(int(r.next - r.low))
	r.low, r.next = next, next
}

// trim lets go of the messages below first, once they are deleted, so that
// an idle queue does not hold its last ring's worth of messages.
func (r *ring) trim(first uint64) {
	if first > r.low {
		r.evict(int(min(first, r.next) - r.low))
	}
}

// leaseHeap orders active leases by deadline.
type leaseHeap []*Lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	l.hidx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.hidx = -1
	return l
}
