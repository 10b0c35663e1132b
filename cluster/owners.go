package cluster

import (
	"container/heap"
	"context"
	"errors"
	"hash/fnv"
	"maps"

	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/cluster/multiraft"
	"github.com/shardq/shardq/queue"
)

// Ownership: every partition's owner is the live node, among those
// placement allows, with the highest rendezvous score for the partition.
// A node joining or leaving changes the winner only of the partitions it
// wins or held. The owner that is no longer the winner hands the
// partition over: it stops serving it, copies it to the winner, records
// the winner as owner with the next epoch, and erases its copy. A dead
// owner keeps its partitions (with replication factor 1 they live on its
// disk alone): they are not served until it returns.

// score is the rendezvous weight of node for partition id.
func score(node string, id queue.PartitionID) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	h.Write([]byte{0})
	h.Write([]byte(id.Queue))
	h.Write([]byte{0, byte(id.Partition >> 24), byte(id.Partition >> 16), byte(id.Partition >> 8), byte(id.Partition)})
	// A final mix: FNV's low bits alone spread poorly over similar names.
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// winner returns the live node that should own id, or "".
func (v *view) winner(id queue.PartitionID, allowed []string, self string) string {
	best, bestScore := "", uint64(0)
	drained := v.allDrained(allowed)
	for node := range v.nodes {
		if node == self && v.leaving {
			continue
		}
		if allowed != nil && !slices.Contains(allowed, node) {
			continue
		}
		if v.draining[node] && !drained {
			continue
		}
		if s := score(node, id); best == "" || s > bestScore || (s == bestScore && node < best) {
			best, bestScore = node, s
		}
	}
	return best
}

// allDrained reports whether every live node placement allows is
// drained.
func (v *view) allDrained(allowed []string) bool {
	for node := range v.nodes {
		if (allowed == nil || slices.Contains(allowed, node)) && !v.draining[node] {
			return false
		}
	}
	return true
}

// allowed returns the nodes the cluster's placement allows to own the
// queue's partitions; nil: every node.
func (n *Node) allowed(queueName string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	owner := n.view.queues[queueName].Owner
	for _, r := range n.view.placement {
		if r.matches(queueName, owner) {
			return r.Nodes
		}
	}
	return nil
}

func (n *Node) reconcileLoop() {
	defer n.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastFull time.Time
	adoptAgain := false
	for {
		full := true
		select {
		case <-n.ctx.Done():
			return
		case <-n.changed:
		case <-t.C:
			// Each second the partitions with something under way or
			// due (revisits); all of them after a change, and every
			// revisitCalm.
			full = time.Since(lastFull) >= revisitCalm
		}
		if full {
			lastFull = time.Now()
		}
		n.checkPeers()
		n.moveBudget = unCounted // counted once a pass needs it
		n.claimsSlow = false
		n.reconcile(full)
		if full || adoptAgain {
			adoptAgain = n.adoptSessions()
		}
	}
}

// reconcile brings the partitions this node serves in line with the view:
// every one (full), or those a pass left unsettled.
func (n *Node) reconcile(full bool) {
	if !n.member.Load() || n.guard.check() != nil {
		n.serveLedWithoutEtcd()
		return
	}
	n.mu.Lock()
	queues := make(map[string]QueueInfo, len(n.view.queues))
	for name, qi := range n.view.queues {
		queues[name] = qi
	}
	n.mu.Unlock()
	if !full {
		n.due.popDue(time.Now(), func(r revisit) {
			if v, ok := n.visited[r.id]; ok && v.due && v.dueAt.Equal(r.at) {
				delete(n.visited, r.id) // visited whatever it looks like
				n.active[r.id] = true
			} // else visited since, and scheduled anew
		})
		for id := range n.active {
			if qi, ok := queues[id.Queue]; ok && id.Partition < qi.Partitions && n.ctx.Err() == nil {
				n.reconcilePartition(id, n.allowed(id.Queue), n.replicationFactor(id.Queue))
			} else {
				delete(n.active, id)
			}
		}
		if n.raft != nil && n.opened {
			// A log recovering since its node started is done once each of
			// its groups has its entries back (cheap when it is not).
			n.raft.mr.RecoveredAll()
		}
		return
	}
	for name, qi := range queues {
		if n.ctx.Err() != nil {
			return
		}
		q, err := n.ensureCataloged(name, qi)
		if err != nil {
			n.log.Error("queue of the cluster's catalog", "queue", name, "err", err)
			continue
		}
		if q == nil {
			continue // deleted since the pass began
		}
		if qi.Declared != nil && q.Options() != *qi.Declared {
			if _, _, err := n.m.Declare(n.ctx, name, *qi.Declared); err != nil {
				n.log.Error("settings of the cluster's catalog", "queue", name, "err", err)
			}
		}
		allowed := n.allowed(name)
		rf := n.replicationFactor(name)
		if n.raft != nil {
			n.raft.setAckPolicy(name, qi.Partitions, n.ackPolicy(name))
		}
		for p := 0; p < qi.Partitions; p++ {
			n.reconcilePartition(queue.PartitionID{Queue: name, Partition: p}, allowed, rf)
		}
	}
	if n.raft != nil {
		// Every group of this node is open now.
		n.opened = true
		n.raft.mr.RecoveredAll()
	}
}

