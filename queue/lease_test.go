package queue_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// The harness's queues have ack_timeout 10s: a lease is lost once the
// clock is past its deadline.
const (
	ackTimeout = 10 * time.Second
	pastLease  = ackTimeout + time.Millisecond
)

// SPEC 3 and 4: a QoS 1 delivery is leased until it is settled or the
// lease runs out; a lost lease makes the message available again at once,
// its delivery-count one higher; only the holder of the lease settles it.
func TestQueueLease(t *testing.T) {
	one := sub{prefetch: 1}
	runScripts(t, []script{
		{
			name: "a delivery is leased until ack_timeout, then goes to another consumer",
			subs: map[string]sub{"c": one, "d": one},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{sub: "d"},
				{tick: ackTimeout - time.Millisecond},
				{tick: 2 * time.Millisecond, want: []string{"d:m1#2"}},
				{op: ack, of: "c:m1", opErr: queue.ErrNotLeased},
				{op: ack, of: "d:m1"},
				{tick: pastLease},
			},
		},
		{
			name: "a lost lease comes back to its own consumer when it has room",
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"m1#1"}},
				{tick: pastLease, want: []string{"m1#2"}},
				{tick: pastLease, want: []string{"m1#3"}},
				{op: ack, of: "m1#3"},
				{tick: pastLease},
			},
		},
		{
			// The lost delivery is still in flight to the consumer until its
			// PUBACK arrives: it keeps the consumer's slot till then.
			name: "a lost lease waits for a consumer without room to PUBACK",
			subs: map[string]sub{"c": one},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"m1#1"}},
				{tick: pastLease},
				{op: ack, of: "m1#1", opErr: queue.ErrNotLeased, want: []string{"m1#2"}},
				{op: ack, of: "m1#2"},
			},
		},
		{
			name: "extend renews the lease for another ack_timeout from then",
			subs: map[string]sub{"c": one, "d": one},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{sub: "d"},
				{tick: 8 * time.Second},
				{op: extend, of: "c:m1"},
				{tick: 8 * time.Second},
				{tick: 2*time.Second - time.Millisecond},
				{tick: 2 * time.Millisecond, want: []string{"d:m1#2"}},
				{op: extend, of: "c:m1", opErr: queue.ErrNotLeased},
				{op: ack, of: "d:m1"},
			},
		},
		{
			name: "extend can renew again and again",
			subs: map[string]sub{"c": one, "d": one},
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
				{sub: "d"},
				{tick: 9 * time.Second},
				{op: extend, of: "c:m1"},
				{tick: 9 * time.Second},
				{op: extend, of: "c:m1"},
				{tick: 9 * time.Second},
				{op: extend, of: "c:m1"},
				{tick: 9 * time.Second},
				{op: ack, of: "c:m1"},
				{tick: pastLease},
			},
		},
		{
			name: "the lease of a redelivery runs from the redelivery",
			steps: []step{
				{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"m1#1"}},
				{tick: 6 * time.Second},
				{pub: []msg{kmsg("b", "m2")}, want: []string{"m2#1"}},
				{tick: 5 * time.Second, want: []string{"m1#2"}},                  // 11s: m1 lost at 10s
				{tick: 5*time.Second + time.Millisecond, want: []string{"m2#2"}}, // 16s: m2 lost, m1 leased till 21s
				{tick: 5 * time.Second, want: []string{"m1#3"}},                  // 21s
			},
		},
	})
}

// SPEC 4: a late PUBACK (or $ack, $nack, $reject, $extend) from a former
// holder changes nothing: the message stays with its new holder, is not
// acked, redelivered or dead-lettered. The late PUBACK does end the
// delivery in flight, so the former holder has room again.
func TestQueueLeaseLateSettle(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   op
	}{
		{"late ack", ack},
		{"late nack", nack},
		{"late reject", reject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			one := sub{prefetch: 1}
			runScript(t, script{
				subs: map[string]sub{"c": one, "d": one},
				steps: []step{
					{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"c:m1#1"}},
					{tick: pastLease},
					{sub: "d", want: []string{"d:m1#2"}},
					{pub: []msg{kmsg("b", "m2")}},
					{op: tc.op, of: "c:m1", opErr: queue.ErrNotLeased, want: []string{"c:m2#1"}},
					// d still holds m1: its nack brings it back, so the late
					// settlement did not ack it.
					{op: nack, of: "d:m1", tick: 2 * time.Second, want: []string{"d:m1#3"}},
					{op: ack, of: "d:m1"},
					{op: ack, of: "c:m2", tick: time.Hour},
				},
			})
		})
	}
}

