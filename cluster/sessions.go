package cluster

import (
	"context"
	"encoding/json"
	"time"

	"github.com/shardq/shardq/queue"
)

// Persistent sessions across the cluster (SPEC section 7). A session that
// outlives its connection lives on the node its client connected to last;
// a client connecting to another node takes it over from there (plain.go,
// ClaimClient). etcd keeps, under sessions/{client id}, its subscriptions
// and the node holding it (SaveSession), so that it outlives that node:
// when the node leaves the membership for good (its lease expired, or it
// left), the live node that rendezvous hashing picks for the client ID
// adopts the session (PlainHandler.Adopt): it holds it offline, with its
// subscriptions, and queues what is published for it until the client
// connects, here or anywhere (and takes it over from there). What the
// lost node had queued for the session and not delivered is lost with it.

func (k keys) session(clientID string) string { return k.prefix + "sessions/" + clientID }

// sessionRecord is the value of a session's key.
type sessionRecord struct {
	Node    string          `json:"node"`
	User    string          `json:"user"`
	Session json.RawMessage `json:"session"` // the handler's encoding
}

// SaveSession records the session of clientID, held here, as the handler
// encoded it. It does not wait: the channel returned is closed once the
// record (or a later one of the client) is in etcd, or no longer this
// node's to write; nil when there is nothing to wait for.
func (n *Node) SaveSession(clientID, user string, session []byte) <-chan struct{} {
	if n.etcd == nil {
		return nil
	}
	v, err := json.Marshal(sessionRecord{Node: n.opts.NodeID, User: user, Session: session})
	if err != nil {
		n.log.Error("a session's record not encoded", "client", clientID, "err", err)
		return nil
	}
	// Written only while this node holds the client: once another node
	// took it, a try left in doubt (etcd slow) is not made again over
	// that node's record.
	return n.sessions.putWhile(n.keys.session(clientID), string(v), func() bool { return n.holdsClient(clientID) })
}

// holdsClient reports whether this node holds clientID (ClaimClient).
func (n *Node) holdsClient(clientID string) bool {
	p := n.plain()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims[clientID] != nil
}

// DropSession removes the record of a session that ended, if there is
// one; it does not wait.
func (n *Node) DropSession(clientID string) {
	if n.etcd == nil {
		return
	}
	n.mu.Lock()
	_, recorded := n.view.sessions[clientID]
	n.mu.Unlock()
	if recorded {
		n.sessions.del(n.keys.session(clientID))
	}
}

// applySession keeps the holder of each recorded session in the view
// (nil value: its record was deleted).
func (v *view) applySession(clientID string, value []byte) {
	if value == nil {
		delete(v.sessions, clientID)
		return
	}
	var rec sessionRecord
	if json.Unmarshal(value, &rec) == nil {
		v.sessions[clientID] = rec.Node
	}
}

// adoptSessions adopts the sessions whose node is no longer a member and
// that rendezvous hashing gives this node. It reports whether some could
// not be read from etcd, to be tried again at the next pass.
func (n *Node) adoptSessions() (again bool) {
	if n.opts.Plain == nil || n.etcd == nil {
		return false
	}
	self := n.opts.NodeID
	var mine []string
	n.mu.Lock()
	if _, member := n.view.nodes[self]; member && !n.view.leaving {
		for clientID, holder := range n.view.sessions {
			if _, live := n.view.nodes[holder]; live {
				continue
			}
			if n.view.winner(queue.PartitionID{Queue: "$session/" + clientID}, nil, self) == self {
				mine = append(mine, clientID)
			}
		}
	}
	n.mu.Unlock()
	for _, clientID := range mine {
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		resp, err := n.etcd.Get(ctx, n.keys.session(clientID))
		cancel()
		if err != nil {
			again = true
			continue
		}
		if len(resp.Kvs) == 0 {
			continue
		}
		var rec sessionRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			n.log.Warn("a session's record unreadable; not adopted", "client", clientID, "err", err)
			continue
		}
		if n.liveNode(rec.Node) {
			continue // taken meanwhile
		}
		if n.opts.Plain.Adopt(clientID, rec.User, rec.Session) {
			n.log.Info("session adopted from a node that left", "client", clientID, "node", rec.Node)
		}
	}
	return again
}
