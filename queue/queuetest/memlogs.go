package queuetest

import (
	"context"
	"sync"
	"time"

	"github.com/shardq/shardq/queue"
)

var (
	_ queue.LogStore = (*MemStore)(nil)
	_ queue.Logs     = (*memLogs)(nil)
	_ queue.Log      = (*memLog)(nil)
)

// OpenLogs starts the store's partition logs: one goroutine applies the
// writes queued since its last pass, one Write per shard with what that
// shard's partitions queued, in the order they were queued.
func (s *MemStore) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	l := &memLogs{store: s, observe: o.OnCommit, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go l.run()
	return l, nil
}

type memLogs struct {
	store   *MemStore
	observe func(queue.CommitStats)

	mu      sync.Mutex
	pending []memReq
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
}

type memReq struct {
	log   *memLog // nil for the catalog
	shard int
	msg   *queue.Message
	state *queue.Batch
	sync  bool
	done  func(error)
	epoch uint64
}

type memLog struct {
	logs      *memLogs
	id        queue.PartitionID
	shard     int
	committed func([]*queue.Message, error)
	fence     uint64 // guarded by logs.mu
}

func (l *memLogs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	return &memLog{logs: l, id: id, shard: queue.ShardOf(id.Queue, id.Partition, len(l.store.shards)), committed: committed}
}

func (l *memLogs) Queues() ([]queue.QueueMeta, error) { return l.store.shards[0].Queues() }

func (l *memLogs) SaveQueues(ctx context.Context, metas []queue.QueueMeta) error {
	done := make(chan error, 1)
	l.submit(memReq{state: &queue.Batch{Queues: metas}, sync: true, done: func(err error) { done <- err }})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *memLogs) DropQueues(ctx context.Context, names []string) error {
	done := make(chan error, 1)
	l.submit(memReq{state: &queue.Batch{DropQueues: names}, sync: true, done: func(err error) { done <- err }})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SyncAsync does nothing: a MemStore write is as durable as it gets.
func (l *memLogs) SyncAsync() {}

func (l *memLogs) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.signal()
	<-l.stopped
	return nil
}

func (l *memLogs) submit(r memReq) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		if r.done != nil {
			r.done(queue.ErrClosed)
		}
		return
	}
	l.pending = append(l.pending, r)
	l.mu.Unlock()
	l.signal()
}

func (l *memLogs) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *memLogs) run() {
	defer close(l.stopped)
	for range l.wake {
		l.mu.Lock()
		reqs := l.pending
		l.pending = nil
		closed := l.closed
		l.mu.Unlock()
		byShard := make([][]memReq, len(l.store.shards))
		for _, r := range reqs {
			byShard[r.shard] = append(byShard[r.shard], r)
		}
		for i, rs := range byShard {
			if len(rs) > 0 {
				l.apply(i, rs)
			}
		}
		if closed {
			l.mu.Lock()
			left := len(l.pending)
			l.mu.Unlock()
			if left == 0 {
				return
			}
			l.signal()
		}
	}
}

// apply writes the requests of one shard as one batch, then reports them.
func (l *memLogs) apply(shard int, rs []memReq) {
	var b queue.Batch
	var kept []memReq
	sync := false
	for _, r := range rs {
		if r.log != nil {
			l.mu.Lock()
			fence := r.log.fence
			l.mu.Unlock()
			if r.epoch < fence {
				r.report(&queue.FencedError{Partition: r.log.id, Epoch: r.epoch, Current: fence})
				continue
			}
		}
		if r.msg != nil {
			b.Appends = append(b.Appends, queue.Append{Queue: r.log.id.Queue, Partition: r.log.id.Partition, Message: r.msg})
		}
		if r.state != nil {
			b.Merge(r.state)
		}
		sync = sync || r.sync
		kept = append(kept, r)
	}
	if len(kept) == 0 {
		return
	}
	start := time.Now()
	err := l.store.shards[shard].Write(&b, sync)
	if l.observe != nil {
		l.observe(queue.CommitStats{Shard: shard, Requests: len(kept), Writes: b.Len(), Duration: time.Since(start), Err: err})
	}
	if err != nil {
		err = &queue.StorageError{Err: err}
	}
	// Each log hears of its appends at once, in order, before the callbacks.
	var logs []*memLog
	appends := map[*memLog][]*queue.Message{}
	for _, r := range kept {
		if r.msg == nil {
			continue
		}
		if appends[r.log] == nil {
			logs = append(logs, r.log)
		}
		appends[r.log] = append(appends[r.log], r.msg)
	}
	for _, lg := range logs {
		if lg.committed != nil {
			lg.committed(appends[lg], err)
		}
	}
	for _, r := range kept {
		if r.done != nil {
			r.done(err)
		}
	}
}

// report completes a request that was not written.
func (r memReq) report(err error) {
	if r.msg != nil && r.log.committed != nil {
		r.log.committed([]*queue.Message{r.msg}, err)
	}
	if r.done != nil {
		r.done(err)
	}
}

func (g *memLog) Fence(epoch uint64) error {
	g.logs.mu.Lock()
	defer g.logs.mu.Unlock()
	if epoch < g.fence {
		return &queue.FencedError{Partition: g.id, Epoch: epoch, Current: g.fence}
	}
	g.fence = epoch
	return nil
}

func (g *memLog) Append(epoch uint64, msg *queue.Message, state *queue.Batch, sync bool, done func(error)) {
	g.logs.submit(memReq{log: g, shard: g.shard, msg: msg, state: state, sync: sync, done: done, epoch: epoch})
}

func (g *memLog) Read(from, to uint64, max int, maxBytes int64) ([]*queue.Message, error) {
	return g.logs.store.shards[g.shard].(*memShard).ReadBytes(g.id.Queue, g.id.Partition, from, to, max, maxBytes)
}

func (g *memLog) Bounds() (first, next uint64, err error) {
	return g.logs.store.shards[g.shard].Bounds(g.id.Queue, g.id.Partition)
}

func (g *memLog) Groups() ([]queue.GroupState, error) {
	return g.logs.store.shards[g.shard].Groups(g.id.Queue, g.id.Partition)
}

func (g *memLog) Dedups() (map[string]time.Time, error) {
	return g.logs.store.shards[g.shard].Dedups(g.id.Queue, g.id.Partition)
}

// Shard returns the index of the shard holding the partition.
func (g *memLog) Shard() int { return g.shard }
