package queue

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// maxParked bounds how many messages of blocked keys one cursor holds aside
// (ordering key). Past it the cursor stops reading ahead until a key frees.
// With few keys and a backlog every cursor holds that many: 8192 kept
// about 20 MB of messages aside for a queue of 8 partitions and 64 keys,
// while 1024 per partition is still 128 waiting behind each busy key.
//
// maxParkedBytes bounds their payload bytes too: past it the cursor
// stops reading ahead, as past maxParked. A count alone let a cursor of a
// queue of 1 MiB messages hold 1 GiB aside.
const (
	maxParked      = 1024
	maxParkedBytes = 8 << 20
)

// readAhead and readAheadBytes bound what a cursor reads from storage at a
// time: 512 messages, and no more once their payloads reach 1 MiB. A
// count alone let a cursor of a queue of 256 KiB messages hold 128 MiB.
const (
	readAhead      = 512
	readAheadBytes = 1 << 20
)

// group is one consumer group of a queue. Its consumers and claims change
// with every lock of the queue held (lockAll); cursors[i], claimed[i],
// owner[i] and moveTo[i] belong to partition i and are read, and for owner
// and moveTo also written, under that partition's lock.
type group struct {
	q         *Queue
	name      string
	cursors   []*cursor
	consumers []*Consumer
	remotes   int // of them, Remote

	// claimed[p] is the consumer that asked for partition p by name
	// (subscription property partitions); claims counts them.
	claimed []*Consumer
	claims  int
	// owner[p] is the consumer partition p is assigned to (ordering
	// partition); moveTo[p] the one it moves to once its leases are settled.
	owner, moveTo []*Consumer

	// starved counts the cursors with messages that had no consumer with
	// credit: a consumer whose credit returns dispatches them (kick).
	starved atomic.Int32

	// filter is the group's subject filter (Filter.Subjects): set by
	// its first subscription, kept with its floors, "" for every
	// subject. Messages it does not match are settled for the group as
	// they come (Filtered).
	filter string

	// sharding is the shard scheme of its sharded consumers (Sharding).
	sharding groupSharding

	stats GroupStats
}

// GroupStats are a group's running totals since the node started.
type GroupStats struct {
	Delivered, Redelivered, Acked, Nacked, Rejected, DeadLettered, LeasesLost atomic.Uint64
	Released, Filtered                                                        atomic.Uint64
}

// GroupCounts are a snapshot of GroupStats.
type GroupCounts struct {
	Delivered, Redelivered, Acked, Nacked, Rejected, DeadLettered, LeasesLost uint64
	Released, Filtered                                                        uint64
}

// Snapshot returns the totals as plain numbers.
func (s *GroupStats) Snapshot() GroupCounts {
	return GroupCounts{
		Delivered: s.Delivered.Load(), Redelivered: s.Redelivered.Load(), Acked: s.Acked.Load(),
		Nacked: s.Nacked.Load(), Rejected: s.Rejected.Load(), DeadLettered: s.DeadLettered.Load(),
		LeasesLost: s.LeasesLost.Load(), Released: s.Released.Load(), Filtered: s.Filtered.Load(),
	}
}

// cursor is a group's position in one partition: the JetStream-style ack
// floor, the settled set above it, the stream position of first
// deliveries, and the messages waiting to be delivered again. Guarded by
// the partition's lock.
type cursor struct {
	g *group
	p *partition

	floor   uint64
	settled map[uint64]bool // offset >= floor settled; true when marked on disk
	// floorSeen is floor for the cursors of the group's other partitions
	// (gatedLocked), which read it without this partition's lock.
	floorSeen atomic.Uint64
	// gated: its next message waits for the group to pass a growth's
	// cuts on other partitions (the partition ticks meanwhile).
	gated bool
	// passed: the growths' source partitions of another node the group
	// has passed (gatedByCluster), by count grown to and partition;
	// born: when the cursor was made, which their answers must follow.
	passed map[[2]int]bool
	born   time.Time
	// gen counts the purges of the cursor, which clear its key state: a
	// dead-lettering that began before one does not pass on a key
	// (deadLettered).
	gen  uint64
	next uint64 // first offset never read for delivery

	// delivered is one past the highest offset leased since the partition
	// was loaded, persisted with the floor: when the partition is loaded
	// again (after a crash, a restart or a move) the unsettled offsets below
	// it count one more ended delivery, and it starts over at the floor.
	delivered, savedDelivered uint64
	// mark bounds what may be delivered for the first time: every offset
	// below it is covered by a delivered mark on disk (or committed to the
	// partition's replicas), so that a crash, or a new leader, counts a
	// delivery of it and redelivers it with DUP. asked is the highest
	// mark asked for; asking is set while a mark's write is on its way.
	// freshUntil bounds when the cursor may deliver at all: a stored mark
	// proves, when it was asked for, that this node still served the
	// partition (in a cluster: led its replicas). See askMarkLocked.
	mark, asked uint64
	asking      bool
	freshUntil  time.Time
	// ahead is how many offsets the next mark covers past the next first
	// delivery, between markAhead and markAheadMax (see widenLocked).
	// early: the mark on its way was asked for before it was needed, at
	// half of the offsets; widened: it was found late, and ahead doubled.
	ahead          uint64
	early, widened bool
	// Loaded with deliveries its last owner may have had out (the
	// unsettled offsets below heldBelow), the cursor delivers none of
	// them before heldUntil (HandoverGrace); the others go out at once.
	heldUntil time.Time
	heldBelow uint64

	// Settlements not yet persisted (see flushStateLocked).
	dirty      bool
	savedFloor uint64
	marks      []uint64 // settled above the floor since the last flush
	unmarks    []uint64 // marked on disk, now below the floor

	ready  readyHeap          // released messages, deliverable now, lowest offset first
	pinned []*pending         // next messages of keys leased to a consumer, for it (key_inflight)
	aside  map[int][]*pending // by shard: messages no consumer that takes their shard could take yet (Sharding)
	asideN int
	// asideBytes are the payload bytes of the messages set aside.
	asideBytes int64
	retries    retryHeap            // nacked and delayed messages, by the time they are due
	keys       map[string]*keyState // ordering key: keys with a message out
	parked     int                  // messages parked behind blocked keys
	// parkedBytes are their payload bytes.
	parkedBytes int64
	// deadLettering counts its messages on their way to the dead-letter
	// queue.
	deadLettering int
	counts        map[uint64]uint32 // ended deliveries of unsettled offsets, as on disk
	leased        int
	out           map[uint64]*Lease // active leases by offset
	rr            int               // next consumer to try
	starved       atomic.Bool       // see group.starved

	ra       []*Message // read-ahead from storage covering [raFrom, raTo)
	raPos    int
	raFrom   uint64
	raTo     uint64
	fetching bool
	fetchErr time.Time // no new fetch before then after a failed read
}

