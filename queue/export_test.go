package queue

import "time"

// TickAt runs, at now, one pass of what the manager's timer does (see
// Manager.run): leases past their deadline are lost, due retries and
// delays become deliverable and, when retain is set, retention deletes
// what every group has settled and evicts what max_age or overflow
// drop-oldest makes due. It returns once the pass is done, the evictions
// it started included.
//
// Tests set ManagerOptions.Tick and RetainEvery long enough that the real
// timer never runs, and call TickAt with the time of their clock instead.
func TickAt(m *Manager, now time.Time, retain bool) {
	for _, q := range m.Queues() {
		q.tick(now, retain)
	}
	if retain {
		m.wg.Wait()
	}
}

// WaitWritten returns once every write the manager queued to its
// partitions' logs so far is stored (or failed): a log completes a
// partition's writes in order, so an empty synced write queued now
// completes after them.
func WaitWritten(m *Manager) {
	var done []chan error
	for _, q := range m.Queues() {
		for _, p := range q.partitions() {
			ch := make(chan error, 1)
			p.mu.Lock()
			p.log.Append(p.epoch, nil, &Batch{}, true, func(err error) { ch <- err })
			p.mu.Unlock()
			done = append(done, ch)
		}
	}
	for _, ch := range done {
		<-ch
	}
}

// MarkAhead is how many offsets a delivered mark covers ahead of the next
// first delivery.
const MarkAhead = markAhead

// MarkAheadMax bounds the offsets a delivered mark covers.
const MarkAheadMax = markAheadMax

// MarkAheadOf returns how many offsets the next delivered mark of group's
// cursor on partition p of queue name covers, 0 when there is no such
// cursor.
func MarkAheadOf(m *Manager, name, group string, p int) int {
	q := m.Queue(name)
	if q == nil || p >= len(q.partitions()) {
		return 0
	}
	part := q.partitions()[p]
	part.mu.Lock()
	defer part.mu.Unlock()
	g := q.groups[group]
	if g == nil {
		return 0
	}
	return int(g.cursors[p].ahead)
}

// MarkAsked reports whether group's cursor on partition p of queue name
// waits for a delivered mark it asked for.
func MarkAsked(m *Manager, name, group string, p int) bool {
	q := m.Queue(name)
	part := q.partitions()[p]
	part.mu.Lock()
	defer part.mu.Unlock()
	return q.groups[group].cursors[p].asking
}

// ReadAheadBytes and MaxParkedBytes are the byte bounds of what a cursor
// holds read from storage.
const (
	ReadAheadBytes = readAheadBytes
	MaxParkedBytes = maxParkedBytes
)

// HeldBytes returns the payload bytes group's cursors on queue name hold
// in memory: their read-ahead from storage, the messages they parked behind
// a key or set aside for a shard (parked), and every message waiting to be
// delivered (waiting: parked ones, and those given back and released).
func HeldBytes(m *Manager, name, group string) (readAhead, parked, waiting int64) {
	q := m.Queue(name)
	if q == nil {
		return 0, 0, 0
	}
	for i, p := range q.partitions() {
		p.mu.Lock()
		if g := q.groups[group]; g != nil {
			c := g.cursors[i]
			readAhead += payloadBytes(c.ra)
			parked += c.parkedBytes + c.asideBytes
			waiting += c.parkedBytes + c.asideBytes
			for _, pd := range c.ready {
				waiting += int64(len(pd.m.Payload))
			}
			for _, pd := range c.pinned {
				waiting += int64(len(pd.m.Payload))
			}
		}
		p.mu.Unlock()
	}
	return readAhead, parked, waiting
}

// RingBytes returns the payload bytes the rings of queue name's partitions
// hold.
func RingBytes(m *Manager, name string) int64 {
	q := m.Queue(name)
	if q == nil {
		return 0
	}
	var n int64
	for _, p := range q.partitions() {
		p.mu.Lock()
		n += p.ring.bytes
		p.mu.Unlock()
	}
	return n
}
