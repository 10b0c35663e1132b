package badger

import (
	"errors"
	"sync"
	"testing"

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
