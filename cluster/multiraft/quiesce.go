package multiraft

import (
	"bytes"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	rpb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Quiescing: a group with nothing to do stops ticking and heartbeating,
// so that thousands of idle groups cost next to nothing. A leader whose
// replicas all hold every entry it has, with nothing proposed, applying
// or changing, for quiesceAfter ticks, sends each replica a last
// heartbeat marked as quiescing and stops ticking; a follower that gets
// it while its log matches the leader's stops ticking too. Anything that
// happens to a quiesced group wakes it: a proposal, a replica change, a
// transfer, any message of its raft but heartbeat answers.
//
// A quiesced follower no longer counts towards an election timeout, so
// the host watches its leader's node instead: every tick each host sends
// one ping to every node it shares a group with (one message for all the
// groups of two nodes), and a quiesced follower whose leader's node has
// not been heard from for an election timeout wakes and, if the leader is
// gone, elects another. A ping names the run of the host that sends it:
// a node that restarted (its replicas may have lost what they had, or be
// recovering) wakes every quiesced group it shares. A quiesced leader cut off learns it is deposed
// when it wakes: its first proposal commits nothing without a majority,
// and CheckQuorum steps it down.

// quiesceAfter is how many idle ticks a leader waits before quiescing.
const quiesceAfter = 3

// quiesceMark is the context of a quiescing heartbeat.
var quiesceMark = []byte("quiesce")

// pingGroup is the group name of a host's ping: no group's.
const pingGroup = ""

// pingEvery is how many ticks apart a host pings its peers: five pings in
// an election timeout, so that a node slowed down for a few hundred
// milliseconds (a loaded machine) is not taken for silent, which would
// wake its groups and keep it out of the in-sync replicas. A ping every
// tick cost the three nodes of an idle cluster 0.9% of a core more
// (BenchmarkIdleGroups/queues=1: 5.1% against 4.2%); every third tick
// saved 0.3% more.
const pingEvery = 2

// Quiesced reports whether the group is quiesced here.
func (g *Group) Quiesced() bool { return g.quiesced.Load() }

// awaken makes a quiesced group tick again (driver goroutine).
func (h *Host) awaken(g *Group) {
	g.idle, g.quietSynced = 0, false
	h.unsynced[g] = true
	if g.quiesced.Swap(false) {
		h.setQuiesced(-1)
		g.version.Add(1)
	}
	if !g.removed {
		h.awake[g] = true
	}
}

// quiesce stops the group's ticks (driver goroutine).
func (h *Host) quiesce(g *Group) {
	delete(h.awake, g)
	if !g.quiesced.Swap(true) {
		h.setQuiesced(1)
		g.version.Add(1)
	}
}

func (h *Host) setQuiesced(delta int) {
	h.quiesced.Add(int64(delta))
	if f := h.o.Observer.Quiesced; f != nil {
		f(delta)
	}
}

// QuiescedGroups returns how many groups are quiesced here.
func (h *Host) QuiescedGroups() int { return int(h.quiesced.Load()) }

// maybeQuiesce, before a leader's tick: a group idle for quiesceAfter
// ticks quiesces, and tells its replicas; it reports whether it did
// (driver goroutine).
func (h *Host) maybeQuiesce(g *Group) bool {
	if !h.idleLeader(g) {
		g.idle = 0
		return false
	}
	if g.idle++; g.idle < quiesceAfter {
		return false
	}
	st := g.rn.BasicStatus()
	var msgs []*rpb.Message
	for id := range g.nodes {
		if id == g.self || !g.isReplica(id) {
			continue
		}
		msgs = append(msgs, &rpb.Message{Type: rpb.MessageType_MsgHeartbeat.Enum(), To: proto.Uint64(id), From: proto.Uint64(g.self),
			Term: proto.Uint64(st.GetTerm()), Commit: proto.Uint64(st.GetCommit()), Context: quiesceMark})
	}
	h.send(g, msgs)
	h.quiesce(g)
	// Every replica holds every entry: each is in sync and up to date,
	// whatever the last tick saw of how recently it answered.
	all := append(slices.Clone(g.replicas), g.learners...)
	slices.Sort(all)
	h.mu.Lock()
	g.inSync, g.upToDate = all, slices.Clone(all)
	h.mu.Unlock()
	return true
}

// idleLeader reports whether g leads with nothing to do: every entry
// committed, applied and stored, every replica holding all of them, no
// proposal, replica change, transfer or recovery under way.
func (h *Host) idleLeader(g *Group) bool {
	if !g.leader || g.recovering.Load() || g.wanted.Load() || g.rn.HasReady() || g.appending > 0 || len(g.learners) > 0 || !g.caughtUp.Load() {
		return false
	}
	st := g.rn.BasicStatus()
	last, _ := g.ms.LastIndex()
	if st.GetCommit() != last || st.Applied != last || st.LeadTransferee != 0 || g.sm.Stored() < last || st.GetTerm() != g.leaderTerm.Load() {
		return false
	}
	all := true
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id != g.self && pr.Match != last {
			all = false
		}
	})
	return all
}

