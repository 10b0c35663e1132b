package multiraft

import (
	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Recovery: a replica whose raft log lost entries it had acknowledged
// (its log was damaged and salvaged, see storage/raftlog) must not vote:
// with a replica that never had those entries it could elect a leader
// without them, and they would be lost though a majority once stored
// them. Raft assumes a durable log and cannot see this on its own, so a
// recovering group here
//
//   - answers no vote, pre-vote or leadership transfer, and asks for
//     none;
//   - answers a leader's heartbeat with a rejection that makes the leader
//     probe its log again (a leader that thinks this replica holds
//     entries it lost never sends them otherwise), and a leader that sees
//     a replica reject below what it acknowledged hands the leadership to
//     another replica, whose fresh view of every follower sends them
//     again;
//   - stops recovering once its log holds everything a leader had
//     committed when it first heard from that leader: from then on it
//     holds every acknowledged entry, as any follower does.
//
// A group is recovering when the store says so for it, or when the whole
// store is (salvaged, and not every group has come back since): a group
// the salvage cut off entirely looks new. The flag is stored, so that a
// restart while recovering goes on recovering.

// recoveringAtOpen reports whether a group opened with the stored state
// st starts recovering.
func (h *Host) recoveringAtOpen(st State) bool {
	return st.Recovering || h.o.Store.Recovering()
}

// screen filters what a peer sends to a recovering group (driver
// goroutine): it reports whether m is stepped.
func (h *Host) screen(g *Group, m *rpb.Message) bool {
	if !g.recovering.Load() {
		return true
	}
	switch m.GetType() {
	case rpb.MessageType_MsgVote, rpb.MessageType_MsgPreVote, rpb.MessageType_MsgTimeoutNow:
		return false
	case rpb.MessageType_MsgHeartbeat:
		last, _ := g.ms.LastIndex()
		// Ask the leader to probe this log: its view of it may be stale.
		h.send(g, []*rpb.Message{{
			Type: rpb.MessageType_MsgAppResp.Enum(), To: proto.Uint64(m.GetFrom()), From: proto.Uint64(m.GetTo()),
			Term: proto.Uint64(m.GetTerm()), Index: proto.Uint64(m.GetCommit()), Reject: proto.Bool(true),
			RejectHint: proto.Uint64(last),
		}})
		return m.GetCommit() <= last
	}
	return true
}

// stepped notes, after a recovering group stepped m, what its leader had
// committed (driver goroutine).
func (h *Host) stepped(g *Group, m *rpb.Message) {
	if g.recovering.Load() && m.GetType() == rpb.MessageType_MsgApp && g.rn.BasicStatus().Lead == m.GetFrom() {
		g.recoverTo = max(g.recoverTo, m.GetCommit())
	}
}

// checkRecovered ends a group's recovery once its log holds what its
// leader had committed (driver goroutine).
func (h *Host) checkRecovered(g *Group) {
	if !g.recovering.Load() || g.recoverTo == 0 {
		return
	}
	st := g.rn.BasicStatus()
	if st.Lead == 0 || st.HardState.GetCommit() < g.recoverTo {
		return
	}
	no := false
	if err := h.o.Store.Save([]Write{{Group: g.name, Recovering: &no}}, true); err != nil {
		h.log.Error("recording a replica's recovery", "group", g.name, "err", err)
		return
	}
	g.recovering.Store(false)
	// Told, so that whoever runs the host clears the store's recovering
	// state once no group is left recovering (RecoveredAll).
	h.changedGroup(g)
	if f := h.o.Observer.Recovering; f != nil {
		f(-1)
	}
	h.log.Info("replica has every committed entry back; it takes part in elections again", "group", g.name, "commit", st.HardState.GetCommit())
}

// lostEntries, on a leader, reads a rejection from a replica: one below
// what the replica acknowledged means it lost entries (driver goroutine).
// Raft never sends a follower entries below what it acknowledged, so the
// leadership goes to another replica, which starts from a fresh view.
func (h *Host) lostEntries(g *Group, m *rpb.Message) {
	if !g.leader || m.GetType() != rpb.MessageType_MsgAppResp || !m.GetReject() {
		return
	}
	pr := g.rn.Status().Progress[m.GetFrom()]
	if m.GetIndex() > pr.Match {
		return
	}
	node := g.node(m.GetFrom())
	if m.GetRejectHint() >= pr.Match {
		// It has what it acknowledged; a probe shows where it is.
		g.rn.ReportUnreachable(m.GetFrom())
		return
	}
	if g.rn.BasicStatus().LeadTransferee != 0 {
		return
	}
	h.log.Warn("a replica lost entries it had acknowledged; the leadership moves so that they are sent to it again",
		"group", g.name, "replica", node, "its_last", m.GetRejectHint(), "acknowledged", pr.Match)
	for _, r := range g.replicas {
		if r != h.o.NodeID && r != node && h.o.Live(r) {
			g.rn.TransferLeader(g.idOf(r))
			return
		}
	}
}

// CheckForgotten marks the store recovering when it holds no group while
// named (the cluster's records) names this node a replica of a group:
// its raft log was removed, or its data directory replaced, while it was
// a voter, so what it voted and acknowledged with is lost.
func (h *Host) CheckForgotten(named func() (group string, ok bool)) error {
	if h.o.Store.Recovering() {
		return nil
	}
	groups, err := h.o.Store.Groups()
	if err != nil || len(groups) > 0 {
		return err
	}
	group, ok := named()
	if !ok {
		return nil
	}
	h.log.Error("this node's raft log is empty while the cluster names it a replica: it takes no part in elections until its peers have given it back every entry",
		"group", group)
	return h.o.Store.MarkRecovering("raft log empty while the cluster names node " + h.o.NodeID + " a replica of " + group)
}

// RecoveredAll clears the store's recovering state once no group is
// recovering; call it when every group of this node is open.
func (h *Host) RecoveredAll() {
	if !h.o.Store.Recovering() {
		return
	}
	for _, g := range h.all() {
		if g.recovering.Load() {
			return
		}
	}
	if err := h.o.Store.Recovered(); err != nil {
		h.log.Error("recording the raft log's recovery", "err", err)
		return
	}
	h.log.Info("every raft group of this node has its entries back")
}
