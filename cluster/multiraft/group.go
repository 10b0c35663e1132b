package multiraft

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Group is one raft group on this node.
type Group struct {
	h    *Host
	name string
	sm   StateMachine
	rn   *raft.RawNode
	ms   *raft.MemoryStorage
	// replicas (the voters), learners, ids and nodes change with replica
	// changes, on the driver goroutine; replicas, learners and ids are
	// read under Host.mu elsewhere. ids are the raft ids of the voters
	// and learners by node; nodes names every raft id seen so far. self
	// is this replica's raft id (ids.go).
	replicas []string
	learners []string
	ids      map[string]uint64
	nodes    map[uint64]string
	self     uint64

	// Driver goroutine only.
	leader bool
	// idle counts a leader's ticks with nothing to do; removed: dropped
	// here (quiesce.go).
	idle    int
	removed bool
	// quietSynced: quiesced, and its applied index recorded since.
	quietSynced bool
	// hurried is the term in which this follower last campaigned as its
	// silent leader's successor (quiesce.go: succeed).
	hurried uint64
	// hsTerm and hsVote are the term and vote last written to the log;
	// appending counts the appends raft asked for that are not stored
	// yet (append.go).
	hsTerm, hsVote uint64
	appending      int
	synced         uint64 // applied index last recorded
	compacted      uint64
	// lagged: the replicas whose lag this leader reported last tick.
	lagged, laggedBefore []string
	// campaign: a new group whose first replica is this node, which
	// starts an election at once rather than after a timeout.
	campaign bool
	// recoverTo: while recovering, what its leader had committed when
	// first heard from (recovery.go).
	recoverTo uint64

	// inSync: the replicas within InSyncLag entries of the leader's log,
	// as the leader saw them at its last tick (nil: not the leader).
	// Guarded by Host.mu.
	inSync []string
	// upToDate: the replicas whose log holds what the leader committed,
	// but UpToDateSlack entries (guarded by Host.mu).
	upToDate []string
	// watched is what the leader saw of each replica, by raft id, at its
	// last tick (Group.watch; driver goroutine); watchTick counts those
	// ticks.
	watched   map[uint64]watched
	watchTick uint64

	// wanted: the state machine has something to propose; onList: the
	// group is on the host's woken list.
	wanted, onList atomic.Bool
	// quiesced: the group stopped ticking (quiesce.go).
	quiesced atomic.Bool
	// version counts the changes of what the group's owner may act on:
	// leadership, catch-up, replicas, quiescing.
	version atomic.Uint64
	// caughtUp: leader, and every entry committed before its term is
	// stored by the state machine.
	caughtUp atomic.Bool
	isLeader atomic.Bool
	// lead names the leader this replica knows of ("" for none), set by
	// the driver.
	lead atomic.Pointer[string]
	// recovering: this replica's log lost entries; it takes no part in
	// elections (recovery.go).
	recovering atomic.Bool
	// leaderTerm is the term this node leads in (while isLeader);
	// leaderSince when it became the leader (UnixNano).
	leaderTerm  atomic.Uint64
	leaderSince atomic.Int64
}

// Version returns a number that changes whenever the group's leadership,
// catch-up, replicas or quiescing does: a caller that saw the same
// number last time has nothing new to act on.
func (g *Group) Version() uint64 { return g.version.Load() }

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// IsLeader reports whether this replica leads the group.
func (g *Group) IsLeader() bool { return g.isLeader.Load() }

// Leader names the leader of the group as this replica knows it, ""
// when it knows none.
func (g *Group) Leader() string {
	if l := g.lead.Load(); l != nil {
		return *l
	}
	return ""
}

// CaughtUp reports whether this replica leads the group and its state
// machine stores every entry committed before its term: it may serve.
func (g *Group) CaughtUp() bool { return g.caughtUp.Load() }

// LeaderTerm returns the term this replica leads in (while IsLeader).
func (g *Group) LeaderTerm() uint64 { return g.leaderTerm.Load() }

