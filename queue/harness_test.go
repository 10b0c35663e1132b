package queue_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// The harness is the only code of the table tests (lease_test.go,
// ordering_test.go, retention_table_test.go, ...) that calls into package
// queue. The tests speak of payloads, keys, consumers, deliveries and dead
// letters; when the queue API changes (how a delivery is settled, where
// Subscribe lives), this file changes and the tables do not.
//
// Time is the harness's: the manager's clock is h.now, its timer never
// fires on its own (Tick and RetainEvery are an hour), and h.tick advances
// the clock and runs one pass of the timer. Deliveries are made while a
// publish completes, a settlement or a tick runs, so they have arrived when
// those return; what happens on other goroutines (the commit of a dead
// letter, an eviction) is waited for with a bound.

// waitLimit bounds every wait for asynchronous work.
const waitLimit = 3 * time.Second

// t0 is where the harness clock starts.
var t0 = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// testOptions are the queue settings the tables start from: one partition
// (so that there is one total order), round numbers for the timeouts.
func testOptions() queue.Options {
	o := queue.DefaultOptions()
	o.Partitions = 1
	o.AckTimeout = 10 * time.Second
	o.MaxDeliveries = 5
	o.RetryBackoff = time.Second
	o.RetryBackoffMax = time.Minute
	o.MaxAge = 0
	o.DedupWindow = 2 * time.Minute
	return o
}

type harness struct {
	t       testing.TB
	m       *queue.Manager
	store   *queuetest.MemStore
	mo      queue.ManagerOptions
	seq     atomic.Uint64 // orders deliveries over every consumer
	arrived chan struct{} // signalled after each delivery

	mu        sync.Mutex
	now       time.Time
	consumers map[string]*consumer // by name, the newest of a name
}

// newHarness starts a manager on an in-memory store; every queue gets
// testOptions changed by edit.
func newHarness(t testing.TB, edit func(*queue.Options)) *harness {
	t.Helper()
	o := testOptions()
	if edit != nil {
		edit(&o)
	}
	h := &harness{t: t, now: t0, consumers: map[string]*consumer{}, arrived: make(chan struct{}, 1)}
	h.store = queuetest.NewMemStore(2)
	mo := queue.DefaultManagerOptions()
	mo.Store = h.store
	mo.Defaults = o
	mo.Clock = h.clock
	mo.Tick = time.Hour
	mo.RetainEvery = time.Hour
	h.mo = mo
	h.start()
	return h
}

// start runs a manager on the harness's store.
func (h *harness) start() {
	t := h.t
	t.Helper()
	h.mo.Store = h.store
	m, err := queue.NewManager(h.mo)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("closing the manager: %v", err)
		}
	})
}

// crash stops the manager as kill -9 would, right after a timer pass (so
// what the timer persists is on "disk"), and starts a new one on the same
// data: nothing the old manager writes afterwards is stored. Consumers
// are gone; subscribe again.
func (h *harness) crash() {
	h.t.Helper()
	h.tick(0)
	h.crashNow()
}

// crashNow is crash without the timer pass: what the timer would have
// persisted next is lost.
func (h *harness) crashNow() {
	h.t.Helper()
	queue.WaitWritten(h.m)
	_ = h.store.Close()
	h.store = h.store.Reopen()
	h.mu.Lock()
	h.consumers = map[string]*consumer{}
	h.mu.Unlock()
	h.start()
}

func (h *harness) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

// tick advances the clock by d and runs one pass of the timer: leases past
// their deadline are lost, due retries and delays are released. Retention
// does not run.
func (h *harness) tick(d time.Duration) {
	h.mu.Lock()
	h.now = h.now.Add(d)
	now := h.now
	h.mu.Unlock()
	queue.TickAt(h.m, now, false)
}

// retain runs one pass of the timer with retention at the current time
// and waits for the evictions it starts.
func (h *harness) retain() {
	h.t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		queue.TickAt(h.m, h.clock(), true)
	}()
	select {
	case <-done:
	case <-time.After(waitLimit):
		h.t.Fatalf("a retention pass did not end within %s", waitLimit)
	}
}

// msg is a message to publish.
type msg struct {
	key, subject, payload string
	dedup                 string        // dedup-id
	delay                 time.Duration // not delivered before publish time + delay
	ttl                   time.Duration // expires at publish time + ttl
	props                 []queue.Property
}

// kmsg is a message of key with payload.
func kmsg(key, payload string) msg { return msg{key: key, payload: payload} }