// keyState is a key of a cursor with a message in circulation (ordering
// key). held counts its messages in circulation: leased, or waiting in
// the ready or retry heap, or on their way to the dead-letter queue. out
// counts those leased, all to owner: with key_inflight above 1, more of the
// key's messages are leased to owner while every held one is leased and
// nothing waits. waiting are the key's next messages, in offset order,
// delivered one at a time once nothing of the key is held.
type keyState struct {
	waiting   []*pending
	held, out int
	owner     *Consumer
}

// pending is a message waiting to be delivered again.
type pending struct {
	m          *Message
	deliveries uint32 // ended deliveries so far
	released   uint32 // of them, those released (not counted toward max_deliveries)
	at         time.Time
	// to, for a message in a cursor's pinned list, is the consumer its
	// key is leased to: it goes to that consumer (see unblockLocked).
	to *Consumer
}

func newGroup(q *Queue, name string) *group {
	n := len(q.partitions())
	g := &group{q: q, name: name, cursors: make([]*cursor, n),
		claimed: make([]*Consumer, n), owner: make([]*Consumer, n), moveTo: make([]*Consumer, n)}
	for i, p := range q.partitions() {
		g.cursors[i] = newCursor(g, p)
	}
	return g
}

// newCursor returns g's cursor of p at the partition's first offset.
func newCursor(g *group, p *partition) *cursor {
	c := &cursor{g: g, p: p, floor: p.first, next: p.first, delivered: p.first, savedDelivered: p.first, mark: p.first, asked: p.first, ahead: markAhead,
		settled: map[uint64]bool{}, counts: map[uint64]uint32{}, keys: map[string]*keyState{}, out: map[uint64]*Lease{}}
	c.floorSeen.Store(c.floor)
	if len(g.q.growths) > 0 {
		c.born = g.q.m.now()
	}
	return c
}

func (g *group) addConsumer(c *Consumer) {
	g.consumers = append(g.consumers, c)
	g.q.consumers++
	if c.remote {
		g.remotes++
	}
	for _, p := range c.partitions {
		g.claimed[p] = c
		g.claims++
	}
	g.rebalance()
}

func (g *group) removeConsumer(c *Consumer) {
	g.leaveSharding(c)
	for i, x := range g.consumers {
		if x == c {
			g.consumers = append(g.consumers[:i], g.consumers[i+1:]...)
			if c.remote {
				g.remotes--
			}
			break
		}
	}
	for p := range g.claimed {
		if g.claimed[p] == c {
			g.claimed[p] = nil
			g.claims--
		}
		if g.owner[p] == c {
			g.owner[p] = nil // its leases were released: free at once
		}
		if g.moveTo[p] == c {
			g.moveTo[p] = nil
		}
	}
	g.rebalance()
	if len(g.consumers) == 0 {
		for _, cur := range g.cursors {
			cur.releaseHeldLocked()
		}
	}
	if g.q.consumers--; g.q.consumers == 0 {
		for _, p := range g.q.partitions() {
			p.ring.pass(p.committed)
		}
	}
}

// releaseHeldLocked lets go of the messages the cursor holds in memory,
// its group having no consumer left: those read ahead from storage and
// those waiting to be delivered (given back by the consumers that left,
// parked behind a key, set aside for a shard). They are read again from
// the floor when a consumer comes: the settled offsets are skipped, and
// the ended deliveries of the others are in counts. A group whose
// consumers left held them until one came back, up to 1.6 MiB per group
// of 1 KiB messages, however many such groups there were. A cursor keeps
// what it holds while something of it lives in memory only: a lease, a
// message waiting for its time (retries), one on its way to the
// dead-letter queue, or one released by its consumer (its release is not
// on disk). The partition's lock must be held.
func (c *cursor) releaseHeldLocked() {
	if len(c.out) > 0 || c.retries.Len() > 0 || c.deadLettering > 0 || c.holdsReleased() {
		return
	}
	c.ra, c.raPos, c.raFrom, c.raTo = nil, 0, 0, 0
	c.ready, c.pinned = nil, nil
	c.aside, c.asideN, c.asideBytes = nil, 0, 0
	clear(c.keys)
	c.parked, c.parkedBytes = 0, 0
	c.next = c.floor
}

