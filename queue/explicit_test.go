package queue_test

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 4, ack explicit: the PUBACK only says the delivery was received;
// the lease stays until $ack, $nack, $reject or runs out, $extend renews
// it, and the message keeps its place in the consumer's prefetch until it
// is settled (or its lease is lost after the PUBACK).
func TestQueueExplicitSettlement(t *testing.T) {
	start := step{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c", want: []string{"m1#1"}}
	explicitOne := map[string]sub{"c": {explicit: true, prefetch: 1}}
	runScripts(t, []script{
		{
			name: "the PUBACK settles nothing; the ack does",
			subs: explicitOne,
			steps: []step{
				start,
				{op: receive, of: "m1"},
				{tick: ackTimeout - time.Millisecond},
				{op: ack, of: "m1", want: []string{"m2#1"}},
				{op: receive, of: "m2"},
				{op: ack, of: "m2", tick: time.Hour},
			},
		},
		{
			name: "settled before the PUBACK",
			subs: explicitOne,
			steps: []step{
				start,
				{op: ack, of: "m1", want: []string{"m2#1"}},
				{op: receive, of: "m1"},
				{op: ack, of: "m2", tick: time.Hour},
			},
		},
		{
			name: "a lease lost after the PUBACK is redelivered at once",
			subs: explicitOne,
			steps: []step{
				start,
				{op: receive, of: "m1"},
				{tick: pastLease, want: []string{"m1#2"}},
				{op: ack, of: "m1#1", opErr: queue.ErrNotLeased},
				{op: receive, of: "m1#2"},
				{op: ack, of: "m1#2", want: []string{"m2#1"}},
			},
		},
		{
			name: "a lease lost before the PUBACK is redelivered once it comes",
			subs: explicitOne,
			steps: []step{
				start,
				{tick: pastLease},
				{op: receive, of: "m1", want: []string{"m1#2"}},
			},
		},
		{
			name: "extend renews the lease",
			subs: explicitOne,
			steps: []step{
				start,
				{op: receive, of: "m1"},
				{tick: 8 * time.Second},
				{op: extend, of: "m1"},
				{tick: 8 * time.Second},
				{op: ack, of: "m1", want: []string{"m2#1"}},
			},
		},
		{
			name: "nack redelivers after the backoff",
			subs: explicitOne,
			steps: []step{
				start,
				{op: receive, of: "m1"},
				{op: nack, of: "m1", want: []string{"m2#1"}},
				{op: receive, of: "m2"},
				{op: ack, of: "m2"},
				{tick: time.Second, want: []string{"m1#2"}},
			},
		},
		{
			name: "reject dead-letters",
			subs: explicitOne,
			steps: []step{
				start,
				{op: receive, of: "m1"},
				{op: reject, of: "m1", want: []string{"m2#1"}},
			},
			dlq: []deadLetter{{payload: "m1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "g"}},
		},
		{
			name: "the PUBACK keeps the message in the prefetch",
			subs: map[string]sub{"c": {explicit: true, prefetch: 2}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3")}, sub: "c", want: []string{"m1#1", "m2#1"}},
				{op: receive, of: "m1"},
				{op: receive, of: "m2"},
				{op: ack, of: "m2", want: []string{"m3#1"}},
			},
		},
	})
}
