package queue_test

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 2: a message with a delay (or deliver-at) is not delivered before
// then. SPEC 5: with ordering key it holds back the later messages of its
// own key, and nothing else.
func TestQueueDelay(t *testing.T) {
	delayed := func(key, payload string, d time.Duration) msg { return msg{key: key, payload: payload, delay: d} }
	// Leases last an hour here: no lease runs out while the clock moves
	// to a delay.
	long := func(o *queue.Options) { o.AckTimeout = time.Hour }
	cases := []script{
		{
			name: "is delivered at its time, not before",
			steps: []step{
				{sub: "c", pub: []msg{delayed("k", "k1", 10*time.Second)}},
				{tick: 10*time.Second - time.Millisecond},
				{tick: time.Millisecond, want: []string{"k1#1"}},
			},
		},
		{
			name: "holds back the later messages of its key only",
			steps: []step{
				{sub: "c", pub: []msg{delayed("k", "k1", 10*time.Second), kmsg("k", "k2"), kmsg("x", "x1")}, want: []string{"x1#1"}},
				{op: ack, of: "x1", pub: []msg{kmsg("x", "x2")}, want: []string{"x2#1"}},
				{tick: 10 * time.Second, want: []string{"k1#1"}},
				{op: ack, of: "k1", want: []string{"k2#1"}},
			},
		},
		{
			name: "does not hold back the earlier messages of its key",
			steps: []step{
				{sub: "c", pub: []msg{kmsg("k", "k1"), delayed("k", "k2", 10*time.Second), kmsg("k", "k3")}, want: []string{"k1#1"}},
				{tick: 5 * time.Second},
				{op: ack, of: "k1"}, // k2 is next of the key, and not due
				{tick: 5*time.Second - time.Millisecond},
				{tick: time.Millisecond, want: []string{"k2#1"}},
				{op: ack, of: "k2", want: []string{"k3#1"}},
			},
		},
		{
			name: "waits for its time when published before the consumer came",
			steps: []step{
				{pub: []msg{delayed("k", "k1", 10*time.Second), kmsg("x", "x1")}},
				{tick: 5 * time.Second},
				{sub: "c", want: []string{"x1#1"}},
				{tick: 5 * time.Second, want: []string{"k1#1"}},
			},
		},
		{
			name: "in the past is no delay",
			steps: []step{
				{sub: "c", pub: []msg{delayed("k", "k1", -time.Second), kmsg("k", "k2")}, want: []string{"k1#1"}},
				{op: ack, of: "k1", want: []string{"k2#1"}},
			},
		},
		{
			name: "with ordering none holds back nothing",
			opts: func(o *queue.Options) { long(o); o.Ordering = queue.OrderNone },
			steps: []step{
				{sub: "c", pub: []msg{delayed("k", "k1", 10*time.Second), kmsg("k", "k2")}, want: []string{"k2#1"}},
				{tick: 10 * time.Second, want: []string{"k1#1"}},
			},
		},
		{
			name: "of two keys in two partitions",
			opts: func(o *queue.Options) { long(o); o.Partitions = 4 },
			steps: []step{
				{sub: "c", pub: []msg{delayed("a", "a1", 10*time.Second), kmsg("a", "a2"), delayed("b", "b1", 20*time.Second), kmsg("b", "b2"), kmsg("c", "c1")}, want: []string{"c1#1"}},
				{tick: 10 * time.Second, want: []string{"a1#1"}},
				{op: ack, of: "a1", want: []string{"a2#1"}},
				{tick: 10 * time.Second, want: []string{"b1#1"}},
				{op: ack, of: "b1", want: []string{"b2#1"}},
			},
		},
	}
	for i := range cases {
		if cases[i].opts == nil {
			cases[i].opts = long
		}
	}
	runScripts(t, cases)
}

// SPEC 2 and 4: a message whose expiry passed before it was delivered goes
// to the dead-letter queue with reason expired, and the next of its key
// follows.
func TestQueueMessageExpiry(t *testing.T) {
	expiring := func(key, payload string, ttl time.Duration) msg { return msg{key: key, payload: payload, ttl: ttl} }
	runScripts(t, []script{
		{
			name: "before the first delivery",
			steps: []step{
				{pub: []msg{expiring("k", "x", 5*time.Second), kmsg("k", "y")}},
				{tick: 6 * time.Second},
				{sub: "c", want: []string{"y#1"}},
			},
			dlq: []deadLetter{{payload: "x", reason: "expired", id: "0-0", topic: "$queue/q", count: 0, group: "g"}},
		},
		{
			name: "not yet expired is delivered",
			steps: []step{
				{pub: []msg{expiring("k", "x", 5*time.Second), kmsg("k", "y")}},
				{tick: 4 * time.Second},
				{sub: "c", want: []string{"x#1"}},
				{op: ack, of: "x", want: []string{"y#1"}},
			},
		},
		{
			name: "while waiting behind its key",
			steps: []step{
				{sub: "c", pub: []msg{kmsg("k", "a1"), expiring("k", "a2", 5*time.Second), kmsg("k", "a3")}, want: []string{"a1#1"}},
				{tick: 6 * time.Second},
				{op: ack, of: "a1", want: []string{"a3#1"}},
			},
			dlq: []deadLetter{{payload: "a2", reason: "expired", id: "0-1", topic: "$queue/q", count: 0, group: "g"}},
		},
		{
			name: "while waiting for a retry",
			opts: func(o *queue.Options) { o.RetryBackoff = 10 * time.Second },
			steps: []step{
				{sub: "c", pub: []msg{expiring("k", "x", 5*time.Second), kmsg("k", "y")}, want: []string{"x#1"}},
				{op: nack, of: "x"},
				{tick: 10 * time.Second, want: []string{"y#1"}},
			},
			dlq: []deadLetter{{payload: "x", reason: "expired", id: "0-0", topic: "$queue/q", count: 1, group: "g"}},
		},
		{
			name: "delayed past its expiry",
			steps: []step{
				{sub: "c", pub: []msg{{key: "k", payload: "x", delay: 10 * time.Second, ttl: 5 * time.Second}, kmsg("k", "y")}},
				{tick: 10 * time.Second, want: []string{"y#1"}},
			},
			dlq: []deadLetter{{payload: "x", reason: "expired", id: "0-0", topic: "$queue/q", count: 0, group: "g"}},
		},
	})
}
