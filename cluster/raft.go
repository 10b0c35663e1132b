package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	rpb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// Replication: a partition with a replication factor above 1 (with its
// dead-letter partition) is a raft group over its replicas, fixed when the
// partition is first claimed. Every write the queue makes to its log is
// proposed to the group, many per entry; every replica applies committed
// entries in order to its local storage. The raft leader is the owner: it
// records itself in etcd with the next epoch once it has applied every
// entry committed before its term, and then serves the partition. A
// publish is acknowledged once its entry is committed (on disk on a
// majority) and applied on the leader.
//
// One driver goroutine runs every group of the node: it ticks them,
// steps the messages peers send, proposes, and handles their Ready
// together, so that one fsync of the raft log covers every group's
// entries.

// RaftStore keeps the raft log of the node's groups (storage/raftlog).
type RaftStore interface {
	Load(group string) (RaftState, error)
	// Save stores many groups' writes with one write; with sync, durably
	// when it returns, else with the next synced Save.
	Save(ws []RaftWrite, sync bool) error
	Compact(group string, index, term uint64) error
	Drop(group string) error
	// Recovering reports that the store was salvaged after damage and
	// Recovered was not called since: a group it holds nothing of may
	// have lost what it acknowledged.
	Recovering() bool
	Recovered() error
	// MarkRecovering makes Recovering true, durably.
	MarkRecovering(why string) error
	// Groups names the groups with stored state.
	Groups() ([]string, error)
}

// RaftState is what is stored of a group.
type RaftState struct {
	HardState *rpb.HardState
	ConfState *rpb.ConfState
	Snapshot  *rpb.SnapshotMetadata
	Entries   []*rpb.Entry
	Applied   uint64
	Meta      []byte
	// Recovering: the group lost entries it acknowledged (recovery.go).
	Recovering bool
}

// RaftWrite is what one Ready of a group stores.
type RaftWrite struct {
	Group     string
	HardState *rpb.HardState
	ConfState *rpb.ConfState
	Entries   []*rpb.Entry
	Applied   uint64
	Meta      []byte
	// Recovering, when set, stores whether the group is recovering.
	Recovering *bool
}

const (
	raftTick      = 100 * time.Millisecond
	electionTicks = 10 // one second
	// raftProposalTimeout fails a proposal not applied by then.
	raftProposalTimeout = 10 * time.Second
	// raftSyncEvery is how often the applied writes are synced and the
	// applied index recorded.
	raftSyncEvery = 500 * time.Millisecond
)

// raftID is the raft id of a node.
func raftID(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	if x := h.Sum64(); x != 0 {
		return x
	}
	return 1
}

func groupName(id queue.PartitionID) string { return id.String() }

// raftHost runs the node's raft groups.
type raftHost struct {
	n     *Node
	store RaftStore
	logs  queue.Logs // the node's local logs, under the raft logs

	mu       sync.Mutex
	groups   map[string]*rgroup
	partLogs map[queue.PartitionID]*raftLog
	senders  map[string]*raftSender

	inbox  chan *pb.RaftMessage
	wake   chan struct{}
	nextID atomic.Uint64
	// snaps are the copies sent to replicas that fell behind, as they end;
	// sending marks the replicas (group/node) a copy is on its way to.
	snaps   chan snapResult
	sending map[string]bool
	// changes are replica changes the reconcile loop asks for.
	changes chan confRequest
	// checkpoints brings back the checkpoints run beside the driver;
	// checkpointing is set while one runs (driver goroutine).
	checkpoints   chan checkpointDone
	checkpointing bool
	// leaving, once set, makes the driver hand leadership over to the
	// live replicas it reports. Guarded by mu.
	leaving func(string) bool
	// token names this run of the node in the entries it proposes, so
	// that an entry of an earlier run is never taken for one of this run;
	// entrySeq numbers them (driver goroutine).
	token    uint64
	entrySeq uint64
}

func newRaftHost(n *Node, store RaftStore) *raftHost {
	return &raftHost{n: n, store: store, groups: map[string]*rgroup{}, partLogs: map[queue.PartitionID]*raftLog{},
		senders: map[string]*raftSender{}, inbox: make(chan *pb.RaftMessage, 4096), wake: make(chan struct{}, 1),
		snaps: make(chan snapResult, 64), sending: map[string]bool{}, changes: make(chan confRequest, 64), checkpoints: make(chan checkpointDone, 1),
		token: uint64(time.Now().UnixNano()) ^ raftID(n.opts.NodeID)}
}

