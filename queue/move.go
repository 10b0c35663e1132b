package queue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Moving a partition between nodes: the node that owns it releases it
// (Release), reads what it holds (PartitionState, ReadPartition) and sends
// it; the node that takes it over writes it whole (ImportPartition) before
// it acquires it; the old node then erases its copy (ErasePartition). A
// partition and its dead-letter partition move together, as two
// PartitionIDs.

// PartitionState is what a released partition holds besides its messages.
type PartitionState struct {
	// First is the first retained offset, Next the offset the next append
	// gets.
	First, Next uint64
	Groups      []GroupState
	Dedups      map[string]time.Time
}

// ErrPartitionServed is returned when a partition that is served is read
// for a move or overwritten.
var ErrPartitionServed = errors.New("queue: partition is served here")

// PartitionState reads the stored state of partition id, which must not be
// served by this node.
func (m *Manager) PartitionState(id PartitionID) (PartitionState, error) {
	if _, err := m.idle(id); err != nil {
		return PartitionState{}, err
	}
	return m.StoredState(id)
}

// ReadPartition reads up to max stored messages of partition id from
// offset from on, stopping at the one whose payload brings theirs to
// maxBytes (0: no such bound).
func (m *Manager) ReadPartition(id PartitionID, from, to uint64, max int, maxBytes int64) ([]*Message, error) {
	p, err := m.partition(id)
	if err != nil {
		return nil, err
	}
	return p.log.Read(from, to, max, maxBytes)
}

// ImportPartition writes a part of a partition moved here, under epoch
// (which raises its log's fence): the first part (first set) erases what
// this node stored of the partition and records st; every part appends
// msgs at their offsets. The last part (last set) is synced. The
// partition must not be served here; it is served once acquired.
func (m *Manager) ImportPartition(ctx context.Context, id PartitionID, epoch uint64, st *PartitionState, msgs []*Message, last bool) error {
	p, err := m.idle(id)
	if err != nil {
		return err
	}
	if st != nil {
		if err := p.log.Fence(epoch); err != nil {
			return err
		}
	}
	b := ImportBatch(id, st, msgs)
	if st != nil && st.Next > st.First && len(msgs) == 0 && last {
		return fmt.Errorf("queue: importing %s: offsets %d to %d announced, none sent", id, st.First, st.Next)
	}
	return m.writeIdle(ctx, p, epoch, b, last)
}

// ImportBatch returns the writes that store a part of a partition copied
// from another node: with st (the first part), everything stored of the
// partition is erased first and st recorded; msgs are appended at their
// offsets.
func ImportBatch(id PartitionID, st *PartitionState, msgs []*Message) *Batch {
	b := new(Batch)
	if st != nil {
		b.Erase = append(b.Erase, id)
		if st.First > 0 {
			b.Deletes = append(b.Deletes, RangeDelete{Queue: id.Queue, Partition: id.Partition, From: 0, To: st.First})
		}
		for _, g := range st.Groups {
			b.Floors = append(b.Floors, FloorWrite{Queue: id.Queue, Group: g.Group, Partition: id.Partition, Floor: g.Floor, Delivered: g.Delivered, Filter: g.Filter})
			for _, off := range g.Settled {
				b.Marks = append(b.Marks, SettleMark{Queue: id.Queue, Group: g.Group, Partition: id.Partition, Offset: off, Set: true})
			}
			for _, off := range slices.Sorted(maps.Keys(g.Deliveries)) {
				b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: id.Queue, Group: g.Group, Partition: id.Partition, Offset: off, Count: g.Deliveries[off]})
			}
		}
		for _, dedup := range slices.Sorted(maps.Keys(st.Dedups)) {
			b.Dedups = append(b.Dedups, DedupMark{Queue: id.Queue, Partition: id.Partition, ID: dedup, At: st.Dedups[dedup]})
		}
	}
	for _, msg := range msgs {
		b.Appends = append(b.Appends, Append{Queue: id.Queue, Partition: id.Partition, Message: msg})
	}
	return b
}

// StoredState reads the stored state of partition id, served here or not:
// a copy for a replica that fell behind.
func (m *Manager) StoredState(id PartitionID) (PartitionState, error) {
	p, err := m.partition(id)
	if err != nil {
		return PartitionState{}, err
	}
	var st PartitionState
	if st.First, st.Next, err = p.log.Bounds(); err != nil {
		return st, err
	}
	if st.Groups, err = p.log.Groups(); err != nil {
		return st, err
	}
	st.Dedups, err = p.log.Dedups()
	return st, err
}

