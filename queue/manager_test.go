package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// recorder is a Receiver that keeps its deliveries.
type recorder struct {
	mu sync.Mutex
	ds []queue.Delivery
	ch chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) Deliver(d queue.Delivery) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// wait returns once n deliveries arrived in all.
func (r *recorder) wait(t *testing.T, n int) []queue.Delivery {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		r.mu.Lock()
		if len(r.ds) >= n {
			out := append([]queue.Delivery(nil), r.ds...)
			r.mu.Unlock()
			return out
		}
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("got %d deliveries, want %d", len(r.ds), n)
		}
	}
}

func newManager(t testing.TB, store queue.LogStore, edit func(*queue.ManagerOptions)) *queue.Manager {
	t.Helper()
	o := queue.DefaultManagerOptions()
	o.Store = store
	o.Tick = 5 * time.Millisecond
	o.RetainEvery = 10 * time.Millisecond
	if edit != nil {
		edit(&o)
	}
	m, err := queue.NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func publish(t *testing.T, m *queue.Manager, q string, msg *queue.Message) error {
	t.Helper()
	done := make(chan error, 1)
	m.Publish(context.Background(), q, msg, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("publish did not complete")
		return nil
	}
}

func TestQueueStorageFailureIsReportedAndNothingDelivered(t *testing.T) {
	store := queuetest.NewMemStore(1)
	m := newManager(t, store, nil)
	if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	store.FailWrites(errors.New("disk full"))
	err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("lost")})
	if !errors.Is(err, queue.ErrStorage) {
		t.Fatalf("publish on a failing store: %v, want ErrStorage", err)
	}
	store.FailWrites(nil)
	if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	q := m.Queue("q")
	if _, err := q.Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := r.wait(t, 1)
	if string(ds[0].Message.Payload) != "ok" {
		t.Fatalf("first delivery %q", ds[0].Message.Payload)
	}
	if err := m.Settle(ds[0].Lease, queue.Ack); err != nil {
		t.Fatal(err)
	}
	ds = r.wait(t, 2)
	if string(ds[1].Message.Payload) != "after" {
		t.Fatalf("second delivery %q: the failed message must be skipped, not delivered", ds[1].Message.Payload)
	}
}

func TestQueueBacklogIsReadFromStorageAfterRestart(t *testing.T) {
	store := queuetest.NewMemStore(2)
	small := func(o *queue.ManagerOptions) { o.RingSize = 16 }
	m := newManager(t, store, small)
	const n = 2000
	for i := 0; i < n; i++ {
		if err := publish(t, m, "big", &queue.Message{Key: fmt.Sprint(i % 7), Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, store.Reopen(), small)
	r := newRecorder()
	if _, err := m2.Queue("big").Subscribe("g", r, queue.ConsumerOptions{Prefetch: 64}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for acked := 0; acked < n; acked++ {
		ds := r.wait(t, acked+1)
		d := ds[acked]
		seen[string(d.Message.Payload)] = true
		if err := m.Settle(d.Lease, queue.Ack); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != n {
		t.Fatalf("saw %d distinct messages, want %d", len(seen), n)
	}
	// Everything is settled by the only group: retention deletes it all.
	deadline := time.Now().Add(5 * time.Second)
	for {
		total := 0
		for _, s := range store.Shards() {
			for p := 0; p < 8; p++ {
				first, next, _ := s.Bounds("big", p)
				total += int(next - first)
			}
		}
		if total == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d settled messages still stored", total)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestQueuePartitionOfKeyIsFNV1a(t *testing.T) {
	// FNV-1a-64("device-42") = 0x6a6f0d1a8ba3b9c3 (computed independently).
	if got := queue.PartitionFor("", 8); got != int(0xcbf29ce484222325%8) {
		t.Fatalf("empty key partition %d", got)
	}
	counts := make([]int, 8)
	for i := 0; i < 8000; i++ {
		counts[queue.PartitionFor(fmt.Sprintf("device-%d", i), 8)]++
	}
	for p, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("partition %d got %d of 8000 keys: FNV-1a should spread them", p, c)
		}
	}
}

// A delivery written to its client long after its lease was made can
// follow the delivery of another node: one paused after it leased a
// message (SIGSTOP, a stalled VM) while another took its partition over
// and delivered the message again. With StaleAfter (a cluster), such a
// delivery is no longer live, so the client's writer gives it back
// unsent instead of writing it without DUP.
func TestQueueStaleDeliveryIsNotLive(t *testing.T) {
	var mu sync.Mutex
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	for _, tc := range []struct {
		name  string
		stale time.Duration
		late  time.Duration
		live  bool
	}{
		{"a cluster, in time", time.Second, 999 * time.Millisecond, true},
		{"a cluster, stale", time.Second, time.Second, false},
		{"a single node, however late", 0, time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, queuetest.NewMemStore(1), func(o *queue.ManagerOptions) {
				o.Clock, o.StaleAfter = clock, tc.stale
			})
			if err := publish(t, m, "q", &queue.Message{Key: "a", Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			r := newRecorder()
			if _, err := m.Queue("q").Subscribe("g", r, queue.ConsumerOptions{}); err != nil {
				t.Fatal(err)
			}
			d := r.wait(t, 1)[0]
			if got := d.Lease.At(); !got.Equal(at) {
				t.Fatalf("At() = %v, want the lease's time %v", got, at)
			}
			if !d.Lease.Live(at) {
				t.Fatal("a delivery just leased is not live")
			}
			if got := d.Lease.Live(at.Add(tc.late)); got != tc.live {
				t.Fatalf("Live %s after the lease = %t, want %t", tc.late, got, tc.live)
			}
		})
	}
}
