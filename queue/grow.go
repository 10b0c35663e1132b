package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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
	Cuts []uint64 `json:"cuts"`
}

// ErrGrowInCluster: a replicated queue's partitions cannot grow yet.
var ErrGrowInCluster = errors.New("queue: partitions of a queue in a cluster cannot grow")

// grow adds partitions to q up to o.Partitions, with o as its declared
// settings (declared: set at run time; else the config file's). Publishes
// to q wait meanwhile (they take its partitions' locks): the cut of each
// partition is its next offset when they started to wait, recorded
// durably with the new count before anything is published under it.
// m.admin must be held.
func (m *Manager) grow(ctx context.Context, q *Queue, o Options, declared bool) error {
	if m.opts.ManualOwnership {
		return fmt.Errorf("%w: queue %q has %d partitions; a queue of a cluster keeps its count for now: declare a new queue with more and move its producers and consumers to it",
			ErrGrowInCluster, q.name, len(q.partitions()))
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
	var added []*partition
	for _, x := range []*Queue{q, q.dlq} {
		was := x.partitions()
		x.lockAll()
		ps := x.addPartitions(n)
		for _, g := range x.groups {
			g.addPartitionsLocked(ps)
		}
		if x == q {
			x.growths = growths
		}
		x.opts.Partitions = n
		for _, p := range was {
			p.mu.Unlock()
		}
		x.mu.Unlock()
		added = append(added, ps...)
	}
	for _, p := range added {
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
		if p < gr.From {
			from = gr.Cuts[p]
		}
		out = append(out, KeySegment{Partition: p, From: from, To: to})
		p, to = prev, gr.Cuts[prev]
	}
	return append(out, KeySegment{Partition: p, From: 0, To: to})
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

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