func (h *harness) message(m msg) *queue.Message {
	qm := &queue.Message{Key: m.key, Subject: m.subject, Payload: []byte(m.payload), DedupID: m.dedup, Headers: queue.Headers{User: m.props}}
	now := h.clock()
	if m.delay != 0 {
		qm.NotBefore = now.Add(m.delay)
	}
	if m.ttl != 0 {
		qm.ExpiresAt = now.Add(m.ttl)
	}
	return qm
}

// publishAsync publishes m to queue q; the channel gets the outcome once
// the message is stored (or refused).
func (h *harness) publishAsync(q string, m msg) <-chan error {
	done := make(chan error, 1)
	h.m.Publish(context.Background(), q, h.message(m), func(err error) { done <- err })
	return done
}

// publish publishes m to queue q and returns the outcome once it is known.
func (h *harness) publish(q string, m msg) error {
	h.t.Helper()
	return h.await(h.publishAsync(q, m))
}

// await returns the outcome of a publish, failing the test when none comes
// within waitLimit.
func (h *harness) await(done <-chan error) error {
	h.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLimit):
		h.t.Fatalf("a publish got no outcome within %s", waitLimit)
		return nil
	}
}

// mustPublish publishes each message in turn and fails the test on an error.
func (h *harness) mustPublish(q string, ms ...msg) {
	h.t.Helper()
	for _, m := range ms {
		if err := h.publish(q, m); err != nil {
			h.t.Fatalf("publish %q to %s: %v", m.payload, q, err)
		}
	}
}

// sub is a subscription's settings.
type sub struct {
	group      string // "" is the group "g"
	subjects   string // the subscription's subject filter
	start      queue.Start
	prefetch   int   // 0 is the queue's prefetch
	explicit   bool  // settled by explicit calls; the PUBACK is received()
	partitions []int // the only partitions the consumer takes
	sharding   *queue.Sharding
	credit     *queue.Credit
	remote     bool // connected to another node (ConsumerOptions.Remote)
	// onDeliver, if set, sees every delivery as it is made, on the
	// goroutine that makes it; it must not call back into the harness's
	// settle, extend or close.
	onDeliver func(delivery)
}

// newCredit is a connection's credit of n deliveries, shared by the
// subscriptions it is given to.
func (h *harness) newCredit(n int) *queue.Credit { return queue.NewCredit(n) }

// consumer is a subscription and the deliveries it got.
type consumer struct {
	h    *harness
	name string
	c    queue.Subscription
	on   func(delivery)

	mu      sync.Mutex
	got     []delivery
	checked int // got[:checked] were returned by take
}

// Deliver makes consumer a queue.Receiver.
func (c *consumer) Deliver(d queue.Delivery) {
	x := delivery{
		seq: c.h.seq.Add(1), to: c.name,
		payload: string(d.Message.Payload), key: d.Message.Key, count: d.Count,
		id: d.ID(), partition: d.Partition, raw: d,
	}
	c.mu.Lock()
	c.got = append(c.got, x)
	c.mu.Unlock()
	if c.on != nil {
		c.on(x)
	}
	select {
	case c.h.arrived <- struct{}{}:
	default:
	}
}

// delivery is one delivery a consumer got.
type delivery struct {
	seq       uint64 // order over every consumer of the harness
	to        string // the consumer's name
	payload   string
	key       string
	count     uint32 // delivery-count
	id        string // msg-id
	partition int
	raw       queue.Delivery
}

func (d delivery) String() string { return fmt.Sprintf("%s:%s#%d", d.to, d.payload, d.count) }

// subscribe adds consumer name to queue q with s; a consumer of the same
// name the harness had is forgotten (not closed).
func (h *harness) subscribe(q, name string, s sub) *consumer {
	h.t.Helper()
	c, err := h.trySubscribe(q, name, s)
	if err != nil {
		h.t.Fatalf("subscribe %s to %s: %v", name, q, err)
	}
	return c
}

func (h *harness) trySubscribe(q, name string, s sub) (*consumer, error) {
	c := &consumer{h: h, name: name, on: s.onDeliver}
	group := s.group
	if group == "" {
		group = "g"
	}
	// Register first: deliveries may be made before Subscribe returns.
	h.mu.Lock()
	old := h.consumers[name]
	h.consumers[name] = c
	h.mu.Unlock()
	qc, err := h.m.Subscribe(context.Background(), queue.Filter{Queue: q, Group: group, Subjects: s.subjects}, c, queue.ConsumerOptions{
		Prefetch: s.prefetch, Explicit: s.explicit, Partitions: s.partitions, Credit: s.credit, Start: s.start,
		Sharding: s.sharding, Remote: s.remote,
	})
	if err != nil {
		h.mu.Lock()
		h.consumers[name] = old
		if old == nil {
			delete(h.consumers, name)
		}
		h.mu.Unlock()
		return nil, err
	}
	c.mu.Lock()
	c.c = qc
	c.mu.Unlock()
	return c, nil
}

