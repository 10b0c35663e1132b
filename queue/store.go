package queue

import (
	"context"
	"time"
)

// The storage seams of the queue domain. The Manager sees only LogStore,
// Logs and Log: one log per partition, written under the partition's epoch.
// Below them, Store, Shard and the batches are what a log is built on
// locally: storage/badger implements both levels on disk, with group commit
// behind Log; queuetest holds an in-memory implementation and the
// conformance suites every implementation must pass. A raft-replicated log
// implements Log too.

// LogStore opens the partition logs of a node.
type LogStore interface {
	// OpenLogs starts the logs of a manager; the manager closes them.
	OpenLogs(o LogOptions) (Logs, error)
}

// LogOptions tune the logs a manager opens.
type LogOptions struct {
	// MaxBatch caps the writes of one commit.
	MaxBatch int
	// Linger, under a steady load (a request came while the last batch
	// was written), is how long a commit waits for more requests before
	// it writes, unless LingerBatch of them are pending: fewer, larger
	// commits, each with one sync, for at most Linger more latency. 0
	// writes at once.
	Linger      time.Duration
	LingerBatch int
	// OnCommit, if set, is told about every committed batch.
	OnCommit func(CommitStats)
	// Unsynced, if set, is told when a write is committed without a sync
	// after the last sync: SyncAsync has something to do. Once per such
	// stretch, or more; it must not block.
	Unsynced func()
}

// CommitStats describes one committed batch, for metrics.
type CommitStats struct {
	Shard    int
	Requests int
	Writes   int
	Duration time.Duration
	Err      error
}

// Logs are a node's partition logs and its catalog of queues, open from a
// manager's start to its close.
type Logs interface {
	// Log returns the log of partition id. committed is told about each
	// committed batch of the partition's appends, in offset order (err
	// set: none was stored, their offsets are holes), before the callbacks
	// of those appends run; it runs on a goroutine of the logs and may take
	// the partition's lock. Call Log once per partition.
	Log(id PartitionID, committed func(msgs []*Message, err error)) Log
	// Queues returns every queue the catalog holds.
	Queues() ([]QueueMeta, error)
	// SaveQueues records the queues' metadata durably.
	SaveQueues(ctx context.Context, metas []QueueMeta) error
	// DropQueues removes the named queues' metadata from the catalog,
	// durably.
	DropQueues(ctx context.Context, names []string) error
	// SyncAsync makes the writes made without sync durable; the manager
	// calls it every sync interval (durability async).
	SyncAsync()
	// Close completes every write queued so far, runs its callbacks and
	// refuses later writes with ErrClosed. The store stays open.
	Close() error
}

// Log is the storage of one partition: what its messages and the state of
// its groups are appended to, and read back from.
type Log interface {
	// Fence makes epoch the epoch the partition's writes need: a write
	// made under an older one fails with a FencedError, even one already
	// queued. An epoch below the current fence fails with a FencedError.
	Fence(epoch uint64) error
	// Append queues a write of the partition made under epoch: msg stored
	// at its offset (nil for none) and state, the partition's state writes
	// (nil for none), applied atomically. done (may be nil) runs once the
	// write is stored, on stable storage when sync is set, or failed. A
	// partition's writes complete in the order they were queued; Append
	// never blocks.
	Append(epoch uint64, msg *Message, state *Batch, sync bool, done func(error))
	// Read returns up to max stored messages with from <= offset < to, in
	// offset order, and stops at the message whose payload brings their
	// payloads to maxBytes (0: no such bound): one at least, whatever its
	// size.
	Read(from, to uint64, max int, maxBytes int64) ([]*Message, error)
	// Bounds returns the first retained offset and the offset the next
	// append gets; (0, 0) for a partition that never held a message.
	Bounds() (first, next uint64, err error)
	// Groups returns the stored state of every group on the partition.
	Groups() ([]GroupState, error)
	// Dedups returns the dedup-ids recorded on the partition and when.
	Dedups() (map[string]time.Time, error)
}

