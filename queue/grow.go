package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Growth is one growth of a queue's partitions, from From to To, with
// the cut of each partition it had: its next offset when the queue grew.
// A key's messages before the cut are in the partition the old count
// gave it; from the cut on, in the one the new count gives it.
//
// Per-key order holds across a growth by draining: within each group, a
// partition's messages from its cut on (a new partition's, all of them)
// wait until the group has settled, up to their cuts, the old partitions
// whose keys can move to it (the old partitions p with p = j mod
// gcd(From, To), but j itself). When To is a multiple of From, keys move
// only from partition j mod From to new partitions, and the old
// partitions never wait. The cost: a group that is slow to settle the
// old partitions holds back its deliveries of the moved keys.
type Growth struct {
	From int      `json:"from"`
	To   int      `json:"to"`
	Cuts []uint64 `json:"cuts,omitempty"` // nil in a cluster: each partition keeps its own
}

// ErrGrowInCluster: a queue of a cluster grows through the cluster's
// catalog (Manager.Ensure), not by a declaration on one node.
var ErrGrowInCluster = errors.New("queue: partitions of a queue in a cluster grow through the cluster")

// In a cluster (ManagerOptions.ManualOwnership) no node holds every
// partition, so a growth's Cuts are nil and each old partition keeps its
// own cut: its server takes it, as the partition's next offset, when it
// learns of the growth (Manager.Ensure) or when it starts serving the
// partition with the growth not yet cut there (loadLocked). The cut is
// stored with the partition's writes, so the replicas of a replicated
// partition agree on it through its log, and a moved partition takes it
// along. It is stored as the floor of a reserved group name (cutGroup),
// which no group can have (ValidGroupName): the storage, the replication
// and the copies of a partition keep it with no format of their own.
//
// A cut taken later than the growth only holds the moved keys back a
// little longer: what matters is that nothing of a moved key is stored
// in the old partition after its cut. The partition's server refuses
// such a publish from the moment it knows the growth (partition.grownTo),
// so that its sender routes it again by the new count.

// cutGroupPrefix starts the reserved group name under which a partition
// stores its cut of the growth to a count: the count follows.
const cutGroupPrefix = "#cut/"

// ValidGroupName reports whether name can be a consumer group's: a share
// name of MQTT, which holds no /, + or # (nor U+0000), and not empty.
func ValidGroupName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/+#\x00")
}

func cutGroup(to int) string { return cutGroupPrefix + strconv.Itoa(to) }

// parseCutGroup returns the count of the growth whose cut a stored group
// state of that name holds, if it is one.
func parseCutGroup(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, cutGroupPrefix)
	if !ok {
		return 0, false
	}
	to, err := strconv.Atoi(rest)
	return to, err == nil
}

// cutLocked records that partition p is cut at its next offset for every
// growth of gs it has no cut of, into b. Every lock of the queue must be
// held.
func (p *partition) cutLocked(gs []Growth, b *Batch) {
	for _, gr := range gs {
		if gr.Cuts != nil || p.index >= gr.From {
			continue
		}
		if _, ok := p.cuts[gr.To]; ok {
			continue
		}
		if p.cuts == nil {
			p.cuts = map[int]uint64{}
		}
		p.cuts[gr.To] = p.next
		p.grownTo = max(p.grownTo, gr.To)
		b.Floors = append(b.Floors, FloorWrite{Queue: p.q.name, Group: cutGroup(gr.To), Partition: p.index, Floor: p.next})
	}
}

// storeCutsLocked cuts the partition, served here, for the growths of gs
// it has no cut of (cutLocked) and writes the cuts after its writes so
// far; it reports whether it cut. Every lock of the queue must be held.
func (p *partition) storeCutsLocked(gs []Growth) bool {
	b := new(Batch)
	p.cutLocked(gs, b)
	if b.Len() == 0 {
		return false
	}
	q, i := p.q, p.index
	p.log.Append(p.epoch, nil, b, true, func(err error) {
		if err != nil {
			// Taken again by the partition's next server, or here at the
			// next load: later, which only holds the moved keys back longer.
			q.m.log.Warn("a partition's cut for a growth not stored", "queue", q.name, "partition", i, "err", err)
		}
	})
	return true
}

// movedLocked refuses a publish of key to the partition when a growth
// this node has not seen yet (but the partition's log has: grownTo) gives
// the key another partition: ErrNotOwned, so that its sender routes it
// again. The partition's lock must be held.
func (p *partition) movedLocked(key string) error {
	if p.grownTo <= len(p.q.partitions()) || PartitionFor(key, p.grownTo) == p.index {
		return nil
	}
	return fmt.Errorf("%w: %s/%d: the queue grew to %d partitions, and this key is another's", ErrNotOwned, p.q.name, p.index, p.grownTo)
}

