package queue

import (
	"sync"
	"sync/atomic"
	"time"
)

// commitReq is one unit of work for a committer: usually a single append
// (the hot path, kept free of allocations beyond the request itself), or a
// batch of state writes.
type commitReq struct {
	app Append
	// part is the partition of app: its completion makes the message
	// visible there, batched with the others of the same commit.
	part  *partition
	batch *Batch
	sync  bool
	done  func(error)
	// epoch, when not 0, is the epoch of partition id the request was made
	// under: a fence raised past it fails the request (ErrFenced).
	id    PartitionID
	epoch uint64
}

// committer is the group commit of one shard: one goroutine drains the
// requests that arrived while the previous batch was being written, writes
// them as one batch with one sync, and hands the batch to a completer
// goroutine that runs the callbacks in submission order while the next
// batch is written. Submit never blocks: producers are bounded by their own
// in-flight cap, so the queue of requests is bounded too.
type committer struct {
	shard    Shard
	maxBatch int
	observe  func(CommitStats)

	mu      sync.Mutex
	pending []commitReq
	closed  bool
	wake    chan struct{}
	fences  map[PartitionID]uint64 // the epoch each partition's writes need

	completions chan completion
	stopped     chan struct{}

	// unsynced: a batch was written without a sync since the last sync.
	unsynced atomic.Bool
}

type completion struct {
	reqs []commitReq
	err  error
}

// CommitStats describes one committed batch, for metrics.
type CommitStats struct {
	Shard    int
	Requests int
	Writes   int
	Duration time.Duration
	Err      error
}

func newCommitter(shard Shard, maxBatch int, observe func(CommitStats), index int) *committer {
	c := &committer{
		shard:       shard,
		maxBatch:    maxBatch,
		wake:        make(chan struct{}, 1),
		completions: make(chan completion, 2),
		stopped:     make(chan struct{}),
	}
	if observe != nil {
		c.observe = func(s CommitStats) { s.Shard = index; observe(s) }
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
			r.done(ErrClosed)
		}
		return
	}
	c.pending = append(c.pending, r)
	first := len(c.pending) == 1
	c.mu.Unlock()
	if first {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// fence makes epoch the epoch partition id's writes need: a request made
// under an older one fails with ErrFenced, even one already queued. A
// lower epoch than the current fence is refused.
func (c *committer) fence(id PartitionID, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.fences[id]; epoch < cur {
		return &FencedError{Partition: id, Epoch: epoch, Current: cur}
	}
	if c.fences == nil {
		c.fences = map[PartitionID]uint64{}
	}
	c.fences[id] = epoch
	return nil
}

// dropFenced completes the requests made under an epoch older than their
// partition's fence, with ErrFenced, and returns the others.
func (c *committer) dropFenced(reqs []commitReq) []commitReq {
	var stale []completion
	kept := reqs[:0]
	c.mu.Lock()
	for _, r := range reqs {
		if cur := c.fences[r.id]; r.epoch != 0 && r.epoch < cur {
			stale = append(stale, completion{reqs: []commitReq{r}, err: &FencedError{Partition: r.id, Epoch: r.epoch, Current: cur}})
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
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.stopped
}

func (c *committer) run() {
	defer close(c.completions)
	var spare []commitReq
	var b Batch
	for range c.wake {
		c.mu.Lock()
		reqs := c.pending
		all := reqs
		c.pending = spare[:0]
		closed := c.closed
		fenced := len(c.fences) > 0
		c.mu.Unlock()
		if fenced {
			reqs = c.dropFenced(reqs)
		}

		for len(reqs) > 0 {
			n := c.fill(&b, reqs)
			start := time.Now()
			sync := c.anySync(reqs[:n])
			err := c.shard.Write(&b, sync)
			if err == nil {
				if sync {
					c.unsynced.Store(false)
				} else if b.Len() > 0 {
					c.unsynced.Store(true)
				}
			}
			if c.observe != nil {
				c.observe(CommitStats{Requests: n, Writes: b.Len(), Duration: time.Since(start), Err: err})
			}
			if err != nil {
				err = storageError(err)
			}
			done := make([]commitReq, n)
			copy(done, reqs[:n])
			c.completions <- completion{reqs: done, err: err}
			b.Reset()
			reqs = reqs[n:]
		}
		clear(all)
		spare = all[:0]
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
func (c *committer) fill(b *Batch, reqs []commitReq) int {
	n := 0
	for n < len(reqs) {
		r := &reqs[n]
		if n > 0 && b.Len() >= c.maxBatch {
			break
		}
		if r.app.Message != nil {
			b.Appends = append(b.Appends, r.app)
		}
		if r.batch != nil {
			b.merge(r.batch)
		}
		n++
	}
	return n
}

func (c *committer) anySync(reqs []commitReq) bool {
	for i := range reqs {
		if reqs[i].sync {
			return true
		}
	}
	return false
}

// complete runs the callbacks of committed batches in order. The appends
// of a batch are first made visible per partition, one lock and one
// dispatch for each partition the batch touched; then the producers are
// answered.
func (c *committer) complete() {
	defer close(c.stopped)
	var parts []*partition
	for comp := range c.completions {
		parts = parts[:0]
		for i := range comp.reqs {
			r := &comp.reqs[i]
			if r.part == nil {
				continue
			}
			if len(r.part.appends) == 0 {
				parts = append(parts, r.part)
			}
			r.part.appends = append(r.part.appends, r.app.Message)
		}
		for i, p := range parts {
			p.appended(p.appends, comp.err)
			clear(p.appends)
			p.appends = p.appends[:0]
			parts[i] = nil
		}
		for i := range comp.reqs {
			if d := comp.reqs[i].done; d != nil {
				d(comp.err)
			}
		}
	}
}
