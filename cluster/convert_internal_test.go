package cluster

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// TestPartitionStateCopy: what a partition's copy carries to another node
// (a move, a new replica) comes out there as it went in, through the
// wire's encoding: each group's floor, settled offsets, delivery counts
// and subject filter (without it, a filtered group served by the new node
// would take every subject), the cuts of its queue's growths (kept as a
// reserved group's floor), and the dedup-ids.
func TestPartitionStateCopy(t *testing.T) {
	st := queue.PartitionState{First: 3, Next: 10,
		Groups: []queue.GroupState{
			{Group: "eu", Floor: 4, Settled: []uint64{6}, Deliveries: map[uint64]uint32{5: 2}, Delivered: 7, Filter: "eu/#"},
			{Group: "#cut/8", Floor: 9},
		},
		Dedups: map[string]time.Time{"d1": time.Unix(5, 0)},
	}
	wire, err := proto.Marshal(toPBState(st))
	if err != nil {
		t.Fatal(err)
	}
	var w pb.PartitionState
	if err := proto.Unmarshal(wire, &w); err != nil {
		t.Fatal(err)
	}
	if got := fromPBState(&w); !reflect.DeepEqual(*got, st) {
		t.Errorf("copied:\n%+v\nwant\n%+v", *got, st)
	}
}
