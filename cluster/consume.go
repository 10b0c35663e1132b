package cluster

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// A consumer connected here takes the deliveries of this node's
// partitions from the local manager, and those of every other node's
// through a Consume stream to it. The owner runs a consumer of its own for
// the stream, in the same group, so leases, per-key order, max deliveries
// and the DLQ stay the owner's. Credit is kept here, where the client is:
// the owner may have a window of deliveries out on the stream (the
// client's credit), and each one takes a credit of the client's
// connection before it is sent. One that finds none is returned to its
// owner at once (queue.Returned), where another consumer of the group can
// have it, and its stream's window stays one smaller until a credit of
// the client comes back here and is granted to that stream again: so the
// windows of a client's streams shrink to what it can take, and no
// message waits here for a client that is busy.

// remoteSub is one consumer here with its streams to the other nodes.
type remoteSub struct {
	n     *Node
	f     queue.Filter
	r     queue.Receiver
	o     queue.ConsumerOptions
	local queue.Subscription

	mu      sync.Mutex
	streams map[string]*consumeStream
	leases  map[leaseKey]remoteLease // remote leases out
	closed  bool
	// owed: the streams' window credits kept back for deliveries
	// returned for want of the client's credit, by node.
	owed map[string]int32
}

// consumeStream is the stream of a consumer here to one node.
type consumeStream struct {
	cancel context.CancelFunc
	// open: the stream is up (rs.mu). left: etcd's view lost the node
	// while it was; the stream goes on until it breaks, and is not
	// opened again unless the node is back by then (rs.mu).
	open, left bool
	// grants are window credits to send up the stream; wake tells its
	// sender.
	grants int32
	wake   chan struct{}
}

// remoteStale bounds how long after its owner made it a delivery from
// another node may still be written to its client; later, it is given
// back unsent. It assumes the nodes' clocks agree within clockSkew.
const (
	remoteStale = time.Second
	clockSkew   = 500 * time.Millisecond
	// handoverGrace: a partition loaded here delivers again what its
	// last owner may have had out only once any delivery of it still on
	// its way has reached its client or turned stale.
	handoverGrace = remoteStale + clockSkew
)

// remoteLease is a lease of a consumer here on another node's message:
// the node that delivered it, which its settlement goes to (the owner
// the view names may have changed since, or not yet), and whether it
// holds a credit of the client.
type remoteLease struct {
	node string
	held bool
}

type leaseKey struct {
	id     queue.PartitionID
	group  string
	offset uint64
	seq    uint64
}

func keyOf(l queue.LeaseRef) leaseKey { return leaseKey{l.Partition, l.Group, l.Offset, l.Seq} }

// subscribeRemote starts the streams of a consumer whose local part is
// local.
func (n *Node) subscribeRemote(f queue.Filter, r queue.Receiver, o queue.ConsumerOptions, local queue.Subscription) *remoteSub {
	rs := &remoteSub{n: n, f: f, r: r, o: o, local: local, streams: map[string]*consumeStream{}, leases: map[leaseKey]remoteLease{},
		owed: map[string]int32{}}
	n.mu.Lock()
	n.subs[rs] = struct{}{}
	if o.Credit != nil && !n.watched[o.Credit] {
		n.watched[o.Credit] = true
		c := o.Credit
		c.Watch(func() { n.creditBack(c) })
	}
	n.mu.Unlock()
	rs.refresh()
	return rs
}

// creditBack grants the credit c got back to a stream that returned a
// delivery for want of it.
func (n *Node) creditBack(c *queue.Credit) {
	n.mu.Lock()
	var subs []*remoteSub
	for rs := range n.subs {
		if rs.o.Credit == c {
			subs = append(subs, rs)
		}
	}
	n.mu.Unlock()
	for _, rs := range subs {
		rs.grant()
	}
}

// refreshSubs opens the streams of every consumer to new members and ends
// those to nodes gone.
func (n *Node) refreshSubs() {
	n.mu.Lock()
	subs := make([]*remoteSub, 0, len(n.subs))
	for rs := range n.subs {
		subs = append(subs, rs)
	}
	n.mu.Unlock()
	for _, rs := range subs {
		rs.refresh()
	}
}

func (n *Node) members() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.view.nodes))
	for id := range n.view.nodes {
		if id != n.opts.NodeID {
			out = append(out, id)
		}
	}
	return out
}

