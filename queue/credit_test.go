package queue_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 3, flow control: a consumer holds at most prefetch unsettled
// messages, the smaller of its own and the queue's; a settlement makes
// room for the next.
func TestQueuePrefetch(t *testing.T) {
	five := []msg{kmsg("a", "m1"), kmsg("b", "m2"), kmsg("c", "m3"), kmsg("d", "m4"), kmsg("e", "m5")}
	queuePrefetch := func(n int) func(*queue.Options) { return func(o *queue.Options) { o.Prefetch = n } }
	runScripts(t, []script{
		{
			name: "the consumer's below the queue's",
			subs: map[string]sub{"c": {prefetch: 2}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"m1", "m2"}},
				{op: ack, of: "m1", want: []string{"m3"}},
				{op: ack, of: "m2", want: []string{"m4"}},
				{op: ack, of: "m4", want: []string{"m5"}},
			},
		},
		{
			name: "the queue's below the consumer's",
			opts: queuePrefetch(3),
			subs: map[string]sub{"c": {prefetch: 10}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"m1", "m2", "m3"}},
				{op: ack, of: "m2", want: []string{"m4"}},
			},
		},
		{
			name: "the queue's when the consumer names none",
			opts: queuePrefetch(2),
			subs: map[string]sub{"c": {}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"m1", "m2"}},
				{op: ack, of: "m1", want: []string{"m3"}},
			},
		},
		{
			name: "each consumer its own",
			subs: map[string]sub{"c": {prefetch: 1}, "d": {prefetch: 2}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"c:m1"}},
				{sub: "d", want: []string{"d:m2", "d:m3"}},
				{op: ack, of: "d:m2", want: []string{"d:m4"}},
				{op: ack, of: "c:m1", want: []string{"c:m5"}},
			},
		},
		{
			name: "nack and reject make room",
			subs: map[string]sub{"c": {prefetch: 1}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"m1"}},
				{op: nack, of: "m1", want: []string{"m2"}},
				{op: reject, of: "m2", want: []string{"m3"}},
			},
			dlq: []deadLetter{{payload: "m2", reason: "rejected", id: "0-1", topic: "$queue/q", count: 1, group: "g"}},
		},
		{
			name: "a lost lease keeps its room until its PUBACK",
			subs: map[string]sub{"c": {prefetch: 2}},
			steps: []step{
				{pub: five, sub: "c", want: []string{"m1#1", "m2#1"}},
				{tick: pastLease},
				{op: ack, of: "m1#1", opErr: queue.ErrNotLeased, want: []string{"m1#2"}},
				{op: ack, of: "m2#1", opErr: queue.ErrNotLeased, want: []string{"m2#2"}},
				{op: ack, of: "m1#2", want: []string{"m3#1"}},
			},
		},
	})
}

// flight counts a connection's deliveries not yet settled, and the most
// there ever were. A delivery counts from when it is made until its
// settlement starts, so the count is never above what the credit allows.
type flight struct{ now, peak atomic.Int64 }

func (f *flight) delivered() {
	n := f.now.Add(1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
}

func (f *flight) settling() { f.now.Add(-1) }

// SPEC 3: the shared credit of a connection (its v5 Receive Maximum)
// bounds its deliveries over every queue it consumes: never more are out,
// and as many as it allows are, while there are messages.
func TestQueueSharedCredit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		credit, n1, n2 int // messages published to q1 and q2
	}{
		{"credit 1", 1, 3, 3},
		{"credit 3", 3, 5, 5},
		{"one queue has few messages", 4, 1, 6},
		{"more credit than messages", 8, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) { o.Ordering, o.AckTimeout = queue.OrderNone, time.Hour })
			var f flight
			credit := h.newCredit(tc.credit)
			for _, q := range []string{"q1", "q2"} {
				h.subscribe(q, "c-"+q, sub{prefetch: 10, credit: credit, onDeliver: func(delivery) { f.delivered() }})
			}
			for i := 0; i < tc.n1; i++ {
				h.mustPublish("q1", kmsg("k", fmt.Sprint("q1-", i)))
			}
			for i := 0; i < tc.n2; i++ {
				h.mustPublish("q2", kmsg("k", fmt.Sprint("q2-", i)))
			}
			var held []delivery
			seen := map[string]bool{}
			for left := tc.n1 + tc.n2; left > 0; left-- {
				h.tick(0) // a pass of the timer, which dispatches every queue
				want := min(tc.credit, left)
				for _, d := range h.newDeliveries(want - len(held)) {
					if seen[d.payload] {
						t.Fatalf("%s delivered twice", d.payload)
					}
					seen[d.payload] = true
					held = append(held, d)
				}
				if len(held) != want {
					t.Fatalf("%d deliveries out with credit %d and %d messages left, want %d: %v", len(held), tc.credit, left, want, held)
				}
				f.settling()
				h.mustSettle(held[0], acked)
				held = held[1:]
			}
			h.tick(0)
			h.expect()
			if p := f.peak.Load(); p > int64(tc.credit) {
				t.Fatalf("%d deliveries were out at once with a credit of %d", p, tc.credit)
			}
		})
	}
}

