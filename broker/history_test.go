package broker_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
)

// GET /api/v1/queues/{q}/history: a sample of the queue's figures every
// 5 s for an hour, with the rates between samples; a queue's view carries
// the rates of the last interval. An idle queue keeps one sample.
func TestQueueHistory(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	p := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if code := p.publish("$queue/jobs", []byte("first")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	now := time.Now()
	b.SampleHistoryForTest(now.Add(-15 * time.Second))
	b.SampleHistoryForTest(now.Add(-10 * time.Second)) // nothing moved: the same sample, seen later
	for range 20 {
		if code := p.publish("$queue/jobs", []byte("m")); code != 0 {
			t.Fatalf("publish: 0x%02x", code)
		}
	}
	b.SampleHistoryForTest(now)

	h := get[broker.History](t, b, http.MethodGet, "/api/v1/queues/jobs/history", "", "", http.StatusOK)
	if h.Queue != "jobs" || h.Interval != 5 || len(h.Samples) != 2 {
		t.Fatalf("history: %+v; want jobs, every 5 s, 2 samples (the idle run is one)", h)
	}
	first, last := h.Samples[0], h.Samples[1]
	if first.Enqueued != 1 || first.Depth != 1 || !first.Until.Equal(now.Add(-10*time.Second).UTC()) {
		t.Errorf("first sample %+v: want 1 enqueued, depth 1, seen until 10 s ago", first)
	}
	if last.Enqueued != 21 || last.Depth != 21 || last.RatesView.Enqueued != 2 {
		t.Errorf("last sample %+v: want 21 enqueued, depth 21, 2 per second (20 in the 10 s since the first was last seen)", last)
	}
	v := get[broker.QueueView](t, b, http.MethodGet, "/api/v1/queues/jobs", "", "", http.StatusOK)
	if v.Rates.Enqueued != 2 || v.Rates.Acked != 0 {
		t.Errorf("the queue's rates %+v, want 2 enqueued per second, none acked", v.Rates)
	}
	get[broker.History](t, b, http.MethodGet, "/api/v1/queues/nope/history", "", "", http.StatusNotFound)
}