// holdsReleased reports whether a message the cursor holds was released
// by a consumer (Release): the delivery counted only in memory.
func (c *cursor) holdsReleased() bool {
	released := func(pd *pending) bool { return pd.released > 0 }
	if slices.ContainsFunc(c.ready, released) || slices.ContainsFunc(c.pinned, released) {
		return true
	}
	for _, list := range c.aside {
		if slices.ContainsFunc(list, released) {
			return true
		}
	}
	for _, ks := range c.keys {
		if slices.ContainsFunc(ks.waiting, released) {
			return true
		}
	}
	return false
}

// rebalance assigns the partitions nobody claimed to the consumers that
// claimed none (ordering partition): balanced, keeping every assignment it
// can. A partition taken from a live consumer moves once its leases are
// settled or released (see settleMoves).
func (g *group) rebalance() {
	if g.q.opts.Ordering != OrderPartition {
		return
	}
	var free []*Consumer
	for _, c := range g.consumers {
		if len(c.partitions) == 0 {
			free = append(free, c)
		}
	}
	var open []int
	for p := range g.cursors {
		if g.claimed[p] == nil {
			open = append(open, p)
		} else {
			g.owner[p], g.moveTo[p] = nil, nil
		}
	}
	if len(free) == 0 {
		for _, p := range open {
			g.owner[p], g.moveTo[p] = nil, nil
		}
		return
	}
	target := map[*Consumer]int{}
	for i, c := range free {
		target[c] = len(open) / len(free)
		if i < len(open)%len(free) {
			target[c]++
		}
	}
	// The consumer each partition ends with: its owner while under target.
	have := map[*Consumer]int{}
	var unplaced []int
	for _, p := range open {
		want := g.moveTo[p]
		if want == nil {
			want = g.owner[p]
		}
		if _, live := target[want]; live && have[want] < target[want] {
			have[want]++
			g.setOwner(p, want)
			continue
		}
		unplaced = append(unplaced, p)
	}
	for _, p := range unplaced {
		for _, c := range free {
			if have[c] < target[c] {
				have[c]++
				g.setOwner(p, c)
				break
			}
		}
	}
	g.settleMoves()
}

// setOwner makes c the partition's consumer: at once when the partition is
// free or idle, else once its in-flight messages are settled or released.
func (g *group) setOwner(p int, c *Consumer) {
	if g.owner[p] == c {
		g.moveTo[p] = nil
		return
	}
	if g.owner[p] == nil || g.cursors[p].leased == 0 {
		g.owner[p], g.moveTo[p] = c, nil
		return
	}
	g.moveTo[p] = c
}

// settleMoves completes the moves whose partitions have nothing in flight.
// Every lock of the queue must be held.
func (g *group) settleMoves() {
	for p := range g.moveTo {
		g.settleMove(p)
	}
}

// settleMove completes the move of partition p once it has nothing in
// flight. The partition's lock must be held.
func (g *group) settleMove(p int) {
	if c := g.moveTo[p]; c != nil && g.cursors[p].leased == 0 {
		g.owner[p], g.moveTo[p] = c, nil
	}
}

// takes reports whether consumer c may be given messages of partition p.
func (g *group) takes(c *Consumer, p int) bool {
	if g.claimed[p] != nil {
		return g.claimed[p] == c
	}
	if len(c.partitions) > 0 {
		return false
	}
	if g.q.opts.Ordering == OrderPartition {
		return g.owner[p] == c && g.moveTo[p] == nil
	}
	return true
}

// dispatchLocked leases the cursor's deliverable messages to the
// group's consumers with credit, round robin, until either runs out. The
// partition's lock must be held.
func (c *cursor) dispatchLocked(now time.Time) {
	g := c.g
	if len(g.consumers) == 0 || !c.p.owned {
		return
	}
	uniform := g.claims == 0 && g.q.opts.Ordering != OrderPartition
	if !uniform {
		g.settleMove(c.p.index)
	}
	rechecked := false
	for {
		if !c.markedLocked(now) {
			if c.outrunLocked() {
				c.widenLocked()
			}
			return // until the mark asked for is stored (marked dispatches)
		}
		rr := c.rr
		cons := c.takeConsumer(uniform)
		if cons == nil && c.hasWork() {
			// Starved: mark it, then look once more, so that credit given
			// back meanwhile either sees the mark or is seen here.
			if c.starved.CompareAndSwap(false, true) {
				g.starved.Add(1)
				c.p.wantTickLocked()
			}
			if cons = c.takeConsumer(uniform); cons != nil && c.starved.CompareAndSwap(true, false) {
				g.starved.Add(-1)
			}
		}
		if cons == nil {
			return
		}
		m, prior, released, to := c.nextLocked(now, cons, uniform)
		if m == nil {
			// Its turn is not used up: the next message goes to it.
			c.rr = rr
			cons.giveBack()
			if c.asideN > 0 && !rechecked && c.waitsForHolder() {
				// Set aside for a consumer without credit now: marked
				// starved, so that its credit coming back dispatches
				// them, then looked at once more, so that credit that
				// came back meanwhile is not missed.
				rechecked = true
				if c.starved.CompareAndSwap(false, true) {
					g.starved.Add(1)
				}
				continue
			}
			return
		}
		if to != cons {
			// The message goes to the consumer its key is leased to:
			// cons keeps its turn.
			c.rr = rr
			cons.giveBack()
		}
		g.leaseLocked(to, c, m, prior, released, now)
	}
}