// isReplica reports whether raft id is a voter or learner of g.
func (g *Group) isReplica(id uint64) bool {
	name, ok := g.nodes[id]
	return ok && g.idOf(name) == id && g.hasNode(name)
}

// hasNode reports whether node is a voter or learner of g.
func (g *Group) hasNode(name string) bool {
	for _, r := range g.replicas {
		if r == name {
			return true
		}
	}
	for _, r := range g.learners {
		if r == name {
			return true
		}
	}
	return false
}

// pingedBy notes a ping from a peer, on the goroutine that received it;
// it reports whether the ping is from a new run of the peer, which the
// driver must hear of (peerRestarted) while groups are quiesced.
func (h *Host) pingedBy(m *rpb.Message) bool {
	from, run := m.GetFrom(), string(m.GetContext())
	h.heardMu.Lock()
	defer h.heardMu.Unlock()
	h.heard[from] = time.Now()
	prev, known := h.peerRun[from]
	h.peerRun[from] = run
	return known && prev != run && h.quiesced.Load() > 0
}

// heardFrom notes a message from node id (driver goroutine).
func (h *Host) heardFrom(id uint64) {
	h.heardMu.Lock()
	h.heard[id] = time.Now()
	h.heardMu.Unlock()
}

// heardLately reports whether a message came from node within an election
// timeout of now. raft's own word for it (Progress.RecentActive) is reset
// at every check of the quorum, heard from or not.
func (h *Host) heardLately(node string, now time.Time) bool {
	h.heardMu.Lock()
	at, ok := h.heard[ID(node)]
	h.heardMu.Unlock()
	return ok && now.Sub(at) < time.Duration(h.o.ElectionTicks)*h.o.Tick
}

// peerRestarted wakes the quiesced groups node id (ID(node)) is a
// replica of: it started again, and may have lost what it did not sync
// (driver goroutine).
func (h *Host) peerRestarted(id uint64) {
	h.heardFrom(id)
	node, known := h.pinged[id]
	if !known {
		return
	}
	for _, g := range h.all() {
		if g.quiesced.Load() && g.hasNode(node) {
			h.awaken(g)
		}
	}
}

// stepQuiesced takes a message for a group, quiesced or not, before raft
// does: it reports whether raft should step it. A quiescing heartbeat
// from the follower's leader, with its log matching, quiesces it; any
// other message but a heartbeat's answer wakes it (driver goroutine).
func (h *Host) stepQuiesced(g *Group, m *rpb.Message) bool {
	if m.GetType() == rpb.MessageType_MsgHeartbeat && bytes.Equal(m.GetContext(), quiesceMark) {
		m.Context = nil // a heartbeat to raft
		st := g.rn.BasicStatus()
		last, _ := g.ms.LastIndex()
		if !g.leader && !g.recovering.Load() && st.Lead == m.GetFrom() && st.GetTerm() == m.GetTerm() && last == m.GetCommit() {
			h.quiesce(g)
			return true
		}
		h.awaken(g)
		return true
	}
	if g.quiesced.Load() && m.GetType() != rpb.MessageType_MsgHeartbeatResp {
		h.awaken(g)
	}
	return true
}

