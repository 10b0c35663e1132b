package queue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// deadLetters publishes payloads with one key to queue q and has group g
// reject each: they end in q's dead-letter queue, in order.
func deadLetters(t *testing.T, m *queue.Manager, q string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if err := publish(t, m, q, &queue.Message{Key: "k", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	r := newRecorder()
	c, err := m.Queue(q).Subscribe("g", r, queue.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range payloads {
		d := r.wait(t, i+1)[i]
		if err := m.Settle(d.Lease, queue.Reject); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	waitDepth(t, m.Queue(q).DLQ(), uint64(len(payloads)))
}

// waitDepth waits until the queue holds n messages (retention runs on a timer).
func waitDepth(t *testing.T, q *queue.Queue, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for q.Info().Depth() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages, want %d", q.Name(), q.Info().Depth(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func payload(d queue.Delivery) string { return string(d.Message.Payload) }

func TestAdminReplayOfAParkedDeadLetterKeepsKeyOrder(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), nil)
	deadLetters(t, m, "q", "a", "b", "c")
	q := m.Queue("q")
	dlq := q.DLQ()

	// A dead-letter consumer holds a (key k); b and c wait behind it.
	r := newRecorder()
	if _, err := dlq.Subscribe(queue.DefaultGroup, r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	a := r.wait(t, 1)[0]
	part := queue.PartitionFor("k", len(dlq.Info().Partitions))
	msgs, err := dlq.Peek(context.Background(), part, 0, 10)
	if err != nil || len(msgs) != 3 || string(msgs[1].Payload) != "b" {
		t.Fatalf("peek: %d messages, %v", len(msgs), err)
	}
	bID := queue.MessageID(part, msgs[1].Offset)
	res, err := q.ReplayDLQ(context.Background(), []string{bID})
	done := res.Letters
	if err != nil || len(done) != 1 || done[0].DLQID != bID {
		t.Fatalf("replay b: %+v, %v", done, err)
	}

	// The group that dead-lettered b gets its copy.
	g := newRecorder()
	if _, err := q.Subscribe("g", g, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := g.wait(t, 1)[0]; payload(d) != "b" || d.ID() != done[0].ID || d.Count != 1 {
		t.Fatalf("replayed delivery %q %s count %d", payload(d), d.ID(), d.Count)
	}

	// Once a is settled, c comes next: b left the line, the key is not stuck.
	if err := m.Settle(a.Lease, queue.Ack); err != nil {
		t.Fatal(err)
	}
	if d := r.wait(t, 2)[1]; payload(d) != "c" {
		t.Fatalf("after a, got %q, want c", payload(d))
	}
	r.mu.Lock()
	n := len(r.ds)
	r.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	if r.mu.Lock(); len(r.ds) != n {
		t.Errorf("delivered %q after c: b was replayed", payload(r.ds[n]))
	}
	r.mu.Unlock()
}

func TestAdminReplayTakesBackALeasedDeadLetter(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), nil)
	deadLetters(t, m, "q", "a", "b")
	q := m.Queue("q")
	r := newRecorder()
	if _, err := q.DLQ().Subscribe(queue.DefaultGroup, r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	a := r.wait(t, 1)[0]
	res, err := q.ReplayDLQ(context.Background(), nil)
	done := res.Letters
	if err != nil || len(done) != 2 {
		t.Fatalf("replay all: %+v, %v", done, err)
	}
	if err := m.Settle(a.Lease, queue.Ack); !errors.Is(err, queue.ErrNotLeased) {
		t.Fatalf("settling a replayed dead letter: %v, want ErrNotLeased", err)
	}
	waitDepth(t, q.DLQ(), 0)
	if got := q.DLQ().Stats().Snapshot().Acked; got != 0 {
		t.Errorf("dead-letter queue acked %d, want 0", got)
	}
	// Nothing left: the key passed on, nothing else is delivered.
	time.Sleep(30 * time.Millisecond)
	if r.mu.Lock(); len(r.ds) != 1 {
		t.Errorf("%d deliveries after the replay, want 1", len(r.ds))
	}
	r.mu.Unlock()
	if again, err := q.ReplayDLQ(context.Background(), nil); err != nil || len(again.Letters) != 0 {
		t.Errorf("second replay: %+v, %v", again, err)
	}
}

func TestAdminPurgeTakesBackLeasesAndFreesKeys(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(2), nil)
	for _, p := range []string{"a", "b", "c"} {
		if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	q := m.Queue("q")
	r := newRecorder()
	if _, err := q.Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	a := r.wait(t, 1)[0]
	res, err := q.Purge(context.Background())
	if err != nil || res.Messages != 3 || len(res.Partitions) != len(q.Info().Partitions) {
		t.Fatalf("purge: %+v, %v; want 3 messages from every partition", res, err)
	}
	if err := m.Settle(a.Lease, queue.Ack); !errors.Is(err, queue.ErrNotLeased) {
		t.Fatalf("settling a purged message: %v, want ErrNotLeased", err)
	}
	info := q.Info()
	g, _ := info.Group("g")
	if info.Depth() != 0 || g.Lag() != 0 || g.Leased() != 0 {
		t.Fatalf("after purge: depth %d lag %d leased %d", info.Depth(), g.Lag(), g.Leased())
	}
	if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	if d := r.wait(t, 2)[1]; payload(d) != "d" {
		t.Fatalf("after purge got %q, want d", payload(d))
	}
}

func TestAdminDeclareAwayFromKeyOrderingReleasesParkedMessages(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(1), nil)
	for _, p := range []string{"a", "b", "c"} {
		if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	q := m.Queue("q")
	r := newRecorder()
	if _, err := q.Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wait(t, 1)
	o := q.Options()
	o.Ordering = queue.OrderNone
	if _, created, err := m.Declare(context.Background(), "q", o); err != nil || created {
		t.Fatalf("declare: created %v, %v", created, err)
	}
	if ds := r.wait(t, 3); payload(ds[1]) != "b" || payload(ds[2]) != "c" {
		t.Fatalf("after the change got %q %q", payload(ds[1]), payload(ds[2]))
	}
	o.Partitions = 7
	if _, _, err := m.Declare(context.Background(), "q", o); !errors.Is(err, queue.ErrPartitionsChanged) {
		t.Fatalf("fewer partitions: %v, want ErrPartitionsChanged", err)
	}
	if q.Options().Ordering != queue.OrderNone || len(q.Info().Partitions) != 8 {
		t.Errorf("settings after the refused change: %+v", q.Options())
	}
}

func TestAdminDeleteQueueTakesGroupsDLQAndData(t *testing.T) {
	store := queuetest.NewMemStore(2)
	m := newManager(t, store, nil)
	ctx := context.Background()
	deadLetters(t, m, "q", "dead")
	for _, p := range []string{"a", "b", "c"} {
		if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte(p), DedupID: "id-" + p}); err != nil {
			t.Fatal(err)
		}
	}
	q := m.Queue("q")
	r := newRecorder()
	if _, err := q.Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	held := r.wait(t, 1)[0]

	if err := m.DeleteQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if m.Queue("q") != nil || m.Queue(queue.DLQName("q")) != nil {
		t.Fatal("queue or its dead-letter queue still listed")
	}
	if err := m.DeleteQueue(ctx, "q"); !errors.Is(err, queue.ErrNoSuchQueue) {
		t.Fatalf("second delete: %v, want ErrNoSuchQueue", err)
	}
	if err := m.Settle(held.Lease, queue.Ack); err == nil {
		t.Fatal("a lease of the deleted queue settled")
	}

	// A publish creates it anew, empty; the old consumer gets nothing and
	// the old dedup-ids are forgotten.
	if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte("new"), DedupID: "id-a"}); err != nil {
		t.Fatal(err)
	}
	nq := m.Queue("q")
	if nq == q || nq.Info().Depth() != 1 || nq.DLQ().Info().Depth() != 0 || len(nq.Info().Groups) != 0 {
		t.Fatalf("new queue: depth %d, dlq depth %d, groups %d", nq.Info().Depth(), nq.DLQ().Info().Depth(), len(nq.Info().Groups))
	}
	r2 := newRecorder()
	if _, err := nq.Subscribe("g", r2, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := r2.wait(t, 1)[0]; payload(d) != "new" {
		t.Fatalf("new queue delivered %q", payload(d))
	}
	r.mu.Lock()
	if len(r.ds) != 1 {
		t.Errorf("the deleted queue's consumer got %d deliveries, want 1", len(r.ds))
	}
	r.mu.Unlock()

	// Deleted again, nothing of it survives a restart.
	if err := m.DeleteQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, store.Reopen(), nil)
	if m2.Queue("q") != nil {
		t.Fatal("deleted queue back after a restart")
	}
	checkErased(t, store, "q")
}