func (rs *remoteSub) refresh() {
	live := rs.n.members()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.closed {
		return
	}
	seen := map[string]bool{}
	for _, id := range live {
		seen[id] = true
		if cs := rs.streams[id]; cs != nil {
			cs.left = false
			continue
		}
		ctx, cancel := context.WithCancel(rs.n.ctx)
		cs := &consumeStream{cancel: cancel, wake: make(chan struct{}, 1)}
		rs.streams[id] = cs
		go rs.run(ctx, id, cs)
	}
	for id, cs := range rs.streams {
		if seen[id] {
			continue
		}
		if cs.open {
			// etcd's view lost the node, but the stream to it is up: the
			// node may only have lost its lease for a moment (etcd was
			// out of reach, or paused past the lease), and it may lead
			// its replicated partitions on meanwhile. Ending the stream
			// would end there the leases of everything this consumer
			// holds from it, and give those messages to another consumer
			// of the group while this one still has them. A node that is
			// really gone breaks the stream (peerKeepalive), and then
			// the stream stops (run).
			cs.left = true
			continue
		}
		rs.dropStream(id, cs)
	}
}

// dropStream ends the stream to node; rs.mu is held.
func (rs *remoteSub) dropStream(node string, cs *consumeStream) {
	cs.cancel()
	if rs.streams[node] == cs {
		delete(rs.streams, node)
		delete(rs.owed, node)
	}
}

// window is how many deliveries a stream may have out at first: the
// consumer's credit. Deliveries the client has no credit for go back to
// their owner and shrink the window (see the top of this file).
func (rs *remoteSub) window() int32 {
	w := rs.o.Prefetch
	if rs.o.Credit != nil && (w == 0 || int(rs.o.Credit.Cap()) < w) {
		w = int(rs.o.Credit.Cap())
	}
	if w <= 0 {
		w = 64
	}
	return int32(w)
}

// run keeps the stream to node open until ctx ends, opening it again
// after a break.
func (rs *remoteSub) run(ctx context.Context, node string, cs *consumeStream) {
	for ctx.Err() == nil {
		err := rs.stream(ctx, node, cs)
		// The stream's consumer on node ended with it, and its window:
		// a new stream starts with a whole one.
		rs.mu.Lock()
		delete(rs.owed, node)
		cs.grants = 0
		cs.open = false
		if cs.left {
			// The node left the view while the stream was up, and the
			// stream broke since: the node is gone (refresh).
			rs.dropStream(node, cs)
		}
		rs.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, queue.ErrFilterMismatch) || errors.Is(err, queue.ErrShardingMismatch) || errors.Is(err, queue.ErrBadSharding) {
			// Refused by the node: the group has another subject filter,
			// or is sharded another way, there. Asked again, in case the
			// group goes (or its other sharded consumers leave).
			rs.n.log.Warn("a partition's leader refuses this consumer: it does not fit its group", "node", node, "queue", rs.f.Queue, "group", rs.f.Group, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
			continue
		}
		rs.n.log.Debug("consumer stream ended", "node", node, "queue", rs.f.Queue, "group", rs.f.Group, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (rs *remoteSub) stream(ctx context.Context, node string, cs *consumeStream) error {
	p, err := rs.n.peer(node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := p.client.Consume(ctx)
	if err != nil {
		return err
	}
	ps := make([]int32, len(rs.o.Partitions))
	for i, x := range rs.o.Partitions {
		ps[i] = int32(x)
	}
	sub := &pb.Subscribe{Queue: rs.f.Queue, Group: rs.f.Group, Shared: rs.f.Shared,
		AllSubjects: rs.f.AllSubjects, Subjects: rs.f.Subjects, Partitions: ps, Prefetch: int32(rs.o.Prefetch), Explicit: rs.o.Explicit, Start: string(rs.o.Start),
		Credit: rs.window(), Node: rs.n.opts.NodeID}
	if sh := rs.o.Sharding; sh != nil {
		sub.ShardBy, sub.ShardCount = sh.By, int32(sh.Count)
		for _, id := range sh.Shards {
			sub.Shards = append(sub.Shards, int32(id))
		}
	}
	if err := s.Send(&pb.ConsumeUp{Subscribe: sub}); err != nil {
		return err
	}
	rs.mu.Lock()
	cs.open = true
	rs.mu.Unlock()
	go rs.sendGrants(ctx, s, cs)
	for {
		down, err := s.Recv()
		if err != nil {
			return err
		}
		if e := fromResult(down.Error); e != nil {
			return e
		}
		for _, w := range down.Deliveries {
			l := fromPBLease(w.Lease)
			if w.SentAt != 0 {
				l.Until = time.Unix(0, w.SentAt).Add(remoteStale)
			}
			rs.deliver(node, queue.Delivery{Lease: l, Queue: l.Partition.Queue, Partition: l.Partition.Partition,
				Message: fromPBMessage(w.Message), Count: w.Count, Explicit: w.Explicit})
		}
	}
}

// deliver sends d to the client when its connection has credit, else
// returns it to its owner, node.
func (rs *remoteSub) deliver(node string, d queue.Delivery) {
	rs.mu.Lock()
	if rs.closed {
		// The client left while it was on its way: it never reached it.
		rs.mu.Unlock()
		if p, err := rs.n.peer(node); err == nil {
			p.settleAsync(&pb.SettleRequest{Lease: toPBLease(d.Lease), Op: pb.SettleOp_UNSENT})
		}
		return
	}
	if rs.o.Credit != nil && !rs.o.Credit.TryTake() {
		// The next credit of the client that comes back is granted to
		// this stream (grant); the message goes back to its owner now.
		rs.owed[node]++
		rs.mu.Unlock()
		rs.returnToOwner(node, d.Lease)
		return
	}
	rs.n.registerLease(d.Lease, rs)
	rs.send(node, d)
	rs.mu.Unlock()
}

// returnToOwner gives a delivery the client had no credit for back to
// node, its owner, where the stream's window credit stays taken.
func (rs *remoteSub) returnToOwner(node string, l queue.LeaseRef) {
	p, err := rs.n.peer(node)
	if err != nil {
		return // the stream ends with the link, and the lease with it
	}
	p.settleAsync(&pb.SettleRequest{Lease: toPBLease(l), Op: pb.SettleOp_RETURNED})
}

// grant gives a credit of the client that came back to a stream that
// returned a delivery for want of one (any of them: map order spreads
// the grants).
func (rs *remoteSub) grant() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.closed || len(rs.owed) == 0 {
		return
	}
	var node string
	for node = range rs.owed {
		break
	}
	if rs.owed[node]--; rs.owed[node] <= 0 {
		delete(rs.owed, node)
	}
	if cs := rs.streams[node]; cs != nil {
		cs.grants++
		select {
		case cs.wake <- struct{}{}:
		default:
		}
	}
}

// sendGrants sends the stream's grants up it until ctx ends.
func (rs *remoteSub) sendGrants(ctx context.Context, s pb.Node_ConsumeClient, cs *consumeStream) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-cs.wake:
		}
		rs.mu.Lock()
		n := cs.grants
		cs.grants = 0
		rs.mu.Unlock()
		if n == 0 {
			continue
		}
		if err := s.Send(&pb.ConsumeUp{Grant: n}); err != nil {
			return // the stream ends, and its window with it
		}
	}
}

