package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/cluster/multiraft"
	"github.com/shardq/shardq/queue"
)

// Replication: a partition with a replication factor above 1 (with its
// dead-letter partition) is a raft group over its replicas, run by the
// node's multiraft host (cluster/multiraft): one driver goroutine and one
// fsync of the raft log for every group. Its state machine is a replica:
// every write the queue makes to its log is proposed to the group, many
// per entry; every replica applies committed entries in order to its
// local storage. The raft leader is the owner: it records itself in etcd
// with the next epoch once it has applied every entry committed before
// its term, and then serves the partition. A publish is acknowledged once
// its entry is committed (on disk on a majority) and applied on the
// leader.

// RaftStore keeps the raft log of the node's groups (storage/raftlog).
type RaftStore = multiraft.Store

// RaftState is what is stored of a group.
type RaftState = multiraft.State

// RaftWrite is what one Ready of a group stores.
type RaftWrite = multiraft.Write

const (
	raftTick      = 100 * time.Millisecond
	electionTicks = 10 // one second
	// raftProposalTimeout fails a proposal not applied by then.
	raftProposalTimeout = 10 * time.Second
	// raftSyncEvery is how often the applied writes are synced and the
	// applied index recorded.
	raftSyncEvery = 500 * time.Millisecond
)

// groupName names the raft group of partition id of the queue's
// incarnation inc: "orders/3" for the queue as first created, "orders/3@2"
// for it created again after two deletions. A queue deleted and created
// again gets new groups, which nothing of the old ones (a replica that
// missed the deletion) can take part in.
func groupName(id queue.PartitionID, inc uint64) string {
	if inc == 0 {
		return id.String()
	}
	return id.String() + "@" + strconv.FormatUint(inc, 10)
}

// groupPartition is the partition a group's name names.
func groupPartition(name string) queue.PartitionID {
	name, _, _ = strings.Cut(name, "@")
	i := strings.LastIndexByte(name, '/')
	p, _ := strconv.Atoi(name[i+1:])
	return queue.PartitionID{Queue: name[:i], Partition: p}
}

// raftHost is the node's replicated partitions: their replicas, and the
// multiraft host that runs their groups.
type raftHost struct {
	n     *Node
	mr    *multiraft.Host
	store RaftStore
	logs  queue.Logs // the node's local logs, under the raft logs

	mu sync.Mutex
	// replicas: the replica of each replicated partition here, of one
	// incarnation of its queue at a time.
	replicas map[queue.PartitionID]*replica
	// proposing: the replicas with proposals in flight, which expire
	// looks at (not at every replica each second).
	proposing map[*replica]bool
	partLogs  map[queue.PartitionID]*raftLog
	senders   map[string]*raftSender
	// ackPolicies: what setAckPolicy set last, by queue.
	ackPolicies map[string]ackPolicyKey

	nextID atomic.Uint64
	// token names this run of the node in the entries it proposes, so
	// that an entry of an earlier run is never taken for one of this run;
	// entrySeq numbers them (driver goroutine).
	token    uint64
	entrySeq uint64
}

func newRaftHost(n *Node, store RaftStore) *raftHost {
	h := &raftHost{n: n, store: store, replicas: map[queue.PartitionID]*replica{}, proposing: map[*replica]bool{}, partLogs: map[queue.PartitionID]*raftLog{}, ackPolicies: map[string]ackPolicyKey{},
		senders: map[string]*raftSender{}, token: uint64(time.Now().UnixNano()) ^ multiraft.ID(n.opts.NodeID)}
	m := n.Metrics()
	h.mr = multiraft.New(multiraft.Options{
		NodeID: n.opts.NodeID, Store: store, Transport: h, Logger: n.log,
		SyncApplied: func() { h.logs.SyncAsync() },
		Live:        n.liveNode,
		// The successor of a silent leader is the replica placement
		// prefers (balanceLeader): no handover follows the election.
		Rank:  func(group, node string) uint64 { return score(node, groupPartition(group)) },
		Nodes: func() []string { return slices.Collect(maps.Keys(n.knownNodes())) },
		Tick:  raftTick, ElectionTicks: electionTicks, LogKeep: uint64(n.opts.RaftLogKeep), SyncEvery: raftSyncEvery,
		Observer: multiraft.Observer{
			LogWrite:      func(d time.Duration) { m.logWrite.Observe(d.Seconds()) },
			LeaderChanged: func(string, bool) { m.elections.Inc() },
			Lag: func(group, node string, lag uint64) {
				id := groupPartition(group)
				m.lag.WithLabelValues(id.Queue, strconv.Itoa(id.Partition), node).Set(float64(lag))
			},
			LagGone: func(group, node string) {
				id := groupPartition(group)
				m.lag.DeleteLabelValues(id.Queue, strconv.Itoa(id.Partition), node)
			},
			CopySent:   func(string, string) { m.copies.Inc() },
			Recovering: func(d int) { m.recovering.Add(float64(d)) },
			Quiesced:   func(d int) { m.quiesced.Add(float64(d)) },
			Changed:    n.poke,
		},
	})
	return h
}

