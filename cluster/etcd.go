package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardq/shardq/queue"
)

// What the cluster keeps in etcd, under the prefix P:
//
//	P nodes/{id}          NodeInfo, under the node's lease: the live members
//	P known/{id}          "", kept: every node id that ever joined
//	P queues/{name}       QueueInfo, kept: the catalog of queues
//	P owners/{queue}/{p}  Ownership, kept: the owner and epoch of a partition
//	P placement           []PlacementRule, kept: which nodes may hold which queues
//	P drain/{id}          "", kept: the node is drained of its partitions
//	P deleted/{name}      Tombstone, kept: the queue was deleted, and who
//	                      has yet to forget it (deletequeue.go)
//
// A partition's owner claims it with a transaction on the ownership key's
// revision that raises the epoch; a dead-letter partition goes with its
// queue's partition, under the same key and epoch.

type keys struct{ prefix string }

func (k keys) node(id string) string  { return k.prefix + "nodes/" + id }
func (k keys) known(id string) string { return k.prefix + "known/" + id }
func (k keys) drain(id string) string { return k.prefix + "drain/" + id }
func (k keys) placement() string      { return k.prefix + "placement" }
func (k keys) deleted(name string) string {
	return k.prefix + "deleted/" + name
}
func (k keys) queue(name string) string {
	return k.prefix + "queues/" + name
}
func (k keys) owner(id queue.PartitionID) string {
	return k.prefix + "owners/" + id.Queue + "/" + strconv.Itoa(id.Partition)
}

// NodeInfo is what a member publishes about itself.
type NodeInfo struct {
	ID      string `json:"id"`
	MQTT    string `json:"mqtt"`
	HTTP    string `json:"http"`
	Cluster string `json:"cluster_addr"`
	Session int64  `json:"session"` // its lease id
	// Instance names the node's data directory: a node that finds its id
	// held by an earlier run of the same directory (killed, its lease not
	// yet expired) takes the id over at once.
	Instance string `json:"instance,omitempty"`
}

// QueueInfo is a queue's entry in the catalog.
type QueueInfo struct {
	Partitions int `json:"partitions"`
	// Declared holds the settings declared through the admin API, which
	// every node applies; nil: each node's config decides.
	Declared *queue.Options `json:"declared,omitempty"`
	// Incarnation counts the times the queue was deleted and created
	// again: its partitions' raft groups are named after it (groupName).
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Owner is the tenant whose client created the queue (queue.Owner).
	Owner string `json:"owner,omitempty"`
	// Growths are the growths of its partitions, oldest first, without
	// cuts: each old partition's server takes its own (queue.Growth).
	Growths []queue.Growth `json:"growths,omitempty"`
	created int64          // the key's create revision: one per incarnation
}

// shape is what the queue package needs of the entry to open the queue
// as the catalog has it.
func (qi QueueInfo) shape() queue.Catalogued {
	return queue.Catalogued{Partitions: qi.Partitions, Growths: qi.Growths, Declared: qi.Declared}
}

// Ownership records who owns a partition, under which epoch. Session is
// the owner's lease when it claimed: an owner that finds another session
// there restarted or lost its lease, and claims again with a higher epoch.
type Ownership struct {
	Owner   string `json:"owner"`
	Epoch   uint64 `json:"epoch"`
	Session int64  `json:"session"`
	// Replicas are the voters of a replicated partition's raft group, as
	// its leader applied them; empty for a partition with one replica.
	// Learners are the replicas being added, catching up before they
	// vote.
	Replicas []string `json:"replicas,omitempty"`
	Learners []string `json:"learners,omitempty"`
	// IDs are the raft ids of the replicas and learners that are not
	// multiraft.ID(node), by node: those added to the group after it
	// was created, each under an id of its own (multiraft/ids.go). A
	// node added reads its id here.
	IDs map[string]uint64 `json:"ids,omitempty"`
	// Term is the raft term of the leader that claimed a replicated
	// partition: a leader of an older term, paused or cut off, may not
	// claim it back.
	Term uint64 `json:"term,omitempty"`
	// Incarnation is the incarnation of the queue the record is of
	// (QueueInfo): it names the partition's raft group.
	Incarnation uint64 `json:"incarnation,omitempty"`
	rev         int64  // the key's mod revision
}