// SPEC 3: the shared credit holds while the queues of one connection
// deliver and settle on many goroutines at once: never more deliveries
// out than the credit, every message delivered once.
func TestQueueSharedCreditConcurrentSettles(t *testing.T) {
	const (
		perQueue = 2000
		window   = 32 // publishes in flight per queue
		workers  = 16
	)
	queues := []string{"q1", "q2"}
	for _, credit := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprintf("credit=%d", credit), func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) {
				o.Ordering, o.AckTimeout, o.Partitions = queue.OrderNone, time.Hour, 4
			})
			var f flight
			total := perQueue * len(queues)
			work := make(chan delivery, total) // a delivery is made at most once here
			c := h.newCredit(credit)
			for _, q := range queues {
				h.subscribe(q, "c-"+q, sub{prefetch: 64, credit: c, onDeliver: func(d delivery) {
					f.delivered()
					work <- d
				}})
			}

			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			acks := map[string]int{}
			var settleErrs atomic.Int64
			allAcked := make(chan struct{})
			for i := 0; i < workers; i++ {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						case d := <-work:
							f.settling()
							if err := h.settle(d, acked); err != nil {
								settleErrs.Add(1)
							}
							mu.Lock()
							acks[d.payload]++
							if len(acks) == total {
								close(allAcked)
							}
							mu.Unlock()
						}
					}
				})
			}
			// The manager's timer, which dispatches every queue.
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
						h.tick(0)
					}
				}
			})
			// Publishes go on while the consumers settle, a window at a
			// time, so that appends dispatch both queues too.
			for from := 0; from < perQueue; from += window {
				var published []<-chan error
				for i := from; i < min(from+window, perQueue); i++ {
					for _, q := range queues {
						published = append(published, h.publishAsync(q, kmsg(fmt.Sprint(i), fmt.Sprintf("%s-%d", q, i))))
					}
				}
				for _, done := range published {
					if err := h.await(done); err != nil {
						t.Fatal(err)
					}
				}
			}
			select {
			case <-allAcked:
			case <-time.After(5 * time.Second):
				mu.Lock()
				n := len(acks)
				mu.Unlock()
				t.Errorf("%d of %d messages acked", n, total)
			}
			close(stop)
			wg.Wait()
			if p := f.peak.Load(); p > int64(credit) {
				t.Errorf("%d deliveries were out at once with a credit of %d", p, credit)
			}
			if n := settleErrs.Load(); n > 0 {
				t.Errorf("%d acks failed", n)
			}
			for p, n := range acks {
				if n != 1 {
					t.Errorf("%s delivered %d times", p, n)
				}
			}
		})
	}
}

// A delivery returned for want of its connection's credit (a consumer on
// another node whose client is busy) is at once another consumer's, and
// the connection's credit it took stays taken until it is given back: the
// busy connection is offered nothing more meanwhile.
func TestQueueReturnedDeliveryKeepsTheCredit(t *testing.T) {
	h := newHarness(t, func(o *queue.Options) { o.Ordering = queue.OrderNone })
	h.mustPublish("q", kmsg("a", "a1"), kmsg("b", "b1"))
	busy := h.newCredit(1)
	h.subscribe("q", "c1", sub{credit: busy})
	d := h.expect("c1:a1#1")[0]
	h.mustSettle(d, returned)
	h.subscribe("q", "c2", sub{prefetch: 1})
	h.expect("c2:a1#1")
	busy.Give()
	h.expect("c1:b1#1")
}
