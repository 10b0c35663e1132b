package queue

import (
	"context"
	"fmt"
	"strconv"
)

// Ownership: a partition is served by the node that acquired it, with an
// epoch that only grows. Acquire loads the partition alone from storage and
// raises its log's fence to the epoch, so that a write carrying an
// older epoch fails with ErrFenced; Release drains it: leases go back to
// their groups, settlements are flushed, and the partition refuses new work
// until it is acquired again. A single node acquires every partition with
// epoch 1 when it starts or creates a queue; a cluster calls them as
// ownership moves.

// SingleNodeEpoch is the epoch of every partition on a single node.
const SingleNodeEpoch = 1

// PartitionID names one partition of one queue.
type PartitionID struct {
	Queue     string
	Partition int
}

func (id PartitionID) String() string { return id.Queue + "/" + strconv.Itoa(id.Partition) }

// Acquire loads partition id from storage and serves it with epoch: it
// accepts publishes and delivers to its groups' consumers. An epoch below
// the partition's fence fails with ErrFenced; acquiring an owned partition
// again with the same epoch does nothing.
func (m *Manager) Acquire(ctx context.Context, id PartitionID, epoch uint64) error {
	p, err := m.partition(id)
	if err != nil {
		return err
	}
	return m.acquire(p, epoch)
}

func (m *Manager) acquire(p *partition, epoch uint64) error {
	q := p.q
	id := PartitionID{q.name, p.index}
	q.lockAll()
	if p.owned && p.epoch == epoch {
		q.unlockAll()
		return nil
	}
	if err := p.log.Fence(epoch); err != nil {
		q.unlockAll()
		return err
	}
	if p.owned {
		// Served here already, under an older epoch: the same owner goes
		// on under the new one, with what it holds in memory (its appends
		// in flight among it). A caller that wants the partition read
		// again from storage releases it first.
		p.epoch = epoch
		q.unlockAll()
		return nil
	}
	crashed, err := p.loadLocked(epoch)
	q.unlockAll()
	if err != nil {
		return err
	}
	// The deliveries the last owner had out ended with it: their counts go
	// up durably before anything is delivered, so that a message that
	// crashes every owner still reaches max_deliveries.
	if crashed.Len() > 0 {
		done := make(chan error, 1)
		p.log.Append(epoch, nil, crashed, true, func(err error) { done <- err })
		if err := <-done; err != nil {
			return fmt.Errorf("queue: recording the deliveries a crash ended on %s: %w", id, err)
		}
	}
	q.lockAll()
	if p.epoch == epoch && !p.owned {
		// A growth learnt since the load is cut as it would have been had
		// the partition been served then.
		p.storeCutsLocked(q.growths)
		p.owned = true
		p.wantTickLocked() // recovered leases' messages, retention below the floors
		p.dispatchLocked(m.now())
	}
	q.unlockAll()
	m.log.Debug("partition acquired", "partition", id.String(), "epoch", epoch)
	return nil
}

// Release stops serving partition id: its consumers' leases on it are
// taken back (their late settlements change nothing; the next owner
// delivers those messages again, the cut delivery counted as ended, as a
// lost lease is), its settlements are flushed and synced, and publishes to
// it fail with ErrNotOwned until it is acquired again. It returns once the appends in
// flight and the flush are stored.
func (m *Manager) Release(ctx context.Context, id PartitionID) error {
	p, err := m.partition(id)
	if err != nil {
		return err
	}
	q := p.q
	var k kicks
	q.lockAll()
	if !p.owned {
		q.unlockAll()
		return nil
	}
	p.owned = false
	for _, l := range p.leasesWhere(func(*Lease) bool { return true }) {
		p.revokeLocked(l, &k)
	}
	q.unlockAll()
	// A message on its way to the dead-letter queue is settled only once
	// its copy is stored (deadLettered): that settlement goes with the
	// flush, or the next owner counts the delivery as cut and dead-letters
	// it again. Not served, the partition starts no more of them; each
	// completes (a log never drops a write).
	p.deadLetters.Wait()
	q.lockAll()
	b := new(Batch)
	p.flushStateLocked(b)
	done := make(chan error, 1)
	// Submitted after every append of the partition: the log
	// completes in order, so the flush completing means they did too.
	p.log.Append(p.epoch, nil, b, true, func(err error) { done <- err })
	q.unlockAll()
	k.run()
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	q.lockAll()
	if !p.owned {
		p.unloadLocked()
	}
	q.unlockAll()
	m.log.Debug("partition released", "partition", id.String())
	return nil
}

// partition returns the partition named by id.
func (m *Manager) partition(id PartitionID) (*partition, error) {
	q := m.Queue(id.Queue)
	if q == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoSuchQueue, id.Queue)
	}
	if id.Partition < 0 || id.Partition >= len(q.partitions()) {
		return nil, fmt.Errorf("%w: partition %d (the queue has %d)", ErrBadPartitions, id.Partition, len(q.partitions()))
	}
	return q.partitions()[id.Partition], nil
}

