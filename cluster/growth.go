package cluster

import (
	"context"
	"sync"
	"time"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// A queue of the cluster grows through its catalog entry (DeclareQueue
// records the growth, every node grows its copy of the queue as it sees
// it: queue.Manager.Ensure) and each old partition's server cuts the
// partition in its own log. A partition of a growth delivers a moved key
// only once its group has settled the partitions the key can come from up
// to their cuts; those are served here or elsewhere, and cutAsker finds
// out which they passed, for the queue package's gate
// (queue.ManagerOptions.CutPassed).

// cutAskEvery spaces the questions about one group, growth and partition
// while it has not passed.
const cutAskEvery = 100 * time.Millisecond

// cutAskTimeout bounds one question to another node.
const cutAskTimeout = 2 * time.Second

// cutAsker keeps the answers about cuts passed, and asks again while a
// gate waits on one.
type cutAsker struct {
	n *Node

	mu      sync.Mutex
	answers map[cutKey]*cutAnswer
}

type cutKey struct {
	queue, group  string
	to, partition int
}

type cutAnswer struct {
	// passed, by a question that began at asked.
	passed bool
	asked  time.Time
	// asking: a question is out, which began at last.
	asking bool
	last   time.Time
}

func newCutAsker(n *Node) *cutAsker {
	return &cutAsker{n: n, answers: map[cutKey]*cutAnswer{}}
}

// passed answers from what the asker knows whether group passed the cut,
// by a question that began at since or later, and asks again when it
// does not know. It never blocks: a partition's lock is held.
func (a *cutAsker) passed(queueName, group string, to, partition int, since time.Time) bool {
	k := cutKey{queueName, group, to, partition}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.answers[k]
	if e == nil {
		e = &cutAnswer{}
		a.answers[k] = e
	}
	if e.passed && !e.asked.Before(since) {
		// The gate keeps it for its cursor's life: forgotten here.
		delete(a.answers, k)
		return true
	}
	if now := time.Now(); !e.asking && now.Sub(e.last) >= cutAskEvery {
		e.asking, e.last = true, now
		go a.ask(k, now)
	}
	return false
}

// ask asks the server of the partition, and records its answer.
func (a *cutAsker) ask(k cutKey, began time.Time) {
	passed, err := a.question(k)
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.answers[k]; e != nil {
		e.asking = false
		if err == nil && passed {
			e.passed, e.asked = true, began
		}
	}
	// Questions nobody repeated for a while: their gates passed or went.
	for key, e := range a.answers {
		if !e.asking && time.Since(e.last) > time.Minute {
			delete(a.answers, key)
		}
	}
	if err != nil {
		a.n.log.Debug("asking whether a group passed a cut", "queue", k.queue, "group", k.group, "partition", k.partition, "err", err)
	}
}

// question asks the server of the partition, here or elsewhere.
func (a *cutAsker) question(k cutKey) (bool, error) {
	id := queue.PartitionID{Queue: k.queue, Partition: k.partition}
	if _, owned := a.n.m.Owned(id); owned {
		return a.n.m.CutPassed(k.queue, k.group, k.to, k.partition)
	}
	owner := a.n.routeTo(id)
	if owner == "" || owner == a.n.opts.NodeID {
		return false, notServed(id)
	}
	p, err := a.n.peer(owner)
	if err != nil {
		if p, err = a.n.peerAny(owner); err != nil {
			return false, err
		}
	}
	ctx, cancel := context.WithTimeout(a.n.ctx, cutAskTimeout)
	defer cancel()
	resp, err := p.client.CutPassed(ctx, &pb.CutPassedRequest{Queue: k.queue, Group: k.group, To: int32(k.to), Partition: int32(k.partition)})
	if err != nil {
		return false, err
	}
	if err := fromResult(resp.GetResult()); err != nil {
		return false, err
	}
	return resp.GetPassed(), nil
}

// CutPassed answers a peer's cutAsker about a partition served here.
func (s *server) CutPassed(_ context.Context, req *pb.CutPassedRequest) (*pb.CutPassedResponse, error) {
	passed, err := s.n.m.CutPassed(req.GetQueue(), req.GetGroup(), int(req.GetTo()), int(req.GetPartition()))
	return &pb.CutPassedResponse{Result: toResult(0, err), Passed: passed}, nil
}