// growTo grows q, a queue of a cluster, to the growths of the cluster's
// catalog, whose last gives its count, with declared its declared
// settings (nil: the config's): the new partitions are added, not served
// (the cluster acquires them), and each partition served here is cut.
func (m *Manager) growTo(ctx context.Context, q *Queue, growths []Growth, declared *Options) error {
	n := growths[len(growths)-1].To
	if declared != nil {
		d := *declared
		d.Partitions = n
		declared = &d
	}
	if err := m.logs.SaveQueues(ctx, []QueueMeta{{Name: q.name, Partitions: n, Owner: q.owner, Growths: growths, Declared: declared},
		{Name: DLQName(q.name), Partitions: n}}); err != nil {
		return err
	}
	var cut []int
	q.extend(n, growths, func(p *partition) {
		if !p.owned {
			return // cut by its server, or here when it is acquired
		}
		if p.storeCutsLocked(growths) {
			cut = append(cut, p.index)
		}
	})
	m.log.Info("queue partitions grown", "queue", q.name, "to", n, "cut_here", cut)
	return nil
}

// CutPassed reports whether group has settled partition of queue name,
// served here, up to its cut of the growth to count to: in a cluster,
// the partitions of a growth ask the server of each partition their keys
// can come from (Growth) before they deliver those keys. A partition not
// served here is ErrNotOwned; one not cut yet, or a group it does not
// know, has not passed.
func (m *Manager) CutPassed(name, group string, to, partition int) (bool, error) {
	q := m.Queue(name)
	if q == nil {
		return false, ErrNoSuchQueue
	}
	parts := q.partitions()
	if partition < 0 || partition >= len(parts) {
		return false, fmt.Errorf("%w: %s/%d", ErrNotOwned, name, partition)
	}
	p := parts[partition]
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.servingLocked(); err != nil {
		return false, err
	}
	cut, ok := p.cuts[to]
	g := q.groups[group]
	if !ok || g == nil {
		return false, nil
	}
	return g.cursors[partition].floorSeen.Load() >= cut, nil
}

// grow adds partitions to q up to o.Partitions, with o as its declared
// settings (declared: set at run time; else the config file's). Publishes
// to q wait meanwhile (they take its partitions' locks): the cut of each
// partition is its next offset when they started to wait, recorded
// durably with the new count before anything is published under it.
// m.admin must be held.
func (m *Manager) grow(ctx context.Context, q *Queue, o Options, declared bool) error {
	if m.opts.ManualOwnership {
		return fmt.Errorf("%w: queue %q has %d partitions here, asked for %d", ErrGrowInCluster, q.name, len(q.partitions()), o.Partitions)
	}
	n := o.Partitions
	wait := make(chan struct{})
	q.lockAll()
	if q.closed {
		q.unlockAll()
		return ErrClosed
	}
	old := q.partitions()
	cuts := make([]uint64, len(old))
	for i, p := range old {
		if err := p.servingLocked(); err != nil {
			q.unlockAll()
			return err
		}
		cuts[i] = p.next
	}
	growths := append(slices.Clone(q.growths), Growth{From: len(old), To: n, Cuts: cuts})
	q.growWait.Store(&wait)
	q.unlockAll()
	defer func() {
		q.growWait.Store(nil)
		close(wait)
	}()
	var err error
	if declared {
		err = m.persistDeclared(ctx, q.name, o, q.owner, growths, true)
	} else {
		err = m.logs.SaveQueues(ctx, []QueueMeta{{Name: q.name, Partitions: n, Owner: q.owner, Growths: growths},
			{Name: DLQName(q.name), Partitions: n}})
	}
	if err != nil {
		return err
	}
	for _, p := range q.extend(n, growths, nil) {
		if err := m.acquire(p, SingleNodeEpoch); err != nil {
			return fmt.Errorf("queue: serving the new partition %d of %s: %w", p.index, p.q.name, err)
		}
	}
	m.log.Info("queue partitions grown", "queue", q.name, "from", len(cuts), "to", n)
	return nil
}

// Growths returns the queue's growths, oldest first (none for a
// dead-letter queue, which grows with its queue but keeps no cuts).
func (q *Queue) Growths() []Growth {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.growths)
}

// KeySegment is where some of a key's messages are: partition Partition
// from offset From up to (not including) To, math.MaxUint64 for no end.
type KeySegment struct {
	Partition int
	From, To  uint64
}