// checkErased fails t if the store holds anything of queue name or of its
// dead-letter queue: messages, group states or dedup-ids.
func checkErased(t *testing.T, store *queuetest.MemStore, name string) {
	t.Helper()
	for _, sh := range store.Reopen().Shards() {
		for _, q := range []string{name, queue.DLQName(name)} {
			for p := range queue.DefaultOptions().Partitions {
				msgs, err := sh.Read(q, p, 0, 1<<20, 10)
				gs, _ := sh.Groups(q, p)
				ds, _ := sh.Dedups(q, p)
				if err != nil || len(msgs) != 0 || len(gs) != 0 || len(ds) != 0 {
					t.Fatalf("%s/%d keeps %d messages, %d groups, %d dedup-ids (%v)", q, p, len(msgs), len(gs), len(ds), err)
				}
			}
		}
	}
}

func TestAdminDeleteQueueWhilePublishing(t *testing.T) {
	m := newManager(t, queuetest.NewMemStore(2), nil)
	ctx := context.Background()
	if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var started, ended, unexpected atomic.Int64
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			started.Add(1)
			m.Publish(ctx, "q", &queue.Message{Key: strconv.Itoa(i % 7), Payload: []byte("x")}, func(err error) {
				if err != nil && !errors.Is(err, queue.ErrClosed) {
					unexpected.Add(1)
				}
				ended.Add(1)
			})
		}
	}()
	// Each delete runs while publishes are going on.
	waitStarted := func(n int64) {
		deadline := time.Now().Add(5 * time.Second)
		for started.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d publishes started", started.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	for range 5 {
		waitStarted(started.Load() + 200)
		if err := m.DeleteQueue(ctx, "q"); err != nil && !errors.Is(err, queue.ErrNoSuchQueue) {
			t.Fatal(err)
		}
	}
	close(stop)
	<-pubDone
	// Every publish ends: stored, or refused because its queue was deleted.
	deadline := time.Now().Add(5 * time.Second)
	for ended.Load() != started.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d publishes ended", ended.Load(), started.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n := unexpected.Load(); n > 0 {
		t.Fatalf("%d publishes failed otherwise than ErrClosed", n)
	}
	// The name works afterwards.
	if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte("last")}); err != nil {
		t.Fatal(err)
	}
}

