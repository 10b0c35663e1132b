package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Seek moves a group to another point of its partitions: every message
// before the point counts as settled for the group, and the retained
// messages from it on are delivered again, their delivery counts starting
// over. A group starts at a point too: Start may name a time.

// SeekTo is where Seek moves a group: to the oldest retained message
// (Earliest), past the newest (Latest), to the first message enqueued at
// or after Time, or, on the one partition Partition, to Offset.
type SeekTo struct {
	Earliest, Latest bool
	Time             time.Time
	// Partition and Offset, when OnePartition: the offset to move to on
	// that partition (clamped to what it retains); the others stay.
	OnePartition bool
	Partition    int
	Offset       uint64
}

// ParseSeek reads a point as the API and the CLI name it: earliest,
// latest or an RFC 3339 time.
func ParseSeek(s string) (SeekTo, error) {
	switch s {
	case string(StartEarliest):
		return SeekTo{Earliest: true}, nil
	case string(StartLatest):
		return SeekTo{Latest: true}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return SeekTo{}, fmt.Errorf("%w: seek to %q: give earliest, latest, an RFC 3339 time (2026-11-27T08:00:00Z) or a partition and an offset", ErrBadSeek, s)
	}
	return SeekTo{Time: t}, nil
}

func (s SeekTo) String() string {
	switch {
	case s.Earliest:
		return string(StartEarliest)
	case s.Latest:
		return string(StartLatest)
	case s.OnePartition:
		return "partition " + strconv.Itoa(s.Partition) + " offset " + strconv.FormatUint(s.Offset, 10)
	}
	return s.Time.UTC().Format(time.RFC3339Nano)
}

// SoughtPartition is what Seek did on one partition: the group's floor
// before and after.
type SoughtPartition struct {
	Partition int    `json:"partition"`
	From      uint64 `json:"from"`
	To        uint64 `json:"to"`
}

// Seek moves group name to the point to on the partitions this node
// serves (every one on a single node; in a cluster each node moves its
// own, through their replicated logs) and returns what it did on each,
// persisted before it returns. A group with consumers connected is
// refused (ErrGroupActive) unless force, which takes their leases back
// first: a late PUBACK of one changes nothing. The point is clamped to
// what each partition retains: before the oldest retained message, the
// group starts there. With create, a group this node does not have yet
// is made at the point (in a cluster, a node whose partitions the group
// has not read from yet).
func (q *Queue) Seek(ctx context.Context, name string, to SeekTo, force, create bool) ([]SoughtPartition, error) {
	if create && !ValidGroupName(name) {
		return nil, fmt.Errorf("%w: %q: a group's name is an MQTT share name, which holds no /, + or #", ErrInvalidGroup, name)
	}
	if to.OnePartition && (to.Partition < 0 || to.Partition >= len(q.partitions())) {
		return nil, fmt.Errorf("%w: queue %s has partitions 0 to %d, not %d", ErrBadPartitions, q.name, len(q.partitions())-1, to.Partition)
	}
	q.m.admin.Lock()
	defer q.m.admin.Unlock()
	var at map[int]uint64
	if !to.Time.IsZero() {
		var err error
		if at, err = q.offsetsAt(to.Time); err != nil {
			return nil, err
		}
	}
	var k kicks
	q.lockAll()
	if q.closed {
		q.unlockAll()
		return nil, ErrClosed
	}
	g := q.groups[name]
	if g == nil && create {
		g = q.groupLocked(name, StartEarliest, nil, "")
	}
	switch {
	case g == nil:
		q.unlockAll()
		return nil, fmt.Errorf("%w: %q in queue %s", ErrNoSuchGroup, name, q.name)
	case len(g.consumers) > 0 && !force:
		n := len(g.consumers)
		q.unlockAll()
		return nil, fmt.Errorf("%w: group %s of queue %s has %d; force takes their leases back", ErrGroupActive, name, q.name, n)
	}
	b := new(Batch)
	out := []SoughtPartition{}
	for _, p := range q.partitions() {
		if p.servingLocked() != nil || to.OnePartition && p.index != to.Partition {
			continue
		}
		var off uint64
		switch {
		case to.Earliest:
			off = p.first
		case to.Latest:
			off = p.committed
		case to.OnePartition:
			off = to.Offset
		default:
			off = at[p.index]
		}
		off = min(max(off, p.first), p.committed)
		cur := g.cursors[p.index]
		out = append(out, SoughtPartition{Partition: p.index, From: cur.floor, To: off})
		cur.seekLocked(off, b, &k)
	}
	wait := q.commitLocked(b)
	q.dispatchAllLocked(q.m.now())
	q.unlockAll()
	k.run()
	if err := wait(ctx); err != nil {
		return nil, err
	}
	q.m.log.Info("consumer group moved", "queue", q.name, "group", name, "to", to.String(), "partitions", len(out))
	return out, nil
}

