package badger

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/queue"
)

// commitReq is one write of a partition log: usually a single append (the
// hot path, kept free of allocations beyond the request itself), or state
// writes, or both.
type commitReq struct {
	log   *partitionLog // nil for catalog writes
	msg   *queue.Message
	state *queue.Batch
	sync  bool
	done  func(error)
	epoch uint64
}

// committer is the group commit of one shard: one goroutine drains the
// requests that arrived while the previous batch was being written, writes
// them as one batch with one sync, and hands the batch to a completer
// goroutine that, while the next batch is written, makes each partition's
// appends of the batch known to it at once (partitionLog.committed) and
// then runs the callbacks in submission order. Submit never blocks:
// producers are bounded by their own in-flight cap, so the queue of
// requests is bounded too.
type committer struct {
	shard    *Shard
	index    int
	maxBatch int
	// linger and lingerBatch: see queue.LogOptions.Linger. full is
	// signalled when lingerBatch requests are pending.
	linger      time.Duration
	lingerBatch int
	full        chan struct{}
	observe     func(queue.CommitStats)
	// unsyncedNow, if set, is told when unsynced turns true.
	unsyncedNow func()

	mu      sync.Mutex
	pending []commitReq
	closed  bool
	wake    chan struct{}

	completions chan completion
	stopped     chan struct{}

	// unsynced: a batch was written without a sync since the last sync.
	unsynced atomic.Bool
}

type completion struct {
	reqs []commitReq
	err  error
}

func newCommitter(shard *Shard, index int, o queue.LogOptions) *committer {
	c := &committer{
		shard:       shard,
		index:       index,
		maxBatch:    o.MaxBatch,
		linger:      o.Linger,
		lingerBatch: o.LingerBatch,
		full:        make(chan struct{}, 1),
		observe:     o.OnCommit,
		unsyncedNow: o.Unsynced,
		wake:        make(chan struct{}, 1),
		completions: make(chan completion, 2),
		stopped:     make(chan struct{}),
	}
	go c.run()
	go c.complete()
	return c
}

// submit queues r; its done callback runs once r is written (or failed).
func (c *committer) submit(r commitReq) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		if r.done != nil {
			r.done(queue.ErrClosed)
		}
		return
	}
	c.pending = append(c.pending, r)
	first, full := len(c.pending) == 1, len(c.pending) == c.lingerBatch
	c.mu.Unlock()
	if first {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if full {
		select {
		case c.full <- struct{}{}:
		default:
		}
	}
}

// lingerFor waits, under a steady load, up to c.linger for more
// requests, or until lingerBatch are pending. Only a batch with a sync
// waits: the sync is what more requests share; unsynced writes (a
// cluster's applies, async queues) cost little each. c.mu must not be
// held.
func (c *committer) lingerFor(busy bool, t *time.Timer) {
	if c.linger <= 0 || !busy {
		return
	}
	c.mu.Lock()
	n, closed, sync := len(c.pending), c.closed, anySync(c.pending)
	c.mu.Unlock()
	if closed || n >= c.lingerBatch || !sync {
		return
	}
	select {
	case <-c.full: // drained: a stale signal must not end the next wait at once
	default:
	}
	c.mu.Lock()
	n, closed = len(c.pending), c.closed // close or lingerBatch since: no wait
	c.mu.Unlock()
	if closed || n >= c.lingerBatch {
		return
	}
	t.Reset(c.linger)
	select {
	case <-t.C:
	case <-c.full:
		t.Stop()
	}
}

// fence makes epoch the epoch l's writes need (see queue.Log.Fence).
func (c *committer) fence(l *partitionLog, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch < l.fence {
		return &queue.FencedError{Partition: l.id, Epoch: epoch, Current: l.fence}
	}
	l.fence = epoch
	return nil
}

// dropFenced completes the requests made under an epoch older than their
// partition's fence, with a FencedError, and returns the others.
func (c *committer) dropFenced(reqs []commitReq) []commitReq {
	var stale []completion
	kept := reqs[:0]
	c.mu.Lock()
	for _, r := range reqs {
		if r.log != nil && r.epoch < r.log.fence {
			err := &queue.FencedError{Partition: r.log.id, Epoch: r.epoch, Current: r.log.fence}
			stale = append(stale, completion{reqs: []commitReq{r}, err: err})
			continue
		}
		kept = append(kept, r)
	}
	c.mu.Unlock()
	for _, comp := range stale {
		c.completions <- comp
	}
	return kept
}

