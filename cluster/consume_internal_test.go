package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// A delivery carried to a consumer on another node turns stale there
// counting from when its owner leased it, not from when its stream took
// it: an owner paused in between (SIGSTOP) while another node took the
// partition over must not have its delivery written after the new
// owner's, without DUP.
func TestStreamStampsDeliveriesWithTheirLease(t *testing.T) {
	leased := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) // long ago: the owner was paused since
	o := queue.DefaultManagerOptions()
	o.Store = queuetest.NewMemStore(1)
	o.Clock = func() time.Time { return leased }
	m, err := queue.NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	done := make(chan error, 1)
	m.Publish(context.Background(), "q", &queue.Message{Key: "a", Payload: []byte("x")}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sr := &streamReceiver{wake: make(chan struct{}, 1)}
	if _, err := m.Queue("q").Subscribe("g", sr, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sr.wake:
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}
	ds := sr.take()
	if len(ds) != 1 {
		t.Fatalf("%d deliveries, want 1", len(ds))
	}
	if got := time.Unix(0, ds[0].at); !got.Equal(leased) {
		t.Fatalf("stamped %v, want the lease's time %v", got.UTC(), leased)
	}
}