// run is the driver goroutine; when it ends, every write waiting for a
// group fails.
func (h *raftHost) run(ctx context.Context) {
	stop := make(chan struct{})
	go func() {
		// raftProposalTimeout is 10 s: expired within a second of it.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				h.expire()
			case <-stop:
				return
			}
		}
	}()
	h.mr.Run(ctx)
	close(stop)
	for _, r := range h.all() {
		r.failAll(queue.ErrClosed)
	}
}

// Send carries a raft message to node (multiraft.Transport).
func (h *raftHost) Send(node, group string, m *rpb.Message) bool {
	data, err := proto.Marshal(m)
	if err != nil {
		return false
	}
	return h.sender(node).send(&pb.RaftMessage{Group: group, Message: data})
}

// replica is one replicated partition on this node: the state machine of
// its raft group, which applies committed entries to the partition's
// local logs (and its dead-letter partition's), and proposes the writes
// the partition makes while this node leads.
type replica struct {
	h    *raftHost
	id   queue.PartitionID
	name string           // its raft group's name (groupName)
	g    *multiraft.Group // set by Bind
	// open: its group is open (guarded by raftHost.mu).
	open bool

	// Guarded by raftHost.mu.
	pending  []*proposal
	inflight map[uint64]*proposal
	// proposed holds the proposals of each entry this leader proposed,
	// by its number, until it is applied.
	proposed map[uint64][]*proposal
	// applying: the entries handed to storage and not yet stored; every
	// entry up to stored is stored locally.
	applying []applyMark
	stored   uint64

	// servedTerm is the term the partition was last acquired in here
	// (set before it is loaded); its writes are taken in that term only;
	// handedAt when this leader last asked to hand the leadership to the
	// preferred replica (monoNow).
	servedTerm atomic.Uint64
	handedAt   atomic.Int64
}

var _ multiraft.StateMachine = (*replica)(nil)

type applyMark struct {
	index   uint64
	pending int
}

// proposal is one write of a partition, proposed through its group.
type proposal struct {
	log   *raftLog
	epoch uint64
	msg   *queue.Message
	state *queue.Batch
	done  func(error)
	id    uint64
	at    time.Time
	// term is the leadership term the partition's state it was made
	// from was loaded in: its entry counts only in that term.
	term uint64
	// early: ack_policy leader, acknowledged once on this leader's disk;
	// persisted and acked record that it was (guarded by raftHost.mu).
	early     bool
	persisted bool
	acked     bool
}

// errOldIncarnation is ensureGroup's error while the replica of an
// earlier incarnation of the partition's queue is still closing here.
var errOldIncarnation = errors.New("cluster: the raft group of a deleted incarnation of the queue is still closing")

// errOldReplica is ensureGroup's error while the replica this node was in
// a group, before it was removed and added again under another raft id,
// is still closing.
var errOldReplica = errors.New("cluster: the replica this node was before it was added again is still closing")

