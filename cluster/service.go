package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// The node serves the queues to the MQTT side (queue.Service) for the
// whole cluster: a publish goes to its partition's owner, here or over
// the link to it; a consumer takes deliveries from every node; a
// settlement goes to the node whose lease it is.

var _ queue.Service = (*Node)(nil)

// notServed is the error of a partition with no reachable owner.
func notServed(id queue.PartitionID) error {
	return fmt.Errorf("%w: %s has no reachable owner", queue.ErrNotOwned, id)
}

// unknownOutcome is a write whose fate is unknown: sent on a link that
// broke before its answer came, or proposed to the replicas of a group
// this node stopped leading before it knew whether it was committed. It
// may be stored, so it is never tried again; errors.Is finds ErrNotOwned
// (0x83 to a producer).
type unknownOutcome struct{ err error }

func (e *unknownOutcome) Error() string        { return e.err.Error() }
func (e *unknownOutcome) Is(target error) bool { return target == queue.ErrNotOwned }

// open returns the named queue (or dead-letter queue), recording it in
// the cluster's catalog first when it is new.
func (n *Node) open(ctx context.Context, name string) (*queue.Queue, error) {
	if q := n.m.Queue(name); q != nil {
		return q, nil
	}
	parent := queue.ParentName(name)
	e, ok := n.catalog(parent)
	if !ok {
		o, declared, err := n.m.NewQueueOptions(parent)
		if err != nil {
			return nil, err
		}
		qi, err := n.catalogQueue(ctx, parent, o.Partitions, declared)
		if err != nil {
			return nil, err
		}
		e = catalogEntry{parent, qi}
	}
	q, err := n.m.Ensure(ctx, parent, e.info.shape())
	if err != nil {
		return nil, err
	}
	n.poke()
	if queue.IsDLQ(name) {
		return q.DLQ(), nil
	}
	return q, nil
}

// Create creates the named queue, in the cluster's catalog first.
func (n *Node) Create(ctx context.Context, name string) error {
	_, err := n.open(ctx, name)
	return err
}

// Settings returns the named queue's settings, or those it would have,
// with the cluster's partition count; asking creates nothing.
func (n *Node) Settings(ctx context.Context, name string) (queue.Options, error) {
	if q := n.m.Queue(name); q != nil {
		return q.Options(), nil
	}
	o, err := n.m.Settings(ctx, name)
	if err != nil {
		return o, err
	}
	if e, ok := n.catalog(name); ok {
		o.Partitions = e.info.Partitions
	}
	return o, nil
}

// CheckSubscription checks a subscription of a consumer here, against
// the group as this node knows it: a node where the group has not been
// read yet learns its subject filter from the partitions' owners, which
// refuse another one on the consumer's streams.
func (n *Node) CheckSubscription(ctx context.Context, f queue.Filter, o queue.ConsumerOptions) error {
	if q := n.m.Queue(f.Queue); q != nil {
		o.Subjects = f.Subjects
		return q.CheckSubscription(f.Group, o)
	}
	qo, err := n.Settings(ctx, f.Queue)
	if err != nil {
		return err
	}
	return queue.CheckNewSubscription(f, qo, o)
}

// Publish stores msg in its partition, on whichever node owns it; done
// runs once the owner stored it, or with ErrNotOwned when no owner could
// be reached within MoveWait (a move in progress, an owner down), or at
// once when the link to the owner broke with the publish in flight.
func (n *Node) Publish(ctx context.Context, name string, msg *queue.Message, done func(error)) {
	if !n.replicated(name) {
		if err := n.guard.check(); err != nil {
			done(err)
			return
		}
	}
	// Refused before the queue is opened: a refused first publish creates
	// no queue.
	if max := n.m.MaxPayload(); max > 0 && len(msg.Payload) > max {
		done(queue.TooLarge(len(msg.Payload), max))
		return
	}
	q, err := n.open(ctx, name)
	if err != nil {
		done(err)
		return
	}
	if msg.Origin == (queue.Origin{}) {
		msg.Origin = queue.Origin{Run: n.run, Seq: n.originSeq.Add(1)}
	}
	id := queue.PartitionID{Queue: q.Name(), Partition: queue.PartitionFor(msg.Key, q.Partitions())}
	n.route(ctx, id, msg, done, time.Now().Add(n.opts.MoveWait), false)
}