// view is the node's copy of the cluster's keys, kept by the watch.
type view struct {
	nodes map[string]NodeInfo
	known map[string]bool
	// draining: the nodes drained of their partitions (Node.Drain).
	draining map[string]bool
	queues   map[string]QueueInfo
	owners   map[queue.PartitionID]Ownership
	// placement is the cluster's placement rules (publishPlacement).
	placement []PlacementRule
	// deleted: the tombstones of deleted queues, by name.
	deleted  map[string]Tombstone
	rev      int64
	leaving  bool              // this node is leaving: it wants no partition
	plain    interest          // every node's plain topic filters (plain.go)
	sessions map[string]string // the node holding each recorded session, by client ID (sessions.go)
}

func newView() view {
	return view{nodes: map[string]NodeInfo{}, known: map[string]bool{}, draining: map[string]bool{}, queues: map[string]QueueInfo{}, owners: map[queue.PartitionID]Ownership{}, sessions: map[string]string{}, deleted: map[string]Tombstone{}}
}

// apply records one key's new value (nil: deleted), with its mod and
// create revisions.
func (v *view) apply(k keys, key string, value []byte, rev, created int64) {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if !ok {
		return
	}
	kind, name, _ := strings.Cut(rest, "/")
	switch kind {
	case "placement":
		v.placement = nil
		if value != nil {
			_ = json.Unmarshal(value, &v.placement)
		}
	case "nodes":
		if value == nil {
			delete(v.nodes, name)
			return
		}
		var ni NodeInfo
		if json.Unmarshal(value, &ni) == nil {
			v.nodes[name] = ni
		}
	case "known":
		if value == nil {
			delete(v.known, name)
		} else {
			v.known[name] = true
		}
	case "drain":
		if value == nil {
			delete(v.draining, name)
		} else {
			v.draining[name] = true
		}
	case "queues":
		if value == nil {
			delete(v.queues, name)
			return
		}
		var qi QueueInfo
		if json.Unmarshal(value, &qi) == nil {
			qi.created = created
			v.queues[name] = qi
		}
	case "owners":
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return
		}
		p, err := strconv.Atoi(name[i+1:])
		if err != nil {
			return
		}
		id := queue.PartitionID{Queue: name[:i], Partition: p}
		if value == nil {
			delete(v.owners, id)
			return
		}
		var o Ownership
		if json.Unmarshal(value, &o) == nil {
			o.rev = rev
			v.owners[id] = o
		}
	case "deleted":
		if value == nil {
			delete(v.deleted, name)
			return
		}
		var t Tombstone
		if json.Unmarshal(value, &t) == nil {
			v.deleted[name] = t
		}
	case "interest": // ordinary MQTT across nodes (plain.go)
		v.plain.apply(name, value != nil)
	case "sessions":
		v.applySession(name, value)
	}
}