// close ends the subscription: what it holds goes back to its group.
func (h *harness) close(c *consumer) {
	c.mu.Lock()
	qc := c.c
	c.mu.Unlock()
	qc.Close()
}

// consumer returns the newest consumer of that name.
func (h *harness) consumer(name string) *consumer {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.consumers[name]
	if c == nil {
		h.t.Fatalf("no consumer %q", name)
	}
	return c
}

// outcome is how a consumer settles a delivery.
type outcome int

const (
	acked outcome = iota
	nacked
	rejected
	unsent   // given back by the consumer's connection before it was written
	returned // given back for want of the connection's credit
	released // $release
)

func (o outcome) String() string {
	return [...]string{"ack", "nack", "reject", "unsent", "returned", "release"}[o]
}

// settle settles d as its consumer would (PUBACK, or $ack/$nack/$reject
// for an explicit consumer).
func (h *harness) settle(d delivery, o outcome) error {
	return h.m.Settle(d.raw.Lease, [...]queue.Outcome{queue.Ack, queue.Nack, queue.Reject, queue.Unsent, queue.Returned, queue.Release}[o])
}

// mustSettle settles d and fails the test on an error.
func (h *harness) mustSettle(d delivery, o outcome) {
	h.t.Helper()
	if err := h.settle(d, o); err != nil {
		h.t.Fatalf("%s of %s: %v", o, d, err)
	}
}

// extend renews d's lease for another ack_timeout ($extend).
func (h *harness) extend(d delivery) error { return h.m.Extend(d.raw.Lease) }

// received is the PUBACK of an explicit consumer: the delivery arrived.
func (h *harness) received(d delivery) { h.m.Received(d.raw.Lease) }

// take returns the deliveries c got since the last take.
func (c *consumer) take() []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	ds := slices.Clone(c.got[c.checked:])
	c.checked = len(c.got)
	return ds
}

func (c *consumer) unchecked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got) - c.checked
}

// all returns every delivery c got.
func (c *consumer) all() []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// latest returns the newest delivery that of names: "payload", optionally
// with "#count" (that delivery of it), optionally prefixed with "consumer:"
// (to that consumer; else to any).
func (h *harness) latest(of string) delivery {
	h.t.Helper()
	name, rest, named := strings.Cut(of, ":")
	if !named {
		name, rest = "", of
	}
	w := parseWant(rest)
	var best delivery
	h.mu.Lock()
	cs := make([]*consumer, 0, len(h.consumers))
	for n, c := range h.consumers {
		if name == "" || n == name {
			cs = append(cs, c)
		}
	}
	h.mu.Unlock()
	for _, c := range cs {
		for _, d := range c.all() {
			if w.matches(d) && d.seq > best.seq {
				best = d
			}
		}
	}
	if best.seq == 0 {
		h.t.Fatalf("no delivery of %q", of)
	}
	return best
}

// expect waits until the consumers got len(want) deliveries in all since
// the last expect, then checks that they are exactly want. A want entry is
// "payload", "payload#count" or either prefixed with "consumer:" (else the
// consumer "c"); each consumer's deliveries are compared in order.
func (h *harness) expect(want ...string) []delivery {
	h.t.Helper()
	got := h.newDeliveries(len(want))
	if !matchDeliveries(got, want) {
		h.t.Fatalf("deliveries %v, want %v", got, want)
	}
	return got
}

// newDeliveries waits until the consumers got n deliveries in all since the
// last call (or waitLimit passed) and returns every one they got, in the
// order they were made.
func (h *harness) newDeliveries(n int) []delivery {
	timeout := time.NewTimer(waitLimit)
	defer timeout.Stop()
wait:
	for {
		h.mu.Lock()
		cs := make([]*consumer, 0, len(h.consumers))
		for _, c := range h.consumers {
			cs = append(cs, c)
		}
		h.mu.Unlock()
		k := 0
		for _, c := range cs {
			k += c.unchecked()
		}
		if k >= n {
			break
		}
		select {
		case <-h.arrived:
		case <-timeout.C:
			break wait
		}
	}
	var got []delivery
	h.mu.Lock()
	for _, c := range h.consumers {
		got = append(got, c.take()...)
	}
	h.mu.Unlock()
	slices.SortFunc(got, func(a, b delivery) int { return cmp.Compare(a.seq, b.seq) })
	return got
}