// LeaderSince returns when this replica became the leader.
func (g *Group) LeaderSince() time.Time { return time.Unix(0, g.leaderSince.Load()) }

// Recovering reports whether the group takes no part in elections until
// it has its entries back (recovery.go).
func (g *Group) Recovering() bool { return g.recovering.Load() }

// Replicas returns the group's replicas, as applied here.
func (g *Group) Replicas() []string {
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	return slices.Clone(g.replicas)
}

// Learners returns the group's learners, as applied here: replicas that
// get every entry but vote in nothing, until promoted.
func (g *Group) Learners() []string {
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	return slices.Clone(g.learners)
}

// Member reports whether this node is a voter or a learner of the group,
// as applied here.
func (g *Group) Member() bool {
	self := g.h.o.NodeID
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	return slices.Contains(g.replicas, self) || slices.Contains(g.learners, self)
}

// UpToDate returns the replicas (learners too) whose log holds every
// entry this leader committed, but for a few in flight, as the leader
// saw them at its last tick; false when it does not lead. A learner is
// promoted only once up to date: one counted in sync while far behind
// would be a voter without the entries it is counted for.
func (g *Group) UpToDate() ([]string, bool) {
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	if g.inSync == nil {
		return nil, false
	}
	return slices.Clone(g.upToDate), true
}

// InSync returns the replicas (learners too) in sync with this leader, false when it
// does not lead.
func (g *Group) InSync() ([]string, bool) {
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	if g.inSync == nil {
		return nil, false
	}
	in := slices.Clone(g.inSync)
	if g.quiesced.Load() {
		// Not looked at since it quiesced: a replica whose node went
		// silent is not in sync.
		in = slices.DeleteFunc(in, func(node string) bool { return g.h.silent[ID(node)] }) // pings know nodes by ID
	}
	return in, true
}

// Wake asks the driver to call the state machine's Propose. Any
// goroutine.
func (g *Group) Wake() {
	g.wanted.Store(true)
	g.h.woke(g)
}

// Poke asks the driver to look at the group again: its state machine
// stored entries (Stored moved). Any goroutine.
func (g *Group) Poke() { g.h.woke(g) }

// Propose proposes data as one entry, on the driver goroutine (in the
// state machine's Propose), if this replica leads the group in term: the
// term its state machine took the leadership in, whose state data was
// made from. A replica that stepped down, or lost and won the leadership
// again since, is refused: what it made from its old state must not land
// in a log a newer leader has written to. raft's own state decides, not
// the leadership last seen in a Ready: a message from a newer leader may
// have been stepped since. Proposals are never forwarded to a leader.
func (g *Group) Propose(term uint64, data []byte) error {
	if !g.leader {
		return ErrNotLeader
	}
	if st := g.rn.BasicStatus(); st.RaftState != raft.StateLeader || st.GetTerm() != term {
		return ErrNotLeader
	}
	return g.rn.Propose(data)
}

// FirstIndex returns the first entry the group's log still holds: a
// replica behind it gets a copy.
func (g *Group) FirstIndex() uint64 {
	i, _ := g.ms.FirstIndex()
	return i
}

// Leading reports, on the driver goroutine, whether this replica leads.
func (g *Group) Leading() bool { return g.leader }

// confState is the group's configuration: its voters and learners.
func (g *Group) confState() *rpb.ConfState {
	cs := &rpb.ConfState{Voters: make([]uint64, 0, len(g.replicas))}
	for _, r := range g.replicas {
		cs.Voters = append(cs.Voters, g.idOf(r))
	}
	for _, r := range g.learners {
		cs.Learners = append(cs.Learners, g.idOf(r))
	}
	return cs
}

// node names raft id, "" when no node known to the host has it.
func (g *Group) node(id uint64) string {
	if name, ok := g.nodes[id]; ok {
		return name
	}
	if g.h.o.Nodes != nil {
		// A group stored before its members were (ids.go) has the ids
		// ID(node) only.
		for _, name := range g.h.o.Nodes() {
			if ID(name) == id {
				g.nodes[id] = name
				return name
			}
		}
	}
	return ""
}