// ensureCataloged opens queue name here if the catalog still holds it,
// nil if not: a queue deleted since the pass began is not opened again
// after it was forgotten (forget waits for this).
func (n *Node) ensureCataloged(name string, qi QueueInfo) (*queue.Queue, error) {
	n.forgetMu.Lock()
	defer n.forgetMu.Unlock()
	n.mu.Lock()
	_, still := n.view.queues[name]
	n.mu.Unlock()
	if !still {
		return nil, nil
	}
	return n.m.Ensure(n.ctx, name, qi.shape())
}

// reconcilePartition brings partition id in line with the view.
func (n *Node) reconcilePartition(id queue.PartitionID, allowed []string, rf int) {
	n.mu.Lock()
	self, session := n.opts.NodeID, int64(n.session)
	rec, has := n.view.owners[id]
	moving := n.moving[id]
	n.mu.Unlock()
	if moving || n.settled(id, rec, rf) {
		return
	}
	n.mu.Lock()
	target := n.view.winner(id, allowed, self)
	n.mu.Unlock()
	if rf > 1 {
		if n.reconcileReplicated(id, rec, has, target, allowed, rf) {
			v := n.visited[id]
			v.calm = true
			n.visited[id] = v
		}
		return
	}
	switch {
	case !has:
		if target == self {
			if o, ok, err := n.claim(n.ctx, id, nil, self, session); err != nil {
				n.log.Warn("claiming a partition", "partition", id.String(), "err", err)
			} else if ok {
				n.acquire(id, o.Epoch)
			}
		}
	case rec.Owner == self:
		if rec.Session != session {
			// Claimed by an earlier run or lease of this node: the
			// writes made under it must be refused from now on.
			o, ok, err := n.claim(n.ctx, id, &rec, self, session)
			if err != nil {
				n.log.Warn("claiming a partition again", "partition", id.String(), "err", err)
				return
			}
			if !ok {
				return
			}
			rec = o
		}
		if epoch, owned := n.m.Owned(id); !owned || epoch != rec.Epoch {
			n.acquire(id, rec.Epoch)
		}
		if target != "" && target != self && n.liveNode(target) {
			n.startHandover(id, rec, target)
		}
	default:
		n.dropIfServed(id, rec)
	}
}

// revisitAfter is how long a settled partition goes without a reconcile
// pass: what follows from time alone (a replica replaced after
// ReplaceAfter, a move waiting for the move budget) waits that long at
// most. The pass of the second it falls due visits it (revisits), not
// the next full pass, which would be up to twice as late. A calm
// partition, a follower here or a leader whose replicas and leadership
// are where placement wants them, waits for nothing but a change, which
// pokes the loop: it is visited every revisitCalm, in case one was
// missed. Thousands of idle partitions cost little then.
const (
	revisitAfter = 10 * time.Second
	revisitCalm  = time.Minute
)

// visit is what a reconcile pass saw of a partition: its record's
// revision, the cluster's topology, and its raft group's version (or,
// with one replica, the epoch it is served under here).
type visit struct {
	rev      int64
	topology uint64
	version  uint64
	at       time.Time
	rep      *replica // the partition's replica here, when it has one
	due      bool     // a revisit is scheduled (n.due), at dueAt
	dueAt    time.Time
	calm     bool // nothing to do but on a change (revisitCalm)
}