// acquireAll acquires every partition of q and of its dead-letter queue
// with the single node's epoch.
func (m *Manager) acquireAll(q *Queue) error {
	if m.opts.ManualOwnership {
		return nil
	}
	for _, x := range []*Queue{q, q.dlq} {
		for _, p := range x.partitions() {
			if err := m.acquire(p, SingleNodeEpoch); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadLocked reads the partition's bounds, the state of every group on it
// and its dedup-ids from storage, for serving with epoch; the partition is
// not served until the caller sets owned. It returns the delivery marks of
// the deliveries the last owner had out (see crashedDeliveries). Every
// lock of the queue must be held.
func (p *partition) loadLocked(epoch uint64) (*Batch, error) {
	q := p.q
	name, i := q.name, p.index
	first, next, err := p.log.Bounds()
	if err != nil {
		return nil, fmt.Errorf("queue: reading bounds of %s/%d: %w", name, i, err)
	}
	states, err := p.log.Groups()
	if err != nil {
		return nil, fmt.Errorf("queue: reading groups of %s/%d: %w", name, i, err)
	}
	ids, err := p.log.Dedups()
	if err != nil {
		return nil, fmt.Errorf("queue: reading dedup-ids of %s/%d: %w", name, i, err)
	}
	p.unloadLocked()
	q.depth.Add(int64(next-first) - int64(p.next-p.first))
	p.first, p.next, p.committed = first, next, next
	p.ring = newRing(next, p.ring.o)
	p.sizes = make([]uint32, next-first)
	if q.opts.MaxBytes > 0 {
		if err := p.loadSizes(); err != nil {
			return nil, fmt.Errorf("queue: reading sizes of %s/%d: %w", name, i, err)
		}
		q.bytes.Add(p.bytes)
	}
	q.dedupMu.Lock()
	for id, at := range ids {
		q.dedup.restore(id, i, at)
	}
	q.dedup.sortOrder()
	q.dedups.Store(len(q.dedup.order) > 0)
	q.dedupMu.Unlock()
	p.cuts, p.grownTo = nil, 0
	groups := states[:0:0]
	for _, st := range states {
		if to, ok := parseCutGroup(st.Group); ok {
			if p.cuts == nil {
				p.cuts = map[int]uint64{}
			}
			p.cuts[to], p.grownTo = st.Floor, max(p.grownTo, to)
			continue
		}
		groups = append(groups, st)
	}
	states = groups
	for _, st := range states {
		if q.groups[st.Group] == nil {
			q.groups[st.Group] = newGroup(q, st.Group)
		}
		if st.Filter != "" {
			q.groups[st.Group].filter = st.Filter
		}
	}
	for _, g := range q.groups {
		g.resetCursor(p)
	}
	crashed := new(Batch)
	for _, st := range states {
		q.groups[st.Group].cursors[i].restore(st, crashed)
	}
	// A growth its last server did not cut is cut now, before anything
	// is published here (stored with the crashed deliveries' counts).
	p.cutLocked(q.growths, crashed)
	p.owned, p.epoch = false, epoch
	return crashed, nil
}

// unloadLocked forgets what the partition holds in memory. Every lock of
// the queue must be held.
func (p *partition) unloadLocked() {
	q := p.q
	q.bytes.Add(-p.bytes)
	p.bytes = 0
	p.sizes = nil
	p.ring = newRing(p.next, p.ring.o)
	for _, g := range q.groups {
		g.resetCursor(p)
	}
}

// resetCursor gives the group a fresh cursor of p. p's lock must be held.
func (g *group) resetCursor(p *partition) {
	if old := g.cursors[p.index]; old.starved.Load() {
		g.starved.Add(-1)
	}
	g.cursors[p.index] = newCursor(g, p)
}

// restore sets a fresh cursor to the group's stored state; the counts of
// deliveries a crash ended go to b.
func (c *cursor) restore(st GroupState, b *Batch) {
	c.floor = max(st.Floor, c.p.first)
	c.floorSeen.Store(c.floor)
	c.next, c.savedFloor = c.floor, st.Floor
	c.delivered = max(st.Delivered, c.floor)
	c.savedDelivered = st.Delivered
	for _, off := range st.Settled {
		if off >= c.floor {
			c.settled[off] = true
		}
	}
	for off, n := range st.Deliveries {
		c.counts[off] = n
	}
	before := len(b.Deliveries)
	c.crashedDeliveries(b)
	if grace := c.g.q.m.opts.HandoverGrace; grace > 0 && len(b.Deliveries) > before {
		c.heldUntil = c.g.q.m.now().Add(grace)
		c.heldBelow = min(c.delivered, c.p.next)
	}
	c.mark, c.asked = c.floor, c.floor
	if c.delivered > c.floor {
		// Counted: from now on the mark covers deliveries made since.
		c.delivered = c.floor
		b.Floors = append(b.Floors, FloorWrite{Queue: c.g.q.name, Group: c.g.name, Partition: c.p.index, Floor: c.floor, Delivered: c.floor, Filter: c.g.filter})
		c.savedFloor, c.savedDelivered = c.floor, c.floor
	}
}

// servingLocked reports why the partition takes no work, or nil when it
// does. Its lock must be held.
func (p *partition) servingLocked() error {
	switch {
	case p.q.closed:
		return ErrClosed
	case !p.owned:
		return fmt.Errorf("%w: %s/%d", ErrNotOwned, p.q.name, p.index)
	}
	return nil
}
