package queue

import (
	"context"
	"fmt"
)

// Service is what the MQTT side asks of the queues: publish, subscribe,
// settle and extend, with leases named by LeaseRef values. Manager
// implements it for the partitions of one node; a cluster implements it
// by forwarding to the node that owns a partition.
type Service interface {
	// Publish appends msg to the named queue, creating the queue when
	// allowed; done runs once it is stored or failed (see Queue.Publish).
	Publish(ctx context.Context, queue string, msg *Message, done func(error))
	// Create creates the named queue when it does not exist and may be
	// created (declared, or auto_create); the error says why not.
	Create(ctx context.Context, queue string) error
	// Settings returns the named queue's settings, or those it would have
	// for a queue not created yet: asking creates nothing (a subscription
	// refused after it must leave no queue behind).
	Settings(ctx context.Context, queue string) (Options, error)
	// CheckSubscription reports whether a consumer of the filter's group
	// may subscribe with its subject filter and claim the partitions ps
	// (see Queue.CheckSubscription).
	CheckSubscription(ctx context.Context, f Filter, o ConsumerOptions) error
	// Subscribe adds a consumer to the filter's queue and group.
	Subscribe(ctx context.Context, f Filter, r Receiver, o ConsumerOptions) (Subscription, error)
	// Settle ends the delivery with o and frees the consumer's credit
	// slot; ErrNotLeased when the lease already ended (the message is then
	// untouched).
	Settle(l LeaseRef, o Outcome) error
	// Received records the PUBACK of an explicit consumer's delivery: the
	// message stays leased until it is settled, but once the lease is lost
	// the consumer's credit slot is free again.
	Received(l LeaseRef)
	// Extend renews an active lease for another ack_timeout.
	Extend(l LeaseRef) error
}

// Subscription is a consumer as its connection holds it.
type Subscription interface {
	// Close leaves the group: every message the consumer holds goes back to
	// the group at once (the ended delivery counts toward max_deliveries).
	Close()
}

var (
	_ Service      = (*Manager)(nil)
	_ Subscription = (*Consumer)(nil)
)

// Create creates the named queue when it does not exist and may be.
func (m *Manager) Create(ctx context.Context, queue string) error {
	_, err := m.Open(ctx, queue)
	return err
}

// Settings returns the named queue's settings, or those it would have.
func (m *Manager) Settings(ctx context.Context, queue string) (Options, error) {
	if q := m.Queue(queue); q != nil {
		return q.Options(), nil
	}
	o, _, err := m.NewQueueOptions(ParentName(queue))
	return o, err
}

// CheckSubscription checks a subscription of f with the options o (its
// subject filter is f's), on the settings the queue would have for a
// queue not created yet.
func (m *Manager) CheckSubscription(ctx context.Context, f Filter, o ConsumerOptions) error {
	o.Subjects = f.Subjects
	if q := m.Queue(f.Queue); q != nil {
		return q.CheckSubscription(f.Group, o)
	}
	qo, err := m.Settings(ctx, f.Queue)
	if err != nil {
		return err
	}
	return CheckNewSubscription(f, qo, o)
}

// CheckNewSubscription checks a subscription of f with the options o to
// a queue not created yet, of settings qo.
func CheckNewSubscription(f Filter, qo Options, o ConsumerOptions) error {
	if err := CheckPartitionsOf(qo.Partitions, o.Partitions); err != nil {
		return err
	}
	return checkShardingLocked(f.Queue, nil, f.Group, qo.Ordering, o.Sharding)
}

// CheckPartitionsOf checks that the partitions ps exist in a queue of n.
func CheckPartitionsOf(n int, ps []int) error {
	for _, p := range ps {
		if p < 0 || p >= n {
			return fmt.Errorf("%w: partition %d (the queue has %d)", ErrBadPartitions, p, n)
		}
	}
	return nil
}

// Settle ends the delivery l names with o.
func (m *Manager) Settle(l LeaseRef, o Outcome) error {
	x, err := m.lease(l)
	if err != nil {
		return err
	}
	return x.cur.g.q.settle(x, o)
}

// Received records the PUBACK of an explicit consumer's delivery.
func (m *Manager) Received(l LeaseRef) {
	if x, err := m.lease(l); err == nil {
		x.receivedPuback()
	}
}

// Extend renews the lease l names.
func (m *Manager) Extend(l LeaseRef) error {
	x, err := m.lease(l)
	if err != nil {
		return err
	}
	return x.extend()
}

// lease returns the lease r names: r's own when this node made it, else
// the active lease of r's group on r's message, if it is the same one.
func (m *Manager) lease(r LeaseRef) (*Lease, error) {
	if r.l != nil {
		return r.l, nil
	}
	p, err := m.partition(r.Partition)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.q.groups[r.Group]; g != nil {
		if l := g.cursors[p.index].out[r.Offset]; l != nil && l.seq == r.Seq {
			return l, nil
		}
	}
	if l := p.slotHeld[r.Seq]; l != nil && l.m.Offset == r.Offset && l.cur.g.name == r.Group {
		return l, nil // ended; settling it frees its consumer's credit
	}
	return nil, fmt.Errorf("%w: %s in group %s", ErrNotLeased, r.ID(), r.Group)
}