// setConf makes cs the group's replicas and learners (driver goroutine,
// or before the group runs).
func (g *Group) setConf(cs *rpb.ConfState) {
	names := func(ids []uint64) []string {
		out := make([]string, 0, len(ids))
		for _, id := range ids {
			if name := g.node(id); name != "" {
				out = append(out, name)
			} else {
				g.h.log.Warn("a replica's node is not known", "group", g.name, "raft_id", id)
			}
		}
		return out
	}
	voters, learners := names(cs.GetVoters()), names(cs.GetLearners())
	ids := map[string]uint64{}
	for _, id := range append(slices.Clone(cs.GetVoters()), cs.GetLearners()...) {
		if name := g.nodes[id]; name != "" {
			ids[name] = id
		}
	}
	g.h.mu.Lock()
	g.replicas, g.learners, g.ids = voters, learners, ids
	g.h.peersChanged = true
	g.h.mu.Unlock()
}

// A replica whose next entry the leader compacted away gets a copy: the
// state machine sends what it stores (Copy), then raft's snapshot
// message, which carries no data, is sent. The replica's copy may be
// newer than the snapshot's index: entries it applies after it again
// must only set what the copy holds already.

type copyResult struct {
	g    *Group
	node string
	m    *rpb.Message
	err  error
}

// sendCopy starts the copy for node, once at a time.
func (h *Host) sendCopy(g *Group, node string, m *rpb.Message) {
	key := g.name + "/" + node
	if h.sending[key] {
		return
	}
	h.sending[key] = true
	h.mu.Lock()
	ctx := h.ctx
	h.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err := g.sm.Copy(cctx, node)
		cancel()
		select {
		case h.copies <- copyResult{g: g, node: node, m: m, err: err}:
		case <-ctx.Done():
		}
	}()
}

