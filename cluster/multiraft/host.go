package multiraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	rpb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Store keeps the raft log of the node's groups (storage/raftlog).
type Store interface {
	Load(group string) (State, error)
	// Save stores many groups' writes with one write; with sync, durably
	// when it returns, else with the next synced Save.
	Save(ws []Write, sync bool) error
	Compact(group string, index, term uint64) error
	Drop(group string) error
	// Recovering reports that the store was salvaged after damage (or
	// marked so) and Recovered was not called since: a group it holds
	// nothing of may have lost what it acknowledged.
	Recovering() bool
	Recovered() error
	// MarkRecovering makes Recovering true, durably.
	MarkRecovering(why string) error
	// Groups names the groups with stored state.
	Groups() ([]string, error)
}

// State is what is stored of a group.
type State struct {
	HardState *rpb.HardState
	ConfState *rpb.ConfState
	Snapshot  *rpb.SnapshotMetadata
	Entries   []*rpb.Entry
	Applied   uint64
	Meta      []byte
	// Recovering: the group lost entries it acknowledged (recovery.go).
	Recovering bool
}

// Write is what one Ready of a group stores.
type Write struct {
	Group     string
	HardState *rpb.HardState
	ConfState *rpb.ConfState
	Entries   []*rpb.Entry
	Applied   uint64
	Meta      []byte
	// Recovering, when set, stores whether the group is recovering.
	Recovering *bool
}

// Transport carries raft messages to other nodes.
type Transport interface {
	// Send hands m of group to node; false when it was dropped (raft
	// sends again).
	Send(node, group string, m *rpb.Message) bool
}

// StateMachine is what a group replicates into. The host calls it on its
// driver goroutine, but Copy and Stored.
type StateMachine interface {
	// Bind gives the state machine its group, before the host runs it.
	Bind(g *Group)
	// Apply applies committed entries, in order, of every type: normal
	// ones with data are the state machine's, the others only move the
	// index on. It may store them asynchronously; Stored reports how far.
	Apply(ents []*rpb.Entry)
	// Stored returns the index up to which every applied entry is
	// stored. Any goroutine.
	Stored() uint64
	// Propose is called after the group's Wake: on a leader, the state
	// machine proposes what it has with Group.Propose.
	Propose()
	// LeaderChanged tells that this replica became, or stopped being,
	// the group's leader.
	LeaderChanged(leader bool)
	// Persisted tells a leader that the entries it proposed so far are on
	// its own disk (not yet committed).
	Persisted()
	// Copy sends what the state machine stores to node, a replica behind
	// the compacted log, before raft's snapshot (which carries no data)
	// is sent to it. On a goroutine of its own.
	Copy(ctx context.Context, node string) error
	// Installed tells that a snapshot at index was installed here: its
	// data came with a copy before it.
	Installed(index uint64)
	// Failed tells that the raft log could not be written: nothing
	// pending will commit here.
	Failed(err error)
	// Removed tells that this node is no longer a replica: the group is
	// closed and its log dropped.
	Removed()
}

// Observer gets the host's events for metrics; every func is optional.
type Observer struct {
	LogWrite      func(time.Duration)
	LeaderChanged func(group string, leader bool)
	// Lag is a replica's lag behind this leader, each tick; LagGone ends
	// a series Lag started.
	Lag      func(group, node string, lag uint64)
	LagGone  func(group, node string)
	CopySent func(group, node string)
	// Recovering counts groups that start (+1) or end (-1) recovering.
	Recovering func(delta int)
	// Changed: a group's leadership, catch-up or replicas changed.
	Changed func()
	// Quiesced counts groups that quiesce (+1) or wake (-1).
	Quiesced func(delta int)
}

// Options configure a Host.
type Options struct {
	// Usually set.
	NodeID    string // required
	Store     Store  // required
	Transport Transport
	Logger    *slog.Logger
	Observer  Observer
	// SyncApplied syncs what every state machine stored; it runs beside
	// the driver before applied indexes are recorded.
	SyncApplied func()
	// Live reports whether a node is a member now (a leader hands its
	// leadership only to live ones); nil: every node.
	Live func(node string) bool
	// Nodes names every node that may be a replica: a replica known to a
	// group only by its raft id (restored from the log, or in a snapshot)
	// is named from them.
	Nodes func() []string
	// Rank weighs node as the leader of group: when a leader's node goes
	// silent, the live voter of highest rank campaigns first (quiesce.go:
	// succeed). nil: a hash of both, which spreads the groups.
	Rank func(group, node string) uint64

	// Fine tuning.
	Tick          time.Duration // default 100ms
	ElectionTicks int           // default 10
	LogKeep       uint64        // applied entries kept for a replica behind; default 5000
	// LogKeepBytes bounds the data of those entries too, default 8 MiB:
	// they are kept in memory (raft's MemoryStorage) as well as on disk,
	// and 5000 entries of 1 MiB messages are 5 GB per group and node.
	LogKeepBytes int
	SyncEvery    time.Duration // default 500ms
	// InSyncLag is how many entries behind its leader a replica may be
	// and count as in sync; default 1000.
	InSyncLag uint64
}