// ensureGroup starts the replica of partition id of the queue's
// incarnation inc on this node, from its stored state, or new with
// replicas as its voters and the raft ids ids (multiraft.Host.Open).
func (h *raftHost) ensureGroup(id queue.PartitionID, inc uint64, replicas []string, ids map[string]uint64) (*replica, error) {
	name := groupName(id, inc)
	h.mu.Lock()
	r := h.replicas[id]
	h.mu.Unlock()
	if r != nil {
		if r.name != name {
			r.g.Close()
			return nil, fmt.Errorf("%w: %s", errOldIncarnation, r.name)
		}
		if want, ok := ids[h.n.opts.NodeID]; ok && r.isOpen() && r.g.Self() != want {
			// Removed and added again, under a new id, before this node
			// closed its earlier replica: that one's log is of no use.
			r.g.Close()
			return nil, fmt.Errorf("%w: %s", errOldReplica, r.name)
		}
		return r, nil
	}
	st, err := h.store.Load(name)
	if err != nil {
		return nil, err
	}
	applied := max(st.Applied, st.Snapshot.GetIndex(), 1)
	if st.HardState != nil {
		applied = min(applied, max(st.HardState.GetCommit(), 1))
	}
	r = &replica{h: h, id: id, name: name, inflight: map[uint64]*proposal{}, proposed: map[uint64][]*proposal{}, stored: applied}
	h.mu.Lock()
	if existing := h.replicas[id]; existing != nil {
		h.mu.Unlock()
		if existing.name != name {
			return nil, fmt.Errorf("%w: %s", errOldIncarnation, existing.name)
		}
		return existing, nil
	}
	h.replicas[id] = r
	h.mu.Unlock()
	if _, err := h.mr.Open(name, replicas, ids, r); err != nil {
		h.mu.Lock()
		delete(h.replicas, id)
		h.mu.Unlock()
		return nil, fmt.Errorf("cluster: raft group %s: %w", name, err)
	}
	h.mu.Lock()
	r.open = true
	h.mu.Unlock()
	return r, nil
}

// isOpen reports whether the replica's group is open here.
func (r *replica) isOpen() bool {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.open
}

// Bind records the replica's group (multiraft, before the group runs).
func (r *replica) Bind(g *multiraft.Group) { r.g = g }

// replica returns the open replica of partition id (of a queue, not of
// its dead-letter queue), nil when none here.
func (h *raftHost) replica(id queue.PartitionID) *replica {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.replicas[id]; r != nil && r.open {
		return r
	}
	return nil
}

func (h *raftHost) all() []*replica {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*replica, 0, len(h.replicas))
	for _, r := range h.replicas {
		if r.open {
			out = append(out, r)
		}
	}
	return out
}

// Propose packs the pending writes into one entry (driver goroutine).
func (r *replica) Propose() {
	h := r.h
	h.mu.Lock()
	ps := r.pending
	r.pending = nil
	h.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	if !r.g.Leading() {
		h.fail(ps, notLeader(r))
		return
	}
	term := r.g.LeaderTerm()
	if slices.ContainsFunc(ps, func(p *proposal) bool { return p.term != term }) {
		// Made from the state of an earlier leadership of this node: never
		// proposed, so never stored; routed again.
		var stale, kept []*proposal
		for _, p := range ps {
			if p.term == term {
				kept = append(kept, p)
			} else {
				stale = append(stale, p)
			}
		}
		h.fail(stale, notLeader(r))
		if ps = kept; len(ps) == 0 {
			return
		}
	}
	e := &pb.RaftEntry{Term: term}
	for _, p := range ps {
		e.Writes = append(e.Writes, toLogWrite(p.log.id, p.epoch, p.msg, p.state))
	}
	h.entrySeq++
	seq := h.entrySeq
	data := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{entryTag}, h.token), seq)
	data, err := proto.MarshalOptions{}.MarshalAppend(data, e)
	if err == nil {
		err = r.g.Propose(term, data)
	}
	if err != nil {
		h.fail(ps, fmt.Errorf("%w: %s: %v", queue.ErrNotOwned, r.g.Name(), err))
		return
	}
	h.mu.Lock()
	for _, p := range ps {
		r.inflight[p.id] = p
	}
	h.proposing[r] = true
	r.proposed[seq] = ps
	h.mu.Unlock()
}

func notLeader(r *replica) error {
	return fmt.Errorf("%w: %s: this node is not its leader", queue.ErrNotOwned, r.name)
}

// LeaderChanged fails what waits for this replica's leadership when it
// ends.
func (r *replica) LeaderChanged(leader bool) {
	if !leader {
		r.failAll(notLeader(r))
		// Not on the driver: releasing takes the partition's locks.
		go r.h.n.releasePartition(r.id)
	}
}

// Failed fails every write waiting: the raft log could not be written.
func (r *replica) Failed(err error) { r.failAll(fmt.Errorf("%w: %v", queue.ErrStorage, err)) }

// Removed fails every write waiting: this node is no longer a replica.
func (r *replica) Removed() {
	h := r.h
	h.mu.Lock()
	if h.replicas[r.id] == r {
		delete(h.replicas, r.id)
	}
	r.open = false
	h.mu.Unlock()
	r.failAll(notLeader(r))
	h.n.poke()
}