// syncIfNeeded makes the writes of async queues durable: it queues an
// empty synced batch when something was written without a sync.
func (c *committer) syncIfNeeded() {
	if c.unsynced.Load() {
		c.submit(commitReq{sync: true})
	}
}

// close stops accepting requests, writes what is pending, runs every
// callback and returns when done.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	for _, ch := range []chan struct{}{c.wake, c.full} { // full ends a linger
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	<-c.stopped
}

func (c *committer) run() {
	defer close(c.completions)
	var spare []commitReq
	var b queue.Batch
	// busy: requests came while the last batch was written, two at least,
	// so more are on their way. A producer that waits for each PUBACK
	// before its next publish (beside the odd write of a consumer's
	// state) never makes it so: its commits never wait.
	busy := false
	t := time.NewTimer(time.Hour)
	t.Stop()
	for range c.wake {
		c.lingerFor(busy, t)
		c.mu.Lock()
		reqs := c.pending
		all := reqs
		c.pending = spare[:0]
		closed := c.closed
		c.mu.Unlock()
		reqs = c.dropFenced(reqs)

		for len(reqs) > 0 {
			n := c.fill(&b, reqs)
			start := time.Now()
			sync := anySync(reqs[:n])
			err := c.shard.Write(&b, sync)
			if err == nil {
				if sync {
					c.unsynced.Store(false)
				} else if b.Len() > 0 && c.unsynced.CompareAndSwap(false, true) && c.unsyncedNow != nil {
					c.unsyncedNow()
				}
			} else if sync && c.unsynced.Load() && c.unsyncedNow != nil {
				c.unsyncedNow() // the sync failed: asked for again
			}
			if c.observe != nil {
				c.observe(queue.CommitStats{Shard: c.index, Requests: n, Writes: b.Len(), Duration: time.Since(start), Err: err})
			}
			if err != nil {
				err = &queue.StorageError{Err: err}
			}
			done := make([]commitReq, n)
			copy(done, reqs[:n])
			c.completions <- completion{reqs: done, err: err}
			b.Reset()
			reqs = reqs[n:]
		}
		clear(all)
		spare = all[:0]
		c.mu.Lock()
		busy = len(c.pending) >= 2
		c.mu.Unlock()
		if closed {
			c.mu.Lock()
			left := len(c.pending)
			c.mu.Unlock()
			if left == 0 {
				return
			}
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
}

// fill merges requests into b up to maxBatch writes and returns how many it took.
func (c *committer) fill(b *queue.Batch, reqs []commitReq) int {
	n := 0
	for n < len(reqs) {
		r := &reqs[n]
		if n > 0 && b.Len() >= c.maxBatch {
			break
		}
		if r.msg != nil {
			b.Appends = append(b.Appends, queue.Append{Queue: r.log.id.Queue, Partition: r.log.id.Partition, Message: r.msg})
		}
		if r.state != nil {
			b.Merge(r.state)
		}
		n++
	}
	return n
}

func anySync(reqs []commitReq) bool {
	for i := range reqs {
		if reqs[i].sync {
			return true
		}
	}
	return false
}

// complete runs the callbacks of committed batches in order. The appends
// of a batch are first made known per partition, one call for each
// partition the batch touched; then the writers are answered.
func (c *committer) complete() {
	defer close(c.stopped)
	var logs []*partitionLog
	for comp := range c.completions {
		logs = logs[:0]
		for i := range comp.reqs {
			r := &comp.reqs[i]
			if r.msg == nil {
				continue
			}
			if len(r.log.appends) == 0 {
				logs = append(logs, r.log)
			}
			r.log.appends = append(r.log.appends, r.msg)
		}
		for i, l := range logs {
			if l.committed != nil {
				l.committed(l.appends, comp.err)
			}
			clear(l.appends)
			l.appends = l.appends[:0]
			logs[i] = nil
		}
		for i := range comp.reqs {
			if d := comp.reqs[i].done; d != nil {
				d(comp.err)
			}
		}
	}
}
