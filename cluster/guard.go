package cluster

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/queue"
)

// guard knows until when this node may commit: a little less than its
// etcd lease's TTL after the last renewal etcd confirmed. Past that, etcd
// may have expired the lease and another node may own the partitions, so
// every write is refused, and so is the acknowledgement of a write that
// completed past it.
type guard struct {
	until atomic.Int64 // monotonic nanoseconds since start; 0: never
}

var clockStart = time.Now()

func monoNow() int64 { return int64(time.Since(clockStart)) }

// renewed records a renewal of a lease of ttl whose request left at asked
// (monotonic, monoNow): etcd restarted the TTL after that, so the lease
// lasts at least until asked + ttl; a fifth of it is kept as margin for
// the clocks of etcd and this node.
func (g *guard) renewed(asked int64, ttl time.Duration) {
	g.until.Store(asked + int64(ttl-ttl/5))
}

// lost forgets the lease.
func (g *guard) lost() { g.until.Store(0) }

// check returns ErrFenced when the node may not commit.
func (g *guard) check() error {
	if monoNow() < g.until.Load() {
		return nil
	}
	return errNoLease
}

var errNoLease = fmt.Errorf("%w: this node's cluster membership lapsed", queue.ErrFenced)

// guardedStore guards the logs of partitions of one replica; those of
// replicated partitions are fenced by raft (a leader commits nothing
// without a quorum), and go on while etcd cannot be reached.
type guardedStore struct {
	s          queue.LogStore
	g          *guard
	replicated func(queue string) bool
}

func (s *guardedStore) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	logs, err := s.s.OpenLogs(o)
	if err != nil {
		return nil, err
	}
	return &guardedLogs{Logs: logs, g: s.g, replicated: s.replicated}, nil
}

type guardedLogs struct {
	queue.Logs
	g          *guard
	replicated func(queue string) bool
}

func (l *guardedLogs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	if l.replicated(id.Queue) {
		return l.Logs.Log(id, committed)
	}
	return &guardedLog{Log: l.Logs.Log(id, committed), g: l.g}
}

type guardedLog struct {
	queue.Log
	g *guard
}

// Local returns the log under the guard (queue.LocalLog).
func (l *guardedLog) Local() queue.Log { return l.Log }

func (l *guardedLog) Append(epoch uint64, msg *queue.Message, state *queue.Batch, sync bool, done func(error)) {
	// A message's offset is assigned already (the manager's Admit refused
	// it before, while the lease had lapsed): it goes to the log so that
	// the partition learns its fate, and only its acknowledgement is
	// refused. A state write alone is refused before it is made.
	if err := l.g.check(); err != nil && msg == nil {
		if done != nil {
			// Not under the partition's lock, which Append runs under.
			go done(err)
		}
		return
	}
	l.Log.Append(epoch, msg, state, sync, func(err error) {
		if err == nil {
			err = l.g.check()
		}
		if done != nil {
			done(err)
		}
	})
}