// join registers the node under a new lease. A live node holding the id
// keeps it: the call waits one lease TTL for it to expire (a restarted
// node finds its own previous key), then fails with ErrNodeIDInUse.
func (n *Node) join(ctx context.Context) error {
	deadline := time.Now().Add(n.opts.LeaseTTL + 2*time.Second)
	for {
		err := n.register(ctx)
		if err == nil || !errors.Is(err, ErrNodeIDInUse) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// register takes a lease, writes the node's key under it if no live node
// holds the id, and keeps the lease alive.
func (n *Node) register(ctx context.Context) error {
	ttl := int64(n.opts.LeaseTTL / time.Second)
	if ttl < 1 {
		ttl = 1
	}
	// The lease starts after the request leaves: it lasts at least until
	// the request's time plus its TTL.
	asked := monoNow()
	grant, err := n.etcd.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("cluster: etcd lease: %w", err)
	}
	if late := time.Duration(monoNow() - asked); late > time.Duration(ttl)*time.Second/3 {
		// Answered late (etcd was paused, or far): counted from when it
		// was asked for, the lease would look spent at once, and be
		// given up for another. Asked for again, now that etcd answers.
		_, _ = n.etcd.Revoke(context.Background(), grant.ID)
		n.log.Info("etcd granted the lease late; asking again", "took", late.Round(time.Millisecond))
		asked = monoNow()
		if grant, err = n.etcd.Grant(ctx, ttl); err != nil {
			return fmt.Errorf("cluster: etcd lease: %w", err)
		}
	}
	info, _ := json.Marshal(NodeInfo{ID: n.opts.NodeID, MQTT: n.opts.MQTT, HTTP: n.opts.HTTP, Cluster: n.addr, Session: int64(grant.ID), Instance: n.opts.Instance})
	key := n.keys.node(n.opts.NodeID)
	resp, err := n.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(info), clientv3.WithLease(grant.ID)), clientv3.OpPut(n.keys.known(n.opts.NodeID), "")).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		_, _ = n.etcd.Revoke(context.Background(), grant.ID)
		return fmt.Errorf("cluster: registering node %s: %w", n.opts.NodeID, err)
	}
	if !resp.Succeeded {
		_, _ = n.etcd.Revoke(context.Background(), grant.ID)
		var other NodeInfo
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &other)
		}
		n.mu.Lock()
		mine := n.session
		n.mu.Unlock()
		if n.opts.Instance != "" && other.Instance == n.opts.Instance && other.Session != int64(mine) {
			// An earlier run of this data directory, which this process
			// holds now: that run is over. Its lease goes, and the id
			// with it.
			if _, err := n.etcd.Revoke(ctx, clientv3.LeaseID(other.Session)); err != nil {
				return fmt.Errorf("cluster: ending the lease of this node's earlier run: %w", err)
			}
			n.log.Info("took the node id over from an earlier run of this data directory", "node", n.opts.NodeID)
			return n.register(ctx)
		}
		return fmt.Errorf("%w: node id %q is held by a live node (cluster address %s); node ids must be unique", ErrNodeIDInUse, n.opts.NodeID, other.Cluster)
	}
	n.guard.renewed(asked, time.Duration(grant.TTL)*time.Second)
	n.etcdRenewed.Store(asked)
	n.etcdFailing.Store(0)
	n.mu.Lock()
	n.session = grant.ID
	n.mu.Unlock()
	n.member.Store(true)
	n.wg.Add(1)
	go n.keepAlive(grant.ID, asked, time.Duration(grant.TTL)*time.Second)
	n.log.Info("joined the cluster", "node", n.opts.NodeID, "cluster_addr", n.addr, "lease", int64(grant.ID))
	n.plainRegistered() // ordinary MQTT across nodes: interest and client IDs under the new lease (plain.go)
	return nil
}

