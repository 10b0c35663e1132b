package broker_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	mpackets "github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// readyz returns /readyz's status, or 0 when HTTP does not answer.
func readyz(addr string) int {
	s, _ := readyzBody(addr)
	return s
}

// readyzBody returns /readyz's status and body; 0 when HTTP does not answer.
func readyzBody(addr string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestReadyzIs503WhileDrainingAndHTTPStaysUp(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	addr := b.HTTPAddr()
	if s := readyz(addr); s != http.StatusOK {
		t.Fatalf("/readyz before shutdown: %d, want 200", s)
	}
	// A client that ignores the DISCONNECT keeps the drain going for the
	// grace period.
	c := dialRaw(t, b.MQTTAddr(), "stubborn", connectOpts{})
	c.subscribe(1, nil, "$queue/x")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- b.Shutdown(ctx)
	}()
	saw503 := false
	deadline := time.Now().Add(10 * time.Second)
	for !saw503 && time.Now().Before(deadline) {
		switch s, body := readyzBody(addr); s {
		case http.StatusServiceUnavailable:
			if !strings.Contains(body, "shutting down") {
				t.Fatalf("/readyz while draining says %q", body)
			}
			saw503 = true
		case 0:
			t.Fatal("HTTP stopped answering before the drain ended")
		}
	}
	if !saw503 {
		t.Fatal("/readyz never answered 503 while shutting down")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) before the stubborn client's grace period", err)
	default:
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if s := readyz(addr); s != 0 {
		t.Fatalf("/readyz after shutdown: %d, want no answer", s)
	}
}

func TestReadyzIs503WhileStorageWritesFail(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	addr := b.HTTPAddr()
	b.ObserveCommitForTest(queue.CommitStats{Shard: 0, Err: errors.New("disk says no")})
	if s, body := readyzBody(addr); s != http.StatusServiceUnavailable || !strings.Contains(body, "storage") {
		t.Fatalf("/readyz after a failed commit: %d %q, want 503 saying storage", s, body)
	}
	// A real commit succeeding makes it ready again.
	p := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if code := p.publish("$queue/h", []byte("x")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
}

// panicker panics on every publish of the client named bad.
type panicker struct {
	mqtt.HookBase
	bad string
}

func (h *panicker) ID() string { return "panicker" }

func (h *panicker) Provides(b byte) bool { return b == mqtt.OnPublish }

func (h *panicker) OnPublish(cl *mqtt.Client, pk mpackets.Packet) (mpackets.Packet, error) {
	if cl.ID == h.bad {
		panic("fault injected for " + cl.ID)
	}
	return pk, nil
}

func TestPanicInAClientsPacketClosesOnlyThatClient(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	if err := b.AddHookForTest(&panicker{bad: "bad"}); err != nil {
		t.Fatal(err)
	}
	good := dialRaw(t, b.MQTTAddr(), "good", connectOpts{})
	good.subscribe(1, nil, "$queue/jobs")
	bad := dialRaw(t, b.MQTTAddr(), "bad", connectOpts{})
	bad.publishAsync("plain/topic", []byte("boom"))
	select {
	case <-bad.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the client whose packet panicked was not closed")
	}
	waitFor(t, func() bool { return counter(t, b, "shardq_client_panics_total", "hook", "OnPublish") == 1 })

	// The node and the other client go on.
	prod := dialRaw(t, b.MQTTAddr(), "prod", connectOpts{})
	if code := prod.publish("$queue/jobs", []byte("after")); code != 0 {
		t.Fatalf("publish after the panic: 0x%02x", code)
	}
	m := good.next(5 * time.Second)
	if !bytes.Equal(m.Payload, []byte("after")) {
		t.Fatalf("got %q", m.Payload)
	}
	good.puback(m, 0)
	if s := readyz(b.HTTPAddr()); s != http.StatusOK {
		t.Fatalf("/readyz after the panic: %d", s)
	}
}