// Store is a node's storage: a fixed number of independent shards.
type Store interface {
	// Shards returns the shards; their number is fixed for a data directory.
	Shards() []Shard
	Close() error
}

// Shard is one independent storage engine. A partition, its messages and
// the state of every group on it live in exactly one shard.
type Shard interface {
	Writer
	LogReader
	StateReader
}

// Writer applies batches. Write is called by one goroutine at a time.
type Writer interface {
	// Write applies b atomically. When sync is true the batch is on stable
	// storage when Write returns nil.
	Write(b *Batch, sync bool) error
	// Sync makes every batch written so far durable.
	Sync() error
}

// LogReader reads a partition's messages.
type LogReader interface {
	// Read returns up to max stored messages of the partition with
	// from <= offset < to, in offset order.
	Read(queue string, partition int, from, to uint64, max int) ([]*Message, error)
	// Bounds returns the partition's first retained offset and the offset the
	// next append gets. An empty partition that never held a message is (0, 0).
	Bounds(queue string, partition int) (first, next uint64, err error)
}

// StateReader reads what recovery needs besides messages.
type StateReader interface {
	// Queues returns every queue whose metadata the shard holds.
	Queues() ([]QueueMeta, error)
	// Groups returns the stored state of every group on the partition.
	Groups(queue string, partition int) ([]GroupState, error)
	// Dedups returns the dedup-ids recorded on the partition and when.
	Dedups(queue string, partition int) (map[string]time.Time, error)
}

// QueueMeta is what survives a restart about a queue itself.
type QueueMeta struct {
	Name       string
	Partitions int
	// Declared holds settings set at run time; nil when the queue follows
	// the config file.
	Declared *Options
	// Owner is the tenant that created the queue (Queue.Owner).
	Owner string
	// Growths are the growths of its partitions, oldest first (Growth).
	Growths []Growth
}

// GroupState is a group's persisted state on one partition.
type GroupState struct {
	Group string
	// Floor: every offset below it is settled for the group.
	Floor uint64
	// Settled lists settled offsets at or above Floor.
	Settled []uint64
	// Deliveries counts the ended deliveries of unsettled offsets.
	Deliveries map[uint64]uint32
	// Delivered is one past the highest offset ever delivered to the
	// group, or 0 when not recorded.
	Delivered uint64
	// Filter is the group's subject filter ("" for every subject).
	Filter string
}

// Batch is a set of writes applied atomically by one shard.
type Batch struct {
	Appends    []Append
	Deletes    []RangeDelete
	Floors     []FloorWrite
	Marks      []SettleMark
	Deliveries []DeliveryMark
	Queues     []QueueMeta
	// DropQueues removes queues' metadata (by name) from the catalog,
	// after Queues.
	DropQueues []string
	// DropGroups removes every record of a group on a partition.
	DropGroups []GroupRef
	// Dedups records (or, with a zero At, forgets) producers' dedup-ids.
	Dedups []DedupMark
	// Erase removes everything stored of a partition (messages, low
	// watermark, group states, dedup-ids), before the Appends: a partition
	// that moved to another node, or one about to be imported whole.
	Erase []PartitionID
}

// DedupMark records that a message with dedup-id ID was stored at At in
// the partition; a zero At removes the record.
type DedupMark struct {
	Queue     string
	Partition int
	ID        string
	At        time.Time
}

// Append stores a message at its offset.
type Append struct {
	Queue     string
	Partition int
	Message   *Message
}

// RangeDelete removes the partition's messages with From <= offset < To and
// records To as its first retained offset.
type RangeDelete struct {
	Queue     string
	Partition int
	From, To  uint64
}

// FloorWrite records a group's ack floor on a partition and its delivered
// mark (one past the highest offset ever delivered; 0: not recorded).
type FloorWrite struct {
	Queue     string
	Group     string
	Partition int
	Floor     uint64
	Delivered uint64
	// Filter is the group's subject filter, kept with its floor.
	Filter string
}