// ping sends one message to every node this host shares a group with,
// for all their groups, every pingEvery ticks, and wakes the quiesced
// followers whose leader's node has been silent for an election timeout
// (driver goroutine, each tick). Every message from a node counts as
// hearing from it, a ping or a group's.
func (h *Host) ping(now time.Time) {
	h.mu.Lock()
	changed := h.peersChanged
	h.peersChanged = false
	h.mu.Unlock()
	if changed {
		seen := map[uint64]string{}
		for _, g := range h.all() {
			for _, r := range g.replicas {
				seen[ID(r)] = r
			}
			for _, r := range g.learners {
				seen[ID(r)] = r
			}
		}
		delete(seen, h.id)
		h.pinged = seen
	}
	h.pings++
	if h.o.Transport != nil && h.pings%pingEvery == 0 {
		for id, node := range h.pinged {
			h.o.Transport.Send(node, pingGroup, &rpb.Message{Type: rpb.MessageType_MsgHeartbeat.Enum(), To: proto.Uint64(id), From: proto.Uint64(h.id),
				Context: h.run})
		}
	}
	timeout := time.Duration(h.o.ElectionTicks) * h.o.Tick
	silent := map[uint64]bool{}
	h.heardMu.Lock()
	for id := range h.pinged {
		if now.Sub(h.heard[id]) > timeout {
			silent[id] = true
		}
	}
	h.heardMu.Unlock()
	h.mu.Lock()
	h.silent = silent
	h.mu.Unlock()
	if len(silent) == 0 {
		return
	}
	if h.quiesced.Load() > 0 {
		for _, g := range h.all() {
			if g.quiesced.Load() && !g.leader && silent[g.nodeID(g.rn.BasicStatus().Lead)] {
				h.awaken(g)
				// Its leader has been silent for an election timeout:
				// so has its election clock, which stood still while
				// quiesced (the tick that follows makes it whole). A
				// follower whose clock runs short refuses to vote.
				for range h.o.ElectionTicks - 1 {
					g.rn.Tick()
				}
				h.dirty[g] = true
			}
		}
	}
	for g := range h.awake {
		h.succeed(g, silent)
	}
}

// succeed starts the election of a group whose leader's node has been
// silent for an election timeout, on one replica: the live voter that
// ranks highest for the group (Options.Rank; every host picks the same
// one when they agree on who is silent). Raft alone would wait out a randomized
// election timeout of one to two on every replica; the other replicas
// still do, should the one picked not win. Pre-vote makes a campaign
// harmless when the leader is alive after all, and the voters' leases
// (CheckQuorum) refuse it while they still hear from the leader (driver
// goroutine).
func (h *Host) succeed(g *Group, silent map[uint64]bool) {
	if g.leader || g.recovering.Load() {
		return
	}
	st := g.rn.BasicStatus()
	if st.Lead == 0 || !silent[g.nodeID(st.Lead)] || g.hurried == st.GetTerm() || !slices.Contains(g.replicas, h.o.NodeID) {
		return
	}
	var best string
	var bestScore uint64
	for _, r := range g.replicas {
		if g.idOf(r) == st.Lead || silent[ID(r)] {
			continue
		}
		if sc := h.o.Rank(g.name, r); best == "" || sc > bestScore {
			best, bestScore = r, sc
		}
	}
	if best != h.o.NodeID {
		return
	}
	g.hurried = st.GetTerm()
	h.log.Info("leader silent for an election timeout: campaigning as its successor", "group", g.name, "term", st.GetTerm())
	_ = g.rn.Campaign()
	h.dirty[g] = true
}
