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
//
// With retention time a queue keeps its messages, settled or not, until
// they are due by max_age, max_messages or max_bytes, and then deletes
// them without dead-lettering any: a stream's history ages out, and a
// group that had not read a message by then does not get it (counted in
// Stats.Expired, or Stats.Dropped when over a limit).

// evictBatch and evictBatchBytes bound the messages one eviction pass
// reads from storage per partition: 256, and no more once their payloads
// reach 4 MiB.
const (
	evictBatch      = 256
	evictBatchBytes = 4 << 20
)

// startEvictionLocked starts a background eviction pass when one may be
// due. q.mu (or every lock of the queue) must be held.
// retentionLimits are the settings the timer's retention looks at.
type retentionLimits struct {
	maxAge                time.Duration
	dropOldest            bool
	maxMessages, maxBytes int64
}

func limitsOf(o Options) *retentionLimits {
	return &retentionLimits{maxAge: o.MaxAge, dropOldest: o.Overflow == OverflowDropOldest, maxMessages: o.MaxMessages, maxBytes: o.MaxBytes}
}

// mayRetain reports, taking no lock, whether the timer's retention may
// find work on the queue: a message old enough for max_age, more than a
// drop-oldest limit holds, or deduplication ids to forget. An idle node
// with thousands of queues then takes none of their locks.
func (q *Queue) mayRetain(now time.Time) bool {
	if q.dedups.Load() {
		return true
	}
	if q.evicting.Load() {
		return false
	}
	r := q.retention.Load()
	return r.maxAge > 0 && now.UnixNano() >= q.evictAt.Load() ||
		r.dropOldest && (r.maxMessages > 0 && q.depth.Load() > r.maxMessages || r.maxBytes > 0 && q.bytes.Load() > r.maxBytes)
}

func (q *Queue) startEvictionLocked(now time.Time) {
	if q.closed || q.evicting.Load() {
		return
	}
	byAge := q.opts.MaxAge > 0 && now.UnixNano() >= q.evictAt.Load()
	byCount := q.opts.Overflow == OverflowDropOldest && q.opts.MaxMessages > 0 && q.depth.Load() > q.opts.MaxMessages
	byBytes := q.opts.Overflow == OverflowDropOldest && q.opts.MaxBytes > 0 && q.bytes.Load() > q.opts.MaxBytes
	if !byAge && !byCount && !byBytes {
		return
	}
	q.evicting.Store(true)
	q.m.wg.Add(1)
	go func() {
		defer q.m.wg.Done()
		defer q.evicting.Store(false)
		q.evict(now)
	}()
}

// evict runs one pass over the partitions.
// evict runs one pass over the partitions and records when the next pass
// by age can find anything due: the soonest head's enqueue time plus
// max_age (a message published later is due later still).
func (q *Queue) evict(now time.Time) {
	next := now.Add(q.maxAge())
	for i := range q.partitions() {
		for {
			n, err := q.evictHead(i, now, &next)
			if err != nil {
				q.m.log.Error("eviction failed", "queue", q.name, "partition", i, "err", err)
				return
			}
			if n < evictBatch {
				break
			}
		}
	}
	q.evictAt.Store(next.UnixNano())
}

func (q *Queue) maxAge() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.opts.MaxAge
}

// evictHead evicts the due messages at the head of partition i and
// returns how many it looked at.
func (q *Queue) evictHead(i int, now time.Time, next *time.Time) (int, error) {
	p := q.partitions()[i]
	p.mu.Lock()
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
	p.mu.Unlock()
	if len(msgs) == 0 && from < to {
		var err error
		if msgs, err = p.log.Read(from, to, evictBatch, evictBatchBytes); err != nil {
			return 0, err
		}
	}
	looked := len(msgs)

	p.mu.Lock()
	stream := q.opts.Retention == RetentionTime
	var due []*Message
	var reasons []string
	excess, excessBytes := int64(0), int64(0)
	if depth := q.depth.Load(); q.opts.Overflow == OverflowDropOldest && q.opts.MaxMessages > 0 && depth > 0 {
		// This partition's share of the excess, by its part of the depth.
		if over := depth - q.opts.MaxMessages; over > 0 {
			excess = (over*int64(p.next-p.first) + depth - 1) / depth
		}
	}
	if bytes := q.bytes.Load(); q.opts.Overflow == OverflowDropOldest && q.opts.MaxBytes > 0 && bytes > 0 {
		// Likewise for max_bytes, by its part of the bytes.
		if over := bytes - q.opts.MaxBytes; over > 0 {
			excessBytes = (over*p.bytes + bytes - 1) / bytes
		}
	}
scan:
	for _, m := range msgs {
		if m.Offset < p.first || q.leasedLocked(i, m.Offset) {
			*next = now // held by a lease: look again next pass
			break
		}
		if !stream && q.settledByAllLocked(i, m.Offset) {
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
			if q.opts.MaxAge > 0 {
				*next = minTime(*next, m.EnqueuedAt.Add(q.opts.MaxAge))
			}
			break scan // the head is not due: nothing behind it is either
		}
		due = append(due, m)
	}
	p.mu.Unlock()
	if len(due) == 0 {
		return 0, nil
	}
	if !stream {
		if err := q.deadLetterAll(i, due, reasons); err != nil {
			return 0, err
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
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
	switch {
	case stream:
		for _, r := range reasons {
			if r == ReasonOverflow {
				q.stats.Dropped.Add(1)
			}
		}
	case q.dlq == nil:
		q.stats.Dropped.Add(uint64(len(due)))
	default:
		q.stats.DeadLettered.Add(uint64(len(due)))
	}
	if (stream || len(q.groups) == 0) && last+1 > p.first {
		b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: i, From: p.first, To: last + 1})
		p.advance(last + 1)
	}
	p.flushStateLocked(b)
	p.retainLocked(b) // what every group has now settled goes at once
	p.flushLocked(b)
	p.dispatchLocked(q.m.now())
	if len(due) < looked {
		return 0, nil
	}
	return looked, nil
}

// settledByAllLocked reports whether every group has settled offset off of
// partition i (false for a queue without groups). Partition i's lock must
// be held.
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
		dm := q.deadLetterCopy(partition, m, DeadLetter{Reason: reasons[i]})
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

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