// route sends msg to partition id's owner. sticky: an attempt to store it
// in id had an unknown outcome, so it is routed to id again until id's
// owner answers, even when the queue grew meanwhile and the key has
// another partition now: only id's owner knows whether id stored it
// (publishHere), and routes it on if not.
func (n *Node) route(ctx context.Context, id queue.PartitionID, msg *queue.Message, done func(error), deadline time.Time, sticky bool) {
	retry := func(err error) bool {
		// An unknown outcome is routed again only with an origin: the
		// owner stores a publish once per origin (origins.go).
		var le *unknownOutcome
		unknown := errors.As(err, &le)
		if !errors.Is(err, queue.ErrNotOwned) || unknown && msg.Origin == (queue.Origin{}) || time.Now().After(deadline) {
			return false
		}
		go n.waitAndRoute(ctx, id, msg, done, deadline, sticky || unknown)
		return true
	}
	if _, owned := n.m.Owned(id); owned {
		n.publishHere(ctx, id, msg, func(err error) {
			if err != nil && retry(err) {
				return
			}
			done(err)
		})
		return
	}
	if owner := n.routeTo(id); owner != "" && owner != n.opts.NodeID {
		p, err := n.peer(owner)
		if errors.Is(err, errNotMember) && n.replicated(id.Queue) {
			// Its leader may serve on while its lease lapsed: raft, not
			// etcd, fences it.
			p, err = n.peerAny(owner)
		}
		switch {
		case err == nil:
			p.publish(id, msg, func(err error) {
				if err != nil && retry(err) {
					return
				}
				done(err)
			})
			return
		case !errors.Is(err, errNotMember):
			if uo := (&unknownOutcome{unavailable(id, owner, err)}); !retry(uo) {
				done(uo)
			}
			return
		case n.replicationFactor(id.Queue) <= 1:
			// Its owner is down: with one replica, nobody else has its
			// messages, so nobody else may append to it.
			done(fmt.Errorf("%w: %s: its owner %s is down", queue.ErrNotOwned, id, owner))
			return
		}
	}
	// Being claimed, moving, or electing a new leader: wait for its owner.
	if !retry(notServed(id)) {
		done(notServed(id))
	}
}

// waitAndRoute routes again once the ownership changed, or a moment
// passed, to the partition the key has then (to id when sticky, see
// route): the queue may have grown, and the partition refused a key that
// moved (queue.Growth).
func (n *Node) waitAndRoute(ctx context.Context, id queue.PartitionID, msg *queue.Message, done func(error), deadline time.Time, sticky bool) {
	n.mu.Lock()
	ch := n.notify
	n.mu.Unlock()
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-n.ctx.Done():
		done(queue.ErrClosed)
		return
	}
	if q := n.m.Queue(id.Queue); q != nil && !sticky {
		id.Partition = queue.PartitionFor(msg.Key, q.Partitions())
	}
	n.route(ctx, id, msg, done, deadline, sticky)
}

// ownerOf returns the node the ownership record names for id, or "".
// routeTo returns the node to send partition id's publishes to: the
// leader its raft group here knows of, if this node keeps a replica of
// it (the view's owner lags while a new leader cannot record itself in
// etcd), else the owner the view names.
func (n *Node) routeTo(id queue.PartitionID) string {
	if n.raft != nil {
		if r := n.raft.replica(queue.PartitionID{Queue: queue.ParentName(id.Queue), Partition: id.Partition}); r != nil && r.g != nil {
			if l := r.g.Leader(); l != "" {
				return l
			}
		}
	}
	return n.ownerOf(id)
}

func (n *Node) ownerOf(id queue.PartitionID) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.view.owners[queue.PartitionID{Queue: queue.ParentName(id.Queue), Partition: id.Partition}].Owner
}

// Subscribe adds a consumer here to the partitions this node serves and,
// through a stream to each other node, to theirs.
func (n *Node) Subscribe(ctx context.Context, f queue.Filter, r queue.Receiver, o queue.ConsumerOptions) (queue.Subscription, error) {
	if _, err := n.open(ctx, f.Queue); err != nil {
		return nil, err
	}
	local, err := n.m.Subscribe(ctx, f, r, o)
	if err != nil {
		return nil, err
	}
	return n.subscribeRemote(f, r, o, local), nil
}

// Settle ends a delivery, on the node that made it.
func (n *Node) Settle(l queue.LeaseRef, o queue.Outcome) error {
	return n.settle(l, settleOp(o))
}

// Received records the PUBACK of an explicit consumer's delivery.
func (n *Node) Received(l queue.LeaseRef) { _ = n.settle(l, pb.SettleOp_RECEIVED) }