// every returns how long the partition goes without a visit.
func (v visit) every() time.Duration {
	if v.calm {
		return revisitCalm
	}
	return revisitAfter
}

// revisits is a min-heap (container/heap) of the partitions to visit
// again, by when.
type revisits []revisit

type revisit struct {
	at time.Time
	id queue.PartitionID
}

func (r revisits) Len() int           { return len(r) }
func (r revisits) Less(i, j int) bool { return r[i].at.Before(r[j].at) }
func (r revisits) Swap(i, j int)      { r[i], r[j] = r[j], r[i] }
func (r *revisits) Push(x any)        { *r = append(*r, x.(revisit)) }
func (r *revisits) Pop() any {
	old := *r
	x := old[len(old)-1]
	*r = old[:len(old)-1]
	return x
}

// popDue calls f with, and takes out, each revisit due by now.
func (r *revisits) popDue(now time.Time, f func(revisit)) {
	for r.Len() > 0 && !(*r)[0].at.After(now) {
		f(heap.Pop(r).(revisit))
	}
}

// revisit schedules a visit of partition id at at, unless one comes
// sooner. One scheduled later stays in the heap, stale: dropped when
// due.
func (n *Node) revisit(id queue.PartitionID, at time.Time) {
	v := n.visited[id]
	if v.due && !v.dueAt.After(at) {
		return
	}
	v.due, v.dueAt = true, at
	n.visited[id] = v
	heap.Push(&n.due, revisit{at, id})
}

// settled reports whether partition id is as the last pass left it, with
// nothing to do: the same record, topology and group (quiesced, or not
// led here), visited within revisitAfter. Thousands of idle partitions
// then cost a reconcile pass next to nothing. A partition not settled is
// active: the passes of every second visit it. Reconcile goroutine only.
func (n *Node) settled(id queue.PartitionID, rec Ownership, rf int) bool {
	last, seen := n.visited[id]
	v := visit{rev: rec.rev, topology: n.topology.Load(), at: time.Now()}
	quiet := true
	if rf > 1 && n.raft != nil {
		r := last.rep
		if r == nil || !r.isOpen() {
			r = n.raft.replica(id)
		}
		v.rep = r
		if r == nil {
			quiet = false
		} else {
			v.version = r.g.Version()
			quiet = r.g.Quiesced() || !r.g.IsLeader()
		}
	} else if epoch, owned := n.m.Owned(id); owned {
		v.version = epoch
	}
	// The revisit scheduled stays: a partition visited often (a pass
	// after every change, while thousands are created) has one in the
	// heap, not one per visit.
	v.due, v.dueAt = last.due, last.dueAt
	n.visited[id] = v
	if !seen || !quiet || last.rev != v.rev || last.topology != v.topology || last.version != v.version || v.at.Sub(last.at) >= last.every() {
		n.active[id] = true
		return false
	}
	n.visited[id] = last // still counting from the last visit
	n.revisit(id, last.at.Add(last.every()))
	delete(n.active, id)
	return true
}

// liveNode reports whether node is a member now.
func (n *Node) liveNode(node string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.view.nodes[node]
	return ok
}

// pair returns a partition and its dead-letter partition.
func pair(id queue.PartitionID) [2]queue.PartitionID {
	return [2]queue.PartitionID{id, {Queue: queue.DLQName(id.Queue), Partition: id.Partition}}
}

// acquire serves id (and its dead-letter partition) under epoch.
func (n *Node) acquire(id queue.PartitionID, epoch uint64) {
	for _, x := range pair(id) {
		if err := n.m.Acquire(n.ctx, x, epoch); err != nil {
			n.log.Error("serving a partition", "partition", x.String(), "epoch", epoch, "err", err)
			return
		}
	}
	n.Metrics().setOwned(id, epoch, true)
	n.log.Info("serving partition", "partition", id.String(), "epoch", epoch)
	n.ownershipChanged()
}