// SettleMark records (Set) or forgets (!Set) that one offset above the
// floor is settled.
type SettleMark struct {
	Queue     string
	Group     string
	Partition int
	Offset    uint64
	Set       bool
}

// DeliveryMark records how many deliveries of an unsettled offset ended;
// Count 0 forgets it.
type DeliveryMark struct {
	Queue     string
	Group     string
	Partition int
	Offset    uint64
	Count     uint32
}

// GroupRef names a group on a partition.
type GroupRef struct {
	Queue     string
	Group     string
	Partition int
}

// The methods below are the one place that lists the batch's fields.

// Len is the number of writes in the batch.
func (b *Batch) Len() int {
	return len(b.Appends) + len(b.Deletes) + len(b.Floors) + len(b.Marks) +
		len(b.Deliveries) + len(b.Queues) + len(b.DropQueues) + len(b.DropGroups) + len(b.Dedups) + len(b.Erase)
}

// Reset empties the batch, keeping its capacity.
func (b *Batch) Reset() {
	clear(b.Appends)
	b.Appends = b.Appends[:0]
	b.Deletes = b.Deletes[:0]
	b.Floors = b.Floors[:0]
	b.Marks = b.Marks[:0]
	b.Deliveries = b.Deliveries[:0]
	b.Queues = b.Queues[:0]
	b.DropQueues = b.DropQueues[:0]
	b.DropGroups = b.DropGroups[:0]
	b.Dedups = b.Dedups[:0]
	b.Erase = b.Erase[:0]
}

// Merge appends the writes of o to b.
func (b *Batch) Merge(o *Batch) {
	b.Appends = append(b.Appends, o.Appends...)
	b.Deletes = append(b.Deletes, o.Deletes...)
	b.Floors = append(b.Floors, o.Floors...)
	b.Marks = append(b.Marks, o.Marks...)
	b.Deliveries = append(b.Deliveries, o.Deliveries...)
	b.Queues = append(b.Queues, o.Queues...)
	b.DropQueues = append(b.DropQueues, o.DropQueues...)
	b.DropGroups = append(b.DropGroups, o.DropGroups...)
	b.Dedups = append(b.Dedups, o.Dedups...)
	b.Erase = append(b.Erase, o.Erase...)
}

// ByPartition splits the partition writes of b by partition; Queues and
// DropQueues writes are left out (they belong to the catalog, not to a partition).
func (b *Batch) ByPartition() map[int]*Batch {
	per := map[int]*Batch{}
	splitInto(per, b.Appends, func(w Append) int { return w.Partition }, func(x *Batch) *[]Append { return &x.Appends })
	splitInto(per, b.Deletes, func(w RangeDelete) int { return w.Partition }, func(x *Batch) *[]RangeDelete { return &x.Deletes })
	splitInto(per, b.Floors, func(w FloorWrite) int { return w.Partition }, func(x *Batch) *[]FloorWrite { return &x.Floors })
	splitInto(per, b.Marks, func(w SettleMark) int { return w.Partition }, func(x *Batch) *[]SettleMark { return &x.Marks })
	splitInto(per, b.Deliveries, func(w DeliveryMark) int { return w.Partition }, func(x *Batch) *[]DeliveryMark { return &x.Deliveries })
	splitInto(per, b.DropGroups, func(w GroupRef) int { return w.Partition }, func(x *Batch) *[]GroupRef { return &x.DropGroups })
	splitInto(per, b.Dedups, func(w DedupMark) int { return w.Partition }, func(x *Batch) *[]DedupMark { return &x.Dedups })
	splitInto(per, b.Erase, func(w PartitionID) int { return w.Partition }, func(x *Batch) *[]PartitionID { return &x.Erase })
	return per
}

// splitInto appends each write of ws to the field of its partition's batch.
func splitInto[T any](per map[int]*Batch, ws []T, partition func(T) int, field func(*Batch) *[]T) {
	for _, w := range ws {
		p := partition(w)
		if per[p] == nil {
			per[p] = new(Batch)
		}
		f := field(per[p])
		*f = append(*f, w)
	}
}
