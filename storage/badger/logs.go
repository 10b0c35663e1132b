package badger

import (
	"context"
	"fmt"
	"time"

	"github.com/shardq/shardq/queue"
)

var (
	_ queue.LogStore = (*Store)(nil)
	_ queue.Logs     = (*logs)(nil)
	_ queue.Log      = (*partitionLog)(nil)
)

// OpenLogs starts one committer per shard: the group commit behind every
// partition log of the store. Close them before closing the store.
func (s *Store) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 4096
	}
	l := &logs{store: s}
	for i, sh := range s.shards {
		l.committers = append(l.committers, newCommitter(sh, i, o))
	}
	return l, nil
}

// logs are the partition logs of a store, written through its committers.
type logs struct {
	store      *Store
	committers []*committer
}

// Log returns the log of partition id, in the shard queue.ShardOf picks.
func (l *logs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	i := queue.ShardOf(id.Queue, id.Partition, len(l.committers))
	return &partitionLog{id: id, shard: l.store.shards[i], c: l.committers[i], committed: committed}
}

// Queues returns the queues recorded in shard 0, which holds the catalog.
func (l *logs) Queues() ([]queue.QueueMeta, error) { return l.store.shards[0].Queues() }

// SaveQueues records metas in shard 0, synced, and waits for it.
func (l *logs) SaveQueues(ctx context.Context, metas []queue.QueueMeta) error {
	done := make(chan error, 1)
	l.committers[0].submit(commitReq{state: &queue.Batch{Queues: metas}, sync: true, done: func(err error) { done <- err }})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DropQueues removes the queues from the catalog in shard 0, synced, and
// waits for it.
func (l *logs) DropQueues(ctx context.Context, names []string) error {
	done := make(chan error, 1)
	l.committers[0].submit(commitReq{state: &queue.Batch{DropQueues: names}, sync: true, done: func(err error) { done <- err }})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SyncAsync syncs the shards that wrote without a sync since their last one.
func (l *logs) SyncAsync() {
	for _, c := range l.committers {
		c.syncIfNeeded()
	}
}

// Close finishes every queued write and stops the committers.
func (l *logs) Close() error {
	for _, c := range l.committers {
		c.close()
	}
	return nil
}

// partitionLog is one partition's log: writes go through its shard's
// committer, reads to the shard directly.
type partitionLog struct {
	id        queue.PartitionID
	shard     *Shard
	c         *committer
	committed func([]*queue.Message, error)

	fence   uint64           // guarded by c.mu
	appends []*queue.Message // the completer's scratch
}

// Shard returns the index of the shard holding the partition.
func (l *partitionLog) Shard() int { return l.shard.id }

func (l *partitionLog) Fence(epoch uint64) error { return l.c.fence(l, epoch) }

func (l *partitionLog) Append(epoch uint64, msg *queue.Message, state *queue.Batch, sync bool, done func(error)) {
	l.c.submit(commitReq{log: l, msg: msg, state: state, sync: sync, done: done, epoch: epoch})
}

func (l *partitionLog) Read(from, to uint64, max int, maxBytes int64) ([]*queue.Message, error) {
	return l.shard.ReadBytes(l.id.Queue, l.id.Partition, from, to, max, maxBytes)
}

func (l *partitionLog) Bounds() (first, next uint64, err error) {
	return l.shard.Bounds(l.id.Queue, l.id.Partition)
}

func (l *partitionLog) Groups() ([]queue.GroupState, error) {
	return l.shard.Groups(l.id.Queue, l.id.Partition)
}

func (l *partitionLog) Dedups() (map[string]time.Time, error) {
	return l.shard.Dedups(l.id.Queue, l.id.Partition)
}

func (l *partitionLog) String() string { return fmt.Sprintf("log %s in shard %d", l.id, l.shard.id) }