// dropIfServed stops serving id when another node owns it now.
func (n *Node) dropIfServed(id queue.PartitionID, rec Ownership) {
	for _, x := range pair(id) {
		if _, owned := n.m.Owned(x); owned {
			if err := n.m.Release(n.ctx, x); err != nil {
				n.log.Warn("releasing a partition another node owns", "partition", x.String(), "err", err)
			}
			n.Metrics().setOwned(id, rec.Epoch, false)
			n.log.Info("partition owned elsewhere, released", "partition", x.String(), "owner", rec.Owner, "epoch", rec.Epoch)
		}
		_ = n.m.Fence(x, rec.Epoch)
	}
}

// releaseAll stops serving every partition of one replica (the lease is
// gone). A replicated partition's leader serves on: raft fences it, and
// it needs no lease.
func (n *Node) releaseAll() {
	for _, q := range n.m.Queues() {
		if n.replicated(q.Name()) {
			continue
		}
		for p := 0; p < q.Partitions(); p++ {
			id := queue.PartitionID{Queue: q.Name(), Partition: p}
			if _, owned := n.m.Owned(id); owned {
				ctx, cancel := context.WithTimeout(context.Background(), n.opts.LeaseTTL)
				_ = n.m.Release(ctx, id)
				cancel()
				if !queue.IsDLQ(q.Name()) {
					n.Metrics().setOwned(id, 0, false)
				}
			}
		}
	}
	n.ownershipChanged()
}

// ownsNothing reports whether no ownership record names this node.
func (n *Node) ownsNothing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range n.view.owners {
		if o.Owner == n.opts.NodeID {
			return false
		}
	}
	return true
}

// startHandover moves id to target in the background, once at a time.
func (n *Node) startHandover(id queue.PartitionID, rec Ownership, target string) {
	n.mu.Lock()
	if n.moving[id] {
		n.mu.Unlock()
		return
	}
	n.moving[id] = true
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		start := time.Now()
		err := n.handover(id, rec, target)
		n.mu.Lock()
		delete(n.moving, id)
		n.mu.Unlock()
		if err != nil {
			n.log.Warn("handing a partition over", "partition", id.String(), "to", target, "err", err)
			n.Metrics().moves.WithLabelValues("failed").Inc()
			// Serve it again until the next try.
			n.acquire(id, rec.Epoch)
			n.poke()
			return
		}
		n.Metrics().moves.WithLabelValues("done").Inc()
		n.log.Info("partition handed over", "partition", id.String(), "to", target, "epoch", rec.Epoch+1, "took", time.Since(start).Round(time.Millisecond))
	}()
}

// importChunk and importChunkBytes cap the messages of one import
// message: 512, and no more once their payloads reach 8 MiB. A count
// alone made a chunk of 512 MiB of 1 MiB messages, past what a peer
// takes in one gRPC message (64 MiB): such a partition could be neither
// moved nor copied to a new replica.
const (
	importChunk      = 512
	importChunkBytes = 8 << 20
)

// handover releases id, copies it to target, records target as its owner
// with the next epoch and erases this node's copy.
func (n *Node) handover(id queue.PartitionID, rec Ownership, target string) error {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Minute)
	defer cancel()
	for _, x := range pair(id) {
		if err := n.m.Release(ctx, x); err != nil {
			return err
		}
	}
	n.Metrics().setOwned(id, rec.Epoch, false)
	n.ownershipChanged()
	p, err := n.peer(target)
	if err != nil {
		return err
	}
	epoch := rec.Epoch + 1
	if err := n.copyPartition(ctx, p, id, epoch, false); err != nil {
		return err
	}
	n.mu.Lock()
	session := n.view.nodes[target].Session
	n.mu.Unlock()
	if _, ok, err := n.claim(ctx, id, &rec, target, session); err != nil {
		return err
	} else if !ok {
		// Someone else changed the ownership meanwhile: keep the copy;
		// the next reconcile decides.
		return nil
	}
	for _, x := range pair(id) {
		if err := n.m.ErasePartition(ctx, x, epoch); err != nil {
			n.log.Warn("erasing a moved partition's copy", "partition", x.String(), "err", err)
		}
	}
	return nil
}