func (h *raftHost) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// rgroup is one partition's raft group on this node.
type rgroup struct {
	name     string
	id       queue.PartitionID
	rn       *raft.RawNode
	ms       *raft.MemoryStorage
	replicas []string
	nodes    map[uint64]string

	// Guarded by raftHost.mu.
	pending  []*proposal
	inflight map[uint64]*proposal
	// proposed holds the proposals of each entry this leader proposed,
	// by its number, until it is applied.
	proposed map[uint64][]*proposal

	// Guarded by raftHost.mu: the entries handed to storage and not yet
	// stored; every entry up to stored is stored locally.
	applying []applyMark
	stored   uint64

	// Driver goroutine only.
	leader bool
	// hsTerm and hsVote are the term and vote last written to the log.
	hsTerm, hsVote uint64
	synced         uint64 // applied index last recorded
	compacted      uint64
	// lagged: the replicas whose lag series this leader set last tick.
	lagged, laggedBefore []string

	// inSync: the replicas within raftInSyncLag entries of the leader's
	// log, as the leader saw them at its last tick (nil: not the leader).
	// Guarded by raftHost.mu.
	inSync []string

	// caughtUp: leader, and every entry committed before its term is
	// stored here. Read by the reconcile loop.
	caughtUp atomic.Bool
	isLeader atomic.Bool
	// campaign: a new group whose first replica is this node, which
	// starts an election at once rather than after a timeout (driver
	// goroutine).
	campaign bool
	// recovering: this replica's log lost entries; it takes no part in
	// elections until recoverTo, what its leader had committed when first
	// heard from, is committed here too (recovery.go). recoverTo is the
	// driver goroutine's.
	recovering atomic.Bool
	recoverTo  uint64

	// leaderTerm is the term this node leads in (while isLeader);
	// servedTerm the term the partition was last acquired in here.
	leaderTerm atomic.Uint64
	servedTerm atomic.Uint64
	// leaderSince: when this node became the leader (monoNow); handedAt:
	// when it last asked to hand the leadership to the preferred replica.
	leaderSince atomic.Int64
	handedAt    atomic.Int64
}

type applyMark struct {
	index   uint64
	pending int
}

type proposal struct {
	log   *raftLog
	epoch uint64
	msg   *queue.Message
	state *queue.Batch
	done  func(error)
	id    uint64
	at    time.Time
	// early: ack_policy leader, acknowledged once on this leader's disk;
	// persisted and acked record that it was (guarded by raftHost.mu).
	early     bool
	persisted bool
	acked     bool
}

// ensureGroup starts the group of partition id on this node, from its
// stored state, or new with replicas as its voters.
func (h *raftHost) ensureGroup(id queue.PartitionID, replicas []string) (*rgroup, error) {
	name := groupName(id)
	h.mu.Lock()
	g := h.groups[name]
	h.mu.Unlock()
	if g != nil {
		return g, nil
	}
	st, err := h.store.Load(name)
	if err != nil {
		return nil, err
	}
	ms := raft.NewMemoryStorage()
	voters := make([]uint64, len(replicas))
	nodes := map[uint64]string{}
	for i, r := range replicas {
		voters[i] = raftID(r)
		nodes[voters[i]] = r
	}
	applied := uint64(0)
	fresh := st.Snapshot == nil && st.HardState == nil
	if fresh {
		// New: an initial state every replica shares, as if a snapshot
		// of an empty partition at index 1 had been applied.
		meta := &rpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: &rpb.ConfState{Voters: voters}}
		hs := &rpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(1)}
		if err := ms.ApplySnapshot(&rpb.Snapshot{Metadata: meta}); err != nil {
			return nil, err
		}
		if err := ms.SetHardState(hs); err != nil {
			return nil, err
		}
		if err := h.store.Save([]RaftWrite{{Group: name, HardState: hs, ConfState: meta.ConfState, Applied: 1}}, true); err != nil {
			return nil, err
		}
		if err := h.store.Compact(name, 1, 1); err != nil {
			return nil, err
		}
		applied = 1
	} else {
		meta := st.Snapshot
		if meta == nil {
			meta = &rpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1)}
		}
		meta.ConfState = st.ConfState
		if meta.ConfState == nil {
			meta.ConfState = &rpb.ConfState{Voters: voters}
		}
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
		if hs := st.HardState; hs != nil && hs.GetCommit() > last {
			// Only a salvaged log lacks entries its commit names.
			h.n.log.Warn("raft group's commit index is past its log; it starts from its log", "group", name, "commit", hs.GetCommit(), "last", last)
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
	if recovering {
		yes := true
		if err := h.store.Save([]RaftWrite{{Group: name, Recovering: &yes}}, true); err != nil {
			return nil, err
		}
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID: raftID(h.n.opts.NodeID), ElectionTick: electionTicks, HeartbeatTick: 1,
		Storage: ms, Applied: applied, MaxSizePerMsg: 4 << 20, MaxInflightMsgs: 256,
		CheckQuorum: true, PreVote: true, Logger: raftLogger{h.n.log},
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: raft group %s: %w", name, err)
	}
	g = &rgroup{name: name, id: id, rn: rn, ms: ms, replicas: replicas, nodes: nodes, inflight: map[uint64]*proposal{},
		proposed: map[uint64][]*proposal{}, campaign: fresh && !recovering && len(replicas) > 0 && replicas[0] == h.n.opts.NodeID,
		stored: applied, synced: applied}
	g.recovering.Store(recovering)
	h.mu.Lock()
	if existing := h.groups[name]; existing != nil {
		h.mu.Unlock()
		return existing, nil
	}
	h.groups[name] = g
	h.mu.Unlock()
	if recovering {
		h.n.Metrics().recovering.Inc()
		h.n.log.Warn("raft group starts recovering: it takes no part in elections until a leader has given it back every committed entry", "group", name)
	}
	h.poke()
	return g, nil
}

