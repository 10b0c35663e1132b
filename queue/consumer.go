package queue

import (
	"container/heap"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Receiver is a consumer's connection as the queue sees it.
type Receiver interface {
	// Deliver hands a leased message to the consumer's connection. It is
	// called with the partition's lock held: it must not block and must not call
	// back into the queue. Credit bounds how many deliveries are unsettled.
	Deliver(d Delivery)
}

// Delivery is one delivery of a message to a consumer.
type Delivery struct {
	Lease     LeaseRef
	Queue     string
	Partition int
	Message   *Message
	// Count is the delivery-count: 1 on the first delivery to the group.
	Count uint32
	// Explicit: the consumer settles by explicit calls; its PUBACK only
	// says the delivery was received (Service.Received).
	Explicit bool
}

// ID returns the delivery's msg-id.
func (d Delivery) ID() string { return MessageID(d.Partition, d.Message.Offset) }

// ConsumerOptions are a subscription's settings.
type ConsumerOptions struct {
	// Prefetch caps the consumer's unsettled messages; the smaller of it and
	// the queue's prefetch applies. 0 means the queue's.
	Prefetch int
	// Explicit: the consumer settles by explicit calls (the $ack, $nack,
	// $reject and $extend topics), not by its PUBACK, which only says the
	// delivery was received.
	Explicit bool
	// Partitions, when set, are the only partitions this consumer takes;
	// the group's other consumers share the rest.
	Partitions []int
	// Start is where the group starts if this subscription creates it
	// ("": the queue's start).
	Start Start
	// Subjects is the subscription's subject filter (Filter.Subjects):
	// a new group takes it; a group with another one refuses the
	// subscription (ErrFilterMismatch).
	Subjects string
	// Sharding, when set, is the consumer's share of the group's
	// messages (Sharding); the group's other sharded consumers must
	// shard the same way (ErrShardingMismatch).
	Sharding *Sharding
	// Credit, when set, is shared by every consumer of one connection: a
	// delivery takes one and its PUBACK (or the end of the connection)
	// gives it back, whatever queue it came from. It carries MQTT 5
	// Receive Maximum, a limit of the connection, not of a subscription.
	Credit *Credit
	// Remote: the consumer's client is connected to another node, which
	// relays its deliveries (and its settlements). A group prefers its
	// local consumers (LocalLead).
	Remote bool
}

// Credit is a count of deliveries a connection may still be sent, shared
// by its consumers. Taking one is a single atomic step, so concurrent
// dispatches on different partitions and queues never exceed it.
type Credit struct {
	n atomic.Int64

	mu      sync.Mutex
	waiting []*group // groups that had a delivery for the connection and no credit
	watch   func()   // told when credit comes back (Watch)
	cap     int64
}

// NewCredit returns a credit of n.
func NewCredit(n int) *Credit {
	c := &Credit{cap: int64(n)}
	c.n.Store(int64(n))
	return c
}

// Cap returns the credit the connection started with.
func (c *Credit) Cap() int64 { return c.cap }

// take takes one credit, or registers g to be kicked when one comes back.
func (c *Credit) take(g *group) bool {
	if c == nil {
		return true
	}
	for {
		n := c.n.Load()
		if n <= 0 {
			break
		}
		if c.n.CompareAndSwap(n, n-1) {
			return true
		}
	}
	c.mu.Lock()
	if !slices.Contains(c.waiting, g) {
		c.waiting = append(c.waiting, g)
	}
	c.mu.Unlock()
	return false
}

// give returns one credit; the groups waiting for it go to k.
func (c *Credit) give(k *kicks) {
	c.n.Add(1)
	c.wake(k)
}

// wake hands the groups waiting for a credit to k and tells the watcher
// that one came back.
func (c *Credit) wake(k *kicks) {
	c.mu.Lock()
	w := c.waiting
	c.waiting = nil
	watch := c.watch
	c.mu.Unlock()
	*k = append(*k, w...)
	if watch != nil {
		watch()
	}
}

// TryTake takes one credit for a delivery made outside the queue (one
// that came from another node); false when there is none.
func (c *Credit) TryTake() bool {
	for {
		n := c.n.Load()
		if n <= 0 {
			return false
		}
		if c.n.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Give returns a credit TryTake took.
func (c *Credit) Give() {
	var k kicks
	c.give(&k)
	k.run()
}

// Watch sets f to be told each time a credit comes back. f may run with a
// partition's lock held: it must not block and must not call into the
// queue, as Receiver.Deliver.
func (c *Credit) Watch(f func()) {
	c.mu.Lock()
	c.watch = f
	c.mu.Unlock()
}

// Consumer is one subscription of a group. Its methods are safe for
// concurrent use.
type Consumer struct {
	q          *Queue
	g          *group
	r          Receiver
	credit     atomic.Int64 // deliveries it may still be sent (its window)
	window     *window
	closed     bool // written with every lock of the queue held
	explicit   bool
	partitions []int  // claimed by name; empty: any the group gives it
	shards     []bool // by shard, those it takes (Sharding); nil: every one
	shared     *Credit
	remote     bool
}

// take takes one credit of the consumer and one of its connection, or
// none. g is kicked when the connection's credit comes back.
func (c *Consumer) take(g *group) bool {
	for {
		n := c.credit.Load()
		if n <= 0 {
			return false
		}
		if c.credit.CompareAndSwap(n, n-1) {
			if n == 1 {
				c.window.full.Store(true)
			}
			break
		}
	}
	if !c.shared.take(g) {
		c.credit.Add(1)
		return false
	}
	return true
}

// resize adds d, a change of the consumer's window, to its credit; the
// group may deliver more (k) when it grew.
func (c *Consumer) resize(d int64, k *kicks) {
	if d == 0 || c.closed {
		return
	}
	c.credit.Add(d)
	if d > 0 {
		k.add(c.g)
	}
}

// Window returns how many unsettled deliveries the consumer may hold now:
// it adapts between InitialWindow and its prefetch (see window).
func (c *Consumer) Window() int { return c.window.Size() }

// hasCredit reports whether the consumer, and its connection, may take
// a delivery now; nothing is taken.
func (c *Consumer) hasCredit() bool {
	return c.credit.Load() > 0 && (c.shared == nil || c.shared.n.Load() > 0)
}

// unsettled is about how many deliveries the consumer holds: its window
// less the credit it has left (read without a lock, so a settlement or
// a resize under way may make it off by one).
func (c *Consumer) unsettled() int64 { return c.window.size.Load() - c.credit.Load() }

// giveBack returns a credit taken for a delivery that did not happen.
// When that credit was the last one, the cursor of another partition may
// have found the consumer (or its connection) without credit meanwhile and
// marked itself starved (or waiting): those are kicked, from a goroutine
// of their own since the caller holds a partition's lock. Without that
// kick such a cursor waited for the next settlement or timer pass. When
// credit was left, no one can have waited, and nothing more is done: this
// runs on every dispatch that finds nothing to deliver.
func (c *Consumer) giveBack() {
	var k kicks
	if c.credit.Add(1) == 1 {
		k.add(c.g)
	}
	if c.shared != nil && c.shared.n.Add(1) == 1 {
		c.shared.wake(&k)
	}
	if len(k) > 0 {
		go k.run()
	}
}

// Close leaves the group: every message the consumer holds goes back to the
// group at once (the ended delivery counts toward max_deliveries).
func (c *Consumer) Close() {
	q := c.q
	var k kicks
	q.lockAll()
	if c.closed {
		q.unlockAll()
		return
	}
	c.closed = true
	now := q.m.now()
	for _, p := range q.partitions() {
		b := new(Batch)
		for _, l := range p.leasesWhere(func(l *Lease) bool { return l.consumer == c }) {
			if !l.active {
				continue // taken back with an earlier one of its key (key_inflight)
			}
			// A delivery not yet PUBACKed still counts against the
			// connection's shared credit: the slot stays until the PUBACK
			// comes (or the connection, and its credit, are gone).
			if l.slot && c.shared == nil {
				l.slot = false
			}
			p.releaseLocked(l, b, now, &k)
		}
		// Its connection is gone: no PUBACK will come for a slot.
		for seq, l := range p.slotHeld {
			if l.consumer == c {
				delete(p.slotHeld, seq)
			}
		}
		p.flushLocked(b)
	}
	c.g.removeConsumer(c)
	q.dispatchAllLocked(now)
	q.unlockAll()
	k.run()
}

// leasesWhere returns the partition's active leases that match. Lock must
// be held.
func (p *partition) leasesWhere(match func(*Lease) bool) []*Lease {
	var out []*Lease
	for _, l := range p.leases {
		if match(l) {
			out = append(out, l)
		}
	}
	return out
}

// Group returns the consumer's group name.
func (c *Consumer) Group() string { return c.g.name }

// Lease is the claim of one consumer on one delivered message. It ends when
// the message is settled, when it runs out (ack_timeout) or when the
// consumer leaves; only an active lease can settle the message. Guarded by
// its partition's lock. Outside the package a lease is named by a LeaseRef.
type Lease struct {
	cur        *cursor
	consumer   *Consumer
	m          *Message
	deliveries uint32
	released   uint32 // of deliveries, those given back by Release
	deadline   time.Time
	at         time.Time // delivered
	seq        uint64
	// active: the lease holds the message. slot: the delivery still counts
	// against the consumer's credit (until its PUBACK arrives; for an
	// explicit consumer until it is settled, or its lease is lost after the
	// PUBACK arrived).
	active, slot bool
	explicit     bool
	received     bool
	hidx         int // index in the partition's lease heap; -1 when not in it
	// ended is set with active cleared, for readers without the lock
	// (LeaseRef.Live).
	ended atomic.Bool
}

// LeaseRef names one lease: a value that can be kept, compared and, in a
// cluster, sent to another node. Seq tells a lease from a later one on the
// same message. A LeaseRef made by this node also finds its lease without
// a lookup.
type LeaseRef struct {
	Partition PartitionID
	Group     string
	Offset    uint64
	Seq       uint64
	// Until, on a lease made by another node, is when its delivery
	// turns stale: one not yet written to its client by then is given
	// back (Unsent) rather than sent, since the partition's owner may have
	// ended the lease and delivered the message again meanwhile.
	Until time.Time

	l *Lease
}

// Live reports whether the delivery of r may still be written to its
// client: its lease has not ended and, with ManagerOptions.StaleAfter,
// was made less than that long ago (a lease of this node), or its
// delivery is not stale (one of another node, see Until).
func (r LeaseRef) Live(now time.Time) bool {
	if r.l != nil {
		stale := r.l.cur.g.q.m.opts.StaleAfter
		return !r.l.ended.Load() && (stale <= 0 || now.Before(r.l.at.Add(stale)))
	}
	return r.Until.IsZero() || now.Before(r.Until)
}

// At returns when a lease of this node was made, zero for one of another
// node: a delivery carried to another node turns stale counting from then
// (see Until), not from when it left, so that a node paused between the
// two cannot send what another node delivers again meanwhile.
func (r LeaseRef) At() time.Time {
	if r.l != nil {
		return r.l.at
	}
	return time.Time{}
}

// ID returns the leased message's msg-id.
func (r LeaseRef) ID() string { return MessageID(r.Partition.Partition, r.Offset) }

func (l *Lease) ref() LeaseRef {
	return LeaseRef{Partition: PartitionID{l.cur.g.q.name, l.cur.p.index}, Group: l.cur.g.name, Offset: l.m.Offset, Seq: l.seq, l: l}
}

// received records the PUBACK of an explicit consumer's delivery: the
// message stays leased until it is settled, but once the lease is lost the
// consumer's credit slot is free again.
func (l *Lease) receivedPuback() {
	p := l.cur.p
	var k kicks
	p.mu.Lock()
	l.received = true
	if !l.active && l.slot {
		p.freeSlotLocked(l, true, &k)
		l.cur.dispatchLocked(p.q.m.now())
	}
	p.mu.Unlock()
	k.run()
}

// Outcome is how a consumer settles a message.
type Outcome int

const (
	// Ack: done for the group.
	Ack Outcome = iota
	// Nack: redeliver after a backoff.
	Nack
	// Reject: straight to the dead-letter queue.
	Reject
	// Unsent: the delivery never reached its client (it turned stale on
	// its way): the message is back for the group at once, and the
	// delivery is not counted.
	Unsent
	// Returned: as Unsent, for a delivery its connection had no credit
	// for; the connection's shared credit it took stays taken (the
	// caller gives it back when the connection has room again), so that
	// its consumer is offered no more than the connection can take.
	Returned
	// Release: given back by a consumer that is shutting down, not
	// failing: back for the group at once, redelivered with DUP, and not
	// counted toward max_deliveries (nor kept across a restart: a
	// message released and then recovered counts its deliveries as
	// though the release had not been).
	Release
)

// extend renews an active lease for another ack_timeout.
func (l *Lease) extend() error {
	p := l.cur.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !l.active {
		return ErrNotLeased
	}
	l.deadline = p.q.m.now().Add(p.q.opts.AckTimeout)
	heap.Fix(&p.leases, l.hidx)
	return nil
}