// LocalLead is how many more unsettled deliveries than the least busy of
// its group's remote consumers (ConsumerOptions.Remote) a local consumer
// may hold and still be given a partition's next message before them. A
// delivery to a remote consumer costs its partition's node and the
// client's node a relay each way (the message out, the settlement back);
// preferring the local one saves both while it keeps up. The lead bounds
// how much more of the group's work waits at a busy local consumer than at
// an idle remote one.
const LocalLead = 16

// leadSample is how many of a group's remote consumers, from its turn on,
// takeConsumer compares a local one with.
const leadSample = 8

// takeConsumer returns the next consumer, round robin, that may take the
// cursor's partition, with one credit taken from it (and from its
// connection), or nil when none has credit. With remote consumers in the
// group, a local one within LocalLead of the least busy remote one (of the
// next leadSample) goes first.
func (c *cursor) takeConsumer(uniform bool) *Consumer {
	cs := c.g.consumers
	n := len(cs)
	// Local consumers go first only beside remote ones; otherwise every
	// consumer is first, and one pass is the plain round robin.
	mixed := c.g.remotes > 0 && c.g.remotes < n
	lead := int64(math.MaxInt64)
	if mixed {
		// The least busy of the next leadSample remote consumers: a group
		// of hundreds of consumers does not look at each for each message.
		seen := 0
		for i := 0; i < n && seen < leadSample; i++ {
			if cons := cs[(c.rr+i)%n]; cons.remote {
				seen++
				if cons.hasCredit() && (uniform || c.g.takes(cons, c.p.index)) {
					lead = min(lead, cons.unsettled()+LocalLead)
				}
			}
		}
	}
	for pass := 0; pass < 2; pass++ {
		passed := false // a consumer this pass left for the next one
		for i := 0; i < n; i++ {
			cons := cs[(c.rr+i)%n]
			if !uniform && !c.g.takes(cons, c.p.index) {
				continue
			}
			if first := !mixed || !cons.remote && cons.unsettled() < lead; first != (pass == 0) {
				passed = true
				continue
			}
			if cons.take(c.g) {
				c.rr = (c.rr + i + 1) % n
				return cons
			}
		}
		if !passed {
			break
		}
	}
	return nil
}

// hasWork reports whether the cursor may have a message to deliver.
func (c *cursor) hasWork() bool {
	return c.ready.Len() > 0 || len(c.pinned) > 0 || c.asideN > 0 || c.next < c.p.committed
}

// kick dispatches the group's starved cursors: a consumer's credit came
// back. No lock of the queue may be held.
func (g *group) kick() {
	if g.starved.Load() == 0 {
		return
	}
	for i, p := range g.q.partitions() {
		p.mu.Lock() // a partition's lock guards its cursor (loading replaces it)
		if cur := g.cursors[i]; cur.starved.CompareAndSwap(true, false) {
			g.starved.Add(-1)
			cur.dispatchLocked(g.q.m.now())
		}
		p.mu.Unlock()
	}
}

// kicks collects the groups to kick once the caller released its lock.
type kicks []*group

func (k *kicks) add(g *group) {
	if g.starved.Load() == 0 || slices.Contains(*k, g) {
		return
	}
	*k = append(*k, g)
}

// run kicks the groups collected. No lock of a queue may be held.
func (k kicks) run() {
	for _, g := range k {
		g.kick()
	}
}

func (g *group) leaseLocked(c *Consumer, cur *cursor, m *Message, prior, released uint32, now time.Time) {
	q := g.q
	cur.p.seq++
	l := &Lease{cur: cur, consumer: c, m: m, deliveries: prior + 1, released: released, seq: cur.p.seq,
		deadline: now.Add(q.opts.AckTimeout), at: now, active: true, slot: true, explicit: c.explicit}
	heap.Push(&cur.p.leases, l)
	cur.p.wantTickLocked()
	cur.leased++
	cur.out[m.Offset] = l
	if q.opts.Ordering == OrderKey {
		if ks := cur.keys[m.Key]; ks != nil {
			ks.out++
			ks.owner = c
		}
	}
	if m.Offset >= cur.delivered {
		cur.delivered = m.Offset + 1
		cur.dirty = true
	}
	q.stats.Delivered.Add(1)
	g.stats.Delivered.Add(1)
	if prior > 0 {
		q.stats.Redelivered.Add(1)
		g.stats.Redelivered.Add(1)
	}
	c.r.Deliver(Delivery{Lease: l.ref(), Queue: q.name, Partition: cur.p.index, Message: m, Count: l.deliveries, Explicit: l.explicit})
}