// wanted is a delivery as a want entry describes it: "payload" or
// "payload#count".
type wanted struct {
	payload string
	count   uint32 // 0: any
}

func parseWant(s string) wanted {
	payload, n, counted := strings.Cut(s, "#")
	w := wanted{payload: payload}
	if counted {
		c, err := strconv.ParseUint(n, 10, 32)
		if err != nil {
			panic("bad delivery count in " + s)
		}
		w.count = uint32(c)
	}
	return w
}

func (w wanted) matches(d delivery) bool {
	return w.payload == d.payload && (w.count == 0 || w.count == d.count)
}

// matchDeliveries reports whether got are the deliveries want describes
// (see expect): the same deliveries to each consumer, and the deliveries
// of one partition to one consumer in the order of want. Deliveries of
// different partitions may come in any order: nothing orders them.
func matchDeliveries(got []delivery, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	per := map[string][]wanted{}
	for _, w := range want {
		name, rest, named := strings.Cut(w, ":")
		if !named {
			name, rest = "c", w
		}
		per[name] = append(per[name], parseWant(rest))
	}
	used := map[string][]bool{}
	last := map[string]int{} // consumer/partition: index in want of its last delivery
	for _, d := range got {
		ws := per[d.to]
		if used[d.to] == nil {
			used[d.to] = make([]bool, len(ws))
		}
		i := slices.IndexFunc(ws, func(w wanted) bool { return w.matches(d) })
		for i >= 0 && used[d.to][i] {
			j := slices.IndexFunc(ws[i+1:], func(w wanted) bool { return w.matches(d) })
			if j < 0 {
				i = -1
				break
			}
			i += 1 + j
		}
		if i < 0 {
			return false
		}
		used[d.to][i] = true
		k := d.to + "/" + strconv.Itoa(d.partition)
		if prev, ok := last[k]; ok && prev > i {
			return false
		}
		last[k] = i
	}
	return true
}

// deadLetter is a message of a dead-letter queue as its consumers see it.
type deadLetter struct {
	payload string
	reason  string // dlq-reason
	id      string // original-msg-id
	topic   string // original-topic
	count   uint32 // original-delivery-count
	group   string // the group that dead-lettered it; "" for retention
}

// deadLetters waits until n messages of queue q were dead-lettered and
// returns what q's dead-letter queue holds, by partition and offset.
func (h *harness) deadLetters(q string, n int) []deadLetter {
	h.t.Helper()
	parent := h.m.Queue(q)
	if parent == nil {
		h.t.Fatalf("no queue %s", q)
	}
	deadline := time.Now().Add(waitLimit)
	for parent.Stats().DeadLettered.Load() < uint64(n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	parent.Info() // the dead-lettering that counted has released the queue
	dlq := parent.DLQ()
	var out []deadLetter
	for p := range dlq.Info().Partitions {
		msgs, err := dlq.Peek(context.Background(), p, 0, 1<<20)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, m := range msgs {
			dl := m.DeadLetter
			out = append(out, deadLetter{payload: string(m.Payload), reason: dl.Reason, id: dl.OriginalID,
				topic: dl.OriginalTopic, count: dl.Deliveries, group: dl.Group})
		}
	}
	return out
}

// expectDeadLetters checks that queue q's dead-letter queue holds exactly
// want, in order, and that nothing else was sent to it.
func (h *harness) expectDeadLetters(q string, want ...deadLetter) {
	h.t.Helper()
	got := h.deadLetters(q, len(want))
	if sent := h.deadLettersSent(q); sent != uint64(len(want)) {
		h.t.Fatalf("%d messages were sent to the dead-letter queue of %s, want %d: %+v", sent, q, len(want), got)
	}
	if !slices.Equal(got, want) {
		h.t.Fatalf("dead letters of %s:\n got %+v\nwant %+v", q, got, want)
	}
}

// deadLettersSent counts the messages sent to q's dead-letter queue,
// stored or still being stored.
func (h *harness) deadLettersSent(q string) uint64 {
	var n uint64
	for _, p := range h.m.Queue(q).DLQ().Info().Partitions {
		n += p.Next
	}
	return n
}

// depth is the number of messages queue q holds.
func (h *harness) depth(q string) uint64 {
	return h.m.Queue(q).Info().Depth()
}

// keyIn returns a key whose messages go to partition p of a queue of
// partitions partitions.
func keyIn(partitions, p int) string {
	for i := 0; ; i++ {
		k := "k" + strconv.Itoa(i)
		if queue.PartitionFor(k, partitions) == p {
			return k
		}
	}
}
