package cluster

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/shardq/shardq/cluster/clusterpb"
)

// Retained messages across the cluster (SPEC section 7; docs/adr/0010).
// etcd keeps the last retained message of every topic under
// retained/{topic}: a node that was down reads them when it is back, and
// none is lost with the node it was published on.
//
//   - A retained publish made here is routed to every member at once, as
//     any publish (plain.go), and recorded in etcd by the node's writer of
//     them (keywriter.go): in order, the latest of a topic only; a failed
//     write is tried again.
//     An empty payload (which clears the topic) is recorded as a
//     tombstone, kept: a node that was down while a topic was cleared
//     must tell a cleared topic from one never recorded.
//   - Every node applies the records as the watch of the cluster's keys
//     brings them, in etcd's order, which decides between publishes made
//     at once on two nodes; at start, and after the watch broke, it makes
//     its retained messages those of etcd (PlainHandler.Retained), and
//     records those it holds that etcd never had (RecordRetained).
//   - A routed retained message that reaches a node after its own record
//     did (it is stale: a later record was applied meanwhile, or it is
//     the same) makes the node read the topic's record again.
//
// A retained message larger than maxRetainedBytes is not recorded: it
// stays on the nodes it was routed to.

// RetainedID names a retained publish: the run of the node it was made
// on and its number there.
type RetainedID struct{ Run, Seq uint64 }

// maxRetainedBytes bounds a retained message recorded in etcd: below
// etcd's default request limit (1.5 MiB).
const maxRetainedBytes = 1 << 20

// retainedSeenFor is how long a record applied is remembered by its id.
const retainedSeenFor = time.Minute

func (k keys) retained(topic string) string { return k.prefix + "retained/" + topic }

// retainedKey reports whether key is a retained message's record.
func retainedKey(k keys, key string) bool {
	rest, _ := strings.CutPrefix(key, k.prefix)
	return strings.HasPrefix(rest, "retained/")
}

// retainedState is this node's writer of retained records and its memory
// of the records applied.
type retainedState struct {
	n      *Node
	writer *keyWriter

	mu   sync.Mutex
	seq  uint64
	seen map[RetainedID]time.Time // records applied, when
	// have is, by topic, the retained publish stored here last when it
	// came by routing or was made here: its record needs no storing again.
	have map[string]RetainedID
}

func newRetainedState(n *Node) *retainedState {
	return &retainedState{n: n, writer: newKeyWriter(n, "retained messages"), seen: map[RetainedID]time.Time{}, have: map[string]RetainedID{}}
}

// record names a retained publish made here and queues its record; the
// channel returned is closed once it, or a later one of its topic, is
// written.
func (r *retainedState) record(rp *pb.RoutedPublish) (RetainedID, <-chan struct{}) {
	r.mu.Lock()
	r.seq++
	rp.RetainedRun, rp.RetainedSeq = r.n.run, r.seq
	id := RetainedID{rp.RetainedRun, rp.RetainedSeq}
	r.have[rp.Topic] = id // mochi stores it here
	r.mu.Unlock()
	value, err := proto.Marshal(rp)
	if err != nil || len(value) > maxRetainedBytes {
		r.n.log.Warn("a retained message too large to record in the cluster: only the nodes it reached keep it", "topic", rp.Topic, "bytes", len(value), "max", maxRetainedBytes)
		done := make(chan struct{})
		close(done)
		return id, done
	}
	return id, r.writer.put(r.n.keys.retained(rp.Topic), string(value))
}

// applied notes the records read from etcd and forgets those read long
// ago; it returns those this node does not hold already.
func (r *retainedState) applied(msgs []PlainMessage, all bool) []PlainMessage {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if all {
		clear(r.have)
	}
	out := msgs[:0:0]
	for _, m := range msgs {
		if m.Retained != (RetainedID{}) {
			r.seen[m.Retained] = now
		}
		if have, ok := r.have[m.Topic]; ok && have == m.Retained {
			continue
		}
		delete(r.have, m.Topic)
		out = append(out, m)
	}
	if len(r.seen) > 1024 {
		for id, at := range r.seen {
			if now.Sub(at) > retainedSeenFor {
				delete(r.seen, id)
			}
		}
	}
	return out
}

// CheckRetained is told of a routed retained message the handler stored:
// when its record was applied before it arrived, the node reads the
// topic's record again and the handler stores that.
func (n *Node) CheckRetained(m PlainMessage) {
	r := n.retained
	r.mu.Lock()
	_, stale := r.seen[m.Retained]
	if !stale {
		r.have[m.Topic] = m.Retained
	}
	r.mu.Unlock()
	if !stale || m.Retained == (RetainedID{}) || n.opts.Plain == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		defer cancel()
		resp, err := n.etcd.Get(ctx, n.keys.retained(m.Topic))
		if err != nil || len(resp.Kvs) == 0 {
			return
		}
		if rm, ok := decodeRetained(m.Topic, resp.Kvs[0].Value); ok {
			n.opts.Plain.Retained([]PlainMessage{rm}, false)
		}
	}()
}

// decodeRetained reads a retained record of topic.
func decodeRetained(topic string, value []byte) (PlainMessage, bool) {
	var rp pb.RoutedPublish
	if proto.Unmarshal(value, &rp) != nil {
		return PlainMessage{}, false
	}
	return PlainMessage{Topic: topic, Payload: rp.Payload, QoS: byte(rp.Qos), Retain: true, Properties: rp.Properties,
		Origin: rp.Origin, Retained: RetainedID{rp.RetainedRun, rp.RetainedSeq}}, true
}

// retainedRecord reads the record of a retained message (put) or its
// deletion.
func (n *Node) retainedRecord(key string, put bool, value []byte) PlainMessage {
	topic := strings.TrimPrefix(key, n.keys.retained(""))
	if put {
		if m, ok := decodeRetained(topic, value); ok {
			return m
		}
		n.log.Warn("a retained record unreadable: the topic's retained message is cleared", "topic", topic)
	}
	return PlainMessage{Topic: topic, Retain: true}
}

// applyRetained hands the records read from etcd to the handler; with
// all, they are every record.
func (n *Node) applyRetained(msgs []PlainMessage, all bool) {
	if !all {
		if msgs = n.retained.applied(msgs, false); len(msgs) == 0 {
			return
		}
	} else {
		n.retained.applied(msgs, true)
	}
	if n.opts.Plain != nil {
		n.opts.Plain.Retained(msgs, all)
	}
}

// Retain records a retained publish made here (an empty payload clears
// its topic) and waits until it is in etcd, or for wait at most: a
// publish acknowledged after its record keeps the order of publishes made
// one after the other on different nodes. It returns the publish's id,
// zero on a node not in a cluster.
func (n *Node) Retain(m PlainMessage, wait time.Duration) RetainedID {
	if n.etcd == nil {
		return RetainedID{}
	}
	id, written := n.retained.record(&pb.RoutedPublish{Topic: m.Topic, Payload: m.Payload, Qos: uint32(m.QoS), Retain: true, Properties: m.Properties, Origin: m.Origin})
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-written:
		case <-t.C:
			n.log.Debug("a retained message acknowledged before etcd recorded it", "topic", m.Topic)
		case <-n.ctx.Done():
		}
	}
	return id
}