// Apply stores committed entries locally, in order; the leader's own
// proposals complete once stored.
func (r *replica) Apply(ents []*rpb.Entry) {
	h := r.h
	for _, e := range ents {
		if e.GetType() != rpb.EntryType_EntryNormal || len(e.GetData()) == 0 {
			r.markStored(e.GetIndex(), 0)
			continue
		}
		index := e.GetIndex()
		token, seq, body, ok := entryHeader(e.GetData())
		if ok && token == h.token {
			// This run's own entry: its proposals hold the writes; no
			// decoding.
			h.mu.Lock()
			ps := r.proposed[seq]
			if len(ps) > 0 && ps[0].term != e.GetTerm() {
				h.mu.Unlock()
				r.void(e, seq, ps[0].term)
				continue
			}
			delete(r.proposed, seq)
			live := make([]bool, len(ps))
			for i, p := range ps {
				_, live[i] = r.inflight[p.id]
				delete(r.inflight, p.id)
			}
			h.mu.Unlock()
			if ps != nil {
				r.markStored(index, len(ps))
				for i, p := range ps {
					b := new(queue.Batch)
					if p.msg != nil {
						b.Appends = append(b.Appends, queue.Append{Queue: p.log.id.Queue, Partition: p.log.id.Partition, Message: p.msg})
					}
					if p.state != nil {
						b.Merge(p.state)
					}
					var own *proposal
					if live[i] {
						own = p
					}
					r.store1(index, p.log.id, own, b)
				}
				continue
			}
		}
		var re pb.RaftEntry
		if err := proto.Unmarshal(body, &re); err != nil {
			h.n.log.Error("raft entry undecodable", "group", r.name, "index", index, "err", err)
			r.markStored(index, 0)
			continue
		}
		if re.Term != 0 && re.Term != e.GetTerm() {
			r.void(e, 0, re.Term)
			continue
		}
		r.markStored(index, len(re.Writes))
		for _, w := range re.Writes {
			id := queue.PartitionID{Queue: w.Queue, Partition: r.id.Partition}
			_, b := fromLogWrite(id, w)
			r.store1(index, id, nil, b)
		}
	}
}

// store1 stores one write of entry index in partition id's local log;
// own, when set, is the proposal of this node it completes.
func (r *replica) store1(index uint64, id queue.PartitionID, own *proposal, b *queue.Batch) {
	h := r.h
	l := h.partLog(id)
	if l == nil {
		h.n.log.Error("raft entry for a partition not built here", "partition", id.String())
		r.storedOne(index)
		if own != nil {
			own.finish(fmt.Errorf("%w: %s", queue.ErrNoSuchQueue, id))
		}
		return
	}
	if own != nil && own.msg != nil && own.msg.Offset < l.next.Load() {
		// Never acknowledge a message whose offset is taken.
		h.n.log.Error("a replicated append below what is stored", "partition", id.String(), "offset", own.msg.Offset, "stored_next", l.next.Load())
		r.storedOne(index)
		own.finish(fmt.Errorf("%w: offset %d of %s is taken", queue.ErrStorage, own.msg.Offset, id))
		return
	}
	b.Appends = l.skipStored(b.Appends)
	for _, a := range b.Appends {
		// Only what is stored: a retry of a publish whose write was
		// skipped must be stored again, not answered as stored.
		if a.Message.Origin != (queue.Origin{}) {
			h.n.origins.stored(a.Message.Origin)
		}
	}
	l.inner.Append(0, nil, b, false, func(err error) {
		r.storedOne(index)
		if own != nil {
			if err == nil {
				h.n.Metrics().proposals.Observe(time.Since(own.at).Seconds())
			}
			own.finish(err)
		}
	})
}

// entryTag starts the data of an entry of writes: the tag, the token of
// the run that proposed it and its number in that run, then the encoded
// RaftEntry.
const entryTag = 0xA1

func entryHeader(data []byte) (token, seq uint64, body []byte, ok bool) {
	if len(data) < 17 || data[0] != entryTag {
		return 0, 0, data, false
	}
	return binary.BigEndian.Uint64(data[1:9]), binary.BigEndian.Uint64(data[9:17]), data[17:], true
}