// ID is the raft id of a node.
func ID(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	if x := h.Sum64(); x != 0 {
		return x
	}
	return 1
}

// Host runs the node's raft groups.
type Host struct {
	o   Options
	log *slog.Logger
	id  uint64

	mu     sync.Mutex
	groups map[string]*Group
	// leaving, once set, makes the driver hand leadership over to the
	// live replicas it reports.
	leaving func(string) bool

	inbox chan inbound
	wake  chan struct{}
	ctx   context.Context // of Run; nil before
	// copies bring back the copies sent to replicas that fell behind;
	// sending marks the replicas (group/node) a copy is on its way to
	// (driver goroutine).
	copies  chan copyResult
	sending map[string]bool
	changes chan confRequest
	// closes brings the groups the cluster closes here (Group.Close);
	// closed names those closed in this run (driver goroutine, and Open
	// under mu).
	closes chan *Group
	closed map[string]bool
	done   chan struct{} // closed when Run returns
	// appends are what groups asked to store and the log writer has not
	// started on; writing is set while it writes; toWrite and written
	// carry a write to the writer and back; writeErr, once set, is the
	// error that made the log unwritable (append.go; driver goroutine).
	appends  []appendReq
	writing  bool
	toWrite  chan logWrite
	written  chan logWrite
	writeErr error
	// checkpoints brings back the checkpoints run beside the driver;
	// checkpointing is set while one runs (driver goroutine).
	checkpoints   chan checkpointDone
	checkpointing bool
	// woken are the groups a state machine woke (Group.Wake, Group.Poke)
	// since the driver last looked; guarded by mu. dirty are the groups
	// the driver looks at next: stepped, ticked, woken, or with a Ready
	// left (driver goroutine). Looking at every group on every message
	// took most of an idle node's time with thousands of groups.
	woken []*Group
	dirty map[*Group]bool
	// awake are the groups that tick (driver goroutine); quiesced counts
	// the others (quiesce.go). pinged is the nodes pinged each tick
	// (driver goroutine); silent the nodes not heard from for an election
	// timeout (guarded by mu).
	awake map[*Group]bool
	// unsynced: the groups a checkpoint looks at, those not quiesced
	// with their applied index recorded since (driver goroutine);
	// checkpointN counts checkpoints, every sweepEvery-th of which looks
	// at every group all the same.
	unsynced    map[*Group]bool
	checkpointN int
	quiesced    atomic.Int64
	pinged      map[uint64]string
	pings       uint64 // ticks counted for pingEvery
	// peersChanged: a group opened, changed replicas or was dropped since
	// the nodes pinged were listed (guarded by mu).
	peersChanged bool
	silent       map[uint64]bool
	// run names this run of the host in its pings.
	run []byte

	// heardMu guards heard, when a message last came from each node, and
	// peerRun, the run of each peer's last ping: a ping is noted by the
	// goroutine that receives it, without waking the driver.
	heardMu sync.Mutex
	heard   map[uint64]time.Time
	peerRun map[uint64]string
}

type inbound struct {
	group string
	m     *rpb.Message
}