// keepAlive renews the lease a third of its TTL after each renewal, and
// the guard with each renewal etcd confirmed, dated from when the request
// left (an answer read late, after a pause, extends nothing). When the
// lease is lost (etcd unreachable past the TTL, or the node was paused),
// the node stops serving its partitions and joins again.
func (n *Node) keepAlive(id clientv3.LeaseID, renewed int64, ttl time.Duration) {
	defer n.wg.Done()
	t := time.NewTimer(ttl / 3)
	defer t.Stop()
	// handing: renewals failed past half the lease, and the leadership of
	// the replicated partitions goes to replicas that may reach etcd: this
	// node will soon commit nothing (its guard), and would stall them.
	handing := false
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if monoNow() >= renewed+int64(ttl) {
			break // past the lease: etcd may have ended it already
		}
		asked := monoNow()
		ctx, cancel := context.WithDeadline(n.ctx, clockStart.Add(time.Duration(renewed)+ttl))
		resp, err := n.etcd.KeepAliveOnce(ctx, id)
		cancel()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			break
		}
		if err != nil {
			n.log.Debug("renewing the cluster lease", "err", err)
			n.etcdFailing.CompareAndSwap(0, asked)
			if !handing && n.raft != nil && monoNow()-renewed > int64(ttl/2) {
				handing = true
				n.handOverFromEtcd(n.etcdFailing.Load(), err)
			}
			t.Reset(100 * time.Millisecond)
			continue
		}
		ttl = time.Duration(resp.TTL) * time.Second
		renewed = asked
		n.guard.renewed(asked, ttl)
		n.etcdRenewed.Store(asked)
		n.etcdFailing.Store(0)
		if handing {
			handing = false
			n.mu.Lock()
			leaving := n.view.leaving
			n.mu.Unlock()
			if !leaving {
				n.raft.mr.StopTransfers()
				n.log.Info("renewed the cluster lease again: this node may lead partitions again")
			}
		}
		t.Reset(ttl / 3)
	}
	if n.ctx.Err() != nil {
		return
	}
	n.guard.lost()
	n.member.Store(false)
	n.mu.Lock()
	if n.session == id {
		n.session = 0
	}
	leaving := n.view.leaving
	n.mu.Unlock()
	n.log.Warn("lost the cluster lease: serving no partition of one replica until joined again; replicated ones go on under raft")
	n.Metrics().leasesLost.Inc()
	n.releaseAll()
	if leaving {
		return
	}
	for n.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(n.ctx, n.opts.LeaseTTL)
		err := n.register(ctx)
		cancel()
		if err == nil {
			if handing && n.raft != nil {
				n.raft.mr.StopTransfers() // a member again, under a new lease
			}
			n.poke()
			return
		}
		n.log.Warn("joining the cluster again", "err", err)
		select {
		case <-n.ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// handOverFromEtcd, on a node that could not renew its lease for half of
// it: the leadership of each replicated partition goes to a replica that
// reaches etcd, as its raft messages say (it renewed its lease after
// since, when this node's renewals began to fail), which can record
// itself as the owner and route publishes; this node would stall the
// partitions once its lease lapsed. Where no replica reaches etcd (etcd
// is down, or cut off from every one), the leaders stay: raft, not etcd,
// fences a replicated partition's writes and deliveries, and they go on.
func (n *Node) handOverFromEtcd(since int64, why error) {
	self := n.opts.NodeID
	to := func(node string) bool { return node != self && n.peerRenewedSince(node, since) }
	handed, kept := 0, 0
	for _, r := range n.raft.all() {
		if !r.g.IsLeader() {
			continue
		}
		if !slices.ContainsFunc(r.g.Replicas(), to) {
			kept++
			continue
		}
		handed++
		n.releasePartition(r.id) // before a transfer elects the next leader at once
		r.g.RequestTransfer(to)
	}
	if handed > 0 {
		// Cut off from etcd alone: leaderships this node takes meanwhile
		// go the same way. Not when no replica reached etcd (etcd is down
		// for all): the first node to renew once it is back would be
		// handed every leadership of the others at once.
		n.raft.mr.TransferAll(to)
	}
	n.log.Warn("cannot renew the cluster lease: the leadership of replicated partitions goes to replicas that reach etcd",
		"handed", handed, "kept_no_replica_reaches_etcd", kept, "err", why)
}

// deregister removes the node from the membership (the lease ends).
func (n *Node) deregister(ctx context.Context) error {
	n.mu.Lock()
	id := n.session
	n.mu.Unlock()
	if id == 0 {
		return nil
	}
	_, err := n.etcd.Delete(ctx, n.keys.node(n.opts.NodeID))
	return err
}

// watch keeps the view: one read of every key, then the changes.
func (n *Node) watch(rev int64) {
	defer n.wg.Done()
	for n.ctx.Err() == nil {
		if rev == 0 {
			var err error
			if rev, err = n.loadView(n.ctx); err != nil {
				n.log.Warn("reading the cluster's keys", "err", err)
				select {
				case <-n.ctx.Done():
					return
				case <-time.After(500 * time.Millisecond):
				}
				continue
			}
		}
		wch := n.etcd.Watch(clientv3.WithRequireLeader(n.ctx), n.keys.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		rev = 0 // after a break, read everything again
		for wr := range wch {
			if wr.Err() != nil {
				n.log.Warn("watching the cluster's keys", "err", wr.Err())
				break
			}
			n.mu.Lock()
			ownership := false
			var retained []PlainMessage
			for _, ev := range wr.Events {
				if key := string(ev.Kv.Key); retainedKey(n.keys, key) {
					retained = append(retained, n.retainedRecord(key, ev.Type == mvccpb.Event_PUT, ev.Kv.Value))
					continue
				}
				ownership = ownership || !plainKey(n.keys, string(ev.Kv.Key))
				if topologyKey(n.keys, string(ev.Kv.Key)) {
					n.topology.Add(1)
				}
				var value []byte
				if ev.Type == mvccpb.Event_PUT {
					value = ev.Kv.Value
					if value == nil {
						value = []byte{} // an empty value, not a delete
					}
				}
				n.view.apply(n.keys, string(ev.Kv.Key), value, ev.Kv.ModRevision, ev.Kv.CreateRevision)
				if t, ok := n.view.deleted[deletedName(n.keys, string(ev.Kv.Key))]; ok && slices.Contains(t.Pending, n.opts.NodeID) && ev.Type == mvccpb.Event_PUT {
					// Forgotten before any later change is seen, such
					// as the queue created again.
					n.mu.Unlock()
					if err := n.forget(n.ctx, deletedName(n.keys, string(ev.Kv.Key)), t); err != nil {
						n.log.Error("forgetting a deleted queue", "err", err)
					}
					n.mu.Lock()
				}
			}
			n.view.rev = wr.Header.Revision
			n.mu.Unlock()
			if len(retained) > 0 {
				n.applyRetained(retained, false)
			}
			if ownership {
				// Interest and client ids (plain MQTT) change with every
				// connection: they need no reconcile of the partitions.
				n.changedView()
			}
		}
	}
}

// loadView reads every key of the cluster into a new view and returns the
// revision it was read at.
func (n *Node) loadView(ctx context.Context) (int64, error) {
	resp, err := n.etcd.Get(ctx, n.keys.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	v := newView()
	retained := []PlainMessage{}
	for _, kv := range resp.Kvs {
		if key := string(kv.Key); retainedKey(n.keys, key) {
			retained = append(retained, n.retainedRecord(key, true, kv.Value))
			continue
		}
		value := kv.Value
		if value == nil {
			value = []byte{}
		}
		v.apply(n.keys, string(kv.Key), value, kv.ModRevision, kv.CreateRevision)
	}
	n.applyRetained(retained, true)
	v.rev = resp.Header.Revision
	// Deleted queues are forgotten before the view shows what came
	// after, such as a queue created again.
	if err := n.forgetTombstones(ctx, v.deleted); err != nil {
		return 0, err
	}
	n.mu.Lock()
	v.leaving = n.view.leaving
	n.view = v
	n.mu.Unlock()
	n.topology.Add(1)
	n.changedView()
	return resp.Header.Revision, nil
}

// topologyKey reports whether key is one of those every partition's
// placement follows: the nodes, drains, placement and queues.
func topologyKey(k keys, key string) bool {
	rest, _ := strings.CutPrefix(key, k.prefix)
	for _, p := range []string{"nodes/", "known/", "drain/", "placement", "queues/"} {
		if strings.HasPrefix(rest, p) {
			return true
		}
	}
	return false
}

// plainKey reports whether key is one of plain MQTT's: interest, a
// client id or a session's record.
func plainKey(k keys, key string) bool {
	rest, _ := strings.CutPrefix(key, k.prefix)
	return strings.HasPrefix(rest, "interest/") || strings.HasPrefix(rest, "clients/") || strings.HasPrefix(rest, "sessions/")
}

func (n *Node) changedView() {
	n.mu.Lock()
	for id := range n.gone {
		if _, live := n.view.nodes[id]; live {
			delete(n.gone, id)
		}
	}
	n.mu.Unlock()
	n.poke()
	n.ownershipChanged()
	n.abandonForwards()
	n.refreshSubs()
}

// catalogQueue returns the partition count of the named queue, recording
// partitions for it when the catalog has none. A queue the catalog holds
// with another count is ErrPartitionsChanged when declared is set (this
// node's config says partitions); otherwise the catalog's count is used.
func (n *Node) catalogQueue(ctx context.Context, name string, partitions int, declared bool) (QueueInfo, error) {
	key := n.keys.queue(name)
	var have QueueInfo
	for {
		inc, cmp, err := n.nextIncarnation(ctx, name)
		if err != nil {
			return QueueInfo{}, fmt.Errorf("%w: recording queue %q in the cluster: %v", queue.ErrNotOwned, name, err)
		}
		qi := QueueInfo{Partitions: partitions, Incarnation: inc, Owner: queue.OwnerFrom(ctx)}
		info, _ := json.Marshal(qi)
		resp, err := n.etcd.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), cmp).
			Then(clientv3.OpPut(key, string(info))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return QueueInfo{}, fmt.Errorf("%w: recording queue %q in the cluster: %v", queue.ErrNotOwned, name, err)
		}
		if resp.Succeeded {
			qi.created = resp.Header.Revision
			n.mu.Lock()
			n.view.queues[name] = qi
			n.mu.Unlock()
			return qi, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &have)
			break
		}
		// The tombstone changed: deleted again meanwhile.
	}
	// A queue grown in the cluster keeps the count the config started it
	// with, or less, in the config.
	if grown := len(have.Growths) > 0 && partitions < have.Partitions; declared && have.Partitions != partitions && !grown {
		return QueueInfo{}, fmt.Errorf("%w: queue %q has %d partitions in the cluster, this node's config says %d: the cluster's count grows through the admin API (PUT /api/v1/queues/%s), not the config",
			queue.ErrPartitionsChanged, name, have.Partitions, partitions, name)
	}
	return have, nil
}

