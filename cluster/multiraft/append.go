package multiraft

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	rpb "go.etcd.io/raft/v3/raftpb"
)

// The log writer stores what raft asks of each group (its
// MsgStorageAppend: entries, hard state, a snapshot) on a goroutine of its
// own, many groups' asks with one write and one fsync, while the driver
// goes on stepping, committing and applying. One write is under way at a
// time; what groups ask meanwhile waits for the next, in order. Once a
// write is durable, the driver makes its entries readable to raft (the
// group's MemoryStorage) and delivers the messages raft held back for it:
// the answers to a leader's appends and votes to other replicas, and to
// raft itself the word that the entries are stable, which is what lets a
// leader count its own disk in a commit and lets any replica apply them.

// appendReq is one group's MsgStorageAppend.
type appendReq struct {
	g *Group
	m *rpb.Message
}

// logWrite is a write of many groups' appends, and its outcome.
type logWrite struct {
	reqs []appendReq
	ws   []Write
	sync bool
	err  error
}

// queueAppend takes a group's MsgStorageAppend (driver goroutine).
func (h *Host) queueAppend(g *Group, m *rpb.Message) {
	g.appending++
	h.appends = append(h.appends, appendReq{g, m})
}

// startWrite hands what groups asked to the writer, unless it writes
// already (driver goroutine). A snapshot is installed on the driver, once
// what its group asked before it is written.
func (h *Host) startWrite() {
	for !h.writing && len(h.appends) > 0 {
		if h.writeErr != nil {
			reqs := h.appends
			h.appends = nil
			h.appended(logWrite{reqs: reqs, err: h.writeErr})
			return
		}
		if r := h.appends[0]; hasSnapshot(r.m) {
			h.appends = h.appends[1:]
			w := logWrite{reqs: []appendReq{r}}
			if !r.g.removed {
				h.installSnapshot(r.g, r.m.GetSnapshot())
				if ws, sync := h.writesOf(w.reqs); len(ws) > 0 {
					w.err = h.o.Store.Save(ws, sync)
				}
			}
			h.appended(w)
			continue
		}
		n := 0
		for n < len(h.appends) && !hasSnapshot(h.appends[n].m) {
			n++
		}
		w := logWrite{reqs: make([]appendReq, n)}
		copy(w.reqs, h.appends[:n])
		h.appends = append(h.appends[:0], h.appends[n:]...)
		w.ws, w.sync = h.writesOf(w.reqs)
		if len(w.ws) == 0 {
			h.appended(w) // nothing to write: in order all the same
			continue
		}
		h.writing = true
		h.toWrite <- w // never blocks: one write at a time
	}
}

func hasSnapshot(m *rpb.Message) bool {
	return m.GetSnapshot() != nil && !raft.IsEmptySnap(m.GetSnapshot())
}

// writesOf turns appends into the log's writes; sync tells whether they
// must be durable before they count. A hard state that changes only the
// commit index is not written on its own: raft learns it again from its
// leader, and a replica that starts takes what it applied as committed
// (Open). Written alone, it made a write of every commit on every
// replica, which the next commit followed: the writer never rested.
func (h *Host) writesOf(reqs []appendReq) (ws []Write, sync bool) {
	for _, r := range reqs {
		g, m := r.g, r.m
		if g.removed {
			continue
		}
		w := Write{Group: g.name, Entries: m.GetEntries()}
		hs := hardStateOf(m)
		if hs != nil && (hs.GetTerm() != g.hsTerm || hs.GetVote() != g.hsVote) {
			sync = true
			g.hsTerm, g.hsVote = hs.GetTerm(), hs.GetVote()
			w.HardState = hs
		}
		if len(w.Entries) > 0 {
			sync = true
			w.HardState = hs
		}
		if w.HardState != nil || len(w.Entries) > 0 {
			ws = append(ws, w)
		}
	}
	return ws, sync
}

// hardStateOf is the hard state a MsgStorageAppend carries, nil when none.
func hardStateOf(m *rpb.Message) *rpb.HardState {
	if m.Term == nil && m.Vote == nil && m.Commit == nil {
		return nil
	}
	return &rpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
}

// writeLoop is the log writer.
func (h *Host) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-h.toWrite:
			if len(w.ws) > 0 {
				start := time.Now()
				w.err = h.o.Store.Save(w.ws, w.sync)
				if f := h.o.Observer.LogWrite; f != nil {
					f(time.Since(start))
				}
			}
			select {
			case h.written <- w:
			case <-ctx.Done():
				return
			}
		}
	}
}

// appended completes a write (driver goroutine): the entries become
// readable to raft, and the messages held back for them go. A failed
// write leaves the log unwritable: nothing asked after it is stored, and
// nothing it or they held back is delivered, for raft would take a later
// append's word as covering the lost one. This node then votes for no
// one and wins no election (a vote must be stored first), and hands the
// groups it leads to other replicas (transfer): a leader that commits
// nothing would otherwise keep its partitions, heartbeats and all.
func (h *Host) appended(w logWrite) {
	h.writing = false
	if w.err != nil && h.writeErr == nil {
		h.writeErr = w.err
		h.log.Error("raft log write failed; this node's replicas store nothing more until it restarts, and the groups it leads are handed to other replicas", "err", w.err)
	}
	var failed map[*Group]bool // on a failure only: this runs for every write
	for _, r := range w.reqs {
		g, m := r.g, r.m
		g.appending--
		if g.removed {
			continue
		}
		if w.err != nil {
			if failed == nil {
				failed = map[*Group]bool{}
			}
			if !failed[g] {
				failed[g] = true
				g.sm.Failed(fmt.Errorf("raft log: %w", w.err))
			}
			continue
		}
		if ents := m.GetEntries(); len(ents) > 0 {
			_ = g.ms.Append(ents)
			if g.leader && ents[len(ents)-1].GetTerm() == g.leaderTerm.Load() {
				// Entries this leader proposed: not those of a newer
				// leader it follows since.
				g.sm.Persisted()
			}
		}
		if hs := hardStateOf(m); hs != nil {
			_ = g.ms.SetHardState(hs)
		}
		h.deliver(g, m.GetResponses())
		h.dirty[g] = true
		h.updateCaughtUp(g)
		h.checkRecovered(g)
	}
}

// awaitWrite waits for the write under way, if any, and completes it
// (driver goroutine): a group dropped must not be written after.
func (h *Host) awaitWrite() {
	if !h.writing {
		return
	}
	select {
	case w := <-h.written:
		h.appended(w)
	case <-h.ctx.Done():
	}
}
