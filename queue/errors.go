package queue

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidTopic: the topic is not a valid $queue/ topic.
	ErrInvalidTopic = errors.New("queue: invalid topic")
	// ErrInvalidFilter: the subscription filter is not a valid $queue/ filter.
	ErrInvalidFilter = errors.New("queue: invalid topic filter")
	// ErrNoSuchQueue: the queue is not declared and auto_create is off.
	ErrNoSuchQueue = errors.New("queue: no such queue")
	// ErrQueueFull: the queue holds max_messages or max_bytes.
	ErrQueueFull = errors.New("queue: queue full")
	// ErrTooLarge: the message is larger than the broker accepts.
	ErrTooLarge = errors.New("queue: message too large")
	// ErrStorage: the message could not be stored; it is safe to retry.
	ErrStorage = errors.New("queue: storage failure")
	// ErrStorageFull: the node refuses new messages while its storage is
	// short of space (below storage.min_free_bytes); settlements and
	// deletes go on, and publishes are taken again once space returns.
	ErrStorageFull = errors.New("queue: storage full")
	// ErrClosed: the manager is shutting down.
	ErrClosed = errors.New("queue: closed")
	// ErrNotLeased: the message is not leased to the caller.
	ErrNotLeased = errors.New("queue: message not leased by this consumer")
	// ErrUnknownMessage: no message has that id.
	ErrUnknownMessage = errors.New("queue: unknown message id")
	// ErrBadPartitions: a consumer named partitions the queue does not have
	// or another consumer of its group took.
	ErrBadPartitions = errors.New("queue: invalid partitions")
	// ErrFilterMismatch: a subscription's subject filter differs from
	// its group's.
	ErrFilterMismatch = errors.New("queue: the subscription's subject filter differs from its group's")
	// ErrBadSharding: a subscription's shard-by, shard-count or shards
	// cannot be taken as they are.
	ErrBadSharding = errors.New("queue: invalid sharding")
	// ErrShardingMismatch: a subscription's shard-by or shard-count
	// differs from those of its group's sharded consumers.
	ErrShardingMismatch = errors.New("queue: the subscription's sharding differs from its group's")
	// ErrBadSeek: a seek or a start names no point a group can be at.
	ErrBadSeek = errors.New("queue: invalid seek point")
	// ErrPartitionsChanged: the config asks for another partition count than the stored queue has.
	ErrPartitionsChanged = errors.New("queue: partition count differs from the stored queue")
	// ErrNotOwned: this node does not serve the partition (not acquired,
	// or released); the outcome of a write is known: nothing was stored.
	ErrNotOwned = errors.New("queue: partition not owned")
	// ErrFenced: a write carried an epoch older than the partition's
	// fence: another owner took the partition over. See FencedError.
	ErrFenced = errors.New("queue: stale epoch")
)

// FencedError is a write refused for its stale epoch; errors.Is(err,
// ErrFenced) holds.
type FencedError struct {
	Partition PartitionID
	Epoch     uint64 // the write's
	Current   uint64 // the partition's fence
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("queue: stale epoch %d for partition %s (fenced at %d)", e.Epoch, e.Partition, e.Current)
}

func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// StorageError wraps a storage engine's error; errors.Is(err, ErrStorage) holds.
type StorageError struct{ Err error }

func (e *StorageError) Error() string   { return "queue: storage failure: " + e.Err.Error() }
func (e *StorageError) Unwrap() []error { return []error{ErrStorage, e.Err} }

func storageError(err error) error { return &StorageError{Err: err} }

// TooLarge is ErrTooLarge for a payload of size bytes over the limit max,
// naming both.
func TooLarge(size, max int) error {
	return fmt.Errorf("%w: the payload is %d bytes, storage.max_payload is %d", ErrTooLarge, size, max)
}