// void skips an entry committed in a term other than the one that
// proposed it (RaftEntry.Term), on every replica alike: its writes were
// made from a state a newer leader has written past (offsets it gave out
// since), so none of them is stored. own, when not 0, numbers the entry
// among this run's proposals: they fail as not stored, and are routed
// again.
func (r *replica) void(e *rpb.Entry, own, term uint64) {
	h := r.h
	h.n.log.Warn("raft entry proposed in an earlier term skipped", "group", r.name, "index", e.GetIndex(), "proposed_in", term, "committed_in", e.GetTerm())
	r.markStored(e.GetIndex(), 0)
	if own == 0 {
		return
	}
	seq := own
	h.mu.Lock()
	ps := r.proposed[seq]
	delete(r.proposed, seq)
	live := ps[:0]
	for _, p := range ps {
		if _, ok := r.inflight[p.id]; ok {
			delete(r.inflight, p.id)
			live = append(live, p)
		}
	}
	h.mu.Unlock()
	h.fail(live, notLeader(r))
}

// markStored records that entry index has n writes to store.
func (r *replica) markStored(index uint64, n int) {
	r.h.mu.Lock()
	r.applying = append(r.applying, applyMark{index: index, pending: n})
	r.advanceStoredLocked()
	r.h.mu.Unlock()
}

// storedOne records one stored write of entry index.
func (r *replica) storedOne(index uint64) {
	r.h.mu.Lock()
	for i := range r.applying {
		if r.applying[i].index == index {
			r.applying[i].pending--
			break
		}
	}
	r.advanceStoredLocked()
	r.h.mu.Unlock()
	r.g.Poke()
}

// advanceStoredLocked moves stored past the entries wholly stored.
// raftHost.mu must be held.
func (r *replica) advanceStoredLocked() {
	i := 0
	for i < len(r.applying) && r.applying[i].pending <= 0 {
		r.stored = r.applying[i].index
		i++
	}
	r.applying = r.applying[i:]
}

// Stored returns the index up to which every entry is stored here.
func (r *replica) Stored() uint64 {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.stored
}

// Installed records a snapshot: its data came with the copy before it.
func (r *replica) Installed(index uint64) {
	r.h.mu.Lock()
	r.applying = nil
	r.stored = max(r.stored, index)
	r.h.mu.Unlock()
}

// Copy streams what this node stores of the partition (and its
// dead-letter partition) to node, a replica behind the compacted log.
func (r *replica) Copy(ctx context.Context, node string) error {
	p, err := r.h.n.peer(node)
	if err != nil {
		return err
	}
	return r.h.n.copyPartition(ctx, p, r.id, 0, true)
}

// Persisted acknowledges the proposals of ack_policy leader that the raft
// log now holds on this leader's disk: every proposal in flight was in
// the entries just stored.
func (r *replica) Persisted() {
	var early []*proposal
	r.h.mu.Lock()
	for _, p := range r.inflight {
		if !p.persisted {
			p.persisted = true
			if p.early {
				p.acked = true
				early = append(early, p)
			}
		}
	}
	r.h.mu.Unlock()
	slices.SortFunc(early, func(a, b *proposal) int { return cmpID(a, b) })
	for _, p := range early {
		if p.done != nil {
			p.done(nil)
		}
	}
}

func cmpID(a, b *proposal) int {
	if a.id < b.id {
		return -1
	}
	return 1
}

// failAll fails every write waiting for this replica's group: those not
// yet proposed with err (they are routed again), those proposed with an
// *unknownOutcome, since a new leader may still commit their entry.
func (r *replica) failAll(err error) {
	h := r.h
	h.mu.Lock()
	ps := r.pending
	r.pending = nil
	proposed := make([]*proposal, 0, len(r.inflight))
	for _, p := range r.inflight {
		proposed = append(proposed, p)
	}
	clear(r.inflight)
	// Entries of this node committed later are decoded as anyone's.
	clear(r.proposed)
	h.mu.Unlock()
	slices.SortFunc(proposed, cmpID)
	h.fail(ps, err)
	h.fail(proposed, unknown(err))
}

// unknown marks err as the failure of a write whose fate is unknown.
func unknown(err error) error {
	if _, ok := errors.AsType[*unknownOutcome](err); ok || !errors.Is(err, queue.ErrNotOwned) {
		return err
	}
	return &unknownOutcome{err}
}

func (h *raftHost) fail(ps []*proposal, err error) {
	for _, p := range ps {
		p.finish(err)
	}
}

