package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardq/shardq/queue"
)

// Deleting a queue in a cluster. One etcd transaction is the deletion:
// it removes the queue from the catalog and the ownership records of its
// partitions, and writes the queue's tombstone, which names every node
// that ever joined as one that has yet to forget it. Each node forgets
// the queue as it sees the tombstone (the watch, in order with every
// other change, so before it could see the queue created again; a node
// that was down, as it starts, before it opens anything): it closes the
// queue's raft groups and drops their logs, erases what it stores of the
// partitions and of the dead-letter queue, cuts the consumers off, and
// takes itself off the tombstone.
//
// A queue created again after a deletion is a new incarnation
// (QueueInfo.Incarnation, one more than the tombstone's): its partitions'
// raft groups have new names (groupName), so a replica of the deleted
// queue that missed the deletion (cut off from etcd meanwhile) cannot
// take part in them, whatever its log holds.

// Tombstone is a deleted queue's record.
type Tombstone struct {
	// Incarnation is the incarnation deleted (QueueInfo.Incarnation).
	Incarnation uint64 `json:"incarnation"`
	// Pending names the nodes that have yet to forget the queue.
	Pending []string  `json:"pending,omitempty"`
	At      time.Time `json:"at"`
}

// QueueDeletion is what DeleteQueue did.
type QueueDeletion struct {
	// Pending names the nodes that had not forgotten the queue when
	// DeleteQueue returned: down ones forget it as they start.
	Pending []string
}

// forgetWait bounds how long DeleteQueue waits for the live nodes to
// forget the queue.
const forgetWait = 10 * time.Second

// DeleteQueue deletes the queue name (with its dead-letter queue) from
// the cluster: it is gone from the catalog when this returns, and this
// node has forgotten it; it waits up to forgetWait for the other live
// nodes to forget it too. queue.ErrNoSuchQueue when the catalog has no
// such queue.
func (n *Node) DeleteQueue(ctx context.Context, name string) (QueueDeletion, error) {
	if err := queue.CheckQueueName(name); err != nil {
		return QueueDeletion{}, fmt.Errorf("%w: %v", queue.ErrInvalidName, err)
	}
	tomb, err := n.writeTombstone(ctx, name)
	if err != nil {
		return QueueDeletion{}, err
	}
	n.log.Info("queue deleted from the cluster", "queue", name, "incarnation", tomb.Incarnation)
	if err := n.forget(ctx, name, tomb); err != nil {
		return QueueDeletion{}, err
	}
	deadline := time.Now().Add(forgetWait)
	for {
		n.mu.Lock()
		t, ok := n.view.deleted[name]
		var live, down []string
		for _, id := range t.Pending {
			if id == n.opts.NodeID {
				continue
			}
			if _, up := n.view.nodes[id]; up {
				live = append(live, id)
			} else {
				down = append(down, id)
			}
		}
		n.mu.Unlock()
		if ok && t.Incarnation == tomb.Incarnation && len(live) == 0 || time.Now().After(deadline) {
			return QueueDeletion{Pending: append(live, down...)}, nil
		}
		select {
		case <-ctx.Done():
			return QueueDeletion{Pending: append(live, down...)}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeTombstone removes the queue from the catalog with its ownership
// records and writes its tombstone, in one transaction.
func (n *Node) writeTombstone(ctx context.Context, name string) (Tombstone, error) {
	qkey, dkey := n.keys.queue(name), n.keys.deleted(name)
	for {
		resp, err := n.etcd.Txn(ctx).Then(clientv3.OpGet(qkey), clientv3.OpGet(dkey)).Commit()
		if err != nil {
			return Tombstone{}, fmt.Errorf("%w: reading queue %q from the cluster: %v", queue.ErrNotOwned, name, err)
		}
		qkvs, dkvs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(qkvs) == 0 {
			return Tombstone{}, fmt.Errorf("%w: %s", queue.ErrNoSuchQueue, name)
		}
		var info QueueInfo
		_ = json.Unmarshal(qkvs[0].Value, &info)
		var prev Tombstone
		var drev int64
		if len(dkvs) > 0 {
			_ = json.Unmarshal(dkvs[0].Value, &prev)
			drev = dkvs[0].ModRevision
		}
		// Those that have yet to forget an earlier incarnation stay on.
		pending := append(slices.Collect(maps.Keys(n.knownNodes())), prev.Pending...)
		slices.Sort(pending)
		tomb := Tombstone{Incarnation: info.Incarnation, Pending: slices.Compact(pending), At: time.Now().UTC()}
		v, _ := json.Marshal(tomb)
		tr, err := n.etcd.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(qkey), "=", qkvs[0].ModRevision), clientv3.Compare(clientv3.ModRevision(dkey), "=", drev)).
			Then(clientv3.OpDelete(qkey), clientv3.OpDelete(n.keys.prefix+"owners/"+name+"/", clientv3.WithPrefix()), clientv3.OpPut(dkey, string(v))).
			Commit()
		if err != nil {
			return Tombstone{}, fmt.Errorf("%w: deleting queue %q from the cluster: %v", queue.ErrNotOwned, name, err)
		}
		if tr.Succeeded {
			n.mu.Lock()
			delete(n.view.queues, name)
			n.mu.Unlock()
			return tomb, nil
		}
	}
}

// nextIncarnation returns the incarnation a queue created now under name
// has, and the comparison that keeps it so in the creating transaction:
// one more than the deleted one's when the name has a tombstone. A
// tombstone that names this node is forgotten first.
func (n *Node) nextIncarnation(ctx context.Context, name string) (uint64, clientv3.Cmp, error) {
	dkey := n.keys.deleted(name)
	resp, err := n.etcd.Get(ctx, dkey)
	if err != nil {
		return 0, clientv3.Cmp{}, err
	}
	if len(resp.Kvs) == 0 {
		return 0, clientv3.Compare(clientv3.ModRevision(dkey), "=", 0), nil
	}
	var t Tombstone
	_ = json.Unmarshal(resp.Kvs[0].Value, &t)
	if slices.Contains(t.Pending, n.opts.NodeID) {
		if err := n.forget(ctx, name, t); err != nil {
			return 0, clientv3.Cmp{}, err
		}
	}
	return t.Incarnation + 1, clientv3.Compare(clientv3.ModRevision(dkey), "=", resp.Kvs[0].ModRevision), nil
}

// forgetTombstones forgets every queue whose tombstone, in tombs, names
// this node.
func (n *Node) forgetTombstones(ctx context.Context, tombs map[string]Tombstone) error {
	var errs []error
	for name, t := range tombs {
		if slices.Contains(t.Pending, n.opts.NodeID) {
			errs = append(errs, n.forget(ctx, name, t))
		}
	}
	return errors.Join(errs...)
}

// readTombstones reads every tombstone from etcd.
func (n *Node) readTombstones(ctx context.Context) (map[string]Tombstone, error) {
	prefix := n.keys.deleted("")
	resp, err := n.etcd.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]Tombstone{}
	for _, kv := range resp.Kvs {
		var t Tombstone
		if json.Unmarshal(kv.Value, &t) == nil {
			out[string(kv.Key[len(prefix):])] = t
		}
	}
	return out, nil
}