func (h *raftHost) group(name string) *rgroup {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.groups[name]
}

// run is the driver goroutine.
func (h *raftHost) run(ctx context.Context) {
	tick := time.NewTicker(raftTick)
	defer tick.Stop()
	sync := time.NewTicker(raftSyncEvery)
	defer sync.Stop()
	for {
		select {
		case <-ctx.Done():
			h.failAll(queue.ErrClosed)
			return
		case <-tick.C:
			for _, g := range h.all() {
				g.rn.Tick()
				h.progress(g)
			}
			h.expire()
		case <-sync.C:
			h.checkpoint()
		case c := <-h.checkpoints:
			h.checkpointed(c)
		case r := <-h.snaps:
			h.snapDone(r)
		case r := <-h.changes:
			h.proposeChange(r)
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
		for _, g := range h.all() {
			if g.campaign {
				// The partition's first replica (the creator's choice, the
				// best-scored node) leads a new group without waiting.
				g.campaign = false
				_ = g.rn.Campaign()
			}
		}
		h.propose()
		// A Ready can leave another at once (a group of one voter commits
		// what it just stored): go on until none is left.
		for i := 0; i < 8 && h.ready(); i++ {
		}
	}
}

func (h *raftHost) all() []*rgroup {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*rgroup, 0, len(h.groups))
	for _, g := range h.groups {
		out = append(out, g)
	}
	return out
}

func (h *raftHost) step(w *pb.RaftMessage) {
	g := h.group(w.Group)
	if g == nil {
		return // not started here yet: raft sends again
	}
	m := new(rpb.Message)
	if err := proto.Unmarshal(w.Message, m); err != nil {
		h.n.log.Warn("raft message undecodable", "group", w.Group, "err", err)
		return
	}
	if !h.screen(g, m) {
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
}

// propose packs each leader group's pending writes into one entry.
func (h *raftHost) propose() {
	h.mu.Lock()
	var work []*rgroup
	for _, g := range h.groups {
		if len(g.pending) > 0 {
			work = append(work, g)
		}
	}
	h.mu.Unlock()
	for _, g := range work {
		h.mu.Lock()
		ps := g.pending
		g.pending = nil
		h.mu.Unlock()
		if !g.leader {
			h.fail(ps, notLeader(g))
			continue
		}
		e := &pb.RaftEntry{}
		for _, p := range ps {
			w := toLogWrite(p.log.id, p.epoch, p.msg, p.state)
			e.Writes = append(e.Writes, w)
		}
		h.entrySeq++
		seq := h.entrySeq
		data := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{entryTag}, h.token), seq)
		data, err := proto.MarshalOptions{}.MarshalAppend(data, e)
		if err == nil {
			err = g.rn.Propose(data)
		}
		if err != nil {
			h.fail(ps, fmt.Errorf("%w: %s: %v", queue.ErrNotOwned, g.name, err))
			continue
		}
		h.mu.Lock()
		for _, p := range ps {
			g.inflight[p.id] = p
		}
		g.proposed[seq] = ps
		h.mu.Unlock()
	}
}

func notLeader(g *rgroup) error {
	return fmt.Errorf("%w: %s: this node is not its leader", queue.ErrNotOwned, g.name)
}

