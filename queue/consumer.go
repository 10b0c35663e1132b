package queue

import (
	"sync/atomic"
	"time"
)

// Receiver is a consumer's connection as the queue sees it.
type Receiver interface {
	// Deliver hands a leased message to the consumer's connection. It is
	// called with the queue's lock held: it must not block and must not call
	// back into the queue. Credit bounds how many deliveries are unsettled.
	Deliver(d Delivery)
}

// Delivery is one delivery of a message to a consumer.
type Delivery struct {
	Lease     *Lease
	Queue     string
	Partition int
	Message   *Message
	// Count is the delivery-count: 1 on the first delivery to the group.
	Count uint32
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
	// Credit, when set, is shared by every consumer of one connection: a
	// delivery takes one and its PUBACK (or the end of the connection)
	// gives it back, whatever queue it came from. It carries MQTT 5
	// Receive Maximum, a limit of the connection, not of a subscription.
	Credit *Credit
}

// Credit is a count of deliveries a connection may still be sent.
type Credit struct{ n atomic.Int64 }

// NewCredit returns a credit of n.
func NewCredit(n int) *Credit {
	c := new(Credit)
	c.n.Store(int64(n))
	return c
}

func (c *Credit) available() bool { return c == nil || c.n.Load() > 0 }

func (c *Credit) take() {
	if c != nil {
		c.n.Add(-1)
	}
}

func (c *Credit) give() {
	if c != nil {
		c.n.Add(1)
	}
}

// Consumer is one subscription of a group. Its methods are safe for
// concurrent use.
type Consumer struct {
	q      *Queue
	g      *group
	r      Receiver
	credit int
	// leases holds every lease that is active or still holds a credit slot.
	leases     map[*Lease]struct{}
	closed     bool
	explicit   bool
	partitions []int // claimed by name; empty: any the group gives it
	shared     *Credit
}

// Close leaves the group: every message the consumer holds goes back to the
// group at once (the ended delivery counts toward max_deliveries).
func (c *Consumer) Close() {
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	now := q.m.now()
	b := new(Batch)
	for l := range c.leases {
		// A delivery not yet PUBACKed still counts against the connection's
		// shared credit: the slot stays until the PUBACK comes (or the
		// connection, and its credit, are gone).
		if l.slot && c.shared == nil {
			l.slot = false
		}
		if l.active {
			q.releaseLocked(l, b, now)
		}
	}
	clear(c.leases)
	c.g.removeConsumer(c)
	q.flushLocked(b)
	q.dispatchLocked(now)
}

// Group returns the consumer's group name.
func (c *Consumer) Group() string { return c.g.name }

// Lease is the claim of one consumer on one delivered message. It ends when
// the message is settled, when it runs out (ack_timeout) or when the
// consumer leaves; only an active lease can settle the message.
type Lease struct {
	cur        *cursor
	consumer   *Consumer
	m          *Message
	deliveries uint32
	deadline   time.Time
	// active: the lease holds the message. slot: the delivery still counts
	// against the consumer's credit (until its PUBACK arrives; for an
	// explicit consumer until it is settled, or its lease is lost after the
	// PUBACK arrived).
	active, slot bool
	explicit     bool
	received     bool
}

// Explicit reports whether the lease is settled explicitly rather than by PUBACK.
func (l *Lease) Explicit() bool { return l.explicit }

// Received records the PUBACK of an explicit consumer's delivery: the
// message stays leased until it is settled, but once the lease is lost the
// consumer's credit slot is free again.
func (l *Lease) Received() {
	q := l.cur.g.q
	q.mu.Lock()
	defer q.mu.Unlock()
	l.received = true
	if !l.active && l.slot {
		q.freeSlotLocked(l)
		q.dispatchLocked(q.m.now())
	}
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
)

// Settle ends the delivery with o and frees the consumer's credit slot. It
// returns ErrNotLeased when the lease already ended (lost to ack_timeout,
// or the consumer left): the message is then untouched.
func (l *Lease) Settle(o Outcome) error {
	return l.cur.g.q.settle(l, o)
}

// Extend renews an active lease for another ack_timeout.
func (l *Lease) Extend() error {
	q := l.cur.g.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if !l.active {
		return ErrNotLeased
	}
	l.deadline = q.m.now().Add(q.opts.AckTimeout)
	return nil
}

// ID returns the leased message's msg-id.
func (l *Lease) ID() string { return MessageID(l.cur.p.index, l.m.Offset) }