// SPEC 4: a nack redelivers after retry_backoff, doubled per delivery, up
// to retry_backoff_max; not a moment before.
func TestQueueNackBackoff(t *testing.T) {
	for _, tc := range []struct {
		name          string
		backoff, max_ time.Duration
		waits         []time.Duration // after the nack of delivery 1, 2, ...
	}{
		{"doubles per delivery", time.Second, time.Minute, []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}},
		{"capped at retry_backoff_max", time.Second, 3 * time.Second, []time.Duration{1 * time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{"max equal to backoff", 5 * time.Second, 5 * time.Second, []time.Duration{5 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"a cap that is not a doubling", 3 * time.Second, 10 * time.Second, []time.Duration{3 * time.Second, 6 * time.Second, 10 * time.Second, 10 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := []step{{pub: []msg{kmsg("a", "m1")}, sub: "c", want: []string{"m1#1"}}}
			for i, w := range tc.waits {
				steps = append(steps,
					step{op: nack, of: "m1"},
					step{tick: w - time.Millisecond},
					step{tick: time.Millisecond, want: []string{fmt.Sprintf("m1#%d", i+2)}},
				)
			}
			steps = append(steps, step{op: ack, of: "m1"})
			runScript(t, script{
				opts: func(o *queue.Options) {
					o.RetryBackoff, o.RetryBackoffMax = tc.backoff, tc.max_
					o.MaxDeliveries = len(tc.waits) + 1
					o.AckTimeout = time.Hour
				},
				steps: steps,
			})
		})
	}
}

// SPEC 4: a reject sends the message straight to the dead-letter queue,
// whatever its delivery count, and lets the next message of its key go.
func TestQueueReject(t *testing.T) {
	runScripts(t, []script{
		{
			name: "on the first delivery",
			steps: []step{
				{pub: []msg{kmsg("k", "m1"), kmsg("k", "m2")}, sub: "c", want: []string{"m1#1"}},
				{op: reject, of: "m1", want: []string{"m2#1"}},
				{op: ack, of: "m2", tick: time.Hour},
			},
			dlq: []deadLetter{{payload: "m1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "g"}},
		},
		{
			name: "after a nack",
			steps: []step{
				{pub: []msg{kmsg("k", "m1"), kmsg("k", "m2")}, sub: "c", want: []string{"m1#1"}},
				{op: nack, of: "m1", tick: time.Second, want: []string{"m1#2"}},
				{op: reject, of: "m1", want: []string{"m2#1"}},
			},
			dlq: []deadLetter{{payload: "m1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 2, group: "g"}},
		},
		{
			name: "keeps the subject in the original topic",
			steps: []step{
				{pub: []msg{kmsg("k", "m0"), {key: "k", subject: "eu/de", payload: "m1"}}, sub: "c", want: []string{"m0"}},
				{op: ack, of: "m0", want: []string{"m1"}},
				{op: reject, of: "m1"},
			},
			dlq: []deadLetter{{payload: "m1", reason: "rejected", id: "0-1", topic: "$queue/q/eu/de", count: 1, group: "g"}},
		},
		{
			name: "by the consumer of another group",
			subs: map[string]sub{"c": {group: "billing"}},
			steps: []step{
				{pub: []msg{kmsg("k", "m1")}, sub: "c", want: []string{"m1#1"}},
				{op: reject, of: "m1"},
			},
			dlq: []deadLetter{{payload: "m1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "billing"}},
		},
	})
}

// SPEC 1 and 4: the dead-letter queue is a queue: its consumers get the
// dead letters.
func TestQueueDeadLetterQueueIsConsumed(t *testing.T) {
	h := newHarness(t, nil)
	h.mustPublish("q", kmsg("k", "m1"), kmsg("k", "m2"))
	h.subscribe("q", "c", defaultSub)
	h.expect("m1#1")
	h.mustSettle(h.latest("m1"), rejected)
	h.expect("m2#1")
	h.expectDeadLetters("q", deadLetter{payload: "m1", reason: "rejected", id: "0-0", topic: "$queue/q", count: 1, group: "g"})
	h.subscribe("q/$dlq", "dl", defaultSub)
	h.expect("dl:m1#1")
}

// SPEC 4: when the delivery numbered max_deliveries ends without an ack,
// whether by nack, lost lease or the consumer leaving, the message goes to
// the dead-letter queue with reason max-deliveries; the next message of its
// key follows.
func TestQueueMaxDeliveries(t *testing.T) {
	const (
		byNack = iota
		byLostLease
		byClose
		byAck
	)
	for _, tc := range []struct {
		name string
		max  int
		ends []int // how each delivery ends
		dead bool
	}{
		{"nacks", 3, []int{byNack, byNack, byNack}, true},
		{"lost leases", 3, []int{byLostLease, byLostLease, byLostLease}, true},
		{"consumer closes", 3, []int{byClose, byClose, byClose}, true},
		{"nack, lost lease, close", 3, []int{byNack, byLostLease, byClose}, true},
		{"close, nack, lost lease", 3, []int{byClose, byNack, byLostLease}, true},
		{"lost lease, close, nack", 3, []int{byLostLease, byClose, byNack}, true},
		{"max_deliveries 1", 1, []int{byNack}, true},
		{"acked on the last delivery", 3, []int{byNack, byLostLease, byAck}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := []step{{pub: []msg{{key: "k", subject: "s", payload: "poison"}, kmsg("k", "next")}, sub: "c", want: []string{"poison#1"}}}
			for i, end := range tc.ends {
				// After the end of delivery n: delivery n+1, or the next
				// message once the poison one is settled.
				n := i + 1
				then := []string{fmt.Sprintf("poison#%d", n+1)}
				if n == tc.max || end == byAck {
					then = []string{"next#1"}
				}
				switch end {
				case byNack:
					// The backoff ends within a minute; a nack that dead-letters
					// waits for nothing (and a minute would lose the next
					// message's lease if the dead letter was stored first).
					tick := time.Minute
					if n == tc.max {
						tick = 0
					}
					steps = append(steps, step{op: nack, of: "poison", tick: tick, want: then})
				case byLostLease:
					steps = append(steps, step{tick: pastLease, want: then})
				case byClose:
					steps = append(steps, step{close: "c", sub: "c", want: then})
				case byAck:
					steps = append(steps, step{op: ack, of: "poison", want: then})
				}
			}
			steps = append(steps, step{op: ack, of: "next", tick: time.Hour})
			var dlq []deadLetter
			if tc.dead {
				dlq = []deadLetter{{payload: "poison", reason: "max-deliveries", id: "0-0", topic: "$queue/q/s", count: uint32(tc.max), group: "g"}}
			}
			runScript(t, script{
				opts:  func(o *queue.Options) { o.MaxDeliveries = tc.max },
				steps: steps,
				dlq:   dlq,
			})
		})
	}
}

// SPEC 12: a message given back with $release (the consumer is shutting
// down) is redelivered at once, its delivery count going up (DUP), and
// does not count toward max_deliveries: released ten times with
// max_deliveries 3 it is still delivered, and only three nacks after
// that dead-letter it.
func TestQueueReleaseIsNotCountedTowardMaxDeliveries(t *testing.T) {
	steps := []step{{pub: []msg{{key: "k", subject: "s", payload: "poison"}, kmsg("k", "next")}, sub: "c", want: []string{"poison#1"}}}
	for n := 2; n <= 11; n++ {
		steps = append(steps, step{op: release, of: "poison", want: []string{fmt.Sprintf("poison#%d", n)}})
	}
	steps = append(steps,
		step{op: nack, of: "poison", tick: time.Minute, want: []string{"poison#12"}},
		step{op: nack, of: "poison", tick: time.Minute, want: []string{"poison#13"}},
		step{op: nack, of: "poison", want: []string{"next#1"}},
		step{op: ack, of: "next", tick: time.Hour},
	)
	runScript(t, script{
		opts:  func(o *queue.Options) { o.MaxDeliveries = 3 },
		steps: steps,
		dlq:   []deadLetter{{payload: "poison", reason: "max-deliveries", id: "0-0", topic: "$queue/q/s", count: 13, group: "g"}},
	})
}

// A late PUBACK relayed from another node, which names the lease rather
// than holds it, frees its consumer's credit like a local one: a consumer
// on another node whose lease ran out would otherwise lose one credit of
// its stream for good, and with it, in the end, every delivery.
func TestQueueLatePubackFromAnotherNodeFreesCredit(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.AckTimeout = time.Second })
	h.mustPublish("q", kmsg("a", "a1"))
	h.subscribe("q", "c", sub{prefetch: 1})
	d := h.expect("c:a1#1")[0]
	h.tick(2 * time.Second) // the lease runs out; its slot waits for the PUBACK
	relayed := queue.LeaseRef{Partition: d.raw.Lease.Partition, Group: d.raw.Lease.Group, Offset: d.raw.Lease.Offset, Seq: d.raw.Lease.Seq}
	if err := h.m.Settle(relayed, queue.Ack); !errors.Is(err, queue.ErrNotLeased) {
		t.Fatalf("a late PUBACK: %v, want ErrNotLeased", err)
	}
	h.expect("c:a1#2")
}
