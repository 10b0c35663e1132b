package cluster

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// The origin index: a publish taken once is stored once; a failed one may
// be taken again; a stored origin is remembered for originWindow.
func TestOrigins(t *testing.T) {
	var now int64
	x := newOrigins()
	x.now = func() int64 { return now }
	a, b := queue.Origin{Run: 1, Seq: 1}, queue.Origin{Run: 1, Seq: 2}
	if s := x.begin(a); s != originNone {
		t.Fatalf("first begin of a: %v", s)
	}
	if s := x.begin(a); s != originPending {
		t.Fatalf("a again while it is stored: %v, want pending", s)
	}
	x.end(a, true)
	if s := x.begin(a); s != originStored {
		t.Fatalf("a again after it was stored: %v, want stored", s)
	}
	x.begin(b)
	x.end(b, false)
	if s := x.begin(b); s != originNone {
		t.Fatalf("b again after it failed: %v, want none (taken again)", s)
	}
	// Applied from another leader's entry.
	c := queue.Origin{Run: 2, Seq: 7}
	x.stored(c)
	if s := x.begin(c); s != originStored {
		t.Fatalf("c, applied here: %v, want stored", s)
	}
	now += int64(originWindow + time.Second)
	x.stored(queue.Origin{Run: 3, Seq: 1}) // expires what is older
	if s := x.begin(a); s != originNone {
		t.Fatalf("a past the window: %v, want forgotten", s)
	}
	if len(x.state) != 2 || len(x.order) != 2 {
		t.Fatalf("after expiry: %d origins, %d in order; want 2 (the new one and a again)", len(x.state), len(x.order))
	}
}