// New returns a host; Run drives it.
func New(o Options) *Host {
	if o.Tick <= 0 {
		o.Tick = 100 * time.Millisecond
	}
	if o.Rank == nil {
		o.Rank = func(group, node string) uint64 { return ID(group + "\x00" + node) }
	}
	if o.ElectionTicks <= 0 {
		o.ElectionTicks = 10
	}
	if o.LogKeep == 0 {
		o.LogKeep = 5000
	}
	if o.LogKeepBytes <= 0 {
		o.LogKeepBytes = 8 << 20
	}
	if o.SyncEvery <= 0 {
		o.SyncEvery = 500 * time.Millisecond
	}
	if o.InSyncLag == 0 {
		o.InSyncLag = 1000
	}
	if o.SyncApplied == nil {
		o.SyncApplied = func() {}
	}
	if o.Live == nil {
		o.Live = func(string) bool { return true }
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Host{o: o, log: log, id: ID(o.NodeID), groups: map[string]*Group{},
		inbox: make(chan inbound, 4096), wake: make(chan struct{}, 1),
		copies: make(chan copyResult, 64), sending: map[string]bool{}, changes: make(chan confRequest, 64),
		closes: make(chan *Group), closed: map[string]bool{}, done: make(chan struct{}),
		awake: map[*Group]bool{}, unsynced: map[*Group]bool{}, heard: map[uint64]time.Time{},
		run: binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano())), peerRun: map[uint64]string{},
		checkpoints: make(chan checkpointDone, 1), dirty: map[*Group]bool{},
		toWrite: make(chan logWrite, 1), written: make(chan logWrite, 1)}
}

// stopped is closed once Run returned.
func (h *Host) stopped() <-chan struct{} { return h.done }

// Poke wakes the driver.
func (h *Host) Poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// woke puts g on the list the driver looks at next.
func (h *Host) woke(g *Group) {
	if g.onList.Swap(true) {
		return
	}
	h.mu.Lock()
	h.woken = append(h.woken, g)
	h.mu.Unlock()
	h.Poke()
}

// changedGroup tells of a change of g (Group.Version).
func (h *Host) changedGroup(g *Group) {
	g.version.Add(1)
	h.changed()
}

func (h *Host) changed() {
	if f := h.o.Observer.Changed; f != nil {
		f()
	}
}

