package queue

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// The read-only views of a queue an operator sees: Info (figures, as
// metrics and the admin API show them) and Peek (messages).

// Info is a snapshot of a queue: its partitions, its groups and its totals.
type Info struct {
	Name    string
	Options Options
	// Partitions are in partition order.
	Partitions []PartitionInfo
	// Groups are in name order.
	Groups []GroupInfo
	Counts Counts
}

// PartitionInfo is a snapshot of one partition.
type PartitionInfo struct {
	Partition int
	Shard     int
	// First is the oldest retained offset, Next the offset the next publish
	// gets, Committed the offset below which every append has finished.
	First, Next, Committed uint64
}

// Depth is the number of messages the partition holds: stored and not yet
// deleted by retention (or a purge).
func (p PartitionInfo) Depth() uint64 { return p.Committed - min(p.First, p.Committed) }

// GroupInfo is a snapshot of one consumer group.
type GroupInfo struct {
	Name      string
	Consumers int
	// Filter is the group's subject filter, "" for every subject.
	Filter string
	// Partitions are in partition order.
	Partitions []GroupPartitionInfo
	// Counts are the group's totals since the node started (dead letters
	// for queue-wide reasons, such as max_age, count for no group).
	Counts GroupCounts
}

// GroupPartitionInfo is a group's position in one partition.
type GroupPartitionInfo struct {
	Partition int
	// Floor: every offset below it is settled for the group.
	Floor uint64
	// SettledAboveFloor counts the stored offsets above the floor the group
	// has settled (acked out of order, or dead-lettered).
	SettledAboveFloor int
	// Lag is how many stored messages the group has not settled:
	// Committed - Floor - SettledAboveFloor.
	Lag uint64
	// Leased counts the messages delivered and not yet settled.
	Leased int
	// OldestUnsettled is when the oldest message the group has not settled
	// was enqueued; zero when Lag is 0.
	OldestUnsettled time.Time
}

// Lag is the group's lag over every partition.
func (g GroupInfo) Lag() uint64 {
	var n uint64
	for _, p := range g.Partitions {
		n += p.Lag
	}
	return n
}

// Leased is the group's leased messages over every partition.
func (g GroupInfo) Leased() int {
	n := 0
	for _, p := range g.Partitions {
		n += p.Leased
	}
	return n
}

// OldestUnsettled is the enqueue time of the group's oldest unsettled
// message over every partition; zero when there is none.
func (g GroupInfo) OldestUnsettled() time.Time {
	var t time.Time
	for _, p := range g.Partitions {
		if !p.OldestUnsettled.IsZero() && (t.IsZero() || p.OldestUnsettled.Before(t)) {
			t = p.OldestUnsettled
		}
	}
	return t
}

// Depth is the number of messages the queue holds over every partition.
func (i Info) Depth() uint64 {
	var n uint64
	for _, p := range i.Partitions {
		n += p.Depth()
	}
	return n
}

// Group returns the named group's snapshot.
func (i Info) Group(name string) (GroupInfo, bool) {
	for _, g := range i.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return GroupInfo{}, false
}

// Counts are a copy of a queue's running totals (Stats) at one moment.
type Counts struct {
	Enqueued, Delivered, Redelivered, Acked, Nacked, Rejected uint64
	DeadLettered, Expired, LeasesLost, Deduplicated           uint64
	Dropped, Released                                         uint64
}

// Snapshot returns the current totals.
func (s *Stats) Snapshot() Counts {
	return Counts{
		Enqueued: s.Enqueued.Load(), Delivered: s.Delivered.Load(), Redelivered: s.Redelivered.Load(),
		Acked: s.Acked.Load(), Nacked: s.Nacked.Load(), Rejected: s.Rejected.Load(),
		DeadLettered: s.DeadLettered.Load(), Expired: s.Expired.Load(),
		LeasesLost: s.LeasesLost.Load(), Deduplicated: s.Deduplicated.Load(),
		Dropped: s.Dropped.Load(), Released: s.Released.Load(),
	}
}

// IsDLQ reports whether q is a dead-letter queue.
func (q *Queue) IsDLQ() bool { return IsDLQ(q.name) }

