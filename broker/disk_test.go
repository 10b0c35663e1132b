package broker_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/shardq/shardq/config"
)

// Below storage.min_free_bytes (read through the fault seam: no disk is
// filled) a v5 producer gets 0x97 for QoS 1 and 2 and stays connected, a
// QoS 0 publish is dropped, a v3.1.1 producer is disconnected, a consumer
// still receives and settles, /readyz is 503 saying why; once space
// returns the node takes publishes and is ready again by itself.
func TestDiskBelowMinFreeBytesRefusesPublishesAndRecovers(t *testing.T) {
	var free atomic.Uint64
	free.Store(1 << 40)
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Storage.MinFreeBytes = 1 << 20 })
	b.SetDiskFreeForTest(func(string) (uint64, error) { return free.Load(), nil })
	addr := b.HTTPAddr()

	cons := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	cons.subscribe(1, nil, "$queue/disk")
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	if code := prod.publish("$queue/disk", []byte("before")); code != 0 {
		t.Fatalf("publish with room: 0x%02x", code)
	}

	free.Store(1000) // below the watermark; the timer notices
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	if s, body := readyzBody(addr); s != http.StatusServiceUnavailable || !strings.Contains(body, "disk below min_free_bytes") {
		t.Fatalf("/readyz below the watermark: %d %q", s, body)
	}
	if code := prod.publish("$queue/disk", []byte("refused-1")); code != 0x97 {
		t.Fatalf("QoS 1 publish below the watermark: 0x%02x, want 0x97", code)
	}
	// QoS 2: the PUBREC carries the refusal.
	id := uint16(60000)
	rec := make(chan *packets.Pubrec, 1)
	func() {
		prod.mu.Lock()
		defer prod.mu.Unlock()
		prod.recs[id] = rec
	}()
	prod.write(&packets.Publish{Topic: "$queue/disk", Payload: []byte("refused-2"), QoS: 2, PacketID: id, Properties: &packets.Properties{}})
	select {
	case r := <-rec:
		if r.ReasonCode != 0x97 {
			t.Fatalf("QoS 2 publish below the watermark: PUBREC 0x%02x, want 0x97", r.ReasonCode)
		}
		prod.write(&packets.Pubrel{PacketID: id, Properties: &packets.Properties{}})
	case <-time.After(5 * time.Second):
		t.Fatal("no PUBREC for the QoS 2 publish")
	}
	prod.write(&packets.Publish{Topic: "$queue/disk", Payload: []byte("refused-0"), QoS: 0, Properties: &packets.Properties{}})
	// No queue is auto-created for a refused publish.
	if code := prod.publish("$queue/disk-new", []byte("refused-new")); code != 0x97 {
		t.Fatalf("publish to a new queue below the watermark: 0x%02x, want 0x97", code)
	}
	if b.Manager().Queue("disk-new") != nil {
		t.Fatal("a refused publish auto-created its queue")
	}
	// Still connected: a further publish is answered.
	if code := prod.publish("$queue/disk", []byte("refused-3")); code != 0x97 {
		t.Fatalf("second QoS 1 publish: 0x%02x, want 0x97", code)
	}

	// The consumer drains: it receives what was stored and settles it.
	d := cons.next(5 * time.Second)
	if string(d.Payload) != "before" {
		t.Fatalf("delivery %q, want before", d.Payload)
	}
	cons.puback(d, 0)
	cons.none(300 * time.Millisecond)

	// A v3.1.1 producer is disconnected, as for every refused publish.
	lost := make(chan error, 1)
	v3 := dialV3(t, b.MQTTAddr(), "producer-v3", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	v3.Publish("$queue/disk", 1, false, "refused-v3")
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("v3.1.1 producer still connected after a refused publish")
	}

	// Replaying dead letters copies them: refused too.
	refused(t, b, "POST", "/api/v1/queues/disk/dlq/replay", "", "", http.StatusServiceUnavailable, "min_free_bytes")

	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "disk_full"); n < 4 {
		t.Fatalf("disk_full refusals: %v, want at least 4", n)
	}
	if v, _ := sum(scrape(t, b), "shardq_storage_free_bytes", nil); v != 1000 {
		t.Fatalf("shardq_storage_free_bytes %v, want 1000", v)
	}

	free.Store(1 << 40) // space returns
	start := time.Now()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("ready again after %s", took)
	}
	if code := prod.publish("$queue/disk", []byte("after")); code != 0 {
		t.Fatalf("publish after space returned: 0x%02x", code)
	}
	d = cons.next(5 * time.Second)
	if string(d.Payload) != "after" {
		t.Fatalf("delivery %q, want after: refused messages must not be stored", d.Payload)
	}
	cons.puback(d, 0)
}