// Step hands a peer's message to its group; a group not open here drops
// it (raft sends again). Any goroutine; it blocks while the inbox is full
// and ctx lasts.
func (h *Host) Step(ctx context.Context, group string, m *rpb.Message) error {
	if group == pingGroup && !h.pingedBy(m) {
		return nil // noted; nothing for the driver
	}
	select {
	case h.inbox <- inbound{group, m}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Group returns the group named, nil when it is not open here.
func (h *Host) Group(name string) *Group {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.groups[name]
}

// all returns the open groups.
func (h *Host) all() []*Group {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Group, 0, len(h.groups))
	for _, g := range h.groups {
		out = append(out, g)
	}
	return out
}

// Open starts group name on this node, from its stored state, or, new,
// over replicas, whose raft ids are those in ids or else ID(node) (ids.go;
// a node added to the group finds its own there); it returns the group
// open already if there is one. A stored group keeps the ids it stored.
func (h *Host) Open(name string, replicas []string, ids map[string]uint64, sm StateMachine) (*Group, error) {
	if g := h.Group(name); g != nil {
		return g, nil
	}
	st, err := h.o.Store.Load(name)
	if err != nil {
		return nil, err
	}
	ms := raft.NewMemoryStorage()
	idOf := func(node string) uint64 {
		if id, ok := ids[node]; ok && id != 0 {
			return id
		}
		return ID(node)
	}
	voters := make([]uint64, len(replicas))
	nodes := map[uint64]string{}
	for i, r := range replicas {
		voters[i] = idOf(r)
		nodes[voters[i]] = r
	}
	self := idOf(h.o.NodeID)
	nodes[self] = h.o.NodeID
	applied := uint64(0)
	var conf *rpb.ConfState
	fresh := st.Snapshot == nil && st.HardState == nil
	if fresh {
		// New: an initial state every replica shares, as if a snapshot
		// of nothing at index 1 had been applied.
		meta := &rpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: &rpb.ConfState{Voters: voters}}
		hs := &rpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(1)}
		if err := ms.ApplySnapshot(&rpb.Snapshot{Metadata: meta}); err != nil {
			return nil, err
		}
		if err := ms.SetHardState(hs); err != nil {
			return nil, err
		}
		if err := h.o.Store.Save([]Write{{Group: name, HardState: hs, ConfState: meta.ConfState, Applied: 1, Meta: encodeMembers(self, nodes)}}, true); err != nil {
			return nil, err
		}
		if err := h.o.Store.Compact(name, 1, 1); err != nil {
			return nil, err
		}
		applied = 1
	} else {
		self, nodes = ID(h.o.NodeID), map[uint64]string{}
		if len(st.Meta) > 0 {
			s, stored, err := decodeMembers(st.Meta)
			if err != nil {
				return nil, fmt.Errorf("multiraft: group %s: %w", name, err)
			}
			self, nodes = s, stored
		}
		// Without stored members (a group stored before they were), the
		// ids are ID(node): of the replicas named, and of the others
		// (Group.node).
		for i, r := range replicas {
			if _, known := nodes[voters[i]]; !known && voters[i] == ID(r) {
				nodes[voters[i]] = r
			}
		}
		meta := st.Snapshot
		if meta == nil {
			meta = &rpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1)}
		}
		meta.ConfState = st.ConfState
		if meta.ConfState == nil {
			meta.ConfState = &rpb.ConfState{Voters: voters}
		}
		conf = meta.ConfState
		if err := ms.ApplySnapshot(&rpb.Snapshot{Metadata: meta}); err != nil {
			return nil, err
		}
		if st.HardState != nil {
			if err := ms.SetHardState(st.HardState); err != nil {
				return nil, err
			}
		}
		if err := ms.Append(st.Entries); err != nil {
			return nil, err
		}
		last, _ := ms.LastIndex()
		if hs := st.HardState; hs != nil {
			// A commit index is stored only beside entries or a vote
			// (append.go): what this replica applied was committed, and
			// its log holds it.
			if c := min(max(st.Applied, meta.GetIndex()), last); c > hs.GetCommit() {
				hs.Commit = proto.Uint64(c)
				if err := ms.SetHardState(hs); err != nil {
					return nil, err
				}
			}
		}
		if hs := st.HardState; hs != nil && hs.GetCommit() > last {
			// Only a salvaged log lacks entries its commit names.
			h.log.Warn("raft group's commit index is past its log; it starts from its log", "group", name, "commit", hs.GetCommit(), "last", last)
			hs.Commit = proto.Uint64(last)
			if err := ms.SetHardState(hs); err != nil {
				return nil, err
			}
		}
		applied = max(st.Applied, meta.GetIndex())
		if st.HardState != nil && applied > st.HardState.GetCommit() {
			applied = st.HardState.GetCommit()
		}
	}
	recovering := h.recoveringAtOpen(st)
	h.mu.Lock()
	if fresh && h.closed[name] && slices.Contains(replicas, h.o.NodeID) {
		// Closed here in this run, named a voter again with an empty log:
		// the records this node was closed by were stale, and it may have
		// acknowledged entries it no longer has.
		recovering = true
	}
	h.mu.Unlock()
	if recovering {
		yes := true
		if err := h.o.Store.Save([]Write{{Group: name, Recovering: &yes}}, true); err != nil {
			return nil, err
		}
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID: self, ElectionTick: h.o.ElectionTicks, HeartbeatTick: 1,
		Storage: ms, Applied: applied, MaxSizePerMsg: 4 << 20, MaxInflightMsgs: 256, AsyncStorageWrites: true,
		CheckQuorum: true, PreVote: true, Logger: raftLogger{h.log},
		// A follower drops a proposal rather than forward it: one made
		// by a replica that has just stepped down would reach the new
		// leader's log, made from a state that leader has moved past.
		DisableProposalForwarding: true,
	})
	if err != nil {
		return nil, fmt.Errorf("multiraft: group %s: %w", name, err)
	}
	g := &Group{h: h, name: name, sm: sm, rn: rn, ms: ms, replicas: replicas, nodes: nodes, self: self, ids: map[string]uint64{},
		campaign: fresh && !recovering && len(replicas) > 0 && replicas[0] == h.o.NodeID,
		synced:   applied}
	if fresh {
		for i, r := range replicas {
			g.ids[r] = voters[i]
		}
	} else {
		// Its replicas as its log has them.
		g.setConf(conf)
	}
	g.recovering.Store(recovering)
	sm.Bind(g)
	h.mu.Lock()
	if existing := h.groups[name]; existing != nil {
		h.mu.Unlock()
		return existing, nil
	}
	h.groups[name] = g
	h.peersChanged = true
	h.mu.Unlock()
	if recovering {
		if f := h.o.Observer.Recovering; f != nil {
			f(1)
		}
		h.log.Warn("raft group starts recovering: it takes no part in elections until a leader has given it back every committed entry", "group", name)
	}
	h.woke(g)
	return g, nil
}

