package multiraft

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
)

// Replica ids. A group's first replicas have the raft ids ID(node). A
// replica added later (a learner) gets a fresh id, which the leader
// picks and the configuration change carries with the node's name, so a
// node removed from a group and added back is a new replica: messages
// raft sent to the earlier one (a heartbeat with a commit index past the
// new, empty log; a vote request of an old term) are addressed to an id
// no replica has any more, and are dropped. The node learns its id from
// whoever runs the group (Open's ids: the cluster's ownership record),
// and keeps it, with the names of the group's raft ids, in the stored
// state's Meta and in raft's snapshots.
//
// Nodes are known to each other by ID(node) in the host's pings, which
// are not of a group.

// freshID returns a raft id no replica of g had so far (driver
// goroutine).
func (g *Group) freshID() uint64 {
	for {
		id := rand.Uint64()
		if _, used := g.nodes[id]; id != 0 && !used {
			return id
		}
	}
}

// idOf returns node's raft id in g: the one its configuration gives it,
// else ID(node) (driver goroutine, or under Host.mu).
func (g *Group) idOf(node string) uint64 {
	if id, ok := g.ids[node]; ok {
		return id
	}
	return ID(node)
}

// nodeID returns the host id, ID(node), of the node of raft id in g, 0
// when unknown: pings and silences are by node (driver goroutine).
func (g *Group) nodeID(id uint64) uint64 {
	if name := g.node(id); name != "" {
		return ID(name)
	}
	return 0
}

// Self returns this node's raft id in the group.
func (g *Group) Self() uint64 { return g.self }

// IDs returns the raft ids of the group's voters and learners that are
// not ID(node), by node, as applied here; nil when there is none. The
// cluster records them, so that a node added to the group knows its id.
func (g *Group) IDs() map[string]uint64 {
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	var out map[string]uint64
	for node, id := range g.ids {
		if id != ID(node) {
			if out == nil {
				out = map[string]uint64{}
			}
			out[node] = id
		}
	}
	return out
}

// A group's members, as stored in its Meta and in its snapshots' data:
// a version byte, this replica's id (0 in a snapshot), then each raft id
// known with its node's name.
const membersVersion = 1

func encodeMembers(self uint64, nodes map[uint64]string) []byte {
	ids := make([]uint64, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := binary.AppendUvarint([]byte{membersVersion}, self)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
		b = binary.AppendUvarint(b, uint64(len(nodes[id])))
		b = append(b, nodes[id]...)
	}
	return b
}

var errMembers = errors.New("multiraft: undecodable members")

func decodeMembers(b []byte) (self uint64, nodes map[uint64]string, err error) {
	if len(b) == 0 || b[0] != membersVersion {
		return 0, nil, errMembers
	}
	b = b[1:]
	next := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			err = errMembers
			return 0
		}
		b = b[n:]
		return v
	}
	self = next()
	count := next()
	nodes = map[uint64]string{}
	for i := uint64(0); i < count && err == nil; i++ {
		id, l := next(), next()
		if err != nil || l > uint64(len(b)) {
			return 0, nil, errMembers
		}
		nodes[id] = string(b[:l])
		b = b[l:]
	}
	if err != nil {
		return 0, nil, err
	}
	return self, nodes, nil
}
