package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// An entry committed in a term other than the one its writes were made
// in (a deposed leader's proposal that reached a newer leader's log) is
// skipped on every replica: nothing of it is stored, its publishes'
// origins are not taken for stored, and the proposals of this node it
// held fail as not stored, so that they are routed again rather than
// answered.
func TestEntryOfAnotherTermIsVoid(t *testing.T) {
	n := &Node{log: slog.New(slog.NewTextHandler(io.Discard, nil)), origins: newOrigins()}
	h := &raftHost{n: n, token: 42, replicas: map[queue.PartitionID]*replica{}, proposing: map[*replica]bool{}, partLogs: map[queue.PartitionID]*raftLog{}}
	id := queue.PartitionID{Queue: "orders", Partition: 3}
	r := &replica{h: h, id: id, name: groupName(id, 0), inflight: map[uint64]*proposal{}, proposed: map[uint64][]*proposal{}}

	entry := func(index, term, token, seq, madeIn uint64, origin queue.Origin) *rpb.Entry {
		msg := &queue.Message{Key: "k", Payload: []byte("p"), Offset: 7, Origin: origin}
		data := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{entryTag}, token), seq)
		data, err := proto.MarshalOptions{}.MarshalAppend(data, &pb.RaftEntry{Term: madeIn, Writes: []*pb.LogWrite{toLogWrite(id, 1, msg, nil)}})
		if err != nil {
			t.Fatal(err)
		}
		return &rpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Data: data}
	}

	// Another node's, made in term 5, committed in term 6.
	theirs := queue.Origin{Run: 9, Seq: 1}
	r.Apply([]*rpb.Entry{entry(10, 6, 7, 1, 5, theirs)})
	if got := r.Stored(); got != 10 {
		t.Fatalf("stored up to %d after a void entry at 10, want 10 (it moves the index on)", got)
	}
	if s := n.origins.begin(theirs); s != originNone {
		t.Fatalf("origin of a void entry: %v, want unknown (the publish must be stored again)", s)
	}

	// This node's own, made in term 5, committed in term 6.
	var answer error
	answered := false
	p := &proposal{log: &raftLog{id: id}, id: 1, term: 5, done: func(err error) { answer, answered = err, true }}
	r.inflight[p.id] = p
	r.proposed[3] = []*proposal{p}
	r.Apply([]*rpb.Entry{entry(11, 6, h.token, 3, 5, queue.Origin{Run: 1, Seq: 2})})
	if !answered {
		t.Fatal("the proposal of a void entry of this node was not answered")
	}
	var uo *unknownOutcome
	if !errors.Is(answer, queue.ErrNotOwned) || errors.As(answer, &uo) {
		t.Fatalf("the proposal of a void entry failed with %v, want not owned, known not stored", answer)
	}
	if len(r.inflight) != 0 || len(r.proposed) != 0 {
		t.Fatalf("a void entry's proposal is still tracked: %d in flight, %d proposed", len(r.inflight), len(r.proposed))
	}
	if got := r.Stored(); got != 11 {
		t.Fatalf("stored up to %d, want 11", got)
	}
}

// A raft sender sends what is queued for a peer in batches of at most
// the bound's bytes, a message larger than it alone, in queue order.
func TestRaftSenderBatchesByBytes(t *testing.T) {
	s := &raftSender{}
	for i, n := range []int{10, 10, 30, 5, 100} {
		s.queue = append(s.queue, &pb.RaftMessage{Group: fmt.Sprint(i), Message: make([]byte, n-1)})
	}
	var got [][]string
	for len(s.queue) > 0 {
		var groups []string
		for _, m := range s.takeLocked(25) {
			groups = append(groups, m.GetGroup())
		}
		got = append(got, groups)
	}
	want := [][]string{{"0", "1"}, {"2"}, {"3"}, {"4"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}