// checkCatalog records the queues this node has in the cluster's catalog
// and refuses to start when a count differs from the cluster's.
func (n *Node) checkCatalog(ctx context.Context) error {
	for _, q := range n.m.Queues() {
		if queue.IsDLQ(q.Name()) {
			continue
		}
		qi, err := n.catalogQueue(ctx, q.Name(), q.Partitions(), true)
		if err != nil {
			return err
		}
		// Grown while this node was down: it grows too.
		if _, err := n.m.Ensure(ctx, q.Name(), qi.shape()); err != nil {
			return err
		}
	}
	return nil
}

// deletedName returns the queue a tombstone's key names, "" for another
// key.
func deletedName(k keys, key string) string {
	name, ok := strings.CutPrefix(key, k.deleted(""))
	if !ok {
		return ""
	}
	return name
}

// ErrUnknownNode is returned by Start when a placement rule names a node
// that never joined the cluster.
var ErrUnknownNode = errors.New("cluster: placement names an unknown node")

// checkPlacement refuses placement rules naming nodes the cluster does
// not know (that never joined).
func (n *Node) checkPlacement(ctx context.Context) error {
	if len(n.opts.PlacementRules) == 0 {
		return nil
	}
	resp, err := n.etcd.Get(ctx, n.keys.prefix+"known/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("cluster: reading the known nodes: %w", err)
	}
	known := map[string]bool{n.opts.NodeID: true}
	for _, kv := range resp.Kvs {
		known[strings.TrimPrefix(string(kv.Key), n.keys.prefix+"known/")] = true
	}
	if unknown := n.unknownPlacement(known); unknown != "" {
		return fmt.Errorf("%w: %s", ErrUnknownNode, unknown)
	}
	return nil
}