// Run is the driver goroutine; it returns when ctx ends.
func (h *Host) Run(ctx context.Context) {
	h.mu.Lock()
	h.ctx = ctx
	h.mu.Unlock()
	defer close(h.done)
	go h.writeLoop(ctx)
	tick := time.NewTicker(h.o.Tick)
	defer tick.Stop()
	sync := time.NewTicker(h.o.SyncEvery)
	defer sync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			h.ping(now)
			for g := range h.awake {
				// Before its tick, which has a leader heartbeat.
				if h.maybeQuiesce(g) {
					continue
				}
				g.rn.Tick()
				h.progress(g)
				h.dirty[g] = true
			}
		case <-sync.C:
			h.checkpoint(ctx)
		case c := <-h.checkpoints:
			h.checkpointed(c)
		case d := <-h.written:
			h.appended(d)
		case r := <-h.copies:
			h.copyDone(r)
		case r := <-h.changes:
			h.proposeChange(r)
		case g := <-h.closes:
			if h.Group(g.name) == g {
				h.mu.Lock()
				h.closed[g.name] = true
				h.mu.Unlock()
				h.drop(g, "the cluster no longer names this node a replica")
			}
		case m := <-h.inbox:
			h.step(m)
			for drained := false; !drained; {
				select {
				case m := <-h.inbox:
					h.step(m)
				default:
					drained = true
				}
			}
		case <-h.wake:
		}
		h.transfer()
		h.mu.Lock()
		woken := h.woken
		h.woken = nil
		h.mu.Unlock()
		for _, g := range woken {
			g.onList.Store(false)
			h.dirty[g] = true
			h.awaken(g)
		}
		for g := range h.dirty {
			if g.campaign {
				// The group's first replica (its creator's choice) leads a
				// new group without waiting.
				g.campaign = false
				_ = g.rn.Campaign()
			}
			if g.wanted.Swap(false) {
				g.sm.Propose()
			}
		}
		// A Ready can leave another at once (what it applied answered):
		// go on until none is left.
		for i := 0; i < 8 && h.ready(); i++ {
		}
		h.startWrite()
		for g := range h.dirty {
			// The state machine may have stored more since its last Ready.
			h.updateCaughtUp(g)
			if !g.rn.HasReady() {
				delete(h.dirty, g)
			}
		}
	}
}

func (h *Host) step(in inbound) {
	m := in.m
	if in.group == pingGroup {
		h.peerRestarted(m.GetFrom())
		return
	}
	g := h.Group(in.group)
	if g == nil {
		return // not open here yet: raft sends again
	}
	if name := g.node(m.GetFrom()); name != "" {
		h.heardFrom(ID(name))
	}
	if m.GetTo() != g.self {
		// To a replica this node was before it was removed from the
		// group and added again (ids.go).
		return
	}
	if !h.stepQuiesced(g, m) || !h.screen(g, m) {
		return
	}
	if m.GetType() == rpb.MessageType_MsgHeartbeat {
		// A leader never commits past what a replica acknowledged: a
		// heartbeat beyond this log was sent before the replica was
		// removed and added again with an empty log. Dropped; the
		// leader's next ones match.
		if last, err := g.ms.LastIndex(); err == nil && m.GetCommit() > last {
			return
		}
	}
	h.lostEntries(g, m)
	_ = g.rn.Step(m)
	h.stepped(g, m)
	h.dirty[g] = true
}

// ready takes what every group has ready; it reports whether there was
// anything. Raft runs with asynchronous storage writes: what is to be
// stored goes to the log writer (append.go), which runs beside the
// driver, so that a group's messages, commits and applies never wait for
// another's fsync; what is to be applied is applied here, at once (raft
// hands over only entries this node's log holds durably); messages to
// other replicas go out at once (those that must wait for the disk come
// back with the write).
func (h *Host) ready() bool {
	any := false
	for g := range h.dirty {
		if g.removed || !g.rn.HasReady() {
			continue
		}
		any = true
		rd := g.rn.Ready()
		out := rd.Messages[:0:0]
		for _, m := range rd.Messages {
			switch m.GetTo() {
			case raft.LocalAppendThread:
				h.queueAppend(g, m)
			case raft.LocalApplyThread:
				h.apply(g, m.GetEntries())
				h.deliver(g, m.GetResponses())
			default:
				out = append(out, m)
			}
		}
		h.send(g, out)
		if rd.SoftState != nil {
			h.softState(g, rd.SoftState)
		}
		h.updateCaughtUp(g)
		h.checkRecovered(g)
	}
	return any
}

