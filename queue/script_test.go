package queue_test

import (
	"cmp"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// A script is one named case of a table test: the queue "q" with its
// settings, consumers subscribed by name, and steps, each of which does
// something and then checks what the consumers got. It runs on a harness,
// so it knows nothing of the queue API.
type script struct {
	name string
	opts func(*queue.Options)
	// subs are the subscriptions of consumers by name; a consumer not
	// listed gets defaultSub.
	subs  map[string]sub
	steps []step
	// dlq is what q's dead-letter queue holds at the end, in order; nothing
	// else may have been sent to it.
	dlq []deadLetter
}

// defaultSub is a consumer of group "g" with room for ten messages.
var defaultSub = sub{prefetch: 10}

// step does, in this order: publish pub (each must return pubErr), close
// consumer close, subscribe consumer sub, apply op to the newest delivery
// of payload of (op must return opErr), advance the clock by tick and run
// the timer, run retention when retain is set. Then the consumers' new
// deliveries must be exactly want (see harness.expect), and q must hold
// depth messages when depth is set.
type step struct {
	pub    []msg
	pubErr error
	close  string
	sub    string
	op     op
	of     string
	opErr  error
	tick   time.Duration
	retain bool
	seek   *seekStep
	want   []string
	depth  *uint64
}

// seekStep moves a group (queue.Queue.Seek); err is what Seek must
// return.
type seekStep struct {
	group string // "" is the group "g"
	to    queue.SeekTo
	force bool
	err   error
}

// op is what a consumer does with a delivery.
type op int

const (
	noOp op = iota
	ack
	nack
	reject
	extend
	receive // the PUBACK of an explicit consumer
	release
)

func (o op) String() string {
	return [...]string{"nothing", "ack", "nack", "reject", "extend", "receive", "release"}[o]
}

func depth(n uint64) *uint64 { return &n }

func runScripts(t *testing.T, cases []script) {
	t.Helper()
	for _, s := range cases {
		t.Run(s.name, func(t *testing.T) { runScript(t, s) })
	}
}

func runScript(t *testing.T, s script) {
	h := newHarness(t, s.opts)
	for i, st := range s.steps {
		for _, m := range st.pub {
			if err := h.publish("q", m); !errors.Is(err, st.pubErr) {
				t.Fatalf("step %d: publish %q: %v, want %v", i, m.payload, err, st.pubErr)
			}
		}
		if st.close != "" {
			h.close(h.consumer(st.close))
		}
		if st.sub != "" {
			o, ok := s.subs[st.sub]
			if !ok {
				o = defaultSub
			}
			h.subscribe("q", st.sub, o)
		}
		if st.op != noOp {
			d := h.latest(st.of)
			var err error
			switch st.op {
			case ack:
				err = h.settle(d, acked)
			case nack:
				err = h.settle(d, nacked)
			case reject:
				err = h.settle(d, rejected)
			case release:
				err = h.settle(d, released)
			case extend:
				err = h.extend(d)
			case receive:
				h.received(d)
			}
			if !errors.Is(err, st.opErr) {
				t.Fatalf("step %d: %s of %s: %v, want %v", i, st.op, d, err, st.opErr)
			}
		}
		if st.tick > 0 {
			h.tick(st.tick)
		}
		if st.retain {
			h.retain()
		}
		if sk := st.seek; sk != nil {
			group := cmp.Or(sk.group, "g")
			if _, err := h.m.Queue("q").Seek(context.Background(), group, sk.to, sk.force, false); !errors.Is(err, sk.err) {
				t.Fatalf("step %d: seek of %s to %s: %v, want %v", i, group, sk.to, err, sk.err)
			}
		}
		if got := h.newDeliveries(len(st.want)); !matchDeliveries(got, st.want) {
			t.Fatalf("step %d: deliveries %v, want %v", i, got, st.want)
		}
		if st.depth != nil {
			if got := h.depth("q"); got != *st.depth {
				t.Fatalf("step %d: q holds %d messages, want %d", i, got, *st.depth)
			}
		}
	}
	h.expectDeadLetters("q", s.dlq...)
}