// ready stores, sends and applies what every group has ready; it reports
// whether there was anything.
func (h *raftHost) ready() bool {
	type item struct {
		g             *rgroup
		rd            raft.Ready
		sent, applied bool
	}
	var items []item
	var writes []RaftWrite
	sync := false // only new entries, terms and votes need the disk now
	for _, g := range h.all() {
		if !g.rn.HasReady() {
			continue
		}
		rd := g.rn.Ready()
		it := item{g: g, rd: rd}
		w := RaftWrite{Group: g.name, Entries: rd.Entries}
		hs := rd.HardState
		if hs != nil && !raft.IsEmptyHardState(hs) {
			w.HardState = hs
		}
		// A leader's appends go out while its own log is written: the
		// answers are read after the write, so nothing commits before the
		// leader's disk has it too. Not so when its term or vote changed.
		if g.leader && (w.HardState == nil || (hs.GetTerm() == g.hsTerm && hs.GetVote() == g.hsVote)) {
			h.send(g, rd.Messages)
			it.sent = true
		}
		if w.HardState != nil {
			g.hsTerm, g.hsVote = hs.GetTerm(), hs.GetVote()
		}
		items = append(items, it)
		if w.HardState != nil || len(w.Entries) > 0 {
			writes = append(writes, w)
			sync = sync || rd.MustSync
		}
	}
	if len(items) == 0 {
		return false
	}
	// Committed entries are on a majority's disks already: they are
	// applied while the new ones are written, not after that write. Not
	// so with a snapshot or a replica change, applied in order after it.
	for i := range items {
		it := &items[i]
		if (it.rd.Snapshot == nil || raft.IsEmptySnap(it.rd.Snapshot)) && !hasConfChange(it.rd.CommittedEntries) {
			h.apply(it.g, it.rd.CommittedEntries)
			it.applied = true
		}
	}
	if len(writes) > 0 {
		start := time.Now()
		err := h.store.Save(writes, sync)
		h.n.Metrics().logWrite.Observe(time.Since(start).Seconds())
		if err != nil {
			// Nothing may be sent or applied that is not on disk.
			h.n.log.Error("raft log write failed", "err", err)
			for _, it := range items {
				h.failGroup(it.g, fmt.Errorf("%w: raft log: %v", queue.ErrStorage, err))
			}
			return false
		}
	}
	for _, it := range items {
		g, rd := it.g, it.rd
		if !it.sent {
			h.send(g, rd.Messages)
		}
		if rd.Snapshot != nil && !raft.IsEmptySnap(rd.Snapshot) {
			h.installSnapshot(g, rd.Snapshot)
		}
		if len(rd.Entries) > 0 && g.leader {
			h.persisted(g)
		}
		if len(rd.Entries) > 0 {
			_ = g.ms.Append(rd.Entries)
		}
		if w := rd.HardState; w != nil && !raft.IsEmptyHardState(w) {
			_ = g.ms.SetHardState(w)
		}
		if !it.applied {
			h.apply(g, rd.CommittedEntries)
		}
		if rd.SoftState != nil {
			h.softState(g, rd.SoftState)
		}
		g.rn.Advance(rd)
		h.updateCaughtUp(g)
		h.checkRecovered(g)
	}
	return true
}

func hasConfChange(ents []*rpb.Entry) bool {
	for _, e := range ents {
		if e.GetType() != rpb.EntryType_EntryNormal {
			return true
		}
	}
	return false
}

func (h *raftHost) softState(g *rgroup, ss *raft.SoftState) {
	leader := ss.RaftState == raft.StateLeader
	if leader == g.leader {
		return
	}
	g.leader = leader
	if leader {
		g.leaderTerm.Store(g.rn.BasicStatus().GetTerm())
		g.leaderSince.Store(monoNow())
	}
	g.isLeader.Store(leader)
	if !leader {
		g.caughtUp.Store(false)
		h.failGroup(g, notLeader(g))
	}
	h.n.log.Info("raft leadership", "group", g.name, "leader", leader, "term", g.rn.BasicStatus().GetTerm())
	h.n.Metrics().elections.Inc()
	h.n.poke()
}

// updateCaughtUp records whether this leader stores every committed entry.
func (h *raftHost) updateCaughtUp(g *rgroup) {
	if !g.leader || g.caughtUp.Load() {
		// Once caught up in its term, a leader stays so: what commits
		// later is its own.
		return
	}
	st := g.rn.BasicStatus()
	commit := st.GetCommit()
	term, err := g.ms.Term(commit)
	h.mu.Lock()
	stored := g.stored
	h.mu.Unlock()
	if err == nil && term == st.GetTerm() && stored >= commit {
		g.caughtUp.Store(true)
		h.n.poke()
	}
}

// raftInSyncLag is how many entries behind the leader a replica may be
// and still count as in sync.
const raftInSyncLag = 1000

// progress records which replicas are in sync with this leader, and their
// lag.
func (h *raftHost) progress(g *rgroup) {
	partition := strconv.Itoa(g.id.Partition)
	// Two slices in turn: no allocation per tick.
	lagged := g.lagged
	g.lagged, g.laggedBefore = g.laggedBefore[:0], lagged
	if !g.leader {
		h.mu.Lock()
		g.inSync = nil
		h.mu.Unlock()
		for _, node := range lagged {
			h.n.Metrics().lag.DeleteLabelValues(g.id.Queue, partition, node)
		}
		return
	}
	last, _ := g.ms.LastIndex()
	var in []string
	self := raftID(h.n.opts.NodeID)
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		node := g.nodes[id]
		lag := uint64(0)
		if last > pr.Match {
			lag = last - pr.Match
		}
		if id == self {
			lag = 0
		}
		if lag <= raftInSyncLag && (id == self || pr.RecentActive) {
			in = append(in, node)
		}
		h.n.Metrics().lag.WithLabelValues(g.id.Queue, partition, node).Set(float64(lag))
		g.lagged = append(g.lagged, node)
	})
	// Replicas removed since the last tick lose their series: one lookup
	// each, not a scan of every series (this runs every tick for every
	// group led here).
	for _, node := range lagged {
		if !slices.Contains(g.lagged, node) {
			h.n.Metrics().lag.DeleteLabelValues(g.id.Queue, partition, node)
		}
	}
	slices.Sort(in)
	h.mu.Lock()
	g.inSync = in
	h.mu.Unlock()
}

