package broker_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

func TestAdminDeleteQueue(t *testing.T) {
	withDeclared := func(c *config.Config) {
		withToken(c)
		c.Queues.Declared = map[string]queue.Options{"decl": c.Queues.Defaults}
	}
	b := startBroker(t, t.TempDir(), withDeclared)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for _, q := range []string{"auto", "decl"} {
		for i := 0; i < 4; i++ {
			if code := prod.publish("$queue/"+q, []byte(strconv.Itoa(i)), "key", "k"); code != 0 {
				t.Fatalf("publish to %s: 0x%02x", q, code)
			}
		}
	}
	// A consumer of auto rejects the first message (a dead letter) and
	// holds the second.
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/auto")
	cons.puback(cons.next(5*time.Second), 0x87)
	cons.next(5 * time.Second)
	dlqCons := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
	dlqCons.subscribe(1, nil, "$queue/auto/$dlq")
	dlqCons.next(5 * time.Second) // the dead letter, left unsettled
	waitFor(t, func() bool { return show(t, b, "auto").DLQ.Depth == 1 })

	refused(t, b, "DELETE", "/api/v1/queues/auto", "", "", http.StatusUnauthorized, "bearer token")
	refused(t, b, "DELETE", "/api/v1/queues/nope", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "DELETE", "/api/v1/queues/b@d", adminToken, "", http.StatusBadRequest, "invalid queue name")
	res := get[broker.QueueDeleted](t, b, "DELETE", "/api/v1/queues/auto", adminToken, "", http.StatusOK)
	if res.Queue != "auto" || res.Messages != 4 || res.DeadLetters != 1 {
		t.Fatalf("delete answer %+v", res)
	}
	get[broker.QueueDeleted](t, b, "DELETE", "/api/v1/queues/decl", adminToken, "", http.StatusOK)
	refused(t, b, "GET", "/api/v1/queues/auto", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "GET", "/api/v1/queues/auto/dlq", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "DELETE", "/api/v1/queues/auto", adminToken, "", http.StatusNotFound, "no such queue")
	list := get[broker.QueueList](t, b, "GET", "/api/v1/queues", adminToken, "", http.StatusOK)
	for _, q := range list.Queues {
		if q.Name == "auto" || q.Name == "decl" {
			t.Fatalf("%s still listed", q.Name)
		}
	}

	// The consumers of the deleted queue receive nothing more, not even
	// what is published to the name afterwards: that creates a new, empty
	// queue.
	if code := prod.publish("$queue/auto", []byte("fresh")); code != 0 {
		t.Fatalf("publish after delete: 0x%02x", code)
	}
	cons.none(300 * time.Millisecond)
	dlqCons.none(10 * time.Millisecond)
	if v := show(t, b, "auto"); v.Depth != 1 || v.DLQ.Depth != 0 || len(v.Groups) != 0 {
		t.Fatalf("recreated queue: depth %d, dlq depth %d, groups %+v", v.Depth, v.DLQ.Depth, v.Groups)
	}
	fresh := dialRaw(t, b.MQTTAddr(), "c2", connectOpts{})
	fresh.subscribe(1, nil, "$queue/auto")
	if p := fresh.next(5 * time.Second); string(p.Payload) != "fresh" {
		t.Fatalf("new consumer got %q, want fresh", p.Payload)
	} else {
		fresh.puback(p, 0)
	}
	if got := get[broker.QueueDeleted](t, b, "DELETE", "/api/v1/queues/auto", adminToken, "", http.StatusOK); got.Messages != 1 {
		t.Fatalf("second delete answer %+v", got)
	}

	// After a restart: the auto-created queue stays gone, the declared one
	// is back, empty.
	for _, c := range []*rawClient{prod, cons, dlqCons, fresh} {
		c.close()
	}
	dir := b.dir
	b.stop(t)
	b2 := startBroker(t, dir, withDeclared)
	refused(t, b2, "GET", "/api/v1/queues/auto", adminToken, "", http.StatusNotFound, "no such queue")
	if v := show(t, b2, "decl"); v.Depth != 0 || v.DLQ.Depth != 0 || len(v.Groups) != 0 {
		t.Fatalf("declared queue after restart: depth %d, dlq %d, groups %d", v.Depth, v.DLQ.Depth, len(v.Groups))
	}
	c3 := dialRaw(t, b2.MQTTAddr(), "c3", connectOpts{})
	c3.subscribe(1, nil, "$queue/decl")
	c3.subscribe(1, nil, "$queue/auto/$dlq")
	c3.none(300 * time.Millisecond)
}
