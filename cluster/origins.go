package cluster

import (
	"sync"
	"time"

	"github.com/shardq/shardq/queue"
)

// Idempotent routing. Every publish that enters the cluster through a
// node gets an origin (queue.Origin: the node's run and a sequence). A
// publish whose outcome was lost on the way (the partition's leader
// stepped down before it knew whether its entry would commit, the link to
// the owner broke with it in flight) is routed again, with the same
// origin, until MoveWait has passed: the owner stores a publish once per
// origin, and answers a publish it stored already as stored. A lost
// outcome is routed again to the same partition, even after a growth
// moved its key: the origins a node knows are those of the partitions it
// keeps replicas of, and only the old partition's owner can tell whether
// its log holds the publish (Node.route, Node.publishHere). So a
// failover is invisible to a producer whose node stays up: a slower
// PUBACK, not 0x83, and the message stored once.
//
// The origins the partitions stored lately are kept in memory on every
// replica: the owner records a publish's origin when it takes it, and
// every replica when it applies an entry another leader proposed, so
// that a new leader knows every origin its log holds. They are kept for
// originWindow, longer than a publish is routed again (MoveWait plus a
// proposal's timeout). Not stored: a replica that restarted and leads
// within originWindow of a lost outcome may store that publish twice.

// originWindow is how long an origin is remembered.
const originWindow = 15 * time.Second

// origins is the node's index of the origins its partitions stored or
// are storing.
type origins struct {
	mu    sync.Mutex
	state map[queue.Origin]originState
	order []originAt // by when recorded, for expiry
	now   func() int64
}

type originState uint8

const (
	originNone    originState = iota
	originPending             // taken here, its outcome not known yet
	originStored
)

type originAt struct {
	o  queue.Origin
	at int64
}

func newOrigins() *origins {
	return &origins{state: map[queue.Origin]originState{}, now: monoNow}
}

// begin records that this node takes the publish of o, unless it knows o
// already: it returns what it knew.
func (x *origins) begin(o queue.Origin) originState {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s := x.state[o]; s != originNone {
		return s
	}
	x.recordLocked(o, originPending)
	return originNone
}

// end records the outcome of a publish begin took: stored, or not (it may
// be routed again).
func (x *origins) end(o queue.Origin, stored bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.state[o] != originPending {
		return // expired meanwhile, or recorded stored by the apply
	}
	if stored {
		x.state[o] = originStored
	} else {
		delete(x.state, o)
	}
}

// stored records o as stored: an entry holding it was applied here.
func (x *origins) stored(o queue.Origin) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.state[o] == originNone {
		x.recordLocked(o, originStored)
		return
	}
	x.state[o] = originStored
}

func (x *origins) recordLocked(o queue.Origin, s originState) {
	now := x.now()
	n := 0
	for n < len(x.order) && now-x.order[n].at >= int64(originWindow) {
		delete(x.state, x.order[n].o)
		n++
	}
	if n > 0 {
		x.order = x.order[n:]
	}
	x.state[o] = s
	x.order = append(x.order, originAt{o, now})
}