// reconcileReplicated: a replicated partition is created by the node that
// wins it, with the live nodes that score highest as its replicas; each
// replica runs its raft group; the raft leader, once it stores every
// committed entry, claims the partition with the next epoch and serves it;
// any other replica stops serving it.
func (n *Node) reconcileReplicated(id queue.PartitionID, rec Ownership, has bool, target string, allowed []string, rf int) (calm bool) {
	self := n.opts.NodeID
	if !has {
		if target != self {
			return false
		}
		n.mu.Lock()
		replicas := n.view.top(id, allowed, rf)
		qi := n.view.queues[id.Queue]
		n.mu.Unlock()
		if err := n.createReplicated(n.ctx, id, qi.Incarnation, qi.created, replicas); err != nil {
			n.log.Warn("creating a replicated partition", "partition", id.String(), "err", err)
		}
		return false
	}
	if !slices.Contains(rec.Replicas, self) && !slices.Contains(rec.Learners, self) {
		n.dropIfServed(id, rec)
		n.raft.closeRemoved(id, rec)
		return true
	}
	r, err := n.raft.ensureGroup(id, rec.Incarnation, rec.Replicas, rec.IDs)
	if errors.Is(err, errOldIncarnation) {
		n.log.Info("waiting for the raft group of a deleted incarnation to close", "partition", id.String(), "err", err)
		return false
	}
	if errors.Is(err, errOldReplica) {
		n.log.Info("waiting for the replica this node was before it was added again to close", "partition", id.String(), "err", err)
		return false
	}
	if err != nil {
		n.log.Error("starting a partition's raft group", "partition", id.String(), "err", err)
		return false
	}
	n.mu.Lock()
	session, leaving := int64(n.session), n.view.leaving
	n.mu.Unlock()
	g := r.g
	if !g.IsLeader() || !g.CaughtUp() || leaving {
		n.releasePartition(id)
		if g.IsLeader() && leaving {
			n.raft.mr.TransferAll(n.liveNode)
		}
		// A follower has nothing to do until its group or the view
		// changes, which pokes the reconcile loop.
		return !g.IsLeader() && !leaving
	}
	term := g.LeaderTerm()
	if rec.Term > term {
		// Claimed by the leader of a later term: this node's leadership
		// is stale (it was paused or cut off); raft tells it soon.
		return false
	}
	if rec.Owner != self || rec.Session != session || rec.Term != term {
		wait := claimLeaderWait
		if n.claimsSlow {
			// etcd did not answer another claim of this pass: the
			// partitions led here are not left unserved a claim's wait
			// each, one after the other.
			wait = claimLeaderWait / 16
		}
		ctx, cancel := context.WithTimeout(n.ctx, wait)
		o, ok, err := n.claimLeader(ctx, id, rec, session, term)
		cancel()
		switch {
		case err != nil:
			// etcd out of reach: served all the same, under raft, and
			// recorded once etcd answers.
			n.claimsSlow = true
			n.log.Warn("claiming a partition this node leads; served meanwhile", "partition", id.String(), "err", err)
			rec = provisional(rec, self, term)
		case !ok:
			return false
		default:
			rec = o
		}
	}
	if epoch, owned := n.m.Owned(id); !owned || epoch != rec.Epoch {
		if owned && r.servedTerm.Load() != term {
			// Served since an earlier term: others appended since; read
			// it again from storage.
			for _, x := range pair(id) {
				ctx, cancel := context.WithTimeout(n.ctx, time.Second)
				_ = n.m.Release(ctx, x)
				cancel()
			}
		}
		// Before the partition is loaded: its writes are taken only in
		// the term it was loaded in (raftLog.Append).
		r.servedTerm.Store(term)
		n.acquire(id, rec.Epoch)
	}
	placed := n.maintainReplicas(id, r, rec, allowed, rf)
	return n.balanceLeader(id, r, allowed) && placed
}

// claimLeaderWait bounds how long a leader waits for etcd to record it
// before it serves its partition all the same.
const claimLeaderWait = 2 * time.Second

// provisional is the ownership a leader of term serves a partition under
// before etcd recorded it: the record its claim will write.
func provisional(rec Ownership, self string, term uint64) Ownership {
	if rec.Owner != self || rec.Term != term {
		rec.Epoch++
	}
	rec.Owner, rec.Term = self, term
	return rec
}

