package broker_test

import (
	"testing"
	"time"
)

func TestBrokerShutdownIsBoundedWhenClientsIgnoreDisconnect(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	c := dialRaw(t, b.MQTTAddr(), "stubborn", connectOpts{}) // reads but never closes
	c.subscribe(1, nil, "$queue/x")
	start := time.Now()
	b.stop(t)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Shutdown took %s with a client that ignores DISCONNECT", d)
	}
}
