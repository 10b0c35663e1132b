package broker

import (
	"reflect"
	"testing"
)

// TestMergeQueue checks how two nodes' views of one queue add up: each
// partition and group position from the node serving it, sums of depth,
// lag, leases and totals, the most consumers and the oldest age.
func TestMergeQueue(t *testing.T) {
	a := QueueView{Node: "a", Name: "jobs", Depth: 3,
		Partitions: []PartitionView{{Partition: 0, Node: "a", Next: 3, Committed: 3, Depth: 3}, {Partition: 1}},
		Groups: []GroupView{{Name: "g", Consumers: 2, Lag: 2, Leased: 1, OldestUnsettledAge: 4,
			Partitions: []GroupPartitionView{{Partition: 0, Floor: 1, Lag: 2, Leased: 1}, {Partition: 1}}}},
		Counts: CountsView{Enqueued: 3, Acked: 1},
		DLQ:    &QueueView{Name: "jobs/$dlq", Depth: 1, Groups: []GroupView{}},
	}
	b := QueueView{Node: "b", Name: "jobs", Depth: 5,
		Partitions: []PartitionView{{Partition: 0}, {Partition: 1, Node: "b", Next: 5, Committed: 5, Depth: 5}},
		Groups: []GroupView{
			{Name: "g", Consumers: 2, Lag: 4, Leased: 2, OldestUnsettledAge: 9,
				Partitions: []GroupPartitionView{{Partition: 0}, {Partition: 1, Floor: 1, Lag: 4, Leased: 2}}},
			{Name: "f", Consumers: 1, Partitions: []GroupPartitionView{{Partition: 0}, {Partition: 1}}},
		},
		Counts: CountsView{Enqueued: 5, Acked: 1},
		DLQ:    &QueueView{Name: "jobs/$dlq", Depth: 2, Groups: []GroupView{}},
	}
	mergeQueue(&a, b)
	want := QueueView{Node: "a", Name: "jobs", Depth: 8,
		Partitions: []PartitionView{{Partition: 0, Node: "a", Next: 3, Committed: 3, Depth: 3}, {Partition: 1, Node: "b", Next: 5, Committed: 5, Depth: 5}},
		Groups: []GroupView{
			{Name: "f", Consumers: 1, Partitions: []GroupPartitionView{{Partition: 0}, {Partition: 1}}},
			{Name: "g", Consumers: 2, Lag: 6, Leased: 3, OldestUnsettledAge: 9,
				Partitions: []GroupPartitionView{{Partition: 0, Floor: 1, Lag: 2, Leased: 1}, {Partition: 1, Floor: 1, Lag: 4, Leased: 2}}},
		},
		Counts: CountsView{Enqueued: 8, Acked: 2},
		DLQ:    &QueueView{Name: "jobs/$dlq", Depth: 3, Groups: []GroupView{}},
	}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("merged:\n%+v\nwant:\n%+v", a, want)
	}
}