// serveLedWithoutEtcd serves the partitions this node leads under raft,
// caught up, that it does not serve yet, while it cannot reach etcd and
// none of their other replicas can either (etcd is out of reach for all):
// raft fences a replicated partition's writes and deliveries, not etcd
// (ADR 0008). A leadership won in the outage (a leader handed it over, or
// died) would otherwise leave its partition unserved until etcd is back.
// The claims are recorded once etcd answers.
func (n *Node) serveLedWithoutEtcd() {
	if n.raft == nil {
		return
	}
	self := n.opts.NodeID
	// A replica that renewed its lease since this node's renewals began
	// to fail reaches etcd (its last renewal before that proves nothing:
	// etcd may have stopped just after it).
	since := n.etcdFailing.Load()
	if since == 0 {
		since = n.etcdRenewed.Load()
	}
	reaches := func(node string) bool { return node != self && n.peerRenewedSince(node, since) }
	for _, r := range n.raft.all() {
		g := r.g
		if g == nil || !g.IsLeader() || !g.CaughtUp() {
			continue
		}
		if slices.ContainsFunc(g.Replicas(), reaches) {
			// Cut off from etcd alone: its leadership goes to a replica
			// that reaches etcd (handOverFromEtcd), not served here.
			continue
		}
		term := g.LeaderTerm()
		_, owned := n.m.Owned(r.id)
		if owned && r.servedTerm.Load() == term {
			continue
		}
		n.mu.Lock()
		rec, leaving := n.view.owners[r.id], n.view.leaving
		n.mu.Unlock()
		if leaving || rec.Term > term {
			continue
		}
		if owned {
			// Served since an earlier term: read it again from storage.
			n.releasePartition(r.id)
		}
		rec = provisional(rec, self, term)
		n.log.Info("serving a partition this node leads while etcd is out of reach", "partition", r.id.String(), "epoch", rec.Epoch, "term", term)
		r.servedTerm.Store(term)
		n.acquire(r.id, rec.Epoch)
	}
}

// releasePartition releases partition id (and its dead-letter partition) here,
// if served: nothing more is delivered or written from it.
func (n *Node) releasePartition(id queue.PartitionID) {
	for _, x := range pair(id) {
		if epoch, owned := n.m.Owned(x); owned {
			ctx, cancel := context.WithTimeout(n.ctx, time.Second)
			_ = n.m.Release(ctx, x)
			cancel()
			n.Metrics().setOwned(id, epoch, false)
			n.ownershipChanged()
		}
	}
}

// leaderSettle is how long a leader serves before it hands the leadership
// to the preferred replica, and how long it waits between two tries.
const leaderSettle = 3 * time.Second

// balanceLeader, on a partition's leader: the leadership goes to the
// preferred replica, the live one that scores highest for the partition,
// once it is in sync. So the partitions' leaders spread over the nodes as
// their owners do with one replica, and return to a node that was down
// once it caught up, rather than staying on the nodes that survived. It
// reports whether the leadership is where it belongs.
func (n *Node) balanceLeader(id queue.PartitionID, r *replica, allowed []string) (balanced bool) {
	// Not before it led, or last handed it, leaderSettle ago: visited
	// again then.
	if wait := max(leaderSettle-time.Since(r.g.LeaderSince()), time.Duration(r.handedAt.Load()+int64(leaderSettle)-monoNow())); wait > 0 {
		n.revisit(id, time.Now().Add(wait))
		return false
	}
	cur := r.g.Replicas()
	in, ok := r.g.InSync()
	if !ok {
		return false
	}
	n.mu.Lock()
	ranked := n.view.top(id, allowed, len(n.view.nodes))
	n.mu.Unlock()
	preferred := ""
	for _, node := range ranked {
		if slices.Contains(cur, node) {
			preferred = node
			break
		}
	}
	if preferred == "" || preferred == n.opts.NodeID {
		return true
	}
	if slices.Contains(in, preferred) {
		n.handLeadership(id, r, "to its preferred replica "+preferred, func(node string) bool { return node == preferred })
	}
	return false
}

// handLeadership hands the leadership of a partition this node leads to
// a replica to accepts, at most once per leaderSettle. The partition
// stops delivering first: the new leader delivers as soon as it is
// elected, which a transfer does at once, without the election timeout a
// delivered mark's freshness counts on. If the transfer fails, the next
// pass serves the partition again.
func (n *Node) handLeadership(id queue.PartitionID, r *replica, why string, to func(string) bool) {
	if monoNow()-r.handedAt.Load() < int64(leaderSettle) {
		return
	}
	r.handedAt.Store(monoNow())
	n.log.Info("handing a partition's leadership over", "partition", id.String(), "why", why)
	n.releasePartition(id)
	r.g.RequestTransfer(to)
}