// forget removes every trace of the queue name's incarnations up to t's
// from this node, then takes the node off the tombstone. Forgetting once
// is enough: later calls for the same tombstone return at once.
func (n *Node) forget(ctx context.Context, name string, t Tombstone) error {
	n.forgetMu.Lock()
	defer n.forgetMu.Unlock()
	if n.forgotten[name] > t.Incarnation {
		return nil
	}
	if n.raft != nil {
		if err := n.raft.closeQueue(ctx, name); err != nil {
			return fmt.Errorf("cluster: forgetting queue %q: %w", name, err)
		}
	}
	if q := n.m.Queue(name); q != nil {
		for p := range q.Partitions() {
			n.Metrics().setOwned(queue.PartitionID{Queue: name, Partition: p}, 0, false)
		}
	}
	if err := n.m.ForgetQueue(ctx, name); err != nil && !errors.Is(err, queue.ErrNoSuchQueue) {
		return fmt.Errorf("cluster: forgetting queue %q: %w", name, err)
	}
	// Until the node is off the tombstone, it must create nothing of the
	// queue again (it would forget that at its next start): it tries
	// until it is.
	for {
		err := n.leaveTombstone(ctx, name)
		if err == nil {
			break
		}
		n.log.Warn("taking this node off a deleted queue's tombstone", "queue", name, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: forgetting queue %q: %w", name, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	n.forgotten[name] = t.Incarnation + 1
	n.log.Info("deleted queue forgotten here", "queue", name, "incarnation", t.Incarnation)
	return nil
}

// leaveTombstone takes this node off the queue's tombstone.
func (n *Node) leaveTombstone(ctx context.Context, name string) error {
	dkey := n.keys.deleted(name)
	for {
		resp, err := n.etcd.Get(ctx, dkey)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var t Tombstone
		_ = json.Unmarshal(resp.Kvs[0].Value, &t)
		if !slices.Contains(t.Pending, n.opts.NodeID) {
			return nil
		}
		t.Pending = slices.DeleteFunc(t.Pending, func(id string) bool { return id == n.opts.NodeID })
		v, _ := json.Marshal(t)
		tr, err := n.etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(dkey), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(dkey, string(v))).Commit()
		if err != nil {
			return err
		}
		if tr.Succeeded {
			return nil
		}
	}
}

// closeQueue closes the raft groups of the queue name here and drops
// their logs, those stored and not open included, and waits until they
// are closed.
func (h *raftHost) closeQueue(ctx context.Context, name string) error {
	var open []*replica
	h.mu.Lock()
	for id, r := range h.replicas {
		if id.Queue == name {
			open = append(open, r)
		}
	}
	for id := range h.partLogs {
		if queue.ParentName(id.Queue) == name {
			delete(h.partLogs, id)
		}
	}
	delete(h.ackPolicies, name)
	h.mu.Unlock()
	for _, r := range open {
		if r.g != nil {
			r.g.Close()
		}
	}
	for _, r := range open {
		for r.isOpen() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	stored, err := h.store.Groups()
	if err != nil {
		return err
	}
	for _, g := range stored {
		if groupPartition(g).Queue == name {
			if err := h.store.Drop(g); err != nil {
				return err
			}
		}
	}
	return nil
}
