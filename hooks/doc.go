// Package hooks is the mochi (github.com/mochi-mqtt/server/v2) hook that
// turns $queue/ topics into queues: the only code of shardq that knows MQTT
// packets. It talks to the queues through queue.Service; plain topics pass
// through to mochi untouched.
//
// # What it does
//
//   - Publishes to $queue/{q}[/{subject}] become queue messages
//     (produce.go). A QoS 1 publish is not acknowledged by mochi: the hook
//     returns packets.ErrRejectPacket and its conn writes the PUBACK once
//     the message is stored, in order with the client's other PUBACKs.
//   - Queue subscriptions become consumers of a group (consume.go), kept
//     out of mochi's topic index; deliveries are written by the hook, not
//     by mochi, and their PUBACKs settle the lease (OnPacketRead).
//   - Publishes to $queue/{q}/$ack, $nack, $reject and $extend settle
//     explicit consumers' leases (settle.go).
//   - codes.go is the one table from domain errors to MQTT reason codes.
//
// # Concurrency
//
// mochi runs each client's inbound packets on that client's read
// goroutine: OnPublish, OnPacketRead and the subscribe hooks run there.
// Each client with queue traffic has a conn (conn.go) with one writer
// goroutine, started on demand: it encodes everything ready (PUBACKs whose
// commits finished, in order, and queued deliveries) into one buffer and
// writes it with one system call. A producer has a window of
// ProducerWindow unacknowledged publishes; OnPublish blocks on it, which
// stops mochi reading that client until commits catch up.
//
// Locks: conn.mu guards a conn's queues of acks and deliveries, its leases
// by packet ID and its subscriptions. It is taken after a queue
// partition's lock (subscription.Deliver runs under it) and never held
// while calling into the queue service, which may take partition locks.
// Hook.mu guards the hook's maps of conns by client ID and of saved
// subscription properties.
package hooks
