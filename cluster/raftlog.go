package cluster

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/queue"
)

// raftStore is the log store of a cluster node: partitions of queues with
// a replication factor above 1 get a raft log, the others the local log
// as it is.
type raftStore struct {
	s queue.LogStore
	h *raftHost
	// replicated reports whether the named queue's partitions are
	// replicated.
	replicated func(queue string) bool
}

func (s *raftStore) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	logs, err := s.s.OpenLogs(o)
	if err != nil {
		return nil, err
	}
	s.h.logs = logs
	return &raftLogs{Logs: logs, s: s}, nil
}

type raftLogs struct {
	queue.Logs
	s *raftStore
}

func (l *raftLogs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	if !l.s.replicated(queue.ParentName(id.Queue)) {
		return l.Logs.Log(id, committed)
	}
	rl := &raftLog{h: l.s.h, id: id, committed: committed,
		group: queue.PartitionID{Queue: queue.ParentName(id.Queue), Partition: id.Partition}}
	rl.ackLeader.Store(l.s.h.n.ackPolicy(id.Queue) == queue.AckLeader)
	// The local log under it stores what the group applies; its own
	// completions are the raft log's business.
	rl.inner = l.Logs.Log(id, func([]*queue.Message, error) {})
	if _, next, err := rl.inner.Bounds(); err == nil {
		rl.next.Store(next)
	}
	l.s.h.mu.Lock()
	l.s.h.partLogs[id] = rl
	l.s.h.mu.Unlock()
	return rl
}

// raftLog is the log of a replicated partition: its writes go through
// the partition's raft group, its reads to the local copy.
type raftLog struct {
	h         *raftHost
	id        queue.PartitionID
	inner     queue.Log
	committed func([]*queue.Message, error)
	group     queue.PartitionID // the partition whose raft group it writes through: its queue's
	fence     atomic.Uint64
	// ackLeader: the queue's ack_policy is leader (kept current by the
	// node's reconcile loop).
	ackLeader atomic.Bool
	// next is one past the highest offset stored here: an entry applied
	// again after a copy from the leader skips what the copy held.
	next atomic.Uint64
}

// skipStored drops the appends already stored and records the others.
func (l *raftLog) skipStored(as []queue.Append) []queue.Append {
	kept := as[:0]
	for _, a := range as {
		if a.Message.Offset < l.next.Load() {
			continue
		}
		kept = append(kept, a)
		l.raiseNext(a.Message.Offset + 1)
	}
	return kept
}

func (l *raftLog) raiseNext(n uint64) {
	for {
		cur := l.next.Load()
		if n <= cur || l.next.CompareAndSwap(cur, n) {
			return
		}
	}
}

func (l *raftLog) Fence(epoch uint64) error {
	for {
		cur := l.fence.Load()
		if epoch < cur {
			return &queue.FencedError{Partition: l.id, Epoch: epoch, Current: cur}
		}
		if l.fence.CompareAndSwap(cur, epoch) {
			return nil
		}
	}
}

func (l *raftLog) Append(epoch uint64, msg *queue.Message, state *queue.Batch, _ bool, done func(error)) {
	p := &proposal{log: l, epoch: epoch, msg: msg, state: state, done: done, id: l.h.nextID.Add(1), at: time.Now(),
		early: msg != nil && l.ackLeader.Load()}
	// A write refused at once completes on a goroutine of its own: Append
	// runs under the partition's lock, which the completion takes.
	if cur := l.fence.Load(); epoch < cur {
		go p.finish(&queue.FencedError{Partition: l.id, Epoch: epoch, Current: cur})
		return
	}
	r := l.h.replica(l.group)
	if r == nil || !r.g.IsLeader() {
		go p.finish(fmt.Errorf("%w: %s: this node does not lead its replicas", queue.ErrNotOwned, l.id))
		return
	}
	term := r.g.LeaderTerm()
	if r.servedTerm.Load() != term {
		// Loaded in an earlier term of this node's leadership (it lost it
		// and won it back): what it holds in memory missed what other
		// leaders wrote meanwhile, until it is loaded again.
		go p.finish(fmt.Errorf("%w: %s: loaded in an earlier term than %d", queue.ErrNotOwned, l.id, term))
		return
	}
	p.term = term
	l.h.mu.Lock()
	r.pending = append(r.pending, p)
	l.h.mu.Unlock()
	r.g.Wake()
}

func (l *raftLog) Read(from, to uint64, max int, maxBytes int64) ([]*queue.Message, error) {
	return l.inner.Read(from, to, max, maxBytes)
}

func (l *raftLog) Bounds() (uint64, uint64, error) { return l.inner.Bounds() }

// Local returns the log of the partition's copy here (queue.LocalLog).
func (l *raftLog) Local() queue.Log { return l.inner }

func (l *raftLog) Groups() ([]queue.GroupState, error) { return l.inner.Groups() }

func (l *raftLog) Dedups() (map[string]time.Time, error) { return l.inner.Dedups() }

// Shard returns the local storage shard the partition is kept in, -1
// when its storage has none.
func (l *raftLog) Shard() int {
	if s, ok := l.inner.(interface{ Shard() int }); ok {
		return s.Shard()
	}
	return -1
}