// inSync returns the in-sync replicas of the group named, when this node
// leads it.
func (h *raftHost) inSync(name string) ([]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[name]
	if g == nil || g.inSync == nil {
		return nil, false
	}
	return slices.Clone(g.inSync), true
}

// send hands messages to the peers' senders.
func (h *raftHost) send(g *rgroup, msgs []*rpb.Message) {
	for _, m := range msgs {
		node := g.nodes[m.GetTo()]
		if node == "" {
			continue
		}
		if m.GetType() == rpb.MessageType_MsgSnap {
			h.sendSnapshot(g, node, m)
			continue
		}
		if g.recovering.Load() && (m.GetType() == rpb.MessageType_MsgPreVote || m.GetType() == rpb.MessageType_MsgVote) {
			continue // asks for no votes (recovery.go)
		}
		data, err := proto.Marshal(m)
		if err != nil {
			continue
		}
		if !h.sender(node).send(&pb.RaftMessage{Group: g.name, Message: data}) {
			g.rn.ReportUnreachable(m.GetTo())
		}
	}
}

// apply stores committed entries locally, in order; the leader's own
// proposals complete once stored.
func (h *raftHost) apply(g *rgroup, ents []*rpb.Entry) {
	for _, e := range ents {
		if e.GetType() == rpb.EntryType_EntryConfChange {
			h.applyChange(g, e)
			h.markStored(g, e.GetIndex(), 0)
			continue
		}
		if e.GetType() != rpb.EntryType_EntryNormal || len(e.GetData()) == 0 {
			h.markStored(g, e.GetIndex(), 0)
			continue
		}
		index := e.GetIndex()
		token, seq, body, ok := entryHeader(e.GetData())
		if ok && token == h.token {
			// This run's own entry: its proposals hold the writes; no
			// decoding.
			h.mu.Lock()
			ps := g.proposed[seq]
			delete(g.proposed, seq)
			live := make([]bool, len(ps))
			for i, p := range ps {
				_, live[i] = g.inflight[p.id]
				delete(g.inflight, p.id)
			}
			h.mu.Unlock()
			if ps != nil {
				h.markStored(g, index, len(ps))
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
					h.store1(g, index, p.log.id, own, b)
				}
				continue
			}
		}
		var re pb.RaftEntry
		if err := proto.Unmarshal(body, &re); err != nil {
			h.n.log.Error("raft entry undecodable", "group", g.name, "index", index, "err", err)
			h.markStored(g, index, 0)
			continue
		}
		h.markStored(g, index, len(re.Writes))
		for _, w := range re.Writes {
			id := queue.PartitionID{Queue: w.Queue, Partition: g.id.Partition}
			_, b := fromLogWrite(id, w)
			h.store1(g, index, id, nil, b)
		}
	}
}