// TestAdminActsOnServedPartitions: with partitions served by two managers
// over one store, as two nodes of a cluster serve theirs, each admin call
// acts on the partitions its manager serves, and a replayed dead letter
// whose partition the other serves goes there for its group only.
func TestAdminActsOnServedPartitions(t *testing.T) {
	store := queuetest.NewMemStore(1)
	opts := queue.DefaultOptions()
	opts.Partitions = 2
	opts.MaxDeliveries = 1
	manual := func(forward func(context.Context, string, *queue.Message, func(error))) func(*queue.ManagerOptions) {
		return func(o *queue.ManagerOptions) {
			o.ManualOwnership = true
			o.Declared = map[string]queue.Options{"q": opts}
			o.Forward = forward
		}
	}
	var m2 *queue.Manager
	m1 := newManager(t, store, manual(func(ctx context.Context, name string, msg *queue.Message, done func(error)) {
		m2.Publish(ctx, name, msg, done)
	}))
	ctx := context.Background()
	acquire := func(m *queue.Manager, name string, p int) {
		t.Helper()
		if _, _, err := m.Declare(ctx, "q", opts); err != nil {
			t.Fatal(err)
		}
		if err := m.Acquire(ctx, queue.PartitionID{Queue: name, Partition: p}, 1); err != nil {
			t.Fatal(err)
		}
	}
	for p := range 2 {
		acquire(m1, "q", p)
		acquire(m1, queue.DLQName("q"), p)
	}
	// Dead letters of group g in both partitions; group h has settled them.
	keys := map[int]string{}
	for i := 0; len(keys) < 2; i++ {
		k := fmt.Sprintf("k%d", i)
		keys[queue.PartitionFor(k, 2)] = k
	}
	h := newRecorder()
	if _, err := m1.Queue("q").Subscribe("h", h, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	g := newRecorder()
	cg, err := m1.Queue("q").Subscribe("g", g, queue.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		if err := publish(t, m1, "q", &queue.Message{Key: keys[p], Payload: []byte(keys[p])}); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range g.wait(t, 2) {
		if err := m1.Settle(d.Lease, queue.Reject); err != nil {
			t.Fatal(err)
		}
		if err := m1.Settle(h.wait(t, i+1)[i].Lease, queue.Ack); err != nil {
			t.Fatal(err)
		}
	}
	cg.Close()
	waitDepth(t, m1.Queue("q").DLQ(), 2)

	// Partition 1 moves to m2.
	if err := m1.Release(ctx, queue.PartitionID{Queue: "q", Partition: 1}); err != nil {
		t.Fatal(err)
	}
	m2 = newManager(t, store, manual(nil))
	acquire(m2, "q", 1)

	res, err := m1.Queue("q").ReplayDLQ(ctx, nil)
	if err != nil || len(res.Letters) != 2 || !slices.Equal(res.Partitions, []int{0, 1}) {
		t.Fatalf("replay: %+v, %v; want both dead letters, from dead-letter partitions 0 and 1", res, err)
	}
	for _, l := range res.Letters {
		if l.ID == "" {
			t.Errorf("replayed %s: the new msg-id is not known", l.DLQID)
		}
	}
	// Group g gets the copy on m2; group h, which had settled it, does not.
	g2, h2 := newRecorder(), newRecorder()
	if _, err := m2.Queue("q").Subscribe("g", g2, queue.ConsumerOptions{Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Queue("q").Subscribe("h", h2, queue.ConsumerOptions{Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if d := g2.wait(t, 1)[0]; payload(d) != keys[1] || d.Count != 1 {
		t.Fatalf("group g on m2 got %q count %d, want the replayed %q", payload(d), d.Count, keys[1])
	}

	// Each manager purges what it serves.
	for _, c := range []struct {
		m    *queue.Manager
		want []int
	}{{m1, []int{0}}, {m2, []int{1}}} {
		res, err := c.m.Queue("q").Purge(ctx)
		if err != nil || !slices.Equal(res.Partitions, c.want) || res.Messages < 1 {
			t.Errorf("purge: %+v, %v; want the replayed copy, of partitions %v", res, err, c.want)
		}
	}
	h2.mu.Lock()
	if len(h2.ds) != 0 {
		t.Errorf("group h got the replayed dead letter of group g: %q", payload(h2.ds[0]))
	}
	h2.mu.Unlock()
}

// refusingStore's partition logs stand for logs that replicate or fence
// their writes (a cluster's partitions led by another node): once refuse
// is set, they refuse every write; their local copy is under them.
type refusingStore struct {
	queue.LogStore
	refuse *atomic.Bool
}

func (s refusingStore) OpenLogs(o queue.LogOptions) (queue.Logs, error) {
	logs, err := s.LogStore.OpenLogs(o)
	return refusingLogs{Logs: logs, refuse: s.refuse}, err
}

type refusingLogs struct {
	queue.Logs
	refuse *atomic.Bool
}

func (l refusingLogs) Log(id queue.PartitionID, committed func([]*queue.Message, error)) queue.Log {
	return refusingLog{Log: l.Logs.Log(id, committed), refuse: l.refuse}
}

type refusingLog struct {
	queue.Log
	refuse *atomic.Bool
}

func (l refusingLog) Append(epoch uint64, msg *queue.Message, state *queue.Batch, sync bool, done func(error)) {
	if l.refuse.Load() {
		go done(queue.ErrNotOwned)
		return
	}
	l.Log.Append(epoch, msg, state, sync, done)
}

func (l refusingLog) Local() queue.Log { return l.Log }

// A queue forgotten here (a cluster deleting it everywhere) is erased
// from this node's local copy even though its partitions' own logs take
// no write: nothing of it, dead letters included, survives a restart.
func TestAdminForgetQueueErasesTheLocalCopy(t *testing.T) {
	store := queuetest.NewMemStore(2)
	refuse := new(atomic.Bool)
	m := newManager(t, refusingStore{LogStore: store, refuse: refuse}, nil)
	ctx := context.Background()
	deadLetters(t, m, "q", "dead")
	for _, p := range []string{"a", "b", "c"} {
		if err := publish(t, m, "q", &queue.Message{Key: "k", Payload: []byte(p), DedupID: "id-" + p}); err != nil {
			t.Fatal(err)
		}
	}
	refuse.Store(true)
	if err := m.ForgetQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if m.Queue("q") != nil || m.Queue(queue.DLQName("q")) != nil {
		t.Fatal("queue or its dead-letter queue still listed")
	}
	if err := m.ForgetQueue(ctx, "q"); !errors.Is(err, queue.ErrNoSuchQueue) {
		t.Fatalf("second forget: %v, want ErrNoSuchQueue", err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if newManager(t, store.Reopen(), nil).Queue("q") != nil {
		t.Fatal("forgotten queue back after a restart")
	}
	checkErased(t, store, "q")
}
