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

	// sizes holds the size of each message in [first, next) (0 when not
	// known: recovered from disk while the queue had no max_bytes); bytes
	// is their sum.
	sizes []uint32
	bytes int64
}

func newPartition(index, shard int, c *committer, store Shard, first, next uint64, ringSize int) *partition {
	return &partition{
		index: index, shard: shard, c: c, store: store,
		first: first, next: next, committed: next,
		ring: make([]*Message, ringSize), ringLow: next,
		sizes: make([]uint32, next-first),
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

// add counts the size of the message appended at the next offset.
func (p *partition) add(size int) {
	p.sizes = append(p.sizes, uint32(size))
	p.bytes += int64(size)
}

// advance makes first the partition's first retained offset: the sizes of
// the messages below it leave the count and the ring lets go of them. It
// returns how many bytes left.
func (p *partition) advance(first uint64) int64 {
	if first <= p.first {
		return 0
	}
	n := min(first-p.first, uint64(len(p.sizes)))
	var freed int64
	for _, sz := range p.sizes[:n] {
		freed += int64(sz)
	}
	p.sizes = p.sizes[n:]
	p.bytes -= freed
	p.first = first
	p.trim(first)
	return freed
}

// loadSizes reads the sizes of the partition's retained messages from
// storage, for max_bytes. It reads every message once: a cost paid at start
// only by queues with max_bytes set.
func (p *partition) loadSizes(queue string) error {
	for from := p.first; from < p.next; {
		msgs, err := p.store.Read(queue, p.index, from, p.next, 4096)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			sz := m.Size()
			p.sizes[m.Offset-p.first] = uint32(sz)
			p.bytes += int64(sz)
		}
		from = msgs[len(msgs)-1].Offset + 1
	}
	return nil
}