// seekLocked replaces the cursor with one at offset to: its leases taken
// back, its settlement marks and delivery counts gone from storage (in b)
// and its floor at to. Every lock of the queue must be held.
func (c *cursor) seekLocked(to uint64, b *Batch, k *kicks) {
	q, g, p := c.g.q.name, c.g.name, c.p.index
	for _, l := range c.p.leasesWhere(func(l *Lease) bool { return l.cur == c }) {
		c.p.revokeLocked(l, k)
	}
	for _, off := range c.unmarks {
		b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off})
	}
	for off, onDisk := range c.settled {
		if onDisk {
			b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off})
		}
	}
	for off := range c.counts {
		b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: q, Group: g, Partition: p, Offset: off})
	}
	b.Floors = append(b.Floors, FloorWrite{Queue: q, Group: g, Partition: p, Floor: to, Delivered: to, Filter: c.g.filter})
	c.g.resetCursor(c.p)
	n := c.g.cursors[p]
	n.floor, n.next, n.delivered, n.mark, n.asked = to, to, to, to, to
	n.floorSeen.Store(to)
	n.savedFloor, n.savedDelivered = to, to
}

// offsetsAt returns, for each partition this node serves, the offset of
// its first retained message enqueued at or after t (past the newest
// when none is). Enqueue times are stored to the millisecond: t is taken
// to its millisecond, and a message of that millisecond counts as at t.
// A binary search over the stored messages, which are in the order they
// were enqueued; taking no lock while it reads.
func (q *Queue) offsetsAt(t time.Time) (map[int]uint64, error) {
	t = t.Truncate(time.Millisecond)
	type bounds struct {
		p        *partition
		lo, next uint64
	}
	var bs []bounds
	q.lockAll()
	for _, p := range q.partitions() {
		if p.servingLocked() == nil {
			bs = append(bs, bounds{p, p.first, p.committed})
		}
	}
	q.unlockAll()
	out := map[int]uint64{}
	for _, b := range bs {
		lo, hi := b.lo, b.next
		for lo < hi {
			mid := lo + (hi-lo)/2
			msgs, err := b.p.log.Read(mid, hi, 1, 0)
			if err != nil {
				return nil, err
			}
			if len(msgs) == 0 {
				// Nothing stored from mid on (deleted meanwhile).
				hi = mid
				continue
			}
			if msgs[0].EnqueuedAt.Before(t) {
				lo = msgs[0].Offset + 1
			} else {
				hi = mid
			}
		}
		out[b.p.index] = lo
	}
	return out, nil
}

// GroupConsumers returns how many consumers group name has connected
// here, and whether this node has the group.
func (q *Queue) GroupConsumers(name string) (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.groups[name]
	if g == nil {
		return 0, false
	}
	return len(g.consumers), true
}

// ParseSeekJSON reads the point of a seek as the admin API takes it: a
// string (ParseSeek) or {"partition": P, "offset": O}.
func ParseSeekJSON(raw []byte) (SeekTo, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return ParseSeek(s)
	}
	var po struct {
		Partition *int    `json:"partition"`
		Offset    *uint64 `json:"offset"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&po); err != nil || po.Partition == nil || po.Offset == nil {
		return SeekTo{}, fmt.Errorf(`%w: "to" must be "earliest", "latest", an RFC 3339 time or {"partition": P, "offset": O}, got %s`, ErrBadSeek, bytes.TrimSpace(raw))
	}
	return SeekTo{OnePartition: true, Partition: *po.Partition, Offset: *po.Offset}, nil
}