// PlacementRule pins the queues whose names match a glob (path.Match) to
// nodes: the first rule that matches a queue gives the nodes that may own
// its partitions.
type PlacementRule struct {
	Name   string `json:"name"` // how the config names the rule, e.g. cluster.placement[1]
	Queues string `json:"queues,omitempty"`
	// Tenants, instead of Queues, places the queues these tenants created
	// (QueueInfo.Owner).
	Tenants []string `json:"tenants,omitempty"`
	Nodes   []string `json:"nodes"`
}

// matches reports whether the rule places queue name, created by owner.
func (r PlacementRule) matches(name, owner string) bool {
	if len(r.Tenants) > 0 {
		return owner != "" && slices.Contains(r.Tenants, owner)
	}
	ok, _ := path.Match(r.Queues, name)
	return ok
}

// What names what the rule places, for messages.
func (r PlacementRule) What() string {
	if len(r.Tenants) > 0 {
		return "tenants " + strings.Join(r.Tenants, ",")
	}
	return r.Queues
}

// publishPlacement seeds the cluster's placement with this node's rules
// when the cluster has none yet: from then on the cluster's rules are
// changed at runtime (SetPlacement), not by a node's config.
func (n *Node) publishPlacement(ctx context.Context) error {
	if len(n.opts.PlacementRules) == 0 {
		return nil
	}
	key := n.keys.placement()
	v, _ := json.Marshal(n.opts.PlacementRules)
	resp, err := n.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(v))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		var have []PlacementRule
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &have)
		}
		if !samePlacement(have, n.opts.PlacementRules) {
			n.log.Warn("the cluster's placement differs from this node's cluster.placement, which only seeds an empty one; change it with shardq cluster placement set",
				"cluster", placementString(have), "config", placementString(n.opts.PlacementRules))
		}
	}
	return nil
}

