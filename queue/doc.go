// Package queue is shardq's domain: durable, partitioned queues with
// consumer groups, leases, per-key ordering, retention and dead-letter
// queues. It knows no MQTT, no Badger, no etcd and no gRPC: storage comes
// through the Store and Shard seams (store.go), consumers through Receiver,
// and the MQTT side talks to the Service interface (service.go).
//
// # Model
//
// A Manager holds the queues of a node. A Queue has a fixed number of
// partitions; a message goes to partition FNV-1a-64(key) mod partitions
// and gets the partition's next offset. A group is one consumer group; its
// position in each partition is a cursor: the ack floor (every offset
// below is settled), the offsets settled above it, the leases out, and the
// messages waiting to be delivered again (ready now, or after a backoff or
// a delay). A delivery is a Lease, named outside the package by a LeaseRef
// value, settled by Service.Settle or lost when its deadline passes.
//
// The partition is the unit of state, locking, recovery and ownership. A
// node serves a partition once it acquired it (Manager.Acquire, with an
// epoch) and stops when it releases it (Manager.Release); a single node
// acquires every partition with SingleNodeEpoch. Every write of a
// partition carries its epoch, and its log refuses one older than
// the partition's fence with a FencedError.
//
//	m, err := queue.NewManager(queue.ManagerOptions{Store: store, Defaults: queue.DefaultOptions(), AutoCreate: true})
//	if err != nil {
//		return err
//	}
//	defer m.Close(ctx)
//	m.Publish(ctx, "orders", &queue.Message{Key: "customer-7", Payload: p}, func(err error) { ... })
//	sub, err := m.Subscribe(ctx, queue.Filter{Queue: "orders", Group: "billing"}, receiver, queue.ConsumerOptions{})
//	// receiver.Deliver(d) ... later: m.Settle(d.Lease, queue.Ack)
//
// # Errors
//
// errors.go lists the sentinels; callers test them with errors.Is.
// Storage failures wrap ErrStorage (StorageError), stale epochs ErrFenced
// (FencedError). hooks maps every one of them to an MQTT reason code in
// one table.
//
// # Concurrency
//
// Goroutines: the callers' (MQTT read loops publish and settle), the
// goroutines of the logs (storage/badger: per shard one committer, which
// writes what was queued while the previous batch was written as one batch
// with one sync, and one completer, which runs the callbacks of committed
// batches in order, first telling each partition of its appends), the
// manager's timer (every Tick, on the partitions with work pending: lease
// expiry, due retries and delays, settlement flushes, and each
// partition's retention every RetainEvery, out of phase; eviction and
// dedup expiry per queue), and short-lived goroutines for storage reads of
// a cursor (read-ahead), eviction passes and dead-letter completions.
//
// Locks, in the order they may be taken:
//
//  1. Manager.admin: serializes the operations of admin.go.
//  2. Manager.mu: the queue map; never held across storage I/O (queue
//     creation records the queue outside it, see Manager.create).
//  3. Queue.mu, then every partition's mu in partition order: lockAll,
//     for what spans partitions and changes rarely (groups, consumers,
//     settings, admin operations). Writes of Queue.opts, Queue.groups and a
//     group's consumers happen under lockAll; reads need any one of those
//     locks.
//  4. partition.mu: everything of one partition (see partition). The hot
//     paths take this one lock: a publish assigns its offset and submits
//     its append under it, so a partition's appends reach its log in
//     offset order; a completed batch is made visible and dispatched under
//     it once; a settlement and a lease expiry run under it.
//  5. A dead-letter queue's partition lock, taken while holding a source
//     partition's (a dead letter is published from the source's lock).
//  6. Queue.dedupMu, Credit.mu, Manager.tickMu, and the logs' own locks:
//     leaves.
//  7. A Receiver's own lock: Deliver runs under the partition's lock and
//     must only queue the delivery.
//
// Credit is atomic: a delivery takes one credit of its consumer and one of
// its connection in one step (Consumer.take), so dispatches running on
// different partitions never exceed a prefetch or a Receive Maximum. A
// cursor that had messages but no consumer with credit marks itself
// starved; whoever gives credit back collects the groups to kick (kicks)
// and, once its lock is released, dispatches their starved cursors.
package queue
