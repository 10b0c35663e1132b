package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// A session's record is written only while its node holds the client: a
// write still pending (etcd slow, a try left in doubt) when another node
// took the client is dropped, not written over that node's record.
func TestKeyWriterDropsWhatIsNoLongerWanted(t *testing.T) {
	_, cli := StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := newKeyWriter(&Node{ctx: ctx, etcd: cli, log: slog.New(slog.DiscardHandler)}, "sessions")

	var holds atomic.Bool
	holds.Store(true)
	wait := func(done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a write did not finish within 10 s")
		}
	}
	get := func(key string) string {
		t.Helper()
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	wait(w.putWhile("s/held", "mine", holds.Load))
	if got := get("s/held"); got != "mine" {
		t.Fatalf("while held: %q, want mine", got)
	}
	if _, err := cli.Put(ctx, "s/taken", "theirs"); err != nil {
		t.Fatal(err)
	}
	holds.Store(false) // another node took the client
	wait(w.putWhile("s/taken", "mine", holds.Load))
	if got := get("s/taken"); got != "theirs" {
		t.Fatalf("after another node took the client: %q, want theirs", got)
	}
	wait(w.put("s/plain", "v"))
	if got := get("s/plain"); got != "v" {
		t.Fatalf("a write without a condition: %q, want v", got)
	}
}