// store1 stores one write of entry index in partition id's local log;
// own, when set, is the proposal of this node it completes.
func (h *raftHost) store1(g *rgroup, index uint64, id queue.PartitionID, own *proposal, b *queue.Batch) {
	l := h.partLog(id)
	if l == nil {
		h.n.log.Error("raft entry for a partition not built here", "partition", id.String())
		h.storedOne(g, index)
		if own != nil {
			own.finish(fmt.Errorf("%w: %s", queue.ErrNoSuchQueue, id))
		}
		return
	}
	if own != nil && own.msg != nil && own.msg.Offset < l.next.Load() {
		// Never acknowledge a message whose offset is taken.
		h.n.log.Error("a replicated append below what is stored", "partition", id.String(), "offset", own.msg.Offset, "stored_next", l.next.Load())
		h.storedOne(g, index)
		own.finish(fmt.Errorf("%w: offset %d of %s is taken", queue.ErrStorage, own.msg.Offset, id))
		return
	}
	b.Appends = l.skipStored(b.Appends)
	l.inner.Append(0, nil, b, false, func(err error) {
		h.storedOne(g, index)
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

// markStored records that entry index has n writes to store.
func (h *raftHost) markStored(g *rgroup, index uint64, n int) {
	h.mu.Lock()
	g.applying = append(g.applying, applyMark{index: index, pending: n})
	h.advanceStoredLocked(g)
	h.mu.Unlock()
}

// storedOne records one stored write of entry index.
func (h *raftHost) storedOne(g *rgroup, index uint64) {
	h.mu.Lock()
	for i := range g.applying {
		if g.applying[i].index == index {
			g.applying[i].pending--
			break
		}
	}
	h.advanceStoredLocked(g)
	h.mu.Unlock()
	h.poke()
}

func (h *raftHost) advanceStoredLocked(g *rgroup) {
	i := 0
	for i < len(g.applying) && g.applying[i].pending <= 0 {
		g.stored = g.applying[i].index
		i++
	}
	g.applying = g.applying[i:]
}

// setAckPolicy records the ack_policy of a queue's partition logs.
func (h *raftHost) setAckPolicy(name string, partitions int, ap queue.AckPolicy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := 0; p < partitions; p++ {
		for _, q := range []string{name, queue.DLQName(name)} {
			if l := h.partLogs[queue.PartitionID{Queue: q, Partition: p}]; l != nil {
				l.ackLeader.Store(ap == queue.AckLeader)
			}
		}
	}
}

// partLog returns the raft log of partition id, if the queue is built.
func (h *raftHost) partLog(id queue.PartitionID) *raftLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.partLogs[id]
}

// checkpoint syncs the local writes applied so far and records the
// applied index of each group, then compacts their logs.
func (h *raftHost) checkpoint() {
	if h.checkpointing {
		return
	}
	gs := h.all()
	if len(gs) == 0 {
		return
	}
	h.mu.Lock()
	stored := make([]uint64, len(gs))
	for i, g := range gs {
		stored[i] = g.stored
	}
	h.mu.Unlock()
	var ws []RaftWrite
	for i, g := range gs {
		if stored[i] > g.synced {
			ws = append(ws, RaftWrite{Group: g.name, Applied: stored[i]})
		}
	}
	// The syncs run beside the driver: a sync of the partitions' storage
	// takes milliseconds, and the driver's commits wait for nothing of it.
	h.checkpointing = true
	go func() {
		h.logs.SyncAsync()
		var err error
		if len(ws) > 0 {
			err = h.store.Save(ws, true)
		}
		select {
		case h.checkpoints <- checkpointDone{gs: gs, stored: stored, err: err}:
		case <-h.n.ctx.Done():
		}
	}()
}

type checkpointDone struct {
	gs     []*rgroup
	stored []uint64
	err    error
}

// checkpointed records a checkpoint and compacts; on the driver goroutine.
func (h *raftHost) checkpointed(c checkpointDone) {
	h.checkpointing = false
	if c.err != nil {
		h.n.log.Warn("recording applied raft indexes", "err", c.err)
		return
	}
	for i, g := range c.gs {
		g.synced = max(g.synced, c.stored[i])
		h.compact(g)
	}
}

// compact drops the entries this node applied and synced but the last
// RaftLogKeep, kept for a replica that comes back.
func (h *raftHost) compact(g *rgroup) {
	upTo, keep := g.synced, uint64(h.n.opts.RaftLogKeep)
	if upTo <= keep {
		return
	}
	upTo -= keep
	if upTo <= g.compacted {
		return
	}
	term, err := g.ms.Term(upTo)
	if err != nil {
		return
	}
	// The point a replica behind it is sent a copy of the partition for.
	if _, err := g.ms.CreateSnapshot(upTo, g.confState(), nil); err != nil {
		return
	}
	if err := g.ms.Compact(upTo); err != nil {
		return
	}
	if err := h.store.Compact(g.name, upTo, term); err != nil {
		h.n.log.Warn("compacting a raft log", "group", g.name, "err", err)
		return
	}
	g.compacted = upTo
}

// expire fails proposals not applied in time.
func (h *raftHost) expire() {
	now := time.Now()
	for _, g := range h.all() {
		var late []*proposal
		h.mu.Lock()
		for id, p := range g.inflight {
			if now.Sub(p.at) > raftProposalTimeout {
				late = append(late, p)
				delete(g.inflight, id)
			}
		}
		h.mu.Unlock()
		slices.SortFunc(late, func(a, b *proposal) int { return int(a.id - b.id) })
		h.fail(late, fmt.Errorf("%w: %s: not committed within %s", queue.ErrNotOwned, g.name, raftProposalTimeout))
	}
}

func (h *raftHost) failGroup(g *rgroup, err error) {
	h.mu.Lock()
	ps := g.pending
	g.pending = nil
	for _, p := range g.inflight {
		ps = append(ps, p)
	}
	clear(g.inflight)
	// Entries of this node committed later are decoded as anyone's.
	clear(g.proposed)
	h.mu.Unlock()
	slices.SortFunc(ps, func(a, b *proposal) int {
		if a.id < b.id {
			return -1
		}
		return 1
	})
	h.fail(ps, err)
}

func (h *raftHost) failAll(err error) {
	for _, g := range h.all() {
		h.failGroup(g, err)
	}
}

func (h *raftHost) fail(ps []*proposal, err error) {
	for _, p := range ps {
		p.finish(err)
	}
}

// persisted acknowledges the proposals of ack_policy leader that the
// raft log now holds on this leader's disk: every proposal in flight was
// in the entries just stored.
func (h *raftHost) persisted(g *rgroup) {
	var early []*proposal
	h.mu.Lock()
	for _, p := range g.inflight {
		if !p.persisted {
			p.persisted = true
			if p.early {
				p.acked = true
				early = append(early, p)
			}
		}
	}
	h.mu.Unlock()
	slices.SortFunc(early, func(a, b *proposal) int {
		if a.id < b.id {
			return -1
		}
		return 1
	})
	for _, p := range early {
		if p.done != nil {
			p.done(nil)
		}
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

// transferLeadership asks the driver to hand every group this node
// leads to another live replica (the node is leaving).
func (h *raftHost) transferLeadership(live func(string) bool) {
	h.mu.Lock()
	h.leaving = live
	h.mu.Unlock()
	h.poke()
}

// transfer hands the groups this node leads to other live replicas; on
// the driver goroutine.
func (h *raftHost) transfer() {
	h.mu.Lock()
	live := h.leaving
	h.mu.Unlock()
	if live == nil {
		return
	}
	for _, g := range h.all() {
		if !g.leader || g.rn.BasicStatus().LeadTransferee != 0 {
			continue
		}
		for _, r := range g.replicas {
			if r != h.n.opts.NodeID && live(r) {
				g.rn.TransferLeader(raftID(r))
				break
			}
		}
	}
}

// raftLogger sends raft's log to the node's, warnings and up.
type raftLogger struct {
	l interface{ Warn(string, ...any) }
}

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

// confState is the group's configuration: its replicas, all voters.
func (g *rgroup) confState() *rpb.ConfState {
	voters := make([]uint64, 0, len(g.replicas))
	for _, r := range g.replicas {
		voters = append(voters, raftID(r))
	}
	return &rpb.ConfState{Voters: voters}
}

// A replica whose next entry the leader compacted away gets a copy of the
// partition instead: the leader streams what it stores of the partition
// (and of its dead-letter partition) with Import, then sends raft's
// snapshot message, which carries no data. The replica's copy may be newer
// than the snapshot's index: the entries it applies after it again only
// set what the copy holds already, and appends below what it stores are
// skipped.

type snapResult struct {
	g    *rgroup
	node string
	m    *rpb.Message
	err  error
}

// sendSnapshot starts the copy for node, once at a time.
func (h *raftHost) sendSnapshot(g *rgroup, node string, m *rpb.Message) {
	key := g.name + "/" + node
	if h.sending[key] {
		return
	}
	h.sending[key] = true
	go func() {
		err := h.copyTo(g, node)
		select {
		case h.snaps <- snapResult{g: g, node: node, m: m, err: err}:
		case <-h.n.ctx.Done():
		}
	}()
}

// snapDone sends raft's snapshot message after a copy, and tells raft how
// it went; on the driver goroutine.
func (h *raftHost) snapDone(r snapResult) {
	delete(h.sending, r.g.name+"/"+r.node)
	to := r.m.GetTo()
	if r.err != nil {
		h.n.log.Warn("copy for a replica behind failed", "group", r.g.name, "replica", r.node, "err", r.err)
		r.g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	data, err := proto.Marshal(r.m)
	if err != nil || !h.sender(r.node).send(&pb.RaftMessage{Group: r.g.name, Message: data}) {
		r.g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	r.g.rn.ReportSnapshot(to, raft.SnapshotFinish)
	h.n.Metrics().copies.Inc()
	h.n.log.Info("replica behind sent a copy", "group", r.g.name, "replica", r.node, "index", r.m.GetSnapshot().GetMetadata().GetIndex())
}

// copyTo streams what this node stores of the group's partitions to node.
func (h *raftHost) copyTo(g *rgroup, node string) error {
	ctx, cancel := context.WithTimeout(h.n.ctx, 5*time.Minute)
	defer cancel()
	p, err := h.n.peer(node)
	if err != nil {
		return err
	}
	return h.n.copyPartition(ctx, p, g.id, 0, true)
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

// installSnapshot records raft's snapshot of a group: its data came with
// the copy before it.
func (h *raftHost) installSnapshot(g *rgroup, snap *rpb.Snapshot) {
	meta := snap.GetMetadata()
	if err := g.ms.ApplySnapshot(snap); err != nil {
		h.n.log.Warn("installing a snapshot", "group", g.name, "err", err)
		return
	}
	if err := h.store.Save([]RaftWrite{{Group: g.name, ConfState: meta.GetConfState(), Applied: meta.GetIndex()}}, true); err != nil {
		h.n.log.Warn("recording a snapshot", "group", g.name, "err", err)
	}
	if err := h.store.Compact(g.name, meta.GetIndex(), meta.GetTerm()); err != nil {
		h.n.log.Warn("recording a snapshot", "group", g.name, "err", err)
	}
	h.mu.Lock()
	g.applying = nil
	g.stored = max(g.stored, meta.GetIndex())
	h.mu.Unlock()
	g.synced = max(g.synced, meta.GetIndex())
	g.compacted = max(g.compacted, meta.GetIndex())
}

// Replica changes: the leader of a group replaces a replica whose node
// has been gone for a while with a live node, and adds replicas to a
// group that has fewer than its replication factor, one change at a time,
// as raft configuration changes. The new replica starts from the initial
// state every group shares and catches up by entries or, past the
// compacted log, by a copy. The change's context names the node, so that
// every replica learns its address.

type confRequest struct {
	g    *rgroup
	add  bool
	node string
	// to, when set, asks for a leadership transfer instead, to a replica
	// it accepts.
	to func(string) bool
}

// requestTransfer asks the driver to hand g's leadership to a replica to
// accepts.
func (h *raftHost) requestTransfer(g *rgroup, to func(string) bool) {
	select {
	case h.changes <- confRequest{g: g, to: to}:
	default:
	}
}

// requestChange asks the driver to propose a replica change.
func (h *raftHost) requestChange(g *rgroup, add bool, node string) {
	select {
	case h.changes <- confRequest{g: g, add: add, node: node}:
	default:
	}
}

func (h *raftHost) proposeChange(r confRequest) {
	g := r.g
	if !g.leader || g.rn.BasicStatus().LeadTransferee != 0 {
		return
	}
	if r.to != nil {
		for _, node := range g.replicas {
			if node != h.n.opts.NodeID && r.to(node) {
				g.rn.TransferLeader(raftID(node))
				return
			}
		}
		return
	}
	typ := rpb.ConfChangeType_ConfChangeRemoveNode
	if r.add {
		typ = rpb.ConfChangeType_ConfChangeAddNode
	}
	cc := &rpb.ConfChange{Type: &typ, NodeId: proto.Uint64(raftID(r.node)), Context: []byte(r.node)}
	if err := g.rn.ProposeConfChange(cc); err != nil {
		h.n.log.Warn("proposing a replica change", "group", g.name, "node", r.node, "add", r.add, "err", err)
		return
	}
	h.n.log.Info("replica change proposed", "group", g.name, "node", r.node, "add", r.add)
}

// applyChange applies a committed replica change.
func (h *raftHost) applyChange(g *rgroup, e *rpb.Entry) {
	var cc rpb.ConfChange
	if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
		h.n.log.Error("replica change undecodable", "group", g.name, "err", err)
		return
	}
	cs := g.rn.ApplyConfChange(&cc)
	node := string(cc.GetContext())
	if cc.GetType() == rpb.ConfChangeType_ConfChangeRemoveNode && cc.GetNodeId() == raftID(h.n.opts.NodeID) {
		// This node is no longer a replica: the group ends here.
		h.mu.Lock()
		delete(h.groups, g.name)
		h.mu.Unlock()
		g.isLeader.Store(false)
		g.caughtUp.Store(false)
		h.failGroup(g, notLeader(g))
		if err := h.store.Drop(g.name); err != nil {
			h.n.log.Warn("dropping a raft group", "group", g.name, "err", err)
		}
		h.n.log.Info("no longer a replica", "group", g.name)
		h.n.poke()
		return
	}
	h.mu.Lock()
	before := len(g.replicas)
	switch cc.GetType() {
	case rpb.ConfChangeType_ConfChangeAddNode:
		if node != "" && !slices.Contains(g.replicas, node) {
			g.replicas = append(slices.Clone(g.replicas), node)
			g.nodes[cc.GetNodeId()] = node
		}
	case rpb.ConfChangeType_ConfChangeRemoveNode:
		g.replicas = slices.DeleteFunc(slices.Clone(g.replicas), func(r string) bool { return raftID(r) == cc.GetNodeId() })
	}
	changed := len(g.replicas) != before
	h.mu.Unlock()
	if err := h.store.Save([]RaftWrite{{Group: g.name, ConfState: cs}}, true); err != nil {
		h.n.log.Warn("recording a replica change", "group", g.name, "err", err)
	}
	if changed {
		h.n.log.Info("replicas changed", "group", g.name, "replicas", g.replicas)
	}
	h.n.poke()
}

// replicas returns the replicas of the group named, as applied here.
func (h *raftHost) replicas(name string) ([]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[name]
	if g == nil {
		return nil, false
	}
	return slices.Clone(g.replicas), true
}
