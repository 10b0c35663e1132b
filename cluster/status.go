package cluster

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// Status is the cluster as this node sees it: the document of
// GET /api/v1/cluster.
type Status struct {
	Nodes      []NodeStatus      `json:"nodes"`
	Partitions []PartitionStatus `json:"partitions"`
}

// NodeStatus is one node: a member ("up"), this node handing its
// partitions over ("leaving"), a member drained that still holds
// replicas ("draining") or holds none ("drained"), or a node that joined
// once and is not a member now ("down"; its addresses are not known
// then). Replicas counts the partitions it keeps a replica of (or owns,
// with one replica), learners included; Leads those it owns.
type NodeStatus struct {
	ID          string `json:"id"`
	MQTT        string `json:"mqtt"`
	HTTP        string `json:"http"`
	ClusterAddr string `json:"cluster_addr"`
	State       string `json:"state"`
	Drained     bool   `json:"drained"`
	Replicas    int    `json:"replicas"`
	Leads       int    `json:"leads"`
}

// Node states.
const (
	StateUp       = "up"
	StateLeaving  = "leaving"
	StateDraining = "draining"
	StateDrained  = "drained"
	StateDown     = "down"
)

// PartitionStatus is one partition of a queue of the catalog: its owner
// ("" while nobody claimed it) and epoch. With replication factor 1 the
// owner is the only replica, in sync while it is up.
type PartitionStatus struct {
	Queue     string   `json:"queue"`
	Partition int      `json:"partition"`
	Owner     string   `json:"owner"`
	Epoch     uint64   `json:"epoch"`
	Replicas  []string `json:"replicas"`
	Learners  []string `json:"learners"`
	InSync    []string `json:"in_sync"`
}

// Status returns the nodes, sorted by id, and every partition of every
// queue of the catalog, sorted by queue and partition.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	v := &n.view
	self := n.opts.NodeID
	st := Status{Nodes: []NodeStatus{}, Partitions: []PartitionStatus{}}
	seen := map[string]bool{}
	for id, info := range v.nodes {
		seen[id] = true
		st.Nodes = append(st.Nodes, NodeStatus{ID: id, MQTT: info.MQTT, HTTP: info.HTTP, ClusterAddr: info.Cluster, State: StateUp})
	}
	down := func(id string) {
		if !seen[id] {
			seen[id] = true
			st.Nodes = append(st.Nodes, NodeStatus{ID: id, State: StateDown})
		}
	}
	for id := range v.known {
		down(id)
	}
	// An owner has joined once, known or not.
	for _, o := range v.owners {
		if o.Owner != "" {
			down(o.Owner)
		}
	}
	if n.etcd != nil {
		down(self)
	}
	held, leads := map[string]int{}, map[string]int{}
	for _, o := range v.owners {
		if o.Owner != "" {
			leads[o.Owner]++
		}
		if len(o.Replicas) == 0 && o.Owner != "" {
			held[o.Owner]++
		}
		for _, r := range o.Replicas {
			held[r]++
		}
		for _, r := range o.Learners {
			held[r]++
		}
	}
	for i := range st.Nodes {
		ns := &st.Nodes[i]
		ns.Replicas, ns.Leads, ns.Drained = held[ns.ID], leads[ns.ID], v.draining[ns.ID]
		if ns.Drained && ns.State == StateUp {
			ns.State = StateDraining
			if held[ns.ID] == 0 {
				ns.State = StateDrained
			}
		}
		if ns.ID != self {
			continue
		}
		// This node's addresses are known even while it is not a member.
		ns.MQTT, ns.HTTP, ns.ClusterAddr = n.opts.MQTT, n.opts.HTTP, n.addr
		if v.leaving {
			ns.State = StateLeaving
		}
	}
	slices.SortFunc(st.Nodes, func(a, b NodeStatus) int { return cmp.Compare(a.ID, b.ID) })

	names := make([]string, 0, len(v.queues))
	for name := range v.queues {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for p := range v.queues[name].Partitions {
			ps := PartitionStatus{Queue: name, Partition: p, Replicas: []string{}, Learners: []string{}, InSync: []string{}}
			if o, ok := v.owners[queue.PartitionID{Queue: name, Partition: p}]; ok {
				ps.Owner, ps.Epoch = o.Owner, o.Epoch
				switch {
				case len(o.Replicas) > 0:
					// Replicated: the leader knows which replicas keep up;
					// elsewhere, the live ones are shown.
					ps.Replicas = append(ps.Replicas, o.Replicas...)
					ps.Learners = append(ps.Learners, o.Learners...)
					if in, ok := n.leaderInSync(queue.PartitionID{Queue: name, Partition: p}); ok {
						ps.InSync = in
					} else {
						for _, r := range o.Replicas {
							if _, up := v.nodes[r]; up {
								ps.InSync = append(ps.InSync, r)
							}
						}
					}
				case o.Owner != "":
					ps.Replicas = append(ps.Replicas, o.Owner)
					if _, up := v.nodes[o.Owner]; up {
						ps.InSync = append(ps.InSync, o.Owner)
					}
				}
			}
			st.Partitions = append(st.Partitions, ps)
		}
	}
	return st
}

// PeerAnswer is one node's answer to a gathered admin read: its HTTP
// status and body, or the error that kept it from answering.
type PeerAnswer struct {
	Node   string
	Status int
	Body   []byte
	Err    error
}

// GatherTimeout bounds how long Gather waits for the other nodes.
const GatherTimeout = 2 * time.Second

// SpreadTimeout bounds how long Spread waits for the other nodes: a change
// waits for its writes to be committed.
const SpreadTimeout = 30 * time.Second

// Gather sends an admin read (method, and path with its query) to every
// other member in parallel and returns their answers, sorted by node id.
// A node that does not answer within GatherTimeout (or ctx) has Err set.
func (n *Node) Gather(ctx context.Context, method, path string) []PeerAnswer {
	return n.askAll(ctx, GatherTimeout, method, path, nil)
}

// Spread sends an admin change (method, path with its query, and body) to
// every other member in parallel, each to act on the partitions it
// serves, and returns their answers, sorted by node id. A node that does
// not answer within SpreadTimeout (or ctx) has Err set: what it did is not
// known.
func (n *Node) Spread(ctx context.Context, method, path string, body []byte) []PeerAnswer {
	return n.askAll(ctx, SpreadTimeout, method, path, body)
}

func (n *Node) askAll(ctx context.Context, timeout time.Duration, method, path string, body []byte) []PeerAnswer {
	ids := n.members()
	slices.Sort(ids)
	out := make([]PeerAnswer, len(ids))
	if len(ids) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = n.ask(ctx, timeout, id, method, path, body)
		}()
	}
	wg.Wait()
	return out
}

func (n *Node) ask(ctx context.Context, timeout time.Duration, id, method, path string, body []byte) PeerAnswer {
	a := PeerAnswer{Node: id}
	p, err := n.peer(id)
	if err != nil {
		a.Err = err
		return a
	}
	resp, err := p.client.Admin(ctx, &pb.AdminRequest{Method: method, Path: path, Body: body})
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		a.Err = errors.New("no answer within " + timeout.String())
	case err != nil:
		a.Err = err
	default:
		a.Status, a.Body = int(resp.Status), resp.Body
	}
	return a
}

// leaderInSync returns the in-sync replicas of a partition this node leads.
func (n *Node) leaderInSync(id queue.PartitionID) ([]string, bool) {
	if n.raft == nil {
		return nil, false
	}
	return n.raft.inSync(id)
}