// Extend renews a lease.
func (n *Node) Extend(l queue.LeaseRef) error { return n.settle(l, pb.SettleOp_EXTEND) }

func (n *Node) settle(l queue.LeaseRef, op pb.SettleOp) error {
	rs := n.remoteLease(l)
	if rs == nil {
		return settleHere(n.m, l, op)
	}
	return rs.settle(l, op)
}

// Declare records a queue of this node's config in the cluster's catalog
// and opens it here; a partition count that differs from the cluster's is
// ErrPartitionsChanged.
func (n *Node) Declare(ctx context.Context, name string) error {
	o, declared, err := n.m.NewQueueOptions(name)
	if err != nil {
		return err
	}
	qi, err := n.catalogQueue(ctx, name, o.Partitions, declared)
	if err != nil {
		return err
	}
	_, err = n.m.Ensure(ctx, name, qi.shape())
	n.poke()
	return err
}

// SetAddrs sets the client addresses the node publishes, before Start.
func (n *Node) SetAddrs(mqtt, http string) {
	n.opts.MQTT, n.opts.HTTP = mqtt, http
}

// ErrReplicationChange is DeclareQueue's error for a change of a queue's
// replication factor from 1 to more, or back: its partitions would change
// how they are kept (one owner fenced by etcd, or a raft group).
var ErrReplicationChange = errors.New("cluster: replication factor cannot change between 1 and more")

// Replication returns the replication factor and the ack policy queue
// name has in the cluster: its own, or the defaults.
func (n *Node) Replication(name string) (int, queue.AckPolicy) {
	return n.replicationFactor(name), n.ackPolicy(name)
}

// effectiveFactor is the replication factor a declaration of rf (0: the
// default) gives queue name.
func (n *Node) effectiveFactor(name string, rf int) int {
	switch {
	case n.raft == nil:
		return 1
	case rf > 0:
		return rf
	}
	if n.opts.QueueOptions != nil {
		if d := n.opts.QueueOptions(name).ReplicationFactor; d > 0 {
			return d
		}
	}
	return DefaultReplicationFactor
}

// QueueOwner returns the tenant that created the queue, as the
// cluster's catalog records it ("" when none did, or for a queue the
// catalog does not hold).
func (n *Node) QueueOwner(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.view.queues[name].Owner
}

// QueueOwners returns the owner of every queue of the catalog that has
// one (QueueOwner).
func (n *Node) QueueOwners() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]string{}
	for name, qi := range n.view.queues {
		if qi.Owner != "" {
			out[name] = qi.Owner
		}
	}
	return out
}

// DeclareQueue declares a queue's settings for the whole cluster (the
// admin API): recorded in the catalog, applied here at once and by every
// node as it sees the change. A partition count that differs from the
// cluster's is ErrPartitionsChanged. It reports whether the queue is new.
func (n *Node) DeclareQueue(ctx context.Context, name string, o queue.Options) (*queue.Queue, bool, error) {
	if err := o.Validate(); err != nil {
		return nil, false, err
	}
	if nodes := n.allowed(name); nodes != nil && o.ReplicationFactor > len(nodes) {
		return nil, false, &queue.FieldError{Field: "replication_factor", Reason: fmt.Sprintf("is %d, more than the %d nodes the cluster's placement allows queue %s (%s)",
			o.ReplicationFactor, len(nodes), name, strings.Join(nodes, ", "))}
	}
	key := n.keys.queue(name)
	isNew := false
	var qi QueueInfo
	for {
		resp, err := n.etcd.Get(ctx, key)
		if err != nil {
			return nil, false, fmt.Errorf("%w: reading queue %q from the cluster: %v", queue.ErrNotOwned, name, err)
		}
		decl := o
		qi = QueueInfo{Partitions: o.Partitions, Declared: &decl}
		var cmps []clientv3.Cmp
		if len(resp.Kvs) == 0 {
			inc, tomb, err := n.nextIncarnation(ctx, name)
			if err != nil {
				return nil, false, fmt.Errorf("%w: recording queue %q in the cluster: %v", queue.ErrNotOwned, name, err)
			}
			qi.Incarnation = inc
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0), tomb)
		} else {
			var have QueueInfo
			_ = json.Unmarshal(resp.Kvs[0].Value, &have)
			qi.Incarnation, qi.Owner, qi.Growths = have.Incarnation, have.Owner, have.Growths
			if have.Partitions > o.Partitions {
				return nil, false, fmt.Errorf("%w: queue %q has %d partitions in the cluster, asked for %d: a queue's partitions can grow, not shrink",
					queue.ErrPartitionsChanged, name, have.Partitions, o.Partitions)
			}
			if have.Partitions < o.Partitions {
				// Every node grows the queue as it sees the entry; each
				// old partition's server cuts it (queue.Growth).
				qi.Growths = append(slices.Clone(have.Growths), queue.Growth{From: have.Partitions, To: o.Partitions})
			}
			if was, will := n.replicationFactor(name), n.effectiveFactor(name, o.ReplicationFactor); (was == 1) != (will == 1) {
				return nil, false, fmt.Errorf("%w: queue %q has %d replicas per partition, asked for %d: a queue keeps one replica or several for its life; declare a new queue and move its consumers to it",
					ErrReplicationChange, name, was, will)
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision))
		}
		info, _ := json.Marshal(qi)
		tr, err := n.etcd.Txn(ctx).If(cmps...).Then(clientv3.OpPut(key, string(info))).Commit()
		if err != nil {
			return nil, false, fmt.Errorf("%w: recording queue %q in the cluster: %v", queue.ErrNotOwned, name, err)
		}
		if tr.Succeeded {
			isNew = len(resp.Kvs) == 0
			break
		}
	}
	if !isNew {
		if _, err := n.m.Ensure(ctx, name, qi.shape()); err != nil {
			return nil, false, err
		}
	}
	q, _, err := n.m.Declare(ctx, name, o)
	n.poke()
	return q, isNew, err
}