// copyDone sends raft's snapshot message after a copy, and tells raft how
// it went; on the driver goroutine.
func (h *Host) copyDone(r copyResult) {
	delete(h.sending, r.g.name+"/"+r.node)
	h.dirty[r.g] = true
	if !r.g.removed {
		h.awaken(r.g)
	}
	to := r.m.GetTo()
	if r.err != nil {
		h.log.Warn("copy for a replica behind failed", "group", r.g.name, "replica", r.node, "err", r.err)
		r.g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	if h.o.Transport == nil || !h.o.Transport.Send(r.node, r.g.name, r.m) {
		r.g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	r.g.rn.ReportSnapshot(to, raft.SnapshotFinish)
	if f := h.o.Observer.CopySent; f != nil {
		f(r.g.name, r.node)
	}
	h.log.Info("replica behind sent a copy", "group", r.g.name, "replica", r.node, "index", r.m.GetSnapshot().GetMetadata().GetIndex())
}

// installSnapshot records raft's snapshot of a group: its data came with
// the copy before it.
func (h *Host) installSnapshot(g *Group, snap *rpb.Snapshot) {
	meta := snap.GetMetadata()
	if err := g.ms.ApplySnapshot(snap); err != nil {
		h.log.Warn("installing a snapshot", "group", g.name, "err", err)
		return
	}
	if _, nodes, err := decodeMembers(snap.GetData()); err == nil {
		for id, name := range nodes {
			g.nodes[id] = name
		}
	}
	if err := h.o.Store.Save([]Write{{Group: g.name, ConfState: meta.GetConfState(), Applied: meta.GetIndex(), Meta: encodeMembers(g.self, g.nodes)}}, true); err != nil {
		h.log.Warn("recording a snapshot", "group", g.name, "err", err)
	}
	if err := h.o.Store.Compact(g.name, meta.GetIndex(), meta.GetTerm()); err != nil {
		h.log.Warn("recording a snapshot", "group", g.name, "err", err)
	}
	g.setConf(meta.GetConfState())
	g.sm.Installed(meta.GetIndex())
	g.synced = max(g.synced, meta.GetIndex())
	g.compacted = max(g.compacted, meta.GetIndex())
}

// Replica changes: a leader adds a replica as a learner, which gets
// every entry but counts in no vote and no commit; once it caught up, the
// leader promotes it to a voter, and removes the replica it replaces.
// One change at a time, as raft configuration changes whose context names
// the node, so that every replica learns its name. The new replica starts
// from the initial state every group shares and catches up by entries
// or, past the compacted log, by a copy.

// Change is a replica change a leader proposes.
type Change int

const (
	// AddLearner adds a node as a learner.
	AddLearner Change = iota
	// Promote makes a learner a voter.
	Promote
	// Remove removes a voter or a learner.
	Remove
)

func (c Change) String() string {
	return [...]string{"add learner", "promote", "remove"}[c]
}

type confRequest struct {
	g      *Group
	change Change
	node   string
	// to, when set, asks for a leadership transfer instead, to a replica
	// it accepts.
	to func(string) bool
}

// RequestTransfer asks the driver to hand the group's leadership to a
// voter to accepts. Any goroutine; dropped when many are waiting.
func (g *Group) RequestTransfer(to func(string) bool) {
	select {
	case g.h.changes <- confRequest{g: g, to: to}:
	default:
	}
}

// RequestChange asks the driver to propose a replica change of node. Any
// goroutine; dropped when many are waiting, or when the group's replicas
// do not allow it (a learner promoted must be one, a node added must be
// none).
func (g *Group) RequestChange(c Change, node string) {
	select {
	case g.h.changes <- confRequest{g: g, change: c, node: node}:
	default:
	}
}

func (h *Host) proposeChange(r confRequest) {
	g := r.g
	if g.removed {
		return
	}
	h.awaken(g)
	if !g.leader || g.rn.BasicStatus().LeadTransferee != 0 {
		return
	}
	h.dirty[g] = true
	if r.to != nil {
		for _, node := range g.replicas {
			if node != h.o.NodeID && r.to(node) {
				g.rn.TransferLeader(g.idOf(node))
				return
			}
		}
		return
	}
	voter, learner := slices.Contains(g.replicas, r.node), slices.Contains(g.learners, r.node)
	var typ rpb.ConfChangeType
	id := g.idOf(r.node)
	switch {
	case r.change == AddLearner && !voter && !learner:
		// A new replica, whatever the node was before (ids.go).
		typ, id = rpb.ConfChangeType_ConfChangeAddLearnerNode, g.freshID()
	case r.change == Promote && learner:
		typ = rpb.ConfChangeType_ConfChangeAddNode
	case r.change == Remove && learner, r.change == Remove && voter && len(g.replicas) > 1:
		// Never the last voter: a group without one has no quorum, and
		// raft stops the process that applies such a change.
		typ = rpb.ConfChangeType_ConfChangeRemoveNode
	default:
		return
	}
	g.nodes[id] = r.node
	cc := &rpb.ConfChange{Type: &typ, NodeId: proto.Uint64(id), Context: []byte(r.node)}
	if err := g.rn.ProposeConfChange(cc); err != nil {
		h.log.Warn("proposing a replica change", "group", g.name, "node", r.node, "change", r.change.String(), "err", err)
		return
	}
	h.log.Info("replica change proposed", "group", g.name, "node", r.node, "change", r.change.String())
}

// applyChange applies a committed replica change; it reports whether it
// removed this node, which ends the group here.
func (h *Host) applyChange(g *Group, e *rpb.Entry) bool {
	var cc rpb.ConfChange
	if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
		h.log.Error("replica change undecodable", "group", g.name, "err", err)
		return false
	}
	if name := string(cc.GetContext()); name != "" {
		g.nodes[cc.GetNodeId()] = name
	}
	if why := g.replayed(&cc); why != "" {
		// Applied as a change of nothing, as raft allows (node id 0).
		h.log.Info("replica change already in the group's replicas", "group", g.name, "index", e.GetIndex(), "raft_id", cc.GetNodeId(), "why", why)
		cc.NodeId = proto.Uint64(0)
	}
	cs := g.rn.ApplyConfChange(&cc)
	if cc.GetType() == rpb.ConfChangeType_ConfChangeRemoveNode && cc.GetNodeId() == g.self {
		// Not closed here: a replica added again after a removal replays
		// that removal from the group's start, and a replica removed is
		// seldom told. Whoever runs the group closes it (Group.Close) when
		// its records no longer name this node.
		h.log.Info("this node is removed from the group's replicas, as of this entry", "group", g.name, "index", e.GetIndex())
	}
	before := g.Replicas()
	beforeLearners := g.Learners()
	g.setConf(cs)
	if err := h.o.Store.Save([]Write{{Group: g.name, ConfState: cs, Meta: encodeMembers(g.self, g.nodes)}}, true); err != nil {
		h.log.Warn("recording a replica change", "group", g.name, "err", err)
	}
	if !slices.Equal(before, g.Replicas()) || !slices.Equal(beforeLearners, g.Learners()) {
		h.log.Info("replicas changed", "group", g.name, "replicas", g.Replicas(), "learners", g.Learners())
	}
	h.changedGroup(g)
	return false
}

// replayed tells why a committed replica change must change nothing, ""
// when it is to be applied. A replica does not always replay its log's
// changes over the replicas they were made on: a replica added to a
// group starts from the replicas the group has now and replays every
// change its leader's log still holds, and a replica that restarts starts
// from the last replicas it recorded, which may be newer than the entries
// it applies again. Replayed over replicas that hold them already, the
// changes this package proposes leave them as they are, but for one:
// adding as a learner a raft id that is a voter, which raft reads as a
// demotion. This package never proposes one (a learner added always has
// a fresh id), so such an entry is a replay. The last voter's removal,
// which raft stops the process for, is never proposed either.
func (g *Group) replayed(cc *rpb.ConfChange) string {
	id := cc.GetNodeId()
	voters := g.rn.Status().Config.Voters.IDs()
	_, voter := voters[id]
	switch cc.GetType() {
	case rpb.ConfChangeType_ConfChangeAddLearnerNode:
		if voter {
			return "a voter added as a learner"
		}
	case rpb.ConfChangeType_ConfChangeRemoveNode:
		if voter && len(voters) == 1 {
			return "the removal of the last voter"
		}
	}
	return ""
}

// drop ends the group here and drops its log (driver goroutine).
func (h *Host) drop(g *Group, why string) {
	h.mu.Lock()
	if h.groups[g.name] == g {
		delete(h.groups, g.name)
	}
	h.peersChanged = true
	h.mu.Unlock()
	delete(h.dirty, g)
	delete(h.awake, g)
	g.removed = true
	if g.quiesced.Swap(false) {
		h.setQuiesced(-1)
	}
	g.isLeader.Store(false)
	g.caughtUp.Store(false)
	if g.recovering.Swap(false) {
		if f := h.o.Observer.Recovering; f != nil {
			f(-1)
		}
	}
	g.sm.Removed()
	// Not written after its log is dropped: the write under way waits,
	// and what it asked for that is not under way is forgotten.
	h.awaitWrite()
	h.appends = slices.DeleteFunc(h.appends, func(r appendReq) bool { return r.g == g })
	if err := h.o.Store.Drop(g.name); err != nil {
		h.log.Warn("dropping a raft group", "group", g.name, "err", err)
	}
	h.log.Info("raft group closed here", "group", g.name, "why", why)
	h.changedGroup(g)
}

// Close ends the group here and drops its log: the cluster's records say
// this node is no longer one of its replicas, a removal it may not have
// been told of (a leader stops sending to a replica it removed). Any
// goroutine; a node named a replica again later starts from an empty log.
func (g *Group) Close() {
	select {
	case g.h.closes <- g:
	case <-g.h.stopped():
	}
}
