package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// peer is this node's link to another node: one gRPC connection, and on it
// one stream that carries the publishes forwarded to that node.
type peer struct {
	n      *Node
	id     string
	addr   string
	conn   *grpc.ClientConn
	client pb.NodeClient

	mu     sync.Mutex
	fwd    *forwarder // nil until the first publish, and after a break
	stl    *settler   // nil until the first settlement sent on, and after a break
	closed bool
	// downSince: when its connection was last seen not ready, zero while
	// it is (Node.checkPeers). Guarded by Node.mu.
	downSince time.Time
}

// errNotMember is the error of a link to a node that is not a member now.
var errNotMember = errors.New("cluster: not a member")

// peer returns the link to node id, dialing it on first use.
func (n *Node) peer(id string) (*peer, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	info, live := n.view.nodes[id]
	if !live {
		return nil, fmt.Errorf("%w: %s", errNotMember, id)
	}
	if p := n.peers[id]; p != nil {
		if p.addr == info.Cluster {
			return p, nil
		}
		p.close() // the node came back on another address
		delete(n.peers, id)
	}
	creds := insecure.NewCredentials()
	if n.opts.PeerTLS != nil {
		creds = credentials.NewTLS(n.opts.PeerTLS)
	}
	conn, err := grpc.NewClient(info.Cluster,
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(callTokens{token: n.opts.Token, admin: n.opts.AdminToken}),
		// A peer back after a long cut is dialed again within seconds:
		// gRPC's default backoff grows to 2 minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: peerBackoff, MinConnectTimeout: 2 * time.Second}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: peerKeepalive, Timeout: peerKeepalive, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(peerStreamWindow), grpc.WithInitialConnWindowSize(peerConnWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	p := &peer{n: n, id: id, addr: info.Cluster, conn: conn, client: pb.NewNodeClient(conn)}
	n.peers[id] = p
	return p, nil
}

// peerAny returns the link to node id, a member now or, while etcd does
// not list it (etcd out of reach, its lease lapsed and not yet taken
// again), the link it had: raft and the replicated partitions' leaders
// do not depend on etcd's view of who is a member.
func (n *Node) peerAny(id string) (*peer, error) {
	p, err := n.peer(id)
	if !errors.Is(err, errNotMember) {
		return p, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.peers[id]; p != nil {
		return p, nil
	}
	return nil, err
}

func (p *peer) close() {
	p.mu.Lock()
	p.closed = true
	f := p.fwd
	p.fwd = nil
	p.mu.Unlock()
	if f != nil {
		f.fail(errors.New("link closed"))
	}
	_ = p.conn.Close()
}

// forwarder batches publishes onto one Publish stream and completes them
// as the owner answers.
type forwarder struct {
	p      *peer
	stream pb.Node_PublishClient
	cancel context.CancelFunc

	mu      sync.Mutex
	seq     uint64
	queue   []*pb.Publish
	pending map[uint64]pendingPublish
	broken  error
	wake    chan struct{}
}

type pendingPublish struct {
	id    queue.PartitionID
	msg   *queue.Message // its Offset set once stored
	done  func(error)
	start time.Time
}

// publish forwards msg to partition id on this peer; done runs with the
// owner's answer, or with ErrNotOwned when the link breaks first.
func (p *peer) publish(id queue.PartitionID, msg *queue.Message, done func(error)) {
	f, err := p.forwarder()
	if err != nil {
		done(unavailable(id, p.id, err))
		return
	}
	f.mu.Lock()
	if f.broken != nil {
		err := f.broken
		f.mu.Unlock()
		done(unavailable(id, p.id, err))
		return
	}
	f.seq++
	f.pending[f.seq] = pendingPublish{id: id, msg: msg, done: done, start: time.Now()}
	f.queue = append(f.queue, &pb.Publish{Seq: f.seq, Queue: id.Queue, Partition: int32(id.Partition), Message: toPBMessage(msg)})
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (p *peer) forwarder() (*forwarder, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("link closed")
	}
	if p.fwd != nil {
		return p.fwd, nil
	}
	ctx, cancel := context.WithCancel(p.n.ctx)
	stream, err := p.client.Publish(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	f := &forwarder{p: p, stream: stream, cancel: cancel, pending: map[uint64]pendingPublish{}, wake: make(chan struct{}, 1)}
	p.fwd = f
	go f.send()
	go f.receive()
	return f, nil
}

// maxForwardBatch caps the publishes of one stream message.
const maxForwardBatch = 256

func (f *forwarder) send() {
	for {
		select {
		case <-f.wake:
		case <-f.stream.Context().Done():
			f.fail(f.stream.Context().Err())
			return
		}
		for {
			f.mu.Lock()
			if f.broken != nil {
				f.mu.Unlock()
				return
			}
			batch := f.queue
			if len(batch) > maxForwardBatch {
				batch = batch[:maxForwardBatch]
				f.queue = f.queue[maxForwardBatch:]
			} else {
				f.queue = nil
			}
			f.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			if err := f.stream.Send(&pb.PublishBatch{Publishes: batch}); err != nil {
				f.fail(err)
				return
			}
		}
	}
}

func (f *forwarder) receive() {
	m := f.p.n.Metrics()
	for {
		resp, err := f.stream.Recv()
		if err != nil {
			f.fail(err)
			return
		}
		for _, r := range resp.Results {
			f.mu.Lock()
			pp, ok := f.pending[r.Seq]
			delete(f.pending, r.Seq)
			f.mu.Unlock()
			if !ok {
				continue
			}
			err := fromResult(r)
			if err == nil {
				pp.msg.Offset = r.Offset
				m.forwards.WithLabelValues("ok").Inc()
			} else {
				m.forwards.WithLabelValues("refused").Inc()
			}
			m.latency.Observe(time.Since(pp.start).Seconds())
			pp.done(err)
		}
	}
}

// fail ends the stream, and the next publish opens a new one. A publish
// not yet sent is routed again; one sent and not answered fails with a
// *unknownOutcome (0x83): the owner may have stored it, so it is not sent
// twice.
func (f *forwarder) fail(cause error) {
	f.mu.Lock()
	if f.broken != nil {
		f.mu.Unlock()
		return
	}
	if cause == nil {
		cause = errors.New("stream ended")
	}
	f.broken = cause
	pending, unsent := f.pending, f.unsentLocked()
	f.pending = nil
	f.queue = nil
	f.mu.Unlock()
	f.cancel()
	f.p.mu.Lock()
	if f.p.fwd == f {
		f.p.fwd = nil
	}
	f.p.mu.Unlock()
	f.answer(pending, unsent, cause)
}

// abandon fails the publishes to partition id in flight on this stream:
// its owner is another node now (the one they went to was paused, cut off
// or died), and they would wait for that node to come back.
func (f *forwarder) abandon(id queue.PartitionID, owner string) {
	f.mu.Lock()
	if f.broken != nil {
		f.mu.Unlock()
		return
	}
	unsent := f.unsentLocked()
	gone := map[uint64]pendingPublish{}
	for seq, pp := range f.pending {
		if queue.ParentName(pp.id.Queue) == id.Queue && pp.id.Partition == id.Partition {
			gone[seq] = pp
			delete(f.pending, seq)
		}
	}
	if len(gone) > 0 {
		f.queue = slices.DeleteFunc(f.queue, func(p *pb.Publish) bool { _, ok := gone[p.Seq]; return ok })
	}
	f.mu.Unlock()
	f.answer(gone, unsent, fmt.Errorf("its owner is %s now", owner))
}

// unsentLocked returns the sequence numbers of the publishes not yet
// handed to the stream. f.mu must be held.
func (f *forwarder) unsentLocked() map[uint64]bool {
	unsent := make(map[uint64]bool, len(f.queue))
	for _, p := range f.queue {
		unsent[p.Seq] = true
	}
	return unsent
}

// answer completes publishes that got no answer: those never sent with an
// error that routes them again, the others with a *unknownOutcome.
func (f *forwarder) answer(pending map[uint64]pendingPublish, unsent map[uint64]bool, cause error) {
	m := f.p.n.Metrics()
	for seq, pp := range pending {
		m.forwards.WithLabelValues("broken").Inc()
		err := unavailable(pp.id, f.p.id, cause)
		if !unsent[seq] {
			err = &unknownOutcome{err}
		}
		pp.done(err)
	}
}

// abandonForwards fails the publishes in flight to a node that no longer
// owns their partition (see forwarder.abandon).
func (n *Node) abandonForwards() {
	n.mu.Lock()
	peers := make(map[string]*peer, len(n.peers))
	maps.Copy(peers, n.peers)
	n.mu.Unlock()
	for node, p := range peers {
		p.mu.Lock()
		f := p.fwd
		p.mu.Unlock()
		if f == nil {
			continue
		}
		f.mu.Lock()
		ids := map[queue.PartitionID]bool{}
		for _, pp := range f.pending {
			ids[queue.PartitionID{Queue: queue.ParentName(pp.id.Queue), Partition: pp.id.Partition}] = true
		}
		f.mu.Unlock()
		for id := range ids {
			if o := n.ownerOf(id); o != "" && o != node {
				f.abandon(id, o)
			}
		}
	}
}

// settler batches the settlements nobody waits for onto one Settles
// stream.
type settler struct {
	p      *peer
	stream pb.Node_SettlesClient
	cancel context.CancelFunc

	mu     sync.Mutex
	queue  []*pb.SettleRequest
	broken bool
	wake   chan struct{}
}

// settleAsync sends a settlement on; if the link breaks first, the lease
// runs out on the owner and the message is delivered again.
func (p *peer) settleAsync(req *pb.SettleRequest) {
	s, err := p.settler()
	if err != nil {
		p.n.log.Debug("settlement not sent", "node", p.id, "err", err)
		return
	}
	s.mu.Lock()
	if s.broken {
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, req)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (p *peer) settler() (*settler, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("link closed")
	}
	if p.stl != nil {
		return p.stl, nil
	}
	ctx, cancel := context.WithCancel(p.n.ctx)
	stream, err := p.client.Settles(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &settler{p: p, stream: stream, cancel: cancel, wake: make(chan struct{}, 1)}
	p.stl = s
	go s.send()
	return s, nil
}

func (s *settler) send() {
	defer s.cancel()
	for {
		select {
		case <-s.wake:
		case <-s.stream.Context().Done():
			s.fail()
			return
		}
		for {
			s.mu.Lock()
			batch := s.queue
			if len(batch) > maxForwardBatch {
				batch = batch[:maxForwardBatch]
				s.queue = s.queue[maxForwardBatch:]
			} else {
				s.queue = nil
			}
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			if err := s.stream.Send(&pb.SettleBatch{Settles: batch}); err != nil {
				s.fail()
				return
			}
		}
	}
}

func (s *settler) fail() {
	s.mu.Lock()
	s.broken = true
	s.queue = nil
	s.mu.Unlock()
	s.p.mu.Lock()
	if s.p.stl == s {
		s.p.stl = nil
	}
	s.p.mu.Unlock()
}

// peerKeepalive is how long a link to a peer may be silent before it is
// pinged, and how long the ping's answer may take before the link is
// given up: a peer that stopped answering is found out within twice it.
const peerKeepalive = 2 * time.Second

// peerStreamWindow and peerConnWindow are the HTTP/2 flow-control
// windows of the links between nodes, a stream's and the connection's,
// fixed on both sides. Left to gRPC, they follow an estimate of the
// link's bandwidth-delay product, measured with a ping sent for every
// message received after the last ping's answer: on a quiet cluster,
// whose links carry mostly a raft ping every tick, that doubled the
// packets each node sends, and the wake-ups of both. 4 MiB per stream
// covers a datacenter link's bandwidth-delay product; a larger burst (a
// copy, raft catching a replica up) waits for the receiver's window
// updates, as flow control means it to.
const (
	peerStreamWindow = 4 << 20
	peerConnWindow   = 16 << 20
)

// peerBackoff is how the links to peers are dialed again: within a
// second at first, at most every 2 s.
var peerBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second}
