package queue

// partition is the in-memory side of one partition's log. All fields are
// guarded by the owning Queue's mutex.
type partition struct {
	index int
	shard int
	c     *committer
	store Shard

	// first is the oldest retained offset; next the offset the next append
	// gets; committed the offset below which every append has finished
	// (stored, or failed and left as a hole).
	first, next, committed uint64

	// ring holds the newest committed messages: slot off%len(ring) holds
	// offset off when off >= ringLow. A nil slot or one holding another
	// offset is a hole.
	ring    []*Message
	ringLow uint64

	// depth counts stored messages not yet deleted; bytes their sizes as far
	// as they are known (messages recovered from disk count from the first read).
	depth int64
}

func newPartition(index, shard int, c *committer, store Shard, first, next uint64, ringSize int) *partition {
	return &partition{
		index: index, shard: shard, c: c, store: store,
		first: first, next: next, committed: next,
		ring: make([]*Message, ringSize), ringLow: next,
		depth: int64(next - first),
	}
}

// put records a committed append (m nil for a failed one) at offset off.
// Commits complete in offset order within a partition.
func (p *partition) put(off uint64, m *Message) {
	p.ring[off%uint64(len(p.ring))] = m
	p.committed = off + 1
	if low := p.committed - min(p.committed, uint64(len(p.ring))); low > p.ringLow {
		p.ringLow = low
	}
}

// cached returns the message at off if the ring holds it. inRing reports
// whether off is within the ring's range at all (a nil message with inRing
// true is a hole).
func (p *partition) cached(off uint64) (m *Message, inRing bool) {
	if off < p.ringLow || off >= p.committed {
		return nil, false
	}
	m = p.ring[off%uint64(len(p.ring))]
	if m != nil && m.Offset != off {
		return nil, true
	}
	return m, true
}

// trim releases the ring's messages below first, once they are deleted, so
// that an idle queue does not hold its last ring's worth of messages.
func (p *partition) trim(first uint64) {
	for off := max(p.ringLow, first-min(first, uint64(len(p.ring)))); off < first && off < p.committed; off++ {
		if m := p.ring[off%uint64(len(p.ring))]; m != nil && m.Offset == off {
			p.ring[off%uint64(len(p.ring))] = nil
		}
	}
}