// deliver steps the messages raft addressed to this replica and sends the
// others (driver goroutine).
func (h *Host) deliver(g *Group, msgs []*rpb.Message) {
	var out []*rpb.Message
	for _, m := range msgs {
		if m.GetTo() == g.self {
			_ = g.rn.Step(m)
			h.dirty[g] = true
			continue
		}
		out = append(out, m)
	}
	h.send(g, out)
}

// apply hands committed entries to the state machine, and applies the
// replica changes among them.
func (h *Host) apply(g *Group, ents []*rpb.Entry) {
	if len(ents) == 0 {
		return
	}
	g.sm.Apply(ents)
	for _, e := range ents {
		if e.GetType() == rpb.EntryType_EntryConfChange && h.applyChange(g, e) {
			return // removed: the group ends here
		}
	}
}

func (h *Host) softState(g *Group, ss *raft.SoftState) {
	lead := ""
	if ss.Lead != raft.None {
		lead = g.node(ss.Lead)
	}
	g.lead.Store(&lead)
	leader := ss.RaftState == raft.StateLeader
	if leader == g.leader {
		return
	}
	g.leader = leader
	if leader {
		g.leaderTerm.Store(g.rn.BasicStatus().GetTerm())
		g.leaderSince.Store(time.Now().UnixNano())
	}
	g.isLeader.Store(leader)
	if !leader {
		g.caughtUp.Store(false)
	}
	g.sm.LeaderChanged(leader)
	h.log.Info("raft leadership", "group", g.name, "leader", leader, "term", g.rn.BasicStatus().GetTerm())
	if f := h.o.Observer.LeaderChanged; f != nil {
		f(g.name, leader)
	}
	h.changedGroup(g)
}

// updateCaughtUp records whether this leader stores every committed entry.
func (h *Host) updateCaughtUp(g *Group) {
	if !g.leader || g.caughtUp.Load() {
		// Once caught up in its term, a leader stays so: what commits
		// later is its own.
		return
	}
	st := g.rn.BasicStatus()
	commit := st.GetCommit()
	term, err := g.ms.Term(commit)
	if err == nil && term == st.GetTerm() && g.sm.Stored() >= commit {
		g.caughtUp.Store(true)
		h.changedGroup(g)
	}
}

// progress records which replicas are in sync with this leader, and their
// lag.
func (h *Host) progress(g *Group) {
	obs := h.o.Observer
	// Two slices in turn: no allocation per tick.
	lagged := g.lagged
	g.lagged, g.laggedBefore = g.laggedBefore[:0], lagged
	if !g.leader {
		h.mu.Lock()
		g.inSync, g.upToDate = nil, nil
		h.mu.Unlock()
		if obs.LagGone != nil {
			for _, node := range lagged {
				obs.LagGone(g.name, node)
			}
		}
		return
	}
	last, _ := g.ms.LastIndex()
	commit := g.rn.BasicStatus().GetCommit()
	var in, upToDate []string
	g.watchTick++
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		node := g.node(id)
		lag := uint64(0)
		if last > pr.Match {
			lag = last - pr.Match
		}
		if id == g.self {
			lag = 0
		}
		active, stuck := true, false
		if id != g.self {
			active, stuck = g.watch(id, pr, lag, 2*h.o.ElectionTicks)
		}
		if lag <= h.o.InSyncLag && active && !stuck {
			in = append(in, node)
		}
		if id == g.self || active && !stuck && pr.Match+upToDateSlack >= commit {
			upToDate = append(upToDate, node)
		}
		if obs.Lag != nil {
			obs.Lag(g.name, node, lag)
		}
		g.lagged = append(g.lagged, node)
	})
	// Replicas removed since the last tick are forgotten, and lose their
	// series.
	for id, w := range g.watched {
		if w.tick != g.watchTick {
			delete(g.watched, id)
		}
	}
	if obs.LagGone != nil {
		for _, node := range lagged {
			if !slices.Contains(g.lagged, node) {
				obs.LagGone(g.name, node)
			}
		}
	}
	slices.Sort(in)
	slices.Sort(upToDate)
	h.mu.Lock()
	g.inSync, g.upToDate = in, upToDate
	h.mu.Unlock()
}

// upToDateSlack is how many committed entries a replica may lack and be
// up to date: those in flight to it.
const upToDateSlack = 8

// watched is what a leader saw of a replica at its last tick.
type watched struct {
	active bool   // raft's RecentActive
	match  uint64 // where the replica's log stood
	still  int    // ticks its log stood there lacking entries
	tick   uint64 // Group.watchTick when last seen: replicas removed go
}

