package queue

import (
	"slices"
	"time"
)

// dedupIndex remembers the dedup-ids of a queue's recent publishes, in the
// order they were stored, so that a window's worth expires from the front.
// Guarded by the queue's mutex.
type dedupIndex struct {
	byID  map[string]*dedupEntry
	order []*dedupEntry
}

type dedupEntry struct {
	id        string
	partition int
	at        time.Time
	// done: the original is stored; until then duplicates wait in waiters
	// and get the original's outcome.
	done    bool
	failed  bool // the original was not stored: there is no record to delete
	waiters []func(error)
}

// get returns the live entry of id, if it is within the window.
func (d *dedupIndex) get(id string, now time.Time, window time.Duration) *dedupEntry {
	e := d.byID[id]
	if e == nil || now.Sub(e.at) >= window {
		return nil
	}
	return e
}

// add records a new original publish of id.
func (d *dedupIndex) add(id string, partition int, at time.Time) *dedupEntry {
	if d.byID == nil {
		d.byID = map[string]*dedupEntry{}
	}
	e := &dedupEntry{id: id, partition: partition, at: at}
	d.byID[id] = e
	d.order = append(d.order, e)
	return e
}

// complete records the outcome of e's commit and returns the duplicates
// waiting for it. A failed original is forgotten: a retry is a new publish.
func (d *dedupIndex) complete(id string, e *dedupEntry, err error) []func(error) {
	e.done = true
	if err != nil {
		e.failed = true
		if d.byID[id] == e {
			delete(d.byID, id)
		}
	}
	w := e.waiters
	e.waiters = nil
	return w
}

// restore adds an entry found in storage at recovery.
func (d *dedupIndex) restore(id string, partition int, at time.Time) {
	e := d.add(id, partition, at)
	e.done = true
}

// sortOrder puts restored entries in time order.
func (d *dedupIndex) sortOrder() {
	slicesSortByTime(d.order)
}

// expire removes the entries older than the window and returns those whose
// original was stored, so that their records are deleted too.
func (d *dedupIndex) expire(now time.Time, window time.Duration) []*dedupEntry {
	n := 0
	for n < len(d.order) && d.order[n].done && now.Sub(d.order[n].at) >= window {
		n++
	}
	if n == 0 {
		return nil
	}
	var gone []*dedupEntry
	for _, e := range d.order[:n] {
		if d.byID[e.id] == e {
			delete(d.byID, e.id)
		}
		if !e.failed {
			gone = append(gone, e)
		}
	}
	clear(d.order[:n])
	d.order = d.order[n:]
	return gone
}

func slicesSortByTime(es []*dedupEntry) {
	slices.SortStableFunc(es, func(a, b *dedupEntry) int { return a.at.Compare(b.at) })
}