// send hands d, from node, to the client; rs.mu is held and d's credit
// taken.
func (rs *remoteSub) send(node string, d queue.Delivery) {
	rs.leases[keyOf(d.Lease)] = remoteLease{node: node, held: true}
	rs.n.Metrics().remote.Inc()
	rs.r.Deliver(d)
}

// settle sends a settlement to the lease's owner; a PUBACK (RECEIVED, or
// the first settlement of a delivery) gives the client's credit back.
func (rs *remoteSub) settle(l queue.LeaseRef, op pb.SettleOp) error {
	k := keyOf(l)
	rs.mu.Lock()
	rl, known := rs.leases[k]
	held := known && rl.held
	if held && (op == pb.SettleOp_RECEIVED || op == pb.SettleOp_UNSENT || !rs.o.Explicit) {
		rl.held = false
		rs.leases[k] = rl
	} else {
		held = false
	}
	if known && op != pb.SettleOp_RECEIVED && op != pb.SettleOp_EXTEND {
		delete(rs.leases, k)
		rs.n.forgetLease(l)
	}
	rs.mu.Unlock()
	if held && rs.o.Credit != nil {
		defer rs.o.Credit.Give()
	}
	// To the node that delivered it: the view's owner may not know yet
	// that it served the partition (a leader recording itself late).
	owner := rl.node
	if !known {
		owner = rs.n.ownerOf(l.Partition)
	}
	if owner == rs.n.opts.NodeID {
		// Moved here since: the lease ended with the move.
		return queue.ErrNotLeased
	}
	// The link it came on, even while the view lost its node for a moment.
	p, err := rs.n.peerAny(owner)
	if err != nil {
		return &unknownOutcome{unavailable(l.Partition, owner, err)}
	}
	if op == pb.SettleOp_RECEIVED || op == pb.SettleOp_UNSENT || !rs.o.Explicit {
		// A PUBACK's settlement, or a delivery given back: nobody waits
		// for its outcome.
		p.settleAsync(&pb.SettleRequest{Lease: toPBLease(l), Op: op})
		return nil
	}
	ctx, cancel := context.WithTimeout(rs.n.ctx, 5*time.Second)
	defer cancel()
	resp, err := p.client.Settle(ctx, &pb.SettleRequest{Lease: toPBLease(l), Op: op})
	if err != nil {
		return &unknownOutcome{unavailable(l.Partition, owner, err)}
	}
	return fromResult(resp.Result)
}