// watch tells, at a tick of the leader, whether replica id is active and
// whether its log is stuck (driver goroutine). Active: raft heard from it
// within an election timeout. raft forgets that at every election
// timeout (CheckQuorum) and learns it again with the next answer, so a
// replica is taken for inactive only when raft found it so at two ticks
// in a row, not for the tick after each timeout. Stuck: its log, at match
// and lag entries behind the leader's, has not moved for limit ticks
// while it lacked entries. Such a replica answers heartbeats, which need
// no disk, but stores nothing: its disk hangs or fails. It is not in sync
// however few entries it lacks, so that the leadership is not handed to
// it (a transfer waits for its log to match, and the leader takes no
// proposal meanwhile) and no quorum is counted on it.
func (g *Group) watch(id uint64, pr tracker.Progress, lag uint64, limit int) (active, stuck bool) {
	w, seen := g.watched[id]
	active = pr.RecentActive || seen && w.active
	if lag == 0 || pr.Match != w.match {
		w.match, w.still = pr.Match, 0
	} else {
		w.still++
	}
	w.active, w.tick = pr.RecentActive, g.watchTick
	if g.watched == nil {
		g.watched = map[uint64]watched{}
	}
	g.watched[id] = w
	return active, w.still >= limit
}

// send hands messages to the transport.
func (h *Host) send(g *Group, msgs []*rpb.Message) {
	for _, m := range msgs {
		node := g.node(m.GetTo())
		if node == "" {
			continue
		}
		if m.GetType() == rpb.MessageType_MsgSnap {
			h.sendCopy(g, node, m)
			continue
		}
		if g.recovering.Load() && (m.GetType() == rpb.MessageType_MsgPreVote || m.GetType() == rpb.MessageType_MsgVote) {
			continue // asks for no votes (recovery.go)
		}
		if h.o.Transport == nil || !h.o.Transport.Send(node, g.name, m) {
			g.rn.ReportUnreachable(m.GetTo())
		}
	}
}

// checkpoint syncs what the state machines stored so far and records the
// applied index of each group, then compacts their logs.
// sweepEvery: every sweepEvery-th checkpoint looks at every group, not
// only those it knows changed.
const sweepEvery = 20

func (h *Host) checkpoint(ctx context.Context) {
	if h.checkpointing {
		return
	}
	var gs []*Group
	var stored []uint64
	var ws []Write
	look := h.unsynced
	if h.checkpointN++; h.checkpointN%sweepEvery == 0 {
		look = map[*Group]bool{}
		for _, g := range h.all() {
			look[g] = true
		}
	}
	for g := range look {
		if g.quiesced.Load() && g.quietSynced || g.removed {
			delete(h.unsynced, g)
			continue // nothing stored since its last checkpoint
		}
		s := g.sm.Stored()
		gs, stored = append(gs, g), append(stored, s)
		if s > g.synced {
			ws = append(ws, Write{Group: g.name, Applied: s})
		}
	}
	if len(ws) == 0 {
		for i, g := range gs {
			g.quietSynced = g.quiesced.Load() && g.synced >= stored[i]
		}
		return
	}
	// The syncs run beside the driver: a sync of the state machines'
	// storage takes milliseconds, and the driver's commits wait for
	// nothing of it.
	h.checkpointing = true
	go func() {
		h.o.SyncApplied()
		var err error
		if len(ws) > 0 {
			err = h.o.Store.Save(ws, true)
		}
		select {
		case h.checkpoints <- checkpointDone{gs: gs, stored: stored, err: err}:
		case <-ctx.Done():
		}
	}()
}

type checkpointDone struct {
	gs     []*Group
	stored []uint64
	err    error
}

// checkpointed records a checkpoint and compacts; on the driver goroutine.
func (h *Host) checkpointed(c checkpointDone) {
	h.checkpointing = false
	if c.err != nil {
		h.log.Warn("recording applied raft indexes", "err", c.err)
		return
	}
	for i, g := range c.gs {
		g.synced = max(g.synced, c.stored[i])
		h.compact(g)
		g.quietSynced = g.quiesced.Load() && g.synced >= c.stored[i]
	}
}

