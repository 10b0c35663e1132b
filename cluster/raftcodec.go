package cluster

import (
	"time"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// toLogWrite encodes what the queue asked a partition's log to append: a
// message, state writes, or both.
func toLogWrite(id queue.PartitionID, epoch uint64, msg *queue.Message, b *queue.Batch) *pb.LogWrite {
	w := &pb.LogWrite{Queue: id.Queue, Epoch: epoch}
	if msg != nil {
		w.Message = toPBMessage(msg)
	}
	if b == nil {
		return w
	}
	for _, a := range b.Appends {
		w.Appends = append(w.Appends, toPBMessage(a.Message))
	}
	for _, d := range b.Deletes {
		w.Deletes = append(w.Deletes, &pb.RangeDelete{From: d.From, To: d.To})
	}
	for _, f := range b.Floors {
		w.Floors = append(w.Floors, &pb.FloorWrite{Group: f.Group, Floor: f.Floor, Delivered: f.Delivered, Filter: f.Filter})
	}
	for _, m := range b.Marks {
		w.Marks = append(w.Marks, &pb.SettleMark{Group: m.Group, Offset: m.Offset, Set: m.Set})
	}
	for _, d := range b.Deliveries {
		w.Deliveries = append(w.Deliveries, &pb.DeliveryMark{Group: d.Group, Offset: d.Offset, Count: d.Count})
	}
	for _, g := range b.DropGroups {
		w.DropGroups = append(w.DropGroups, g.Group)
	}
	for _, d := range b.Dedups {
		w.Dedups = append(w.Dedups, &pb.DedupMark{Id: d.ID, At: unixNano(d.At)})
	}
	w.Erase = len(b.Erase) > 0
	return w
}

// fromLogWrite decodes a write of partition id: the message (nil when
// none) and every write as one batch.
func fromLogWrite(id queue.PartitionID, w *pb.LogWrite) (*queue.Message, *queue.Batch) {
	var msg *queue.Message
	b := new(queue.Batch)
	q, p := id.Queue, id.Partition
	if w.Erase {
		b.Erase = append(b.Erase, id)
	}
	if w.Message != nil {
		msg = fromPBMessage(w.Message)
		b.Appends = append(b.Appends, queue.Append{Queue: q, Partition: p, Message: msg})
	}
	for _, m := range w.Appends {
		b.Appends = append(b.Appends, queue.Append{Queue: q, Partition: p, Message: fromPBMessage(m)})
	}
	for _, d := range w.Deletes {
		b.Deletes = append(b.Deletes, queue.RangeDelete{Queue: q, Partition: p, From: d.From, To: d.To})
	}
	for _, f := range w.Floors {
		b.Floors = append(b.Floors, queue.FloorWrite{Queue: q, Group: f.Group, Partition: p, Floor: f.Floor, Delivered: f.Delivered, Filter: f.Filter})
	}
	for _, m := range w.Marks {
		b.Marks = append(b.Marks, queue.SettleMark{Queue: q, Group: m.Group, Partition: p, Offset: m.Offset, Set: m.Set})
	}
	for _, d := range w.Deliveries {
		b.Deliveries = append(b.Deliveries, queue.DeliveryMark{Queue: q, Group: d.Group, Partition: p, Offset: d.Offset, Count: d.Count})
	}
	for _, g := range w.DropGroups {
		b.DropGroups = append(b.DropGroups, queue.GroupRef{Queue: q, Group: g, Partition: p})
	}
	for _, d := range w.Dedups {
		at := time.Time{}
		if d.At != 0 {
			at = time.Unix(0, d.At)
		}
		b.Dedups = append(b.Dedups, queue.DedupMark{Queue: q, Partition: p, ID: d.Id, At: at})
	}
	return msg, b
}
