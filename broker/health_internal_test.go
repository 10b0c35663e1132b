package broker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// The committers' outcomes, through the OnCommit the broker installs, make
// the node not ready while writes fail and ready again once one succeeds.
func TestHealthFollowsTheCommitters(t *testing.T) {
	store := queuetest.NewMemStore(2)
	var h health
	mo := queue.DefaultManagerOptions()
	mo.Store = store
	var observed atomic.Int64
	mo.OnCommit = func(queue.CommitStats) { observed.Add(1) } // the metrics' hook still runs
	h.watchCommits(&mo, 2)
	m, err := queue.NewManager(mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	publish := func() error {
		done := make(chan error, 1)
		m.Publish(context.Background(), "q", &queue.Message{Key: "k", Payload: []byte("x")}, func(err error) { done <- err })
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("publish did not complete")
			return nil
		}
	}
	if err := publish(); err != nil || !h.storageOK() {
		t.Fatalf("publish %v, storage ok %v", err, h.storageOK())
	}
	store.FailWrites(errors.New("device error"))
	if err := publish(); err == nil {
		t.Fatal("publish succeeded on failing storage")
	}
	if h.storageOK() {
		t.Fatal("ready while storage writes fail")
	}
	store.FailWrites(nil)
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	if !h.storageOK() {
		t.Fatal("not ready after a successful commit")
	}
	if observed.Load() == 0 {
		t.Error("the OnCommit set before was not called")
	}
}
