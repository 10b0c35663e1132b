package hooks

import (
	"net"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/shardq/shardq/queue"
)

// A panic on a client's writer goroutine stops that client and is
// reported; the process goes on.
func TestWriterPanicStopsOnlyItsClient(t *testing.T) {
	reported := make(chan any, 1)
	h := New(Options{OnPanic: func(cl *mqtt.Client, v any, stack []byte) {
		if len(stack) == 0 {
			t.Error("no stack reported")
		}
		reported <- v
	}})
	server := mqtt.New(nil)
	conn, peer := net.Pipe()
	defer peer.Close()
	cl := server.NewClient(conn, "test", "victim", false)
	cl.Properties.ProtocolVersion = 5
	c := newConn(h, cl)
	c.mu.Lock()
	// A delivery without its subscription: prepare dereferences nil.
	c.out = append(c.out, delivery{d: queue.Delivery{Message: &queue.Message{}}})
	c.signalLocked()
	c.mu.Unlock()
	select {
	case <-reported:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer's panic was not reported")
	}
	if !cl.Closed() {
		t.Error("the client whose writer panicked is not stopped")
	}
}