// KeySegments returns where the messages of key are in a queue of
// partitions partitions grown by growths, newest first: under each count
// the key had one partition, from that growth's cut on.
func KeySegments(key string, partitions int, growths []Growth) []KeySegment {
	var out []KeySegment
	p, to := PartitionFor(key, partitions), uint64(math.MaxUint64)
	for i := len(growths) - 1; i >= 0; i-- {
		gr := growths[i]
		prev := PartitionFor(key, gr.From)
		if prev == p {
			continue // the key kept its partition: its messages go on below the cut
		}
		from := uint64(0) // a partition this growth added
		if p < gr.From && gr.Cuts != nil {
			from = gr.Cuts[p] // in a cluster the cuts are the partitions' own: read all of it
		}
		out = append(out, KeySegment{Partition: p, From: from, To: to})
		p, to = prev, uint64(math.MaxUint64)
		if gr.Cuts != nil {
			to = gr.Cuts[prev]
		}
	}
	return append(out, KeySegment{Partition: p, From: 0, To: to})
}

// extend adds partitions to q and its dead-letter queue up to n, with
// growths as q's, and returns those it added. Under every lock of q,
// before any is added, cut (if set) runs for each of q's partitions.
func (q *Queue) extend(n int, growths []Growth, cut func(*partition)) []*partition {
	var added []*partition
	for _, x := range []*Queue{q, q.dlq} {
		was := x.partitions()
		x.lockAll()
		if x == q && cut != nil {
			for _, p := range was {
				cut(p)
			}
		}
		ps := x.addPartitions(n)
		for _, g := range x.groups {
			g.addPartitionsLocked(ps)
		}
		if x == q {
			x.growths = slices.Clone(growths)
		}
		x.opts.Partitions = n
		for _, p := range was {
			p.mu.Unlock()
		}
		x.mu.Unlock()
		added = append(added, ps...)
	}
	return added
}

// addPartitionsLocked gives the group a cursor on each of ps, new
// partitions of its queue. Every lock of the queue must be held.
func (g *group) addPartitionsLocked(ps []*partition) {
	for _, p := range ps {
		g.cursors = append(g.cursors, newCursor(g, p))
		g.claimed = append(g.claimed, nil)
		g.owner = append(g.owner, nil)
		g.moveTo = append(g.moveTo, nil)
	}
	g.rebalance()
}

// waitGrowth waits, when q is growing, until it has grown, and reports
// whether it waited (the caller picks its partition again). p's lock,
// held, is released first.
func (q *Queue) waitGrowth(p *partition) bool {
	w := q.growWait.Load()
	if w == nil {
		return false
	}
	p.mu.Unlock()
	<-*w
	return true
}

// gatedLocked reports whether the message at off of the cursor's
// partition waits for the group to settle other partitions up to a
// growth's cuts (Growth). The partition's lock must be held.
func (c *cursor) gatedLocked(off uint64) bool {
	j := c.p.index
	for _, gr := range c.g.q.growths {
		if j >= gr.To {
			continue // made by a later growth, whose cuts cover this one's
		}
		if gr.Cuts == nil {
			if c.gatedByCluster(gr, off) {
				return true
			}
			continue
		}
		if j < gr.From && off < gr.Cuts[j] {
			continue // before the cut: placed by the old count
		}
		step := gcd(gr.From, gr.To)
		for src := j % step; src < gr.From; src += step {
			if src != j && c.g.cursors[src].floorSeen.Load() < gr.Cuts[src] {
				return true
			}
		}
	}
	return false
}

// gatedByCluster is gatedLocked for a growth of a queue of a cluster,
// whose cuts are the partitions' own: a source partition served here is
// read here (its cut and owned change only under every lock of the
// queue, one of which is held), another is asked of its server through
// ManagerOptions.CutPassed. What passed is kept for the cursor's life (a
// seek or a new load makes a new cursor).
func (c *cursor) gatedByCluster(gr Growth, off uint64) bool {
	j := c.p.index
	if j < gr.From {
		cut, ok := c.p.cuts[gr.To]
		if !ok {
			return true // not cut yet: nothing is known to be before it
		}
		if off < cut {
			return false
		}
	}
	step := gcd(gr.From, gr.To)
	parts := c.g.q.partitions()
	for src := j % step; src < gr.From; src += step {
		if src == j || c.passed[[2]int{gr.To, src}] {
			continue
		}
		sp := parts[src]
		if cut, ok := sp.cuts[gr.To]; ok && sp.owned {
			if c.g.cursors[src].floorSeen.Load() < cut {
				return true
			}
			continue // served here: read again next time, it is cheap
		}
		ask := c.g.q.m.opts.CutPassed
		if ask == nil || !ask(c.g.q.name, c.g.name, gr.To, src, c.born) {
			return true
		}
		if c.passed == nil {
			c.passed = map[[2]int]bool{}
		}
		c.passed[[2]int{gr.To, src}] = true
	}
	return false
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
