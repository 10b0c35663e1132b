// Package cluster makes shardq nodes one broker: membership, ownership
// and placement in etcd, forwarding and delivery between nodes over gRPC,
// and replication of partitions through raft groups run by
// cluster/multiraft. It is the only package that knows etcd and gRPC.
//
// # Model
//
// A Node is this node's member of the cluster. It keeps a view of the
// cluster's keys in etcd (nodes, queues, each partition's ownership
// record, placement, plain MQTT interest) and reconciles the partitions
// with it: a partition of replication factor 1 is owned by the live node
// rendezvous hashing picks, which claims it in etcd with a higher epoch
// (fencing); a replicated partition is a raft group whose leader records
// itself as the owner once it stores every committed entry (raft.go).
// Every node serves every client: a publish for a partition owned
// elsewhere is forwarded to its owner (peer.go), deliveries come from
// each owner to the node the consumer is on (consume.go), and plain MQTT
// is routed to the nodes with matching subscribers (plain.go).
//
//	n, err := cluster.New(cluster.Options{NodeID: "a", Endpoints: []string{"http://127.0.0.1:2379"}, RaftStore: store})
//	err = n.Start(ctx, manager) // joins, reads the cluster's keys, serves
//	defer n.Close()
//
// # Errors
//
// What a publish or settlement meets on its way maps to queue's errors
// (one table, convert.go): a partition not served where it was sent is
// queue.ErrNotOwned (0x83 to an MQTT client), its outcome unknown when a
// link broke with it in flight (unknownOutcome: never sent twice).
//
// # Goroutines
//
//   - the reconcile loop (owners.go): claims, serves, releases and hands
//     partitions over as the view changes, and maintains each replicated
//     partition's replicas and leadership;
//   - the watch of etcd (etcd.go) and the lease keep-alive;
//   - the multiraft driver, and a ticker failing proposals not applied in
//     time (raft.go);
//   - per peer: a raft message sender (raftnet.go), a forwarder's send
//     and receive loops and a settler (peer.go), a consumer stream per
//     remote consumer (consume.go);
//   - gRPC's handlers of the peers' calls (server.go, service.go).
//
// # Locks
//
// Node.mu guards the view, the peers, the gone nodes and the ownership
// notification; it may be held while taking a peer's mu (closing a link)
// and a forwarder's mu (never the other way round). A keyWriter's mu may
// be held while taking plainState's mu (a session's write asking whether
// the node still holds its client). raftHost.mu guards
// the replicas, the partition logs and each replica's proposals and
// applied marks; nothing else is taken under it. multiraft.Host's lock
// is its own and never held while calling a replica. No lock of this
// package is held while calling into queue.Manager, which takes its own
// (queue/doc.go lists them).
package cluster