// compact drops the entries this node applied and synced but the last
// LogKeep, kept for a replica that comes back (one further behind gets a
// copy). Of those it keeps LogKeepBytes of data, more on a leader for a
// replica it heard from lately that lacks them (a follower a little
// behind would otherwise get a copy of the whole partition), but never
// more than lagKeep times that.
func (h *Host) compact(g *Group) {
	// Never past what raft applied in this run: a state machine may store
	// more than the applied index recorded before a restart, which raft
	// applies again from (the stored commit index may lag, append.go).
	applied := min(g.synced, g.rn.BasicStatus().Applied)
	upTo := applied - min(applied, h.o.LogKeep)
	if first, err := g.ms.FirstIndex(); err == nil && first <= applied {
		if ents, err := g.ms.Entries(max(first, upTo+1), applied+1, math.MaxUint64); err == nil {
			var bytesAt, lagAt uint64 // the newest entries past each bound
			size := 0
			for i := len(ents) - 1; i >= 0 && lagAt == 0; i-- {
				size += len(ents[i].GetData())
				if size > h.o.LogKeepBytes && bytesAt == 0 {
					bytesAt = ents[i].GetIndex()
				}
				if size > lagKeep*h.o.LogKeepBytes {
					lagAt = ents[i].GetIndex()
				}
			}
			if g.leader {
				now := time.Now()
				g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
					if id != g.self && pr.Match < bytesAt && h.heardLately(g.node(id), now) {
						bytesAt = pr.Match
					}
				})
			}
			upTo = max(upTo, bytesAt, lagAt)
		}
	}
	if upTo == 0 || upTo <= g.compacted {
		return
	}
	term, err := g.ms.Term(upTo)
	if err != nil {
		return
	}
	// The point a replica behind it is sent a copy for.
	if _, err := g.ms.CreateSnapshot(upTo, g.confState(), encodeMembers(0, g.nodes)); err != nil {
		return
	}
	if err := g.ms.Compact(upTo); err != nil {
		return
	}
	if err := h.o.Store.Compact(g.name, upTo, term); err != nil {
		h.log.Warn("compacting a raft log", "group", g.name, "err", err)
		return
	}
	g.compacted = upTo
}

// lagKeep is how many times LogKeepBytes a leader keeps at most for a
// replica it heard from lately that lacks them.
const lagKeep = 4

// TransferAll asks the driver to hand every group this node leads to
// another replica that live accepts (the node is leaving).
func (h *Host) TransferAll(live func(string) bool) {
	h.mu.Lock()
	h.leaving = live
	h.mu.Unlock()
	h.Poke()
}

// StopTransfers ends what TransferAll started.
func (h *Host) StopTransfers() {
	h.mu.Lock()
	h.leaving = nil
	h.mu.Unlock()
}

// transfer hands the groups this node leads to other live replicas; on
// the driver goroutine.
func (h *Host) transfer() {
	h.mu.Lock()
	live := h.leaving
	h.mu.Unlock()
	if h.writeErr != nil {
		// This node's raft log takes no write: it commits nothing more,
		// and another replica must lead (append.go).
		live = h.o.Live
	}
	if live == nil {
		return
	}
	for _, g := range h.all() {
		if !g.leader || g.rn.BasicStatus().LeadTransferee != 0 {
			continue
		}
		for _, r := range g.replicas {
			if r != h.o.NodeID && live(r) {
				h.awaken(g)
				g.rn.TransferLeader(g.idOf(r))
				h.dirty[g] = true
				break
			}
		}
	}
}

// raftLogger sends raft's log to the host's, warnings and up.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(...any)                {}
func (r raftLogger) Debugf(string, ...any)       {}
func (r raftLogger) Info(...any)                 {}
func (r raftLogger) Infof(string, ...any)        {}
func (r raftLogger) Warning(v ...any)            { r.l.Warn(fmt.Sprint(v...), "component", "raft") }
func (r raftLogger) Warningf(f string, v ...any) { r.l.Warn(fmt.Sprintf(f, v...), "component", "raft") }
func (r raftLogger) Error(v ...any)              { r.l.Warn(fmt.Sprint(v...), "component", "raft") }
func (r raftLogger) Errorf(f string, v ...any)   { r.l.Warn(fmt.Sprintf(f, v...), "component", "raft") }
func (r raftLogger) Fatal(v ...any)              { panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(f string, v ...any)   { panic(fmt.Sprintf(f, v...)) }
func (r raftLogger) Panic(v ...any)              { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(f string, v ...any)   { panic(fmt.Sprintf(f, v...)) }

// ErrNotLeader is Propose's error on a replica that does not lead.
var ErrNotLeader = errors.New("multiraft: not the group's leader")