// maintainReplicas, on a partition's leader: the record in etcd follows
// the replicas raft applied, and the replicas follow placement, one
// change at a time. The replicas wanted are the rf live nodes placement
// allows that score highest for the partition, drained nodes left out: a
// node that joins wins its share of partitions, a drained one loses all
// of its. A wanted node that is no replica is added as a learner, which
// counts in no vote and no commit; once in sync it is promoted, and the
// replica wanted least is removed, after it handed the leadership over if
// it leads. A replica whose node has been gone for ReplaceAfter is
// removed. At most MaxMoves partitions move at once per leader; a
// replica replacing a missing one does not wait for that. It reports
// whether the replicas are the wanted ones, nothing left to wait for.
func (n *Node) maintainReplicas(id queue.PartitionID, rep *replica, rec Ownership, allowed []string, rf int) (placed bool) {
	voters, learners := rep.g.Replicas(), rep.g.Learners()
	if len(voters) == 0 {
		return false
	}
	ids := rep.g.IDs()
	if !sameSet(voters, rec.Replicas) || !sameSet(learners, rec.Learners) || !maps.Equal(ids, rec.IDs) {
		next := rec
		next.Replicas, next.Learners, next.IDs = voters, learners, ids
		key := n.keys.owner(id)
		if _, _, err := n.writeOwnership(n.ctx, id, clientv3.Compare(clientv3.ModRevision(key), "=", rec.rev), next); err != nil {
			n.log.Warn("recording a partition's replicas", "partition", id.String(), "err", err)
		}
		return false
	}
	self := n.opts.NodeID
	in, _ := rep.g.InSync()
	upToDate, _ := rep.g.UpToDate()
	n.mu.Lock()
	gone := n.goneFor(append(slices.Clone(voters), learners...), n.opts.ReplaceAfter)
	wanted := n.view.top(id, allowed, rf)
	n.mu.Unlock()
	switch {
	case len(learners) > 0:
		l := learners[0]
		switch {
		case !slices.Contains(wanted, l):
			// Placement changed, or the node drained or left, while it
			// caught up.
			n.log.Info("removing a learner no longer wanted", "partition", id.String(), "node", l)
			rep.g.RequestChange(multiraft.Remove, l)
		case slices.Contains(upToDate, l):
			n.log.Info("promoting a learner up to date", "partition", id.String(), "node", l)
			rep.g.RequestChange(multiraft.Promote, l)
		}
		return false
	case len(gone) > 0 && len(voters) > 1:
		n.log.Info("replacing a replica whose node is gone", "partition", id.String(), "node", gone[0], "after", n.opts.ReplaceAfter)
		rep.g.RequestChange(multiraft.Remove, gone[0])
		return false
	case len(voters) > rf:
		x := n.leastWanted(id, voters, wanted)
		if !quorumWithout(voters, in, x) {
			return false // the others must be in sync first
		}
		if x == self {
			n.handLeadership(id, rep, "its replica here is to be removed", func(node string) bool {
				return node != self && slices.Contains(in, node) && slices.Contains(wanted, node)
			})
			return false
		}
		n.log.Info("removing a replica placement no longer wants", "partition", id.String(), "node", x, "replicas", voters)
		rep.g.RequestChange(multiraft.Remove, x)
		return false
	}
	for _, w := range wanted {
		if slices.Contains(voters, w) {
			continue
		}
		if len(voters) >= rf && !n.takeMove() {
			return false
		}
		n.log.Info("adding a replica as a learner", "partition", id.String(), "node", w, "replicas", voters)
		rep.g.RequestChange(multiraft.AddLearner, w)
		return false
	}
	return len(voters) == len(wanted)
}

// goneFor returns the nodes of replicas that have not been members for
// longer than after; it notes when the others were last seen gone.
// Called with mu held.
func (n *Node) goneFor(replicas []string, after time.Duration) []string {
	var gone []string
	now := time.Now()
	for _, r := range replicas {
		if _, live := n.view.nodes[r]; live {
			delete(n.gone, r)
			continue
		}
		since, ok := n.gone[r]
		if !ok {
			n.gone[r] = now
			continue
		}
		if now.Sub(since) > after {
			gone = append(gone, r)
		}
	}
	return gone
}