func samePlacement(a, b []PlacementRule) bool {
	return slices.EqualFunc(a, b, func(x, y PlacementRule) bool {
		return x.Queues == y.Queues && slices.Equal(x.Tenants, y.Tenants) && slices.Equal(x.Nodes, y.Nodes)
	})
}

func placementString(rules []PlacementRule) string {
	if len(rules) == 0 {
		return "none"
	}
	parts := make([]string, len(rules))
	for i, r := range rules {
		parts[i] = r.What() + "=" + strings.Join(r.Nodes, ",")
	}
	return strings.Join(parts, " ")
}

// Placement returns the cluster's placement rules, as this node sees
// them.
func (n *Node) Placement() []PlacementRule {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.view.placement)
}

// ErrBadPlacement is SetPlacement's error for rules that cannot be
// applied.
var ErrBadPlacement = errors.New("cluster: bad placement")

// SetPlacement makes rules the cluster's placement (none: every queue on
// every node). Every node follows at once: the partitions of a queue
// move to the nodes its rule names, a few at a time. A rule must have a
// valid pattern and name nodes that joined the cluster once.
func (n *Node) SetPlacement(ctx context.Context, rules []PlacementRule) error {
	known := n.knownNodes()
	for i := range rules {
		r := &rules[i]
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule %d", i+1)
		}
		switch {
		case len(r.Tenants) > 0 && r.Queues != "":
			return fmt.Errorf("%w: %s names queues and tenants: a rule names one or the other", ErrBadPlacement, r.Name)
		case len(r.Tenants) > 0:
			if slices.Contains(r.Tenants, "") {
				return fmt.Errorf("%w: %s names an empty tenant", ErrBadPlacement, r.Name)
			}
		default:
			if _, err := path.Match(r.Queues, ""); err != nil || r.Queues == "" {
				return fmt.Errorf("%w: %s: queues pattern %q is not a valid glob (for example orders-*), and it names no tenants", ErrBadPlacement, r.Name, r.Queues)
			}
		}
		if len(r.Nodes) == 0 {
			return fmt.Errorf("%w: %s names no node", ErrBadPlacement, r.Name)
		}
		for _, id := range r.Nodes {
			if !known[id] {
				return fmt.Errorf("%w: %s names node %q, which never joined the cluster (known: %s)", ErrBadPlacement, r.Name, id, strings.Join(sortedKeys(known), ", "))
			}
		}
	}
	n.mu.Lock()
	names := slices.Sorted(maps.Keys(n.view.queues))
	owners := map[string]string{}
	for name, qi := range n.view.queues {
		owners[name] = qi.Owner
	}
	n.mu.Unlock()
	for _, name := range names {
		for _, r := range rules {
			if r.matches(name, owners[name]) {
				if rf := min(n.replicationFactor(name), len(known)); rf > len(r.Nodes) {
					return fmt.Errorf("%w: %s gives queue %q %d node(s), fewer than its replication factor %d: name at least %d",
						ErrBadPlacement, r.Name, name, len(r.Nodes), rf, rf)
				}
				break
			}
		}
	}
	key := n.keys.placement()
	var err error
	if len(rules) == 0 {
		_, err = n.etcd.Delete(ctx, key)
	} else {
		v, _ := json.Marshal(rules)
		_, err = n.etcd.Put(ctx, key, string(v))
	}
	if err != nil {
		return fmt.Errorf("%w: recording the placement in etcd: %v", queue.ErrNotOwned, err)
	}
	n.log.Info("cluster placement changed", "placement", placementString(rules))
	return nil
}

// knownNodes returns every node id that joined the cluster once.
func (n *Node) knownNodes() map[string]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	known := map[string]bool{n.opts.NodeID: true}
	for id := range n.view.known {
		known[id] = true
	}
	for id := range n.view.nodes {
		known[id] = true
	}
	return known
}

// ErrUnknownNodeID is Drain's error for a node that never joined.
var ErrUnknownNodeID = errors.New("cluster: no such node")