// Close ends the consumer here and on every node.
func (rs *remoteSub) Close() {
	rs.mu.Lock()
	if rs.closed {
		rs.mu.Unlock()
		return
	}
	rs.closed = true
	for _, cs := range rs.streams {
		cs.cancel()
	}
	rs.streams = nil
	// The connection, and its credit, are going away: the credits the
	// remote leases hold need no giving back.
	for k := range rs.leases {
		rs.n.forgetLeaseKey(k)
	}
	rs.leases = nil
	rs.mu.Unlock()
	rs.n.mu.Lock()
	delete(rs.n.subs, rs)
	rs.n.mu.Unlock()
	rs.local.Close()
}

// The remote leases of consumers here, so that a settlement finds its way.

func (n *Node) registerLease(l queue.LeaseRef, rs *remoteSub) {
	n.leases.Store(keyOf(l), rs)
}

func (n *Node) forgetLease(l queue.LeaseRef) { n.leases.Delete(keyOf(l)) }

func (n *Node) forgetLeaseKey(k leaseKey) { n.leases.Delete(k) }

// remoteLease returns the consumer here holding the remote lease l, or
// nil when l is this node's own.
func (n *Node) remoteLease(l queue.LeaseRef) *remoteSub {
	if v, ok := n.leases.Load(keyOf(l)); ok {
		return v.(*remoteSub)
	}
	return nil
}

// Consume runs a consumer here for a client connected to another node.
func (s *server) Consume(stream pb.Node_ConsumeServer) error {
	ctx := stream.Context()
	up, err := stream.Recv()
	if err != nil {
		return err
	}
	sub := up.Subscribe
	if sub == nil {
		return errors.New("cluster: a consume stream starts with a subscribe")
	}
	if _, err := s.n.open(ctx, sub.Queue); err != nil {
		return stream.Send(&pb.ConsumeDown{Error: toResult(0, err)})
	}
	sr := &streamReceiver{wake: make(chan struct{}, 1)}
	o := queue.ConsumerOptions{Prefetch: int(sub.Prefetch), Explicit: sub.Explicit, Start: queue.Start(sub.Start), Credit: queue.NewCredit(int(max(1, sub.Credit))), Remote: true}
	if sub.ShardCount > 0 {
		o.Sharding = &queue.Sharding{By: sub.ShardBy, Count: int(sub.ShardCount)}
		for _, id := range sub.Shards {
			o.Sharding.Shards = append(o.Sharding.Shards, int(id))
		}
	}
	f := queue.Filter{Queue: sub.Queue, Group: sub.Group, Shared: sub.Shared, AllSubjects: sub.AllSubjects, Subjects: sub.Subjects}
	c, err := s.n.m.Subscribe(ctx, f, sr, o)
	if err != nil {
		return stream.Send(&pb.ConsumeDown{Error: toResult(0, err)})
	}
	defer c.Close()
	go func() {
		// Credit granted back by the consumer's node (see the top of
		// this file).
		for {
			up, err := stream.Recv()
			if err != nil {
				return
			}
			for range up.Grant {
				o.Credit.Give()
			}
		}
	}()
	var ds []streamDelivery
	defer func() {
		// Deliveries the stream did not carry never reached the client:
		// back to the group, not counted (before c.Close, which would end
		// their leases as deliveries).
		for _, d := range append(ds, sr.take()...) {
			_ = s.n.m.Settle(d.Lease, queue.Unsent)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.n.ctx.Done():
			return nil
		case <-sr.wake:
		}
		ds = sr.take()
		if len(ds) == 0 {
			continue
		}
		w := make([]*pb.Delivery, len(ds))
		for i, d := range ds {
			w[i] = &pb.Delivery{Lease: toPBLease(d.Lease), Message: toPBMessage(d.Message), Count: d.Count, Explicit: d.Explicit, SentAt: d.at}
		}
		if err := stream.Send(&pb.ConsumeDown{Deliveries: w}); err != nil {
			return err
		}
		ds = nil
	}
}

// streamReceiver collects a remote consumer's deliveries for its stream.
type streamReceiver struct {
	mu   sync.Mutex
	out  []streamDelivery
	wake chan struct{}
}

// streamDelivery is a delivery waiting for its stream, with when its
// owner leased it (UnixNano).
type streamDelivery struct {
	queue.Delivery
	at int64
}

// Deliver queues d for the stream, stamped with when it was leased: its
// staleness on the consumer's node counts from then (LeaseRef.At).
func (r *streamReceiver) Deliver(d queue.Delivery) {
	at := d.Lease.At()
	if at.IsZero() {
		at = time.Now()
	}
	r.mu.Lock()
	r.out = append(r.out, streamDelivery{d, at.UnixNano()})
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *streamReceiver) take() []streamDelivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.out
	r.out = nil
	return out
}
