package cluster

import (
	"errors"
	"fmt"
	"time"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// The wire forms of the queue's values, both ways.

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func toPBMessage(m *queue.Message) *pb.Message {
	w := &pb.Message{
		Offset:          m.Offset,
		Key:             m.Key,
		Subject:         m.Subject,
		EnqueuedAt:      unixNano(m.EnqueuedAt),
		NotBefore:       unixNano(m.NotBefore),
		ExpiresAt:       unixNano(m.ExpiresAt),
		ContentType:     m.Headers.ContentType,
		ResponseTopic:   m.Headers.ResponseTopic,
		CorrelationData: m.Headers.CorrelationData,
		PayloadFormat:   uint32(m.Headers.PayloadFormat),
		ExpiryInterval:  m.Headers.ExpiryInterval,
		Payload:         m.Payload,
		DedupId:         m.DedupID,
		OriginRun:       m.Origin.Run,
		OriginSeq:       m.Origin.Seq,
		ReplayFor:       m.ReplayFor,
	}
	if len(m.Headers.User) > 0 {
		w.User = make([]*pb.Property, len(m.Headers.User))
		for i, p := range m.Headers.User {
			w.User[i] = &pb.Property{Name: p.Name, Value: p.Value}
		}
	}
	if dl := m.DeadLetter; dl != nil {
		w.DeadLetter = &pb.DeadLetter{Reason: dl.Reason, OriginalId: dl.OriginalID, OriginalTopic: dl.OriginalTopic,
			Deliveries: dl.Deliveries, Group: dl.Group}
	}
	return w
}

func fromPBMessage(w *pb.Message) *queue.Message {
	if w == nil {
		return &queue.Message{}
	}
	m := &queue.Message{
		Offset:     w.Offset,
		Key:        w.Key,
		Subject:    w.Subject,
		EnqueuedAt: fromUnixNano(w.EnqueuedAt),
		NotBefore:  fromUnixNano(w.NotBefore),
		ExpiresAt:  fromUnixNano(w.ExpiresAt),
		Headers: queue.Headers{
			ContentType:     w.ContentType,
			ResponseTopic:   w.ResponseTopic,
			CorrelationData: w.CorrelationData,
			PayloadFormat:   byte(w.PayloadFormat),
			ExpiryInterval:  w.ExpiryInterval,
		},
		Payload:   w.Payload,
		DedupID:   w.DedupId,
		Origin:    queue.Origin{Run: w.OriginRun, Seq: w.OriginSeq},
		ReplayFor: w.ReplayFor,
	}
	if len(w.User) > 0 {
		m.Headers.User = make([]queue.Property, len(w.User))
		for i, p := range w.User {
			m.Headers.User[i] = queue.Property{Name: p.Name, Value: p.Value}
		}
	}
	if dl := w.DeadLetter; dl != nil {
		m.DeadLetter = &queue.DeadLetter{Reason: dl.Reason, OriginalID: dl.OriginalId, OriginalTopic: dl.OriginalTopic,
			Deliveries: dl.Deliveries, Group: dl.Group}
	}
	return m
}

func toPBLease(l queue.LeaseRef) *pb.LeaseRef {
	return &pb.LeaseRef{Queue: l.Partition.Queue, Partition: int32(l.Partition.Partition), Group: l.Group, Offset: l.Offset, Seq: l.Seq}
}

func fromPBLease(w *pb.LeaseRef) queue.LeaseRef {
	if w == nil {
		return queue.LeaseRef{}
	}
	return queue.LeaseRef{Partition: queue.PartitionID{Queue: w.Queue, Partition: int(w.Partition)}, Group: w.Group, Offset: w.Offset, Seq: w.Seq}
}

func toPBState(st queue.PartitionState) *pb.PartitionState {
	w := &pb.PartitionState{First: st.First, Next: st.Next}
	for _, g := range st.Groups {
		w.Groups = append(w.Groups, &pb.GroupState{Group: g.Group, Floor: g.Floor, Settled: g.Settled, Deliveries: g.Deliveries, Delivered: g.Delivered, Filter: g.Filter})
	}
	if len(st.Dedups) > 0 {
		w.Dedups = make(map[string]int64, len(st.Dedups))
		for id, at := range st.Dedups {
			w.Dedups[id] = at.UnixNano()
		}
	}
	return w
}

func fromPBState(w *pb.PartitionState) *queue.PartitionState {
	st := &queue.PartitionState{First: w.First, Next: w.Next}
	for _, g := range w.Groups {
		st.Groups = append(st.Groups, queue.GroupState{Group: g.Group, Floor: g.Floor, Settled: g.Settled, Deliveries: g.Deliveries, Delivered: g.Delivered, Filter: g.Filter})
	}
	if len(w.Dedups) > 0 {
		st.Dedups = make(map[string]time.Time, len(w.Dedups))
		for id, at := range w.Dedups {
			st.Dedups[id] = time.Unix(0, at)
		}
	}
	return st
}

// codes is the one table between the queue's errors and the wire's codes.
var codes = []struct {
	code pb.Code
	err  error
}{
	{pb.Code_NOT_OWNED, queue.ErrNotOwned},
	{pb.Code_FENCED, queue.ErrFenced},
	{pb.Code_QUEUE_FULL, queue.ErrQueueFull},
	{pb.Code_TOO_LARGE, queue.ErrTooLarge},
	{pb.Code_STORAGE_FULL, queue.ErrStorageFull},
	{pb.Code_STORAGE, queue.ErrStorage},
	{pb.Code_NO_SUCH_QUEUE, queue.ErrNoSuchQueue},
	{pb.Code_INVALID_TOPIC, queue.ErrInvalidTopic},
	{pb.Code_NOT_LEASED, queue.ErrNotLeased},
	{pb.Code_CLOSED, queue.ErrClosed},
	{pb.Code_BAD_PARTITIONS, queue.ErrBadPartitions},
	{pb.Code_FILTER_MISMATCH, queue.ErrFilterMismatch},
	{pb.Code_SHARDING_MISMATCH, queue.ErrShardingMismatch},
	{pb.Code_BAD_SHARDING, queue.ErrBadSharding},
}

// toResult encodes err for the wire.
func toResult(seq uint64, err error) *pb.Result {
	if err == nil {
		return &pb.Result{Seq: seq}
	}
	if _, ok := errors.AsType[*unknownOutcome](err); ok {
		return &pb.Result{Seq: seq, Code: pb.Code_UNKNOWN_OUTCOME, Error: err.Error()}
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return &pb.Result{Seq: seq, Code: c.code, Error: err.Error()}
		}
	}
	return &pb.Result{Seq: seq, Code: pb.Code_OTHER, Error: err.Error()}
}

// remoteError is an error a peer answered with: errors.Is finds the
// queue's sentinel of its code.
type remoteError struct {
	code pb.Code
	msg  string
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Is(target error) bool {
	for _, c := range codes {
		if c.code == e.code {
			return target == c.err
		}
	}
	return false
}

// fromResult decodes a result; nil for OK.
func fromResult(r *pb.Result) error {
	if r == nil || r.Code == pb.Code_OK {
		return nil
	}
	if r.Code == pb.Code_UNKNOWN_OUTCOME {
		return &unknownOutcome{&remoteError{code: pb.Code_NOT_OWNED, msg: r.Error}}
	}
	return &remoteError{code: r.Code, msg: r.Error}
}

// unavailable is the error of a publish or settlement whose node could not
// be reached: the partition is not served for now (0x83 to a producer).
func unavailable(id queue.PartitionID, node string, err error) error {
	return fmt.Errorf("%w: %s: node %s unreachable: %v", queue.ErrNotOwned, id, node, err)
}
