package queue_test

import (
	"testing"

	"github.com/shardq/shardq/queue"
)

// SPEC 12, start: a new group starts at the oldest retained message
// (earliest, the default) or after the newest (latest), as the queue's
// start or the subscription's says; a group that exists keeps its place.
func TestQueueGroupStart(t *testing.T) {
	latest := func(o *queue.Options) { o.Start = queue.StartLatest }
	runScripts(t, []script{
		{
			name: "a new group starts at the oldest retained message",
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c", want: []string{"m1#1", "m2#1"}},
			},
		},
		{
			name: "a subscription starting at latest sees only what comes after it",
			subs: map[string]sub{"c": {prefetch: 10, start: queue.StartLatest}, "d": {group: "all", prefetch: 10}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1"), kmsg("b", "m2")}, sub: "c"},
				{pub: []msg{kmsg("c", "m3")}, want: []string{"c:m3#1"}},
				{sub: "d", want: []string{"d:m1#1", "d:m2#1", "d:m3#1"}},
			},
		},
		{
			name: "the queue's start applies to its new groups",
			opts: latest,
			subs: map[string]sub{"e": {group: "early", prefetch: 10, start: queue.StartEarliest}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c"},
				{pub: []msg{kmsg("b", "m2")}, want: []string{"c:m2#1"}},
				{sub: "e", want: []string{"e:m1#1", "e:m2#1"}},
			},
		},
		{
			name: "a group that exists keeps its place",
			subs: map[string]sub{"c2": {prefetch: 10, start: queue.StartLatest}},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"m1#1"}},
				{close: "c"},
				{pub: []msg{kmsg("b", "m2")}, sub: "c2", want: []string{"c2:m1#2", "c2:m2#1"}},
			},
		},
	})
}
