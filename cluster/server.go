package cluster

import (
	"context"
	"errors"
	"io"
	"sync"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// server answers the calls of the other nodes.
type server struct {
	pb.UnimplementedNodeServer
	n *Node
}

// Publish stores forwarded publishes in the partitions this node owns and
// answers each once stored; a partition it does not serve answers
// NOT_OWNED (the forwarding node finds the owner again).
func (s *server) Publish(stream pb.Node_PublishServer) error {
	var (
		mu      sync.Mutex
		results []*pb.Result
		wake    = make(chan struct{}, 1)
		done    = make(chan struct{})
		sendErr error
	)
	go func() {
		defer close(done)
		for {
			select {
			case <-wake:
			case <-stream.Context().Done():
				return
			}
			mu.Lock()
			batch := results
			results = nil
			mu.Unlock()
			if len(batch) == 0 {
				continue
			}
			if err := stream.Send(&pb.PublishResults{Results: batch}); err != nil {
				mu.Lock()
				sendErr = err
				mu.Unlock()
				return
			}
		}
	}()
	answer := func(r *pb.Result) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				<-done
				return nil
			}
			return err
		}
		for _, p := range req.Publishes {
			seq := p.Seq
			id := queue.PartitionID{Queue: p.Queue, Partition: int(p.Partition)}
			if _, owned := s.n.m.Owned(id); !owned {
				answer(toResult(seq, notServed(id)))
				continue
			}
			m := fromPBMessage(p.Message)
			s.n.publishHere(ctx, id, m, func(err error) {
				r := toResult(seq, err)
				if err == nil {
					r.Offset = m.Offset
				}
				answer(r)
			})
		}
		mu.Lock()
		err = sendErr
		mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// Import writes a partition handed over to this node.
func (s *server) Import(stream pb.Node_ImportServer) error {
	ctx := stream.Context()
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&pb.ImportResponse{Result: toResult(0, nil)})
		}
		if err != nil {
			return err
		}
		id := queue.PartitionID{Queue: c.Partition.GetQueue(), Partition: int(c.Partition.GetPartition())}
		if qi, ok := s.n.catalog(id.Queue); ok {
			if _, err := s.n.m.Ensure(ctx, qi.name, qi.info.shape()); err != nil {
				return stream.SendAndClose(&pb.ImportResponse{Result: toResult(0, err)})
			}
		}
		msgs := make([]*queue.Message, len(c.Messages))
		for i, w := range c.Messages {
			msgs[i] = fromPBMessage(w)
		}
		var st *queue.PartitionState
		if c.State != nil {
			st = fromPBState(c.State)
		}
		if c.RaftSnapshot {
			if s.n.raft == nil {
				return stream.SendAndClose(&pb.ImportResponse{Result: toResult(0, errors.New("cluster: this node keeps no replicas"))})
			}
			if err := s.n.raft.importCopy(ctx, id, st, msgs, c.Last); err != nil {
				return stream.SendAndClose(&pb.ImportResponse{Result: toResult(0, err)})
			}
			continue
		}
		if err := s.n.m.ImportPartition(ctx, id, c.Epoch, st, msgs, c.Last); err != nil {
			return stream.SendAndClose(&pb.ImportResponse{Result: toResult(0, err)})
		}
	}
}

// Settle settles a lease of a partition this node serves.
func (s *server) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	return &pb.SettleResponse{Result: toResult(0, s.settle(req))}, nil
}

// Settles applies the settlements of a stream; their outcomes are not
// answered.
func (s *server) Settles(stream pb.Node_SettlesServer) error {
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&pb.SettleResponse{})
		}
		if err != nil {
			return err
		}
		for _, req := range b.Settles {
			_ = s.settle(req)
		}
	}
}

func (s *server) settle(req *pb.SettleRequest) error {
	return settleHere(s.n.m, fromPBLease(req.Lease), req.Op)
}

// Admin answers an admin read with this node's own view, or acts on the
// partitions this node serves for a change another node spreads.
func (s *server) Admin(ctx context.Context, req *pb.AdminRequest) (*pb.AdminResponse, error) {
	if s.n.opts.Admin == nil {
		return &pb.AdminResponse{Status: 404}, nil
	}
	status, body := s.n.opts.Admin(ctx, req.Method, req.Path, req.Body)
	return &pb.AdminResponse{Status: int32(status), Body: body}, nil
}

type catalogEntry struct {
	name string
	info QueueInfo
}

// catalog returns the catalog's entry of the queue named (a dead-letter
// queue's name gives its parent's).
func (n *Node) catalog(name string) (catalogEntry, bool) {
	parent := name
	if queue.IsDLQ(name) {
		parent = queue.ParentName(name)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	qi, ok := n.view.queues[parent]
	return catalogEntry{parent, qi}, ok
}
