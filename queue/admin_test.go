package queue_test

import (
	"context"
	"errors"
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
	done, err := q.ReplayDLQ(context.Background(), []string{bID})
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
	done, err := q.ReplayDLQ(context.Background(), nil)
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
	if again, err := q.ReplayDLQ(context.Background(), nil); err != nil || len(again) != 0 {
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
	n, err := q.Purge(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("purge: %d, %v; want 3", n, err)
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
	o.Partitions = 9
	if _, _, err := m.Declare(context.Background(), "q", o); !errors.Is(err, queue.ErrPartitionsChanged) {
		t.Fatalf("changing partitions: %v, want ErrPartitionsChanged", err)
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
	for _, sh := range store.Reopen().Shards() {
		for _, name := range []string{"q", queue.DLQName("q")} {
			for p := range queue.DefaultOptions().Partitions {
				msgs, err := sh.Read(name, p, 0, 1<<20, 10)
				if err != nil || len(msgs) != 0 {
					t.Fatalf("%s/%d holds %d messages after the delete (%v)", name, p, len(msgs), err)
				}
				gs, _ := sh.Groups(name, p)
				ds, _ := sh.Dedups(name, p)
				if len(gs) != 0 || len(ds) != 0 {
					t.Fatalf("%s/%d keeps %d groups, %d dedup-ids", name, p, len(gs), len(ds))
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