// nextLocked returns the cursor's next deliverable message for cons, how
// many of its deliveries already ended, how many of those were released,
// and the consumer it goes to: cons, or, for a message of a key leased to
// another consumer (key_inflight), that one, with one of its credits
// taken. It returns a nil message when there is none.
func (c *cursor) nextLocked(now time.Time, cons *Consumer, uniform bool) (*Message, uint32, uint32, *Consumer) {
	for i := 0; i < len(c.pinned); i++ {
		pd := c.pinned[i]
		to := pd.to
		switch {
		case c.isSettled(pd.m.Offset):
		case to.closed && c.g.sharding.members > 0 && !cons.accepts(pd.m):
			// Its consumer left, and cons does not take its shard.
			c.pinned = slices.Delete(c.pinned, i, i+1)
			i--
			pd.to = nil
			c.setAsideLocked(pd)
			continue
		case to.closed:
			to = cons // its consumer left: it is the key's next message for anyone
		case to == cons:
		case (uniform || c.g.takes(to, c.p.index)) && to.take(c.g):
		default:
			continue // for a consumer without credit now
		}
		c.pinned = slices.Delete(c.pinned, i, i+1)
		i--
		if c.isSettled(pd.m.Offset) {
			c.unblockLocked(pd.m)
			continue
		}
		if c.expiredLocked(pd.m, pd.deliveries, now) || c.spentLocked(pd.m, pd.deliveries-pd.released, now) {
			if to != cons {
				to.giveBack()
			}
			continue
		}
		return pd.m, pd.deliveries, pd.released, to
	}
	sharded := c.g.sharding.members > 0
	for c.asideN > 0 {
		pd, to := c.takeAsideLocked(cons, uniform)
		if pd == nil {
			break
		}
		if m, ok := c.dueLocked(pd, now); ok {
			return m, pd.deliveries, pd.released, to
		}
		if to != cons {
			to.giveBack()
		}
	}
	for c.ready.Len() > 0 {
		pd := heap.Pop(&c.ready).(*pending)
		m, ok := c.dueLocked(pd, now)
		if !ok {
			continue
		}
		to := cons
		if sharded && !cons.accepts(m) {
			if to = c.takerLocked(m, cons, uniform); to == nil {
				c.setAsideLocked(pd)
				continue
			}
		}
		return m, pd.deliveries, pd.released, to
	}
	q := c.g.q
	// Asked for before it is needed: half of the offsets or half of the
	// time used, so that a busy cursor never waits for its mark. Asked
	// for by time, the offsets of a wide mark were more than the cursor
	// needed: the next one covers fewer.
	if !c.asking {
		byOffsets := c.next < c.p.committed && c.next+c.ahead/2 >= c.mark
		if byOffsets || now.After(c.freshUntil.Add(-markFresh/2)) {
			if !byOffsets {
				c.ahead = max(markAhead, c.ahead/2)
			}
			c.askMarkLocked(now)
			c.early = byOffsets
		}
	}
	for c.next < min(c.p.committed, c.mark) {
		if sharded && (c.asideN >= maxParked || c.asideBytes >= maxParkedBytes) {
			return nil, 0, 0, nil // until a consumer of a shard set aside takes some
		}
		off := c.next
		m, known := c.messageAt(off)
		if !known {
			return nil, 0, 0, nil // being read from storage
		}
		if m == nil || c.isSettled(off) {
			c.next++
			if m == nil {
				c.settleLocked(off, nil) // a hole: nothing to deliver
			}
			continue
		}
		if gated := len(q.growths) > 0 && c.gatedLocked(off); gated || c.gated {
			if c.gated = gated; gated {
				c.p.wantTickLocked() // looked at again each tick
				return nil, 0, 0, nil
			}
		}
		if c.g.filter != "" && !MatchSubject(c.g.filter, m.Subject) {
			c.next++
			c.settleLocked(off, nil) // not for this group
			c.g.stats.Filtered.Add(1)
			continue
		}
		if q.opts.Ordering == OrderKey {
			if ks := c.keys[m.Key]; ks != nil {
				if to := c.pipelineTo(ks, m, cons, uniform, now); to != nil {
					ks.held++
					c.next++
					return m, c.counts[off], 0, to
				}
				if c.parkedFull() {
					return nil, 0, 0, nil
				}
				ks.waiting = append(ks.waiting, &pending{m: m, deliveries: c.counts[off]})
				c.park(m)
				c.next++
				continue
			}
			c.keys[m.Key] = &keyState{held: 1}
		}
		c.next++
		prior := c.counts[off]
		if off < c.heldBelow && now.Before(c.heldUntil) {
			// Its last owner may have it on its way to a client still.
			c.p.wantTickLocked()
			heap.Push(&c.retries, &pending{m: m, deliveries: prior, at: c.heldUntil})
			continue
		}
		if !m.NotBefore.IsZero() && m.NotBefore.After(now) {
			c.p.wantTickLocked()
			heap.Push(&c.retries, &pending{m: m, deliveries: prior, at: m.NotBefore})
			continue
		}
		if c.expiredLocked(m, prior, now) || c.spentLocked(m, prior, now) {
			continue
		}
		to := cons
		if sharded && !cons.accepts(m) {
			if to = c.takerLocked(m, cons, uniform); to == nil {
				c.setAsideLocked(&pending{m: m, deliveries: prior})
				continue
			}
		}
		return m, prior, 0, to
	}
	return nil, 0, 0, nil
}

// dueLocked returns the message of pd, waiting to be delivered again,
// unless it was settled meanwhile (its key passes on), has expired, or
// used up its deliveries (dead-lettered). The partition's lock must be
// held.
func (c *cursor) dueLocked(pd *pending, now time.Time) (*Message, bool) {
	if c.isSettled(pd.m.Offset) {
		c.unblockLocked(pd.m)
		return nil, false
	}
	if c.expiredLocked(pd.m, pd.deliveries, now) || c.spentLocked(pd.m, pd.deliveries-pd.released, now) {
		return nil, false
	}
	return pd.m, true
}