// ErasePartition removes what this node stores of partition id, which
// another node serves now. The partition must not be served here.
func (m *Manager) ErasePartition(ctx context.Context, id PartitionID, epoch uint64) error {
	p, err := m.idle(id)
	if err != nil {
		return err
	}
	if err := p.log.Fence(epoch); err != nil {
		return err
	}
	return m.writeIdle(ctx, p, epoch, &Batch{Erase: []PartitionID{id}}, true)
}

func (m *Manager) writeIdle(ctx context.Context, p *partition, epoch uint64, b *Batch, sync bool) error {
	done := make(chan error, 1)
	p.log.Append(epoch, nil, b, sync, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// idle returns partition id when this node does not serve it.
func (m *Manager) idle(id PartitionID) (*partition, error) {
	p, err := m.partition(id)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	owned := p.owned
	p.mu.Unlock()
	if owned {
		return nil, fmt.Errorf("%w: %s", ErrPartitionServed, id)
	}
	return p, nil
}

// Owned reports whether this node serves partition id, and its epoch.
func (m *Manager) Owned(id PartitionID) (epoch uint64, ok bool) {
	p, err := m.partition(id)
	if err != nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.epoch, p.owned
}

// Fence raises the fence of partition id's log to epoch, so that no write
// of an older epoch, even one queued, is stored.
func (m *Manager) Fence(id PartitionID, epoch uint64) error {
	p, err := m.partition(id)
	if err != nil {
		return err
	}
	return p.log.Fence(epoch)
}

// Ensure opens the named queue as the cluster's catalog has it, creating
// it when it does not exist here (a queue another node of a cluster
// created) and growing it when the catalog's count grew (a growth made
// through another node, or while this one was down). A queue that exists
// with another count is ErrPartitionsChanged.
func (m *Manager) Ensure(ctx context.Context, name string, c Catalogued) (*Queue, error) {
	partitions := c.Partitions
	if q := m.Queue(name); q != nil {
		return q, m.ensureGrown(ctx, q, c)
	}
	if !ValidQueueName(name) || IsDLQ(name) {
		return nil, ErrInvalidTopic
	}
	opts := m.optionsFor(name)
	created := partitions
	if len(c.Growths) > 0 {
		created = c.Growths[0].From // grown below, its cuts taken as a grown queue's
	}
	opts.Partitions = created
	q, _, err := m.create(ctx, name, func(ctx context.Context) error {
		return m.persistMeta(ctx, name, created)
	}, opts)
	if err != nil {
		return nil, err
	}
	return q, m.ensureGrown(ctx, q, c)
}

// Catalogued is what a cluster's catalog says of a queue's shape: its
// partition count, the growths that made it (oldest first, without cuts:
// each partition keeps its own), and its declared settings (nil: each
// node's config).
type Catalogued struct {
	Partitions int
	Growths    []Growth
	Declared   *Options
}

// ensureGrown grows q as c says, or reports how it differs.
func (m *Manager) ensureGrown(ctx context.Context, q *Queue, c Catalogued) error {
	n := len(q.partitions())
	switch {
	case n == c.Partitions:
		return nil
	case n > c.Partitions && len(q.Growths()) > len(c.Growths):
		return nil // grown here already; the view of the catalog lags
	case n < c.Partitions && len(c.Growths) > 0 && c.Growths[len(c.Growths)-1].To == c.Partitions:
		m.admin.Lock()
		defer m.admin.Unlock()
		if len(q.partitions()) == c.Partitions {
			return nil
		}
		return m.growTo(ctx, q, c.Growths, c.Declared)
	}
	return fmt.Errorf("%w: queue %q has %d partitions here, the cluster's catalog says %d",
		ErrPartitionsChanged, q.name, n, c.Partitions)
}

// Partitions returns the queue's partition count.
func (q *Queue) Partitions() int { return len(q.partitions()) }

// NewQueueOptions returns the settings a queue of that name would be
// created with here, and whether the config declares it: ErrNoSuchQueue
// when it is not declared and auto_create is off.
func (m *Manager) NewQueueOptions(name string) (Options, bool, error) {
	if err := CheckQueueName(name); err != nil {
		return Options{}, false, fmt.Errorf("%w: %v", ErrInvalidTopic, err)
	}
	_, declared := m.opts.Declared[name]
	if !declared && !m.opts.AutoCreate {
		return Options{}, false, ErrNoSuchQueue
	}
	return m.optionsFor(name), declared, nil
}

// MaxPayload returns the largest payload a publish may carry; 0: no limit.
func (m *Manager) MaxPayload() int { return m.opts.MaxPayload }