// Info returns a snapshot of the queue. It holds the queue's lock only to
// copy figures; the enqueue time of an oldest unsettled message that is no
// longer in memory is read from storage afterwards.
func (q *Queue) Info() Info {
	type lookup struct{ g, p int }
	var reads []lookup
	q.lockAll()
	info := Info{Name: q.name, Options: q.opts, Counts: q.stats.Snapshot()}
	for _, p := range q.partitions() {
		info.Partitions = append(info.Partitions, PartitionInfo{
			Partition: p.index, Shard: shardOf(p.log), First: p.first, Next: p.next, Committed: p.committed,
		})
	}
	names := make([]string, 0, len(q.groups))
	for name := range q.groups {
		names = append(names, name)
	}
	sort.Strings(names)
	for gi, name := range names {
		g := q.groups[name]
		gs := GroupInfo{Name: name, Consumers: len(g.consumers), Filter: g.filter, Partitions: make([]GroupPartitionInfo, len(g.cursors)), Counts: g.stats.Snapshot()}
		for pi, cur := range g.cursors {
			gs.Partitions[pi] = cur.infoLocked()
			if gs.Partitions[pi].Lag > 0 && gs.Partitions[pi].OldestUnsettled.IsZero() {
				reads = append(reads, lookup{gi, pi})
			}
		}
		info.Groups = append(info.Groups, gs)
	}
	q.unlockAll()
	for _, r := range reads {
		gp := &info.Groups[r.g].Partitions[r.p]
		p := q.partitions()[r.p]
		msgs, err := p.log.Read(gp.Floor, info.Partitions[r.p].Committed, 1, 0)
		if err == nil && len(msgs) == 1 {
			gp.OldestUnsettled = msgs[0].EnqueuedAt
		}
	}
	return info
}

// infoLocked returns the cursor's figures; OldestUnsettled is left zero
// when the message at the floor is not in memory.
func (c *cursor) infoLocked() GroupPartitionInfo {
	committed := c.p.committed
	gp := GroupPartitionInfo{Partition: c.p.index, Floor: c.floor, Leased: c.leased}
	for off := range c.settled {
		if off < committed {
			gp.SettledAboveFloor++
		}
	}
	if c.floor < committed {
		gp.Lag = committed - c.floor - uint64(gp.SettledAboveFloor)
	}
	if gp.Lag == 0 {
		return gp
	}
	m, _ := c.p.cached(c.floor)
	if m == nil && c.floor >= c.raFrom && c.floor < c.raTo {
		for _, x := range c.ra {
			if x.Offset >= c.floor {
				m = x
				break
			}
		}
	}
	if m != nil {
		gp.OldestUnsettled = m.EnqueuedAt
	}
	return gp
}

// Peek returns up to n messages of the partition from offset from on (from
// the oldest retained one when from is below it), in offset order, without
// delivering or settling anything. The messages are copies.
func (q *Queue) Peek(ctx context.Context, partition int, from uint64, n int) ([]*Message, error) {
	if partition < 0 || partition >= len(q.partitions()) {
		return nil, fmt.Errorf("%w: partition %d (the queue has %d)", ErrBadPartitions, partition, len(q.partitions()))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	msgs, err := q.read(partition, from, ^uint64(0), n)
	if err != nil {
		return nil, err
	}
	out := make([]*Message, len(msgs))
	for i, m := range msgs {
		cp := *m
		out[i] = &cp
	}
	return out, nil
}

// read returns up to n stored messages of partition pi with from <= offset
// < to, below the committed offset: the older ones from storage, the newer
// from the ring.
func (q *Queue) read(pi int, from, to uint64, n int) ([]*Message, error) {
	if n <= 0 {
		return nil, nil
	}
	p := q.partitions()[pi]
	p.mu.Lock()
	from = max(from, p.first)
	to = min(to, p.committed)
	low := p.ring.low
	var mem []*Message
	for off := max(from, low); off < to && len(mem) < n; off++ {
		if m, _ := p.cached(off); m != nil {
			mem = append(mem, m)
		}
	}
	p.mu.Unlock()
	var out []*Message
	if from < min(low, to) {
		var err error
		if out, err = p.log.Read(from, min(low, to), n, 0); err != nil {
			return nil, storageError(err)
		}
	}
	out = append(out, mem...)
	return out[:min(len(out), n)], nil
}

// shardOf returns the storage shard of a log that has one, else -1.
func shardOf(l Log) int {
	if s, ok := l.(interface{ Shard() int }); ok {
		return s.Shard()
	}
	return -1
}
