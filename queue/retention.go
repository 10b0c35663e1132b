package queue

import (
	"time"
)

// Eviction: messages leave a queue before every group has acked them when
// they are older than max_age (dead-letter reason expired) or, with
// overflow drop-oldest, when the queue holds more than max_messages
// (reason overflow). Either way they go to the dead-letter queue first and
// are removed only once their dead-letter copy is stored, so nothing
// disappears without a trace. A dead-letter queue has no dead-letter queue:
// what it evicts is dropped and counted in Stats.Dropped.
//
// Eviction takes messages from the head of a partition only and stops at a
// message some consumer holds a lease on: it is evicted once settled or
// released, if still due.

// evictBatch bounds the messages one eviction pass reads per partition.
const evictBatch = 256

// startEvictionLocked starts a background eviction pass when one may be due.
func (q *Queue) startEvictionLocked(now time.Time) {

	if q.evicting || q.closed {
		return
	}
	byAge := q.opts.MaxAge > 0
	byCount := q.opts.Overflow == OverflowDropOldest && q.opts.MaxMessages > 0 && q.depthLocked() > q.opts.MaxMessages
	byBytes := q.opts.Overflow == OverflowDropOldest && q.opts.MaxBytes > 0 && q.bytes > q.opts.MaxBytes
	if !byAge && !byCount && !byBytes {
		return
	}
	q.evicting = true
	q.m.wg.Add(1)
	go func() {
		defer q.m.wg.Done()
		q.evict(now)
		q.mu.Lock()
		q.evicting = false
		q.mu.Unlock()
	}()
}

func (q *Queue) depthLocked() int64 {
	var depth int64
	for _, p := range q.parts {
		depth += int64(p.next - p.first)
	}
	return depth
}

// evict runs one pass over the partitions.
func (q *Queue) evict(now time.Time) {
	for i := range q.parts {
		for {
			n, err := q.evictHead(i, now)
			if err != nil {
				q.m.log.Error("eviction failed", "queue", q.name, "partition", i, "err", err)
				return
			}
			if n < evictBatch {
				break
			}
		}
	}
}

// evictHead evicts the due messages at the head of partition i and
// returns how many it looked at.
func (q *Queue) evictHead(i int, now time.Time) (int, error) {
	p := q.parts[i]
	q.mu.Lock()
	from, to := p.first, p.committed
	var msgs []*Message
	for off := from; off < to && len(msgs) < evictBatch; off++ {
		m, in := p.cached(off)
		if !in {
			break
		}
		if m != nil {
			msgs = append(msgs, m)
		}
	}
	q.mu.Unlock()
	if len(msgs) == 0 && from < to {
		var err error
		if msgs, err = p.store.Read(q.name, i, from, to, evictBatch); err != nil {
			return 0, err
		}
	}
	looked := len(msgs)

	q.mu.Lock()
	var due []*Message
	var reasons []string
	excess, excessBytes := int64(0), int64(0)
	if q.opts.Overflow == OverflowDropOldest && q.opts.MaxMessages > 0 {
		// This partition's share of the excess, by its part of the depth.
		if over := q.depthLocked() - q.opts.MaxMessages; over > 0 {
			excess = (over*int64(p.next-p.first) + q.depthLocked() - 1) / q.depthLocked()
		}
	}
	if q.opts.Overflow == OverflowDropOldest && q.opts.MaxBytes > 0 && q.bytes > 0 {
		// Likewise for max_bytes, by its part of the bytes.
		if over := q.bytes - q.opts.MaxBytes; over > 0 {
			excessBytes = (over*p.bytes + q.bytes - 1) / q.bytes
		}
	}
scan:
	for _, m := range msgs {
		if m.Offset < p.first || q.leasedLocked(i, m.Offset) {
			break
		}
		if q.settledByAllLocked(i, m.Offset) {
			continue // waits for retention to delete it; not to be evicted again
		}
		switch {
		case q.opts.MaxAge > 0 && now.Sub(m.EnqueuedAt) >= q.opts.MaxAge:
			reasons = append(reasons, ReasonExpired)
		case excess > 0 || excessBytes > 0:
			reasons = append(reasons, ReasonOverflow)
			excess--
			excessBytes -= int64(m.Size())
		default:
			break scan // the head is not due: nothing behind it is either
		}
		due = append(due, m)
	}
	q.mu.Unlock()
	if len(due) == 0 {
		return 0, nil
	}
	if err := q.deadLetterAll(i, due, reasons); err != nil {
		return 0, err
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	b := new(Batch)
	last := due[len(due)-1].Offset
	for j, m := range due {
		if reasons[j] == ReasonExpired {
			q.stats.Expired.Add(1)
		}
		for _, g := range q.groups {
			cur := g.cursors[i]
			if !cur.isSettled(m.Offset) {
				cur.settleLocked(m.Offset, b)
			}
		}
	}
	if q.dlq == nil {
		q.stats.Dropped.Add(uint64(len(due)))
	} else {
		q.stats.DeadLettered.Add(uint64(len(due)))
	}
	if len(q.groups) == 0 && last+1 > p.first {
		b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: i, From: p.first, To: last + 1})
		q.bytes -= p.advance(last + 1)
	}
	q.flushStateLocked(b)
	q.retainLocked(b) // what every group has now settled goes at once
	q.flushLocked(b)
	q.dispatchLocked(q.m.now())
	if len(due) < looked {
		return 0, nil
	}
	return looked, nil
}

// settledByAllLocked reports whether every group has settled offset off of
// partition i (false for a queue without groups).
func (q *Queue) settledByAllLocked(i int, off uint64) bool {
	if len(q.groups) == 0 {
		return false
	}
	for _, g := range q.groups {
		if !g.cursors[i].isSettled(off) {
			return false
		}
	}
	return true
}

// leasedLocked reports whether a consumer of any group holds offset off of
// partition i.
func (q *Queue) leasedLocked(i int, off uint64) bool {
	for _, g := range q.groups {
		if _, ok := g.cursors[i].out[off]; ok {
			return true
		}
	}
	return false
}

// deadLetterAll stores dead-letter copies of msgs and waits for them.
func (q *Queue) deadLetterAll(partition int, msgs []*Message, reasons []string) error {
	if q.dlq == nil {
		return nil
	}
	errs := make(chan error, len(msgs))
	for i, m := range msgs {
		dm := &Message{Key: m.Key, Headers: m.Headers, Payload: m.Payload, DeadLetter: &DeadLetter{
			Reason:        reasons[i],
			OriginalID:    MessageID(partition, m.Offset),
			OriginalTopic: TopicName(q.name, m.Subject),
		}}
		dm.Headers.ExpiryInterval = 0
		q.dlq.Publish(dm, func(err error) { errs <- err })
	}
	var first error
	for range msgs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