// Drain marks node drained (on) or not: a drained node is given no
// partition, replica or leadership; those it holds move to the other
// nodes, a few at a time, and it can then be stopped without any
// partition losing a replica. Drained is kept until undrained, across
// restarts.
func (n *Node) Drain(ctx context.Context, node string, on bool) error {
	if !n.knownNodes()[node] {
		return fmt.Errorf("%w: %q never joined the cluster (known: %s)", ErrUnknownNodeID, node, strings.Join(sortedKeys(n.knownNodes()), ", "))
	}
	var err error
	if on {
		_, err = n.etcd.Put(ctx, n.keys.drain(node), "")
	} else {
		_, err = n.etcd.Delete(ctx, n.keys.drain(node))
	}
	if err != nil {
		return fmt.Errorf("%w: recording the drain in etcd: %v", queue.ErrNotOwned, err)
	}
	n.log.Info("node drain changed", "node", node, "drained", on)
	return nil
}

func (n *Node) unknownPlacement(known map[string]bool) string {
	for _, r := range n.opts.PlacementRules {
		for _, id := range r.Nodes {
			if !known[id] {
				return fmt.Sprintf("%s names node %q, which never joined the cluster (known: %s)", r.Name, id, strings.Join(sortedKeys(known), ", "))
			}
		}
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// claim makes this node the owner of id with the next epoch, if the
// ownership key is still as seen (prev nil: absent).
func (n *Node) claim(ctx context.Context, id queue.PartitionID, prev *Ownership, owner string, session int64) (Ownership, bool, error) {
	key := n.keys.owner(id)
	next := Ownership{Owner: owner, Epoch: 1, Session: session}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if prev != nil {
		next.Epoch = prev.Epoch + 1
		next.Replicas, next.Learners, next.IDs = prev.Replicas, prev.Learners, prev.IDs
		next.Term, next.Incarnation = prev.Term, prev.Incarnation
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", prev.rev)
	}
	return n.writeOwnership(ctx, id, cmp, next)
}

// claimLeader records this node, raft leader of id in term, as its owner
// with the next epoch, if the record is still prev.
func (n *Node) claimLeader(ctx context.Context, id queue.PartitionID, prev Ownership, session int64, term uint64) (Ownership, bool, error) {
	next := Ownership{Owner: n.opts.NodeID, Epoch: prev.Epoch + 1, Session: session, Replicas: prev.Replicas, Learners: prev.Learners, IDs: prev.IDs, Term: term, Incarnation: prev.Incarnation}
	return n.writeOwnership(ctx, id, clientv3.Compare(clientv3.ModRevision(n.keys.owner(id)), "=", prev.rev), next)
}

// createReplicated records a new replicated partition of the queue's
// incarnation inc: its replicas, no owner yet (the raft leader claims
// it), if it has no record.
// The queue's catalog entry must still be the one of that incarnation
// (created at revision created): a record is never written for a queue
// deleted meanwhile.
func (n *Node) createReplicated(ctx context.Context, id queue.PartitionID, inc uint64, created int64, replicas []string) error {
	key := n.keys.owner(id)
	_, _, err := n.writeOwnership(ctx, id, clientv3.Compare(clientv3.CreateRevision(key), "=", 0), Ownership{Replicas: replicas, Incarnation: inc},
		clientv3.Compare(clientv3.CreateRevision(n.keys.queue(id.Queue)), "=", created))
	return err
}

func (n *Node) writeOwnership(ctx context.Context, id queue.PartitionID, cmp clientv3.Cmp, next Ownership, more ...clientv3.Cmp) (Ownership, bool, error) {
	key := n.keys.owner(id)
	v, _ := json.Marshal(next)
	resp, err := n.etcd.Txn(ctx).If(append([]clientv3.Cmp{cmp}, more...)...).Then(clientv3.OpPut(key, string(v))).Commit()
	if err != nil {
		return next, false, err
	}
	if !resp.Succeeded {
		return next, false, nil
	}
	next.rev = resp.Header.Revision
	n.mu.Lock()
	if cur, ok := n.view.owners[id]; !ok || cur.rev < next.rev {
		n.view.owners[id] = next
	}
	n.mu.Unlock()
	n.Metrics().claims.Inc()
	return next, true, nil
}

func zapDiscard() *zap.Logger { return zap.NewNop() }
