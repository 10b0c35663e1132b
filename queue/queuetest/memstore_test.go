package queuetest_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

func TestStoreMemSuite(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*queuetest.MemStore{}
	queuetest.RunStoreSuite(t, func(t *testing.T, dir string) queue.Store {
		mu.Lock()
		defer mu.Unlock()
		st, ok := stores[dir]
		if !ok {
			st = queuetest.NewMemStore(3)
		} else {
			st = st.Reopen()
		}
		stores[dir] = st
		return st
	})
}

func TestStoreMemFailNextWrites(t *testing.T) {
	st := queuetest.NewMemStore(2)
	boom := errors.New("boom")
	st.FailNextWrites(2, boom)
	b := &queue.Batch{Appends: []queue.Append{{Queue: "q", Message: &queue.Message{Offset: 0}}}}
	s0, s1 := st.Shards()[0], st.Shards()[1]
	if err := s0.Write(b, true); !errors.Is(err, boom) {
		t.Fatalf("first Write = %v, want %v", err, boom)
	}
	if err := s1.Sync(); !errors.Is(err, boom) {
		t.Fatalf("Sync = %v, want %v", err, boom)
	}
	if err := s0.Write(b, true); err != nil {
		t.Fatalf("third Write = %v, want success", err)
	}
	if got, want := st.Stats(), (queuetest.MemStats{Writes: 1, SyncWrites: 1, Failed: 2}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s0.Write(b, false); !errors.Is(err, queuetest.ErrClosed) {
		t.Fatalf("Write after Close = %v, want %v", err, queuetest.ErrClosed)
	}
	if _, _, err := st.Reopen().Shards()[0].Bounds("q", 0); err != nil {
		t.Fatal(err)
	}
}