// pipelineTo returns the consumer m may be leased to while other messages
// of its key are (key_inflight above 1), or nil: every held message of the
// key is leased, to one consumer, fewer than key_inflight of them, nothing
// of the key waits, and m is due. That consumer is cons, or the key's
// owner with one of its credits taken.
func (c *cursor) pipelineTo(ks *keyState, m *Message, cons *Consumer, uniform bool, now time.Time) *Consumer {
	q := c.g.q
	n := q.opts.keyInflight()
	if n < 2 || len(ks.waiting) > 0 || ks.out != ks.held || ks.out >= n || ks.owner == nil || ks.owner.closed ||
		c.g.sharding.members > 0 && !ks.owner.accepts(m) {
		return nil
	}
	if m.Offset < c.heldBelow && now.Before(c.heldUntil) || !m.NotBefore.IsZero() && m.NotBefore.After(now) ||
		!m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt) || q.dlq != nil && int(c.counts[m.Offset]) >= q.opts.MaxDeliveries {
		return nil // it goes through the key's waiting messages
	}
	if ks.owner == cons {
		return cons
	}
	if (uniform || c.g.takes(ks.owner, c.p.index)) && ks.owner.take(c.g) {
		return ks.owner
	}
	return nil
}

// markedLocked reports whether the cursor may deliver now, asking for a
// mark when it may not: a stale mark, or only first deliveries left and
// the mark used up. It is checked before a consumer's credit is taken, so
// that a cursor waiting for its mark holds no credit another partition's
// cursor could use. The partition's lock must be held.
func (c *cursor) markedLocked(now time.Time) bool {
	stale := !now.Before(c.freshUntil)
	usedUp := c.ready.Len() == 0 && c.next >= c.mark && c.next < c.p.committed
	if (stale || usedUp) && !c.asking {
		c.askMarkLocked(now)
	}
	return !stale && !usedUp
}

// outrunLocked reports whether the cursor waits for a mark it asked for
// early (at half of the offsets of the last), with first deliveries left
// and a consumer that could take one: its deliveries outran the mark's
// writes (a fast consumer; in a cluster, marks committed through raft).
// The partition's lock must be held.
func (c *cursor) outrunLocked() bool {
	if !c.asking || !c.early || c.ready.Len() > 0 || c.next < c.mark || c.next >= c.p.committed {
		return false
	}
	for _, cons := range c.g.consumers {
		if cons.hasCredit() {
			return true
		}
	}
	return false
}

// widenLocked doubles the offsets the next marks cover, up to
// markAheadMax, once per mark asked for (outrunLocked). The partition's
// lock must be held.
func (c *cursor) widenLocked() {
	if c.widened {
		return
	}
	c.widened = true
	c.ahead = min(2*c.ahead, markAheadMax)
}

// markFresh is how long after it was asked for a stored mark lets a cursor
// deliver. It is shorter than a cluster's election timeout (1 s): a
// leader that was paused, or cut off, longer than that delivers nothing
// more until a new mark is stored, which it cannot do once another replica
// leads, so two nodes never hold leases on one message.
const markFresh = 500 * time.Millisecond

// markRetry is how long after a mark's write failed the cursor asks again
// (while its partition is served here).
const markRetry = 100 * time.Millisecond

// markAhead is how many offsets a delivered mark covers ahead of the next
// first delivery, at first. A cursor asks for the next mark when half of
// it is used, so that deliveries rarely wait for its write; a crash or a
// failover counts one delivery more for the unsettled offsets under the
// mark that were not delivered yet, as it does for parked ones. A cursor
// that used up its mark before the next was stored covers twice as many
// with its next marks (widenLocked), up to markAheadMax, and half as many
// again (not below markAhead) when half of a mark's time passes before
// half of its offsets are used: so that bound is markAhead per group and
// partition for a cursor that delivers less than about 128 messages a
// second, and at most markAheadMax for one that delivers as fast as a
// consumer takes them. Measured: with 64 at most, a paho.mqtt.golang
// consumer fed 55k msgs/s over 8 partitions fell behind its producers,
// waiting for marks.
const markAhead = 64

// markAheadMax bounds the offsets a mark covers (markAhead).
const markAheadMax = 1024

// askMarkLocked writes a delivered mark c.ahead offsets past the next
// first delivery. Until it is stored (committed to the partition's
// replicas), no offset at or above the current mark is delivered for the
// first time. The partition's lock must be held.
func (c *cursor) askMarkLocked(now time.Time) {
	g, p := c.g, c.p
	target := max(c.next+c.ahead, c.mark)
	c.asked, c.asking, c.early, c.widened = max(c.asked, target), true, false, false
	b := &Batch{Floors: []FloorWrite{{Queue: g.q.name, Group: g.name, Partition: p.index, Floor: c.floor, Delivered: c.asked, Filter: g.filter}}}
	c.savedFloor, c.savedDelivered = c.floor, c.asked
	p.log.Append(p.epoch, nil, b, g.q.opts.Durability == DurabilityFsync, func(err error) {
		// Not under the partition's lock: a log may complete at once.
		go g.marked(p, c, target, now, err)
	})
}

// marked records that the mark asked for at asked is stored, and
// delivers on.
func (g *group) marked(p *partition, c *cursor, target uint64, asked time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g.cursors[p.index] != c {
		return // reloaded meanwhile: the new cursor asks for its own
	}
	c.asking = false
	if err != nil {
		// Asked again soon: nothing else may come to dispatch this
		// cursor, whose messages would then wait for good.
		time.AfterFunc(markRetry, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if g.cursors[p.index] == c {
				c.dispatchLocked(g.q.m.now())
			}
		})
		return
	}
	c.mark = max(c.mark, target)
	c.freshUntil = asked.Add(markFresh)
	c.dispatchLocked(g.q.m.now())
}

// expiredLocked dead-letters m when its producer's expiry has passed.
func (c *cursor) expiredLocked(m *Message, prior uint32, now time.Time) bool {
	if m.ExpiresAt.IsZero() || now.Before(m.ExpiresAt) {
		return false
	}
	c.g.q.stats.Expired.Add(1)
	c.g.q.deadLetterLocked(c, m, prior, ReasonExpired, now)
	return true
}

