package broker_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
)

// TestSubjectFilter (SPEC 12, subject filters): a group subscribed to
// $queue/orders/eu/# gets exactly the messages published under
// $queue/orders/eu/, on their own topics; another group gets them all;
// the others are counted as filtered for the first group. A
// subscription with another filter to the same group gets SUBACK 0x8F
// saying the group's filter.
func TestSubjectFilter(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	eu := dialRaw(t, b.MQTTAddr(), "eu", connectOpts{})
	if codes := eu.subscribe(1, nil, "$share/eu/$queue/orders/eu/#"); len(codes) != 1 || codes[0] != 1 {
		t.Fatalf("SUBACK of a subject filter: %v", codes)
	}
	all := dialRaw(t, b.MQTTAddr(), "all", connectOpts{})
	all.subscribe(1, nil, "$share/all/$queue/orders")
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	topics := []string{"$queue/orders/eu/de", "$queue/orders/us/ny", "$queue/orders/eu/fr/paris", "$queue/orders", "$queue/orders/europe"}
	for _, topic := range topics {
		if code := prod.publish(topic, []byte(topic)); code != 0 {
			t.Fatalf("publish to %s: %#x", topic, code)
		}
	}
	got := map[string]bool{}
	for range 2 {
		p := eu.next(5 * time.Second)
		if string(p.Payload) != p.Topic {
			t.Errorf("%q delivered on topic %s, not its own", p.Payload, p.Topic)
		}
		got[p.Topic] = true
		eu.puback(p, 0)
	}
	if !got["$queue/orders/eu/de"] || !got["$queue/orders/eu/fr/paris"] {
		t.Fatalf("eu/# got %v", got)
	}
	for range topics {
		all.puback(all.next(5*time.Second), 0)
	}
	// Everything is settled for eu: delivered, or left out.
	waitFor(t, func() bool {
		g, _ := groupOf(show(t, b, "orders"), "eu")
		return g.Lag == 0 && g.Filtered == 3
	})
	if g, _ := groupOf(show(t, b, "orders"), "eu"); g.Filter != "eu/#" {
		t.Fatalf("group eu shows filter %q", g.Filter)
	}
	eu.none(100 * time.Millisecond)

	other := dialRaw(t, b.MQTTAddr(), "other", connectOpts{})
	sa := other.subscribeAck(1, nil, "$share/eu/$queue/orders/us/#")
	if len(sa.Reasons) != 1 || sa.Reasons[0] != 0x8F || !strings.Contains(sa.Properties.ReasonString, "takes subjects eu/#") {
		t.Fatalf("another filter for group eu: SUBACK %v %q, want 0x8F saying the group takes eu/#", sa.Reasons, sa.Properties.ReasonString)
	}
}

// TestAdminRetained: GET /api/v1/retained lists the retained messages,
// sorted by topic, those under a prefix, at most the limit; a cleared
// topic is gone from it.
func TestAdminRetained(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	publishRetained(c, "sensors/b/temp", []byte("21.5"))
	publishRetained(c, "sensors/a/temp", []byte("19.0"))
	publishRetained(c, "other/x", []byte("x"))
	l := get[broker.RetainedList](t, b, "GET", "/api/v1/retained?prefix=sensors/", adminToken, "", http.StatusOK)
	if l.Total != 2 || len(l.Messages) != 2 || l.Messages[0].Topic != "sensors/a/temp" || string(l.Messages[0].Payload) != "19.0" ||
		l.Messages[1].Topic != "sensors/b/temp" || l.Messages[0].QoS != 1 || l.Messages[0].RetainedAt == nil {
		t.Fatalf("retained under sensors/: %+v", l)
	}
	if l := get[broker.RetainedList](t, b, "GET", "/api/v1/retained?limit=1", adminToken, "", http.StatusOK); l.Total != 3 || len(l.Messages) != 1 || l.Messages[0].Topic != "other/x" {
		t.Fatalf("retained, limit 1: %+v", l)
	}
	publishRetained(c, "other/x", nil) // clears it
	waitFor(t, func() bool {
		return get[broker.RetainedList](t, b, "GET", "/api/v1/retained", adminToken, "", http.StatusOK).Total == 2
	})
	refused(t, b, "GET", "/api/v1/retained?limit=0", adminToken, "", http.StatusBadRequest, "from 1 to 10000")
	refused(t, b, "GET", "/api/v1/retained", "", "", http.StatusUnauthorized, "bearer token")
}
