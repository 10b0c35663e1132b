// Package multiraft runs many raft groups (go.etcd.io/raft) on one node:
// one driver goroutine ticks them, steps what peers send, proposes,
// applies and sends, and one log writer stores what every group asks to
// store, so that one write and one fsync of the shared log (Store,
// storage/raftlog) cover every group's new entries (append.go). Raft runs
// with asynchronous storage writes: the driver never waits for the disk.
//
// It knows groups and bytes, not queues. A group is opened with a
// StateMachine, which applies the committed entries, proposes when asked,
// and sends a copy of its state to a replica behind the compacted log;
// the Transport carries raft's messages to the other nodes. cluster/
// implements both for a queue's partition.
//
//	h := multiraft.New(multiraft.Options{NodeID: "a", Store: store, Transport: t})
//	go h.Run(ctx)
//	g, err := h.Open("orders/0", []string{"a", "b", "c"}, nil, sm)
//	// a peer's message: h.Step("orders/0", m)
//	// sm.Propose, on the driver goroutine: g.Propose(g.LeaderTerm(), data)
//
// # Replicas
//
// A group's replicas are node names. Its first replicas have the raft
// ids ID(node); a replica added later gets a fresh id, so a node removed
// and added again is a new replica that no message to the one it was
// reaches (ids.go). A new group starts from an initial state every
// replica shares: a snapshot of nothing at index 1. Its first replica
// campaigns at once. A replica change is a raft configuration change
// whose context names the node.
//
// # Durability
//
// Entries, hard state and configuration are on the Store's disk before
// anything that depends on them leaves the node (raft holds those
// messages back until the writer says the write is durable); a leader's
// appends leave at once, and a leader counts its own disk in a commit
// only once its write is durable. Only entries this node's log holds
// durably are applied. A commit index is stored beside entries and votes,
// never on its own; a group that starts takes what it applied as
// committed. Every SyncEvery the host syncs what the state machines
// stored (SyncApplied), records each group's applied index, and compacts
// its log to LogKeep entries below it; a replica behind that point gets
// a copy.
//
// A replica whose log lost entries it had acknowledged (the Store was
// salvaged after damage, or its log is gone while it is still a replica)
// takes no part in elections until it has them again: see recovery.go.
//
// # Goroutines and locks
//
// The driver (Run) owns every group's raw node and memory storage, and
// calls the state machines, except Copy, which runs on a goroutine of its
// own, and Stored, which may be called from any. The log writer
// (writeLoop) only calls Store.Save, one write at a time, with what the
// driver hands it. Host.mu guards the group
// map, the leaving function and each group's in-sync list; it is never
// held while calling a state machine or the Store. Group's atomics are
// read from anywhere.
package multiraft