// expire fails proposals not applied in time.
func (h *raftHost) expire() {
	now := time.Now()
	lates := map[*replica][]*proposal{}
	h.mu.Lock()
	for r := range h.proposing {
		if len(r.inflight) == 0 {
			delete(h.proposing, r)
			continue
		}
		for id, p := range r.inflight {
			if now.Sub(p.at) > raftProposalTimeout {
				lates[r] = append(lates[r], p)
				delete(r.inflight, id)
			}
		}
	}
	h.mu.Unlock()
	for r, late := range lates {
		slices.SortFunc(late, cmpID)
		h.fail(late, unknown(fmt.Errorf("%w: %s: not committed within %s", queue.ErrNotOwned, r.name, raftProposalTimeout)))
	}
}

// finish tells the partition and the caller how the write ended; a
// caller acknowledged early was told already.
func (p *proposal) finish(err error) {
	if p.msg != nil && p.log.committed != nil {
		p.log.committed([]*queue.Message{p.msg}, err)
	}
	if p.acked {
		return
	}
	if p.done != nil {
		p.done(err)
	}
}

// setAckPolicy records the ack_policy of a queue's partition logs.
func (h *raftHost) setAckPolicy(name string, partitions int, ap queue.AckPolicy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key := ackPolicyKey{partitions, ap}
	if h.ackPolicies[name] == key {
		return // as set last time, on every partition built since
	}
	h.ackPolicies[name] = key
	for p := 0; p < partitions; p++ {
		for _, q := range []string{name, queue.DLQName(name)} {
			if l := h.partLogs[queue.PartitionID{Queue: q, Partition: p}]; l != nil {
				l.ackLeader.Store(ap == queue.AckLeader)
			}
		}
	}
}

// ackPolicyKey is what setAckPolicy last set for a queue.
type ackPolicyKey struct {
	partitions int
	policy     queue.AckPolicy
}

// partLog returns the raft log of partition id, if the queue is built.
func (h *raftHost) partLog(id queue.PartitionID) *raftLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.partLogs[id]
}

// importCopy writes a part of a copy from the leader into the local
// storage of a replicated partition.
func (h *raftHost) importCopy(ctx context.Context, id queue.PartitionID, st *queue.PartitionState, msgs []*queue.Message, last bool) error {
	l := h.partLog(id)
	if l == nil {
		return fmt.Errorf("%w: %s is not replicated here", queue.ErrNoSuchQueue, id)
	}
	done := make(chan error, 1)
	l.inner.Append(0, nil, queue.ImportBatch(id, st, msgs), last, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if st != nil {
		l.next.Store(st.First)
	}
	for _, m := range msgs {
		l.raiseNext(m.Offset + 1)
	}
	if st != nil && st.Next > l.next.Load() {
		l.next.Store(st.Next)
	}
	return nil
}

// inSync returns the in-sync replicas of partition id, when this node
// leads it.
func (h *raftHost) inSync(id queue.PartitionID) ([]string, bool) {
	r := h.replica(id)
	if r == nil {
		return nil, false
	}
	return r.g.InSync()
}

// closeRemoved closes the group of partition id here when the record, as
// a leader wrote it, names this node no replica: its leader removed it,
// and stopped sending it anything, the removal included. A leader of
// its own never closes.
func (h *raftHost) closeRemoved(id queue.PartitionID, rec Ownership) {
	r := h.replica(id)
	if r == nil {
		return
	}
	if r.name != groupName(id, rec.Incarnation) {
		h.n.log.Info("raft group of a deleted incarnation of the queue closes here", "group", r.name)
		r.g.Close()
		return
	}
	if r.g.IsLeader() || rec.Term == 0 || len(rec.Replicas) == 0 {
		return
	}
	h.n.log.Info("no longer a replica of a partition: its raft group closes here", "partition", id.String(), "replicas", rec.Replicas, "learners", rec.Learners)
	r.g.Close()
}

// checkForgotten marks the raft log recovering when it is empty while the
// cluster's records name this node a replica (multiraft.CheckForgotten).
func (h *raftHost) checkForgotten() error {
	return h.mr.CheckForgotten(func() (string, bool) {
		self := h.n.opts.NodeID
		h.n.mu.Lock()
		defer h.n.mu.Unlock()
		for id, o := range h.n.view.owners {
			if slices.Contains(o.Replicas, self) {
				return groupName(id, o.Incarnation), true
			}
		}
		return "", false
	})
}
