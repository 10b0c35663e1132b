package cluster

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
)

// raftSender carries this node's raft messages to one peer on one stream,
// batched. A message that finds the stream broken or its queue full is
// dropped: raft sends again.
type raftSender struct {
	h    *raftHost
	node string

	mu     sync.Mutex
	queue  []*pb.RaftMessage
	stream pb.Node_RaftClient
	cancel context.CancelFunc
	wake   chan struct{}
}

// raftQueueMax bounds the messages waiting for one peer.
const raftQueueMax = 8192

// raftBatchBytes bounds the raft message bytes of one send, far below the
// 64 MiB a peer takes in one gRPC message: while a send waits on a slow
// or paused peer, the messages queued behind it (entries of up to 4 MiB
// each, of every group) may add up to more, and a send past the limit
// fails whole. A message larger than the bound goes alone.
const raftBatchBytes = 16 << 20

func (h *raftHost) sender(node string) *raftSender {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.senders[node]
	if s == nil {
		s = &raftSender{h: h, node: node, wake: make(chan struct{}, 1)}
		h.senders[node] = s
		go s.run()
	}
	return s
}

// send queues m; false when it was dropped.
func (s *raftSender) send(m *pb.RaftMessage) bool {
	s.mu.Lock()
	if len(s.queue) >= raftQueueMax {
		s.mu.Unlock()
		return false
	}
	s.queue = append(s.queue, m)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

func (s *raftSender) run() {
	ctx := s.h.n.ctx
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			batch := s.takeLocked(raftBatchBytes)
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			if err := s.write(ctx, batch); err != nil {
				s.h.n.log.Debug("raft messages not sent", "node", s.node, "n", len(batch), "err", err)
				s.mu.Lock()
				if s.cancel != nil {
					s.cancel()
				}
				s.stream, s.cancel = nil, nil
				s.mu.Unlock()
				break
			}
		}
	}
}

// takeLocked takes the queue's first messages, as many as add up to max
// bytes at most (one at least). s.mu must be held.
func (s *raftSender) takeLocked(max int) []*pb.RaftMessage {
	n, size := 0, 0
	for n < len(s.queue) {
		size += len(s.queue[n].GetMessage()) + len(s.queue[n].GetGroup())
		if n > 0 && size > max {
			break
		}
		n++
	}
	batch := s.queue[:n:n]
	if s.queue = s.queue[n:]; len(s.queue) == 0 {
		s.queue = nil
	}
	return batch
}

func (s *raftSender) write(ctx context.Context, batch []*pb.RaftMessage) error {
	s.mu.Lock()
	stream := s.stream
	s.mu.Unlock()
	if stream == nil {
		// A replica is talked to whether etcd lists it now or not: raft
		// keeps its own count of who answers.
		p, err := s.h.n.peerAny(s.node)
		if err != nil {
			return err
		}
		sctx, cancel := context.WithCancel(ctx)
		stream, err = p.client.Raft(sctx)
		if err != nil {
			cancel()
			return err
		}
		s.mu.Lock()
		s.stream, s.cancel = stream, cancel
		s.mu.Unlock()
	}
	return stream.Send(&pb.RaftBatch{Messages: batch, From: s.h.n.opts.NodeID, EtcdRenewedMsAgo: s.h.n.etcdRenewedAgo()})
}

// peerEtcd is what a peer said, with its last raft messages, of its
// lease in etcd: when it renewed it last, and when it said so (monoNow,
// this node's clock; 0: never).
type peerEtcd struct {
	renewed, at int64
}

// etcdRenewedAgo is how many milliseconds ago this node last renewed its
// lease, -1 when never.
func (n *Node) etcdRenewedAgo() int64 {
	r := n.etcdRenewed.Load()
	if r == 0 {
		return -1
	}
	return (monoNow() - r) / int64(time.Millisecond)
}

// etcdOK reports whether this node renewed its lease within half of it.
func (n *Node) etcdOK() bool {
	return monoNow()-n.etcdRenewed.Load() < int64(n.opts.LeaseTTL/2)
}

// notePeerEtcd records what a peer said of its lease.
func (n *Node) notePeerEtcd(node string, agoMS int64) {
	now := monoNow()
	pe := peerEtcd{at: now}
	if agoMS >= 0 {
		pe.renewed = now - agoMS*int64(time.Millisecond)
	}
	n.mu.Lock()
	if n.peersEtcd == nil {
		n.peersEtcd = map[string]peerEtcd{}
	}
	n.peersEtcd[node] = pe
	n.mu.Unlock()
}

// peerRenewedSince reports whether node said, within the last second,
// that it renewed its lease after since (monoNow): it reaches etcd while
// this node has been failing to since then.
func (n *Node) peerRenewedSince(node string, since int64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pe := n.peersEtcd[node]
	return pe.renewed > since && monoNow()-pe.at < int64(time.Second)
}

// Raft receives a peer's raft messages.
func (s *server) Raft(stream pb.Node_RaftServer) error {
	h := s.n.raft
	if h == nil {
		return errors.New("cluster: this node keeps no replicas")
	}
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&pb.RaftResponse{})
		}
		if err != nil {
			return err
		}
		if b.From != "" {
			s.n.notePeerEtcd(b.From, b.EtcdRenewedMsAgo)
		}
		for _, w := range b.Messages {
			m := new(rpb.Message)
			if err := proto.Unmarshal(w.Message, m); err != nil {
				s.n.log.Warn("raft message undecodable", "group", w.Group, "err", err)
				continue
			}
			s.n.Metrics().raftReceived(m.GetType())
			if err := h.mr.Step(stream.Context(), w.Group, m); err != nil {
				return err
			}
		}
	}
}