// leastWanted returns the voter to remove from a group with one too
// many: one not wanted, a node that is down first, then a drained one,
// then the one scoring lowest.
func (n *Node) leastWanted(id queue.PartitionID, voters, wanted []string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	rank := func(node string) int {
		_, live := n.view.nodes[node]
		switch {
		case slices.Contains(wanted, node):
			return 0
		case n.view.draining[node]:
			return 2
		case !live:
			return 3
		}
		return 1
	}
	best := ""
	for _, v := range voters {
		if best == "" || rank(v) > rank(best) || (rank(v) == rank(best) && score(v, id) < score(best, id)) {
			best = v
		}
	}
	return best
}

// quorumWithout reports whether the voters but x that are in sync are a
// majority of the voters but x.
func quorumWithout(voters, in []string, x string) bool {
	ok := 0
	for _, v := range voters {
		if v != x && slices.Contains(in, v) {
			ok++
		}
	}
	return ok > (len(voters)-1)/2
}

// takeMove takes one of this pass's moves (reconcile goroutine).
func (n *Node) takeMove() bool {
	if n.moveBudget == unCounted {
		n.countMoves()
	}
	if n.moveBudget <= 0 {
		return false
	}
	n.moveBudget--
	return true
}

// unCounted is moveBudget before the pass first needs it.
const unCounted = -1 << 31

// countMoves sets the moves this node may start in a reconcile pass: the
// cluster's MaxMoves less those under way in the groups it leads, which
// have a learner or a voter too many.
func (n *Node) countMoves() {
	moving := 0
	if n.raft != nil {
		for _, r := range n.raft.all() {
			if !r.g.IsLeader() {
				continue
			}
			if len(r.g.Learners()) > 0 || len(r.g.Replicas()) > n.replicationFactor(r.id.Queue) {
				moving++
			}
		}
	}
	n.moveBudget = n.opts.MaxMoves - moving
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// top returns the live nodes placement allows with the highest
// rendezvous scores for id, at most k, the best first. Drained nodes are
// left out, unless every node placement allows is drained (a partition
// must live somewhere).
func (v *view) top(id queue.PartitionID, allowed []string, k int) []string {
	var nodes []string
	drained := v.allDrained(allowed)
	for node := range v.nodes {
		if (allowed == nil || slices.Contains(allowed, node)) && (!v.draining[node] || drained) {
			nodes = append(nodes, node)
		}
	}
	slices.SortFunc(nodes, func(a, b string) int {
		sa, sb := score(a, id), score(b, id)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return strings.Compare(a, b)
	})
	return nodes[:min(k, len(nodes))]
}

// copyPartition streams what this node stores of partition id and its
// dead-letter partition to peer p with Import: for a move under epoch
// (the partitions must be released here), or (raftSnapshot) as a copy for
// a replica its raft log left behind.
func (n *Node) copyPartition(ctx context.Context, p *peer, id queue.PartitionID, epoch uint64, raftSnapshot bool) error {
	stream, err := p.client.Import(ctx)
	if err != nil {
		return err
	}
	for _, x := range pair(id) {
		read := n.m.PartitionState
		if raftSnapshot {
			read = n.m.StoredState
		}
		st, err := read(x)
		if err != nil {
			return err
		}
		chunk := &pb.ImportChunk{Partition: &pb.PartitionID{Queue: x.Queue, Partition: int32(x.Partition)}, Epoch: epoch,
			State: toPBState(st), From: n.opts.NodeID, RaftSnapshot: raftSnapshot}
		for from := st.First; ; {
			msgs, err := n.m.ReadPartition(x, from, st.Next, importChunk, importChunkBytes)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				chunk.Messages = append(chunk.Messages, toPBMessage(m))
			}
			if len(msgs) > 0 {
				from = msgs[len(msgs)-1].Offset + 1
			}
			done := len(msgs) == 0 || from >= st.Next
			chunk.Last = done
			if err := stream.Send(chunk); err != nil {
				return err
			}
			if done {
				break
			}
			chunk = &pb.ImportChunk{Partition: chunk.Partition, Epoch: epoch, From: n.opts.NodeID, RaftSnapshot: raftSnapshot}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return err
	}
	return fromResult(resp.Result)
}