// settleOp is the wire operation of outcome o.
func settleOp(o queue.Outcome) pb.SettleOp {
	switch o {
	case queue.Nack:
		return pb.SettleOp_NACK
	case queue.Reject:
		return pb.SettleOp_REJECT
	case queue.Unsent:
		return pb.SettleOp_UNSENT
	case queue.Returned:
		return pb.SettleOp_RETURNED
	case queue.Release:
		return pb.SettleOp_RELEASE
	}
	return pb.SettleOp_ACK
}

// settleHere applies op to a lease of this node.
func settleHere(m *queue.Manager, l queue.LeaseRef, op pb.SettleOp) error {
	switch op {
	case pb.SettleOp_ACK:
		return m.Settle(l, queue.Ack)
	case pb.SettleOp_NACK:
		return m.Settle(l, queue.Nack)
	case pb.SettleOp_REJECT:
		return m.Settle(l, queue.Reject)
	case pb.SettleOp_UNSENT:
		return m.Settle(l, queue.Unsent)
	case pb.SettleOp_RETURNED:
		return m.Settle(l, queue.Returned)
	case pb.SettleOp_RELEASE:
		return m.Settle(l, queue.Release)
	case pb.SettleOp_RECEIVED:
		m.Received(l)
		return nil
	case pb.SettleOp_EXTEND:
		return m.Extend(l)
	}
	return fmt.Errorf("cluster: unknown settle operation %v", op)
}

// publishHere stores msg in partition id, which this node serves, once
// per origin: a publish whose origin it stored already is answered as
// stored; one whose first copy is still on its way here is routed again a
// moment later.
func (n *Node) publishHere(ctx context.Context, id queue.PartitionID, msg *queue.Message, done func(error)) {
	o := msg.Origin
	if o == (queue.Origin{}) {
		n.m.Publish(ctx, id.Queue, msg, done)
		return
	}
	switch n.origins.begin(o) {
	case originStored:
		done(nil)
		return
	case originPending:
		done(fmt.Errorf("%w: %s: the same publish is being stored", queue.ErrNotOwned, id))
		return
	}
	if q := n.m.Queue(id.Queue); q != nil {
		if to := queue.PartitionFor(msg.Key, q.Partitions()); to != id.Partition {
			// Sent to id before the queue grew and its key moved,
			// again after an unknown outcome in id (route): id did not
			// store it, this node serving id knows every origin id's log
			// holds, so it goes to the key's partition now. Routed from
			// the node that sent it, it might have been stored twice: in
			// id, whose outcome was lost, and in the new partition, led
			// by a replica that had not applied id's entry yet.
			n.origins.end(o, false)
			n.log.Debug("publish routed on to the partition its key has since a growth", "queue", id.Queue, "from", id.Partition, "to", to)
			n.route(ctx, queue.PartitionID{Queue: id.Queue, Partition: to}, msg, done, time.Now().Add(n.opts.MoveWait), false)
			return
		}
	}
	n.m.Publish(ctx, id.Queue, msg, func(err error) {
		n.origins.end(o, err == nil)
		done(err)
	})
}
