package queue_test

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 3: when a consumer leaves, its unsettled messages go back to its
// group at once (no timer involved), to the others or to it when it
// returns, their delivery-count one higher; its late settlements change
// nothing.
func TestQueueConsumerClose(t *testing.T) {
	two := []msg{kmsg("a", "m1"), kmsg("b", "m2")}
	runScripts(t, []script{
		{
			name: "its messages go to another consumer at once",
			subs: map[string]sub{"c": {prefetch: 1}, "d": {prefetch: 2}},
			steps: []step{
				{pub: two, sub: "c", want: []string{"c:m1#1"}},
				{sub: "d", want: []string{"d:m2#1"}},
				{close: "c", want: []string{"d:m1#2"}},
				{op: ack, of: "d:m1"},
				{op: ack, of: "d:m2", tick: time.Hour},
			},
		},
		{
			name: "its messages wait for a consumer of the group",
			steps: []step{
				{pub: two, sub: "c", want: []string{"m1#1", "m2#1"}},
				{close: "c"},
				{tick: time.Hour},
				{sub: "c", want: []string{"m1#2", "m2#2"}},
			},
		},
		{
			name: "its late settlement changes nothing",
			subs: map[string]sub{"c": {prefetch: 1}, "d": {prefetch: 1}},
			steps: []step{
				{pub: two[:1], sub: "c", want: []string{"c:m1#1"}},
				{close: "c"},
				{op: ack, of: "c:m1", opErr: queue.ErrNotLeased},
				{op: reject, of: "c:m1", opErr: queue.ErrNotLeased},
				{op: extend, of: "c:m1", opErr: queue.ErrNotLeased},
				{sub: "d", want: []string{"d:m1#2"}},
				{op: nack, of: "d:m1", tick: 2 * time.Second, want: []string{"d:m1#3"}},
			},
		},
		{
			name: "what it acked stays acked",
			steps: []step{
				{pub: two, sub: "c", want: []string{"m1#1", "m2#1"}},
				{op: ack, of: "m1"},
				{close: "c", sub: "c", want: []string{"m2#2"}},
			},
		},
		{
			name: "the other groups keep their leases",
			subs: map[string]sub{"d": {group: "other", prefetch: 10}},
			steps: []step{
				{pub: two, sub: "c", want: []string{"c:m1#1", "c:m2#1"}},
				{sub: "d", want: []string{"d:m1#1", "d:m2#1"}},
				{close: "c"},
				{op: ack, of: "d:m1"},
				{op: ack, of: "d:m2", tick: time.Hour},
			},
		},
	})
}

// SPEC 3: every group of a queue receives every message; within a group
// each message goes to one consumer at a time; a group never seen starts
// at the oldest retained message.
func TestQueueGroups(t *testing.T) {
	otherGroup := map[string]sub{"d": {group: "other", prefetch: 10}}
	runScripts(t, []script{
		{
			name: "messages published before the first consumer are delivered",
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}},
				{sub: "c", want: []string{"m1#1", "m2#1"}},
			},
		},
		{
			name: "every group receives every message",
			subs: otherGroup,
			steps: []step{
				{sub: "c"},
				{sub: "d"},
				{pub: []msg{kmsg("a", "m1")}, want: []string{"c:m1#1", "d:m1#1"}},
				{pub: []msg{kmsg("b", "m2")}, want: []string{"c:m2#1", "d:m2#1"}},
			},
		},
		{
			name: "within a group each message goes to one consumer",
			subs: map[string]sub{"c": {prefetch: 1}, "d": {prefetch: 1}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3")}, sub: "c", want: []string{"c:m1#1"}},
				{sub: "d", want: []string{"d:m2#1"}},
				{op: ack, of: "c:m1", want: []string{"c:m3#1"}},
				{op: ack, of: "d:m2"},
				{op: ack, of: "c:m3", tick: time.Hour},
			},
		},
		{
			name: "a new group starts at the oldest retained message",
			subs: otherGroup,
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("a", "m2")}, sub: "c", want: []string{"c:m1"}},
				{op: ack, of: "m1", want: []string{"c:m2"}},
				{op: ack, of: "m2", retain: true, depth: depth(0)},
				{pub: []msg{kmsg("a", "m3")}, want: []string{"c:m3"}},
				{sub: "d", want: []string{"d:m3#1"}},
			},
		},
		{
			name: "a new group gets what another group holds",
			subs: otherGroup,
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c", want: []string{"c:m1", "c:m2"}},
				{retain: true},
				{sub: "d", want: []string{"d:m1#1", "d:m2#1"}},
			},
		},
		{
			name: "a group without consumers keeps its place",
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("a", "m2")}, sub: "c", want: []string{"m1"}},
				{op: ack, of: "m1", want: []string{"m2"}},
				{close: "c", pub: []msg{kmsg("a", "m3")}},
				{retain: true},
				{sub: "c", want: []string{"m2#2"}},
				{op: ack, of: "m2", want: []string{"m3#1"}},
			},
		},
	})
}