// spentLocked dead-letters m when max_deliveries of its deliveries already
// ended: the last of them was cut by a crash, which ends a delivery too.
func (c *cursor) spentLocked(m *Message, prior uint32, now time.Time) bool {
	q := c.g.q
	if q.dlq == nil || int(prior) < q.opts.MaxDeliveries {
		return false
	}
	q.deadLetterLocked(c, m, prior, ReasonMaxDeliveries, now)
	return true
}

// crashedDeliveries counts, at recovery, one more ended delivery for each
// unsettled offset below the delivered mark, and records the new counts in
// b: it may have been leased when the broker stopped, and a crash ends a
// delivery like a lost lease does. Messages below the mark that were
// parked behind their key and never delivered are counted too (the bound
// the README states).
func (c *cursor) crashedDeliveries(b *Batch) {
	// Offsets not yet written were never delivered, mark or not.
	for off := c.floor; off < min(c.delivered, c.p.next); off++ {
		if _, settled := c.settled[off]; !settled {
			c.counts[off]++
			b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: c.g.q.name, Group: c.g.name, Partition: c.p.index, Offset: off, Count: c.counts[off]})
		}
	}
}

func (c *cursor) isSettled(off uint64) bool {
	if off < c.floor {
		return true
	}
	_, ok := c.settled[off]
	return ok
}

// messageAt returns the message at off from the ring or the read-ahead.
// known is false while it is being read from storage.
func (c *cursor) messageAt(off uint64) (m *Message, known bool) {
	if m, in := c.p.cached(off); in {
		return m, true
	}
	if off >= c.raFrom && off < c.raTo {
		for c.raPos < len(c.ra) && c.ra[c.raPos].Offset < off {
			c.raPos++
		}
		if c.raPos < len(c.ra) && c.ra[c.raPos].Offset == off {
			return c.ra[c.raPos], true
		}
		return nil, true
	}
	c.fetchLocked(off)
	return nil, false
}

// fetchLocked reads messages from off up to the ring from storage, in the
// background; the group is dispatched again when they arrive. A closed
// queue reads nothing more: a commit completing while the manager closes
// dispatches, and a read begun then would race the manager's wait for its
// reads.
func (c *cursor) fetchLocked(off uint64) {
	q := c.g.q
	if q.closed || c.fetching || q.m.now().Before(c.fetchErr) {
		return
	}
	c.fetching = true
	to := min(c.p.ring.low, c.p.committed)
	q.m.wg.Add(1)
	go func() {
		defer q.m.wg.Done()
		msgs, err := c.p.log.Read(off, to, readAhead, readAheadBytes)
		c.p.mu.Lock()
		defer c.p.mu.Unlock()
		if c.g.cursors[c.p.index] != c {
			return // the partition was released or loaded again meanwhile
		}
		c.fetching = false
		if err != nil {
			c.fetchErr = q.m.now().Add(time.Second)
			c.p.wantTickLocked() // the timer tries again
			q.m.log.Error("reading messages failed", "queue", q.name, "partition", c.p.index, "offset", off, "err", err)
			return
		}
		c.ra, c.raPos, c.raFrom, c.raTo = msgs, 0, off, to
		c.fetchErr = time.Time{}
		if len(msgs) > 0 && (len(msgs) == readAhead || payloadBytes(msgs) >= readAheadBytes) {
			// Cut short by a bound: what follows the last is unread.
			c.raTo = msgs[len(msgs)-1].Offset + 1
		}
		c.dispatchLocked(q.m.now())
	}()
}

// payloadBytes is the sum of the payload sizes of msgs, as Log.Read
// counts them.
func payloadBytes(msgs []*Message) int64 {
	var n int64
	for _, m := range msgs {
		n += int64(len(m.Payload))
	}
	return n
}

// settleLocked marks off settled for the group and advances the floor.
// The change reaches storage at the next flushStateLocked (every tick):
// settlements are persisted lazily, so many acks cost one floor write.
// Delivery marks of the offset are removed through b.
func (c *cursor) settleLocked(off uint64, b *Batch) {
	if off < c.floor {
		return
	}
	if off == c.floor {
		c.floor++
		for {
			onDisk, ok := c.settled[c.floor]
			if !ok {
				break
			}
			if onDisk {
				c.unmarks = append(c.unmarks, c.floor)
			}
			delete(c.settled, c.floor)
			c.floor++
		}
		c.floorSeen.Store(c.floor)
	} else {
		c.settled[off] = false
		c.marks = append(c.marks, off)
	}
	c.dirty = true
	c.p.wantTickLocked()
	if _, ok := c.counts[off]; ok && b != nil {
		delete(c.counts, off)
		b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: c.g.q.name, Group: c.g.name, Partition: c.p.index, Offset: off})
	}
}

// flushStateLocked records the cursor's settlements since the last flush
// in b: the floor, the marks of offsets settled above it, and the removal
// of marks the floor has passed.
func (c *cursor) flushStateLocked(b *Batch) {
	if !c.dirty {
		return
	}
	c.dirty = false
	q, g, p := c.g.q.name, c.g.name, c.p.index
	// The mark asked for may be ahead of what was delivered: it is never
	// written back below it.
	if delivered := max(c.delivered, c.asked); c.floor != c.savedFloor || delivered != c.savedDelivered {
		b.Floors = append(b.Floors, FloorWrite{Queue: q, Group: g, Partition: p, Floor: c.floor, Delivered: delivered, Filter: c.g.filter})
		c.savedFloor, c.savedDelivered = c.floor, delivered
	}
	for _, off := range c.marks {
		if onDisk, ok := c.settled[off]; ok && !onDisk {
			c.settled[off] = true
			b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off, Set: true})
		}
	}
	for _, off := range c.unmarks {
		b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off})
	}
	c.marks, c.unmarks = c.marks[:0], c.unmarks[:0]
}

