package badger

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// TestStoreLogCommitsInOrderAndFencesStaleEpochs appends to one partition
// log from its owner, raises the fence as a new owner would, and checks
// that the partition hears of its appends in offset order before their
// callbacks, and that a write made under the old epoch is refused and
// leaves nothing stored.
func TestStoreLogCommitsInOrderAndFencesStaleEpochs(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(2))
	logs, err := st.OpenLogs(queue.LogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var mu sync.Mutex
	var seen []uint64 // offsets as committed reports them
	var order []string
	id := queue.PartitionID{Queue: "orders", Partition: 3}
	l := logs.Log(id, func(msgs []*queue.Message, err error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if err == nil {
				seen = append(seen, m.Offset)
			}
			order = append(order, "committed")
		}
	})
	if err := l.Fence(1); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		l.Append(1, &queue.Message{Offset: uint64(i), Payload: []byte("m")}, nil, true, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("append %d: %v", i, err)
			}
			mu.Lock()
			order = append(order, "done")
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, off := range seen {
		if off != uint64(i) {
			t.Fatalf("committed reported offset %d at position %d: not in offset order", off, i)
		}
	}
	if len(seen) != n {
		t.Fatalf("committed reported %d appends, want %d", len(seen), n)
	}
	committedBefore := 0
	for _, o := range order {
		if o == "done" {
			break
		}
		committedBefore++
	}
	if committedBefore == 0 {
		t.Fatal("a callback ran before the partition heard of its append")
	}

	if err := l.Fence(2); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	l.Append(1, &queue.Message{Offset: n, Payload: []byte("late")}, nil, true, func(err error) { errc <- err })
	var fe *queue.FencedError
	if err := <-errc; !errors.As(err, &fe) || fe.Epoch != 1 || fe.Current != 2 {
		t.Fatalf("append under epoch 1 after the fence moved to 2: %v, want a FencedError", err)
	}
	if _, next, err := l.Bounds(); err != nil || next != n {
		t.Fatalf("after the fenced append: next %d (%v), want %d", next, err, n)
	}
	if err := l.Fence(1); !errors.Is(err, queue.ErrFenced) {
		t.Fatalf("lowering the fence: %v, want ErrFenced", err)
	}
}

// TestLogsTellWhenSomethingIsUnsynced: the logs tell their owner when a
// write is committed without a sync after the last sync (the node's
// timer then syncs within its interval, and sleeps otherwise), once per
// such stretch; a synced write tells nothing.
func TestLogsTellWhenSomethingIsUnsynced(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	told := make(chan struct{}, 8)
	logs, err := st.OpenLogs(queue.LogOptions{Unsynced: func() { told <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	l := logs.Log(queue.PartitionID{Queue: "q", Partition: 0}, func([]*queue.Message, error) {})
	next := uint64(0)
	write := func(sync bool) {
		t.Helper()
		done := make(chan error, 1)
		l.Append(0, &queue.Message{Offset: next, Payload: []byte("m")}, nil, sync, func(err error) { done <- err })
		next++
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		n := 0
		for {
			select {
			case <-told:
				n++
			default:
				return n
			}
		}
	}
	write(true)
	if n := count(); n != 0 {
		t.Fatalf("a synced write told %d times, want 0", n)
	}
	write(false)
	write(false)
	if n := count(); n != 1 {
		t.Fatalf("two writes without a sync told %d times, want 1", n)
	}
	write(true) // a sync ends the stretch
	if n := count(); n != 0 {
		t.Fatalf("a synced write told %d times, want 0", n)
	}
	write(false)
	if n := count(); n != 1 {
		t.Fatalf("a write without a sync after a sync told %d times, want 1", n)
	}
}

// TestLogsLinger: a synced commit that finds writes which came while the
// last batch was written (two at least) waits for more
// (LogOptions.Linger), up to LingerBatch of them, and writes them as one
// batch with one sync. A producer that waits for each write before the
// next never makes a commit wait, nor do unsynced writes.
func TestLogsLinger(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	commits := make(chan int, 16)
	var during func() // runs in the committer right after a batch is written
	var mu sync.Mutex
	logs, err := st.OpenLogs(queue.LogOptions{Linger: time.Hour, LingerBatch: 4, OnCommit: func(s queue.CommitStats) {
		commits <- s.Requests
		mu.Lock()
		f := during
		during = nil
		mu.Unlock()
		if f != nil {
			f()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	l := logs.Log(queue.PartitionID{Queue: "q", Partition: 0}, func([]*queue.Message, error) {})
	var next atomic.Uint64
	write := func(sync bool) <-chan error {
		done := make(chan error, 1)
		l.Append(0, &queue.Message{Offset: next.Add(1) - 1, Payload: []byte("m")}, nil, sync, func(err error) { done <- err })
		return done
	}
	wait := func(dones ...<-chan error) {
		t.Helper()
		for _, d := range dones {
			select {
			case err := <-d:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a write waited for a linger it should not have")
			}
		}
	}
	expect := func(want int) {
		t.Helper()
		if got := <-commits; got != want {
			t.Fatalf("a commit wrote %d requests, want %d", got, want)
		}
	}
	// One at a time, each after the last is done: no commit waits.
	for range 3 {
		wait(write(true))
		expect(1)
	}
	// Two writes that come while a batch is written: the next commit
	// waits (an hour, here) until 4 are pending.
	var dones []<-chan error
	mu.Lock()
	during = func() { dones = append(dones, write(true), write(true)) }
	mu.Unlock()
	wait(write(true))
	expect(1)
	for range 2 {
		dones = append(dones, write(true))
	}
	wait(dones...)
	expect(4)
	// One alone is not a steady load: no wait.
	var one <-chan error
	mu.Lock()
	during = func() { one = write(true) }
	mu.Unlock()
	wait(write(true))
	expect(1)
	wait(one)
	expect(1)
	// Unsynced writes: no sync to share, no wait.
	var unsynced []<-chan error
	mu.Lock()
	during = func() { unsynced = append(unsynced, write(false), write(false)) }
	mu.Unlock()
	wait(write(true))
	expect(1)
	wait(unsynced...)
	expect(2)
}