// doneLocked is called when m leaves circulation for good (acked or
// dead-lettered): it is settled and its key lets the next message through.
func (c *cursor) doneLocked(m *Message, b *Batch) {
	c.settleLocked(m.Offset, b)
	c.unblockLocked(m)
}

func (c *cursor) unblockLocked(m *Message) {
	if c.g.q.opts.Ordering != OrderKey {
		return
	}
	ks := c.keys[m.Key]
	if ks == nil {
		return
	}
	if ks.held--; ks.held > 0 {
		// Others of the key are still out: its next message goes to
		// their consumer, if all of them are leased (key_inflight).
		if len(ks.waiting) > 0 && ks.out == ks.held && ks.owner != nil && !ks.owner.closed &&
			(c.g.sharding.members == 0 || ks.owner.accepts(ks.waiting[0].m)) {
			if pd := ks.waiting[0]; pd.at.IsZero() && (pd.m.NotBefore.IsZero() || !pd.m.NotBefore.After(c.g.q.m.now())) {
				ks.waiting[0] = nil
				ks.waiting = ks.waiting[1:]
				c.unpark(pd.m)
				ks.held++
				pd.to = ks.owner
				c.pinned = append(c.pinned, pd)
			}
		}
		return
	}
	if len(ks.waiting) == 0 {
		delete(c.keys, m.Key)
		return
	}
	pd := ks.waiting[0]
	ks.waiting[0] = nil
	ks.waiting = ks.waiting[1:]
	c.unpark(pd.m)
	ks.held, ks.owner = 1, nil
	if next := pd.m; pd.at.IsZero() && !next.NotBefore.IsZero() && next.NotBefore.After(c.g.q.m.now()) {
		pd.at = next.NotBefore // delayed: it takes the key but waits for its time
	}
	if !pd.at.IsZero() {
		c.p.wantTickLocked()
		heap.Push(&c.retries, pd)
		return
	}
	heap.Push(&c.ready, pd)
}

// returnLocked puts back pd, the message of l, whose lease just ended
// without an ack: into the ready heap, or the retry heap when pd.at is
// set. With ordering key and key_inflight above 1, the later messages of
// its key that l's consumer holds are taken back first (their deliveries
// end as released: they come again with DUP, not counted toward
// max_deliveries, and their late PUBACKs change nothing), and while
// earlier ones of its key are still leased, pd waits behind them with
// those taken back, so that the key is delivered again in order.
func (c *cursor) returnLocked(l *Lease, pd *pending, k *kicks) {
	if ks := c.keys[l.m.Key]; ks != nil && c.g.q.opts.Ordering == OrderKey && ks.out > 0 {
		var later []*Lease
		for off, x := range c.out {
			if off > l.m.Offset && x.m.Key == l.m.Key && x.consumer == l.consumer {
				later = append(later, x)
			}
		}
		slices.SortFunc(later, func(a, b *Lease) int { return cmp.Compare(a.m.Offset, b.m.Offset) })
		for _, x := range later {
			c.p.revokeLocked(x, k)
			c.waitLocked(ks, &pending{m: x.m, deliveries: x.deliveries, released: x.released + 1})
		}
		c.pinned = slices.DeleteFunc(c.pinned, func(pd *pending) bool {
			if pd.m.Key != l.m.Key {
				return false
			}
			pd.to = nil
			c.waitLocked(ks, pd)
			return true
		})
		if ks.out > 0 {
			c.waitLocked(ks, pd)
			return
		}
	}
	if !pd.at.IsZero() {
		c.p.wantTickLocked()
		heap.Push(&c.retries, pd)
		return
	}
	heap.Push(&c.ready, pd)
}

// waitLocked moves a held message of ks to its waiting ones, in offset
// order.
func (c *cursor) waitLocked(ks *keyState, pd *pending) {
	i, _ := slices.BinarySearchFunc(ks.waiting, pd.m.Offset, func(w *pending, off uint64) int { return cmp.Compare(w.m.Offset, off) })
	ks.waiting = slices.Insert(ks.waiting, i, pd)
	ks.held--
	c.park(pd.m)
}

// park and unpark count a message parked behind its key, and one that
// leaves the key's waiting ones.
func (c *cursor) park(m *Message) {
	c.parked++
	c.parkedBytes += int64(len(m.Payload))
}

func (c *cursor) unpark(m *Message) {
	c.parked--
	c.parkedBytes -= int64(len(m.Payload))
}

// parkedFull reports whether the cursor holds as many messages aside as
// it may (maxParked, maxParkedBytes).
func (c *cursor) parkedFull() bool {
	return c.parked >= maxParked || c.parkedBytes >= maxParkedBytes
}

// readyHeap orders pending messages by offset.
type readyHeap []*pending

func (h readyHeap) Len() int           { return len(h) }
func (h readyHeap) Less(i, j int) bool { return h[i].m.Offset < h[j].m.Offset }
func (h readyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *readyHeap) Push(x any)        { *h = append(*h, x.(*pending)) }
func (h *readyHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// retryHeap orders pending messages by the time they may be delivered.
type retryHeap []*pending

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(*pending)) }
func (h *retryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}
