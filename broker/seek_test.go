package broker_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
)

// TestAdminSeekGroup (SPEC 12, seek): a group moved to earliest gets again
// what it acked, counted from one; moved to a time between two batches it
// gets exactly the later one; moved to a partition's offset, what follows
// it. Refused while the group has a consumer unless forced; bad points
// are refused saying what a point is.
func TestAdminSeekGroup(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	get[broker.QueueView](t, b, "PUT", "/api/v1/queues/work", adminToken, `{"partitions": 1}`, http.StatusCreated)
	// audit reads nothing: what g acks stays retained for it.
	audit := dialRaw(t, b.MQTTAddr(), "audit", connectOpts{})
	audit.subscribe(1, nil, "$share/audit/$queue/work")
	audit.close()
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	publish := func(batch string) {
		for i := range 4 {
			if code := prod.publish("$queue/work", []byte(batch+strconv.Itoa(i))); code != 0 {
				t.Fatalf("publish: %#x", code)
			}
		}
	}
	read := func(want ...string) {
		t.Helper()
		c := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
		c.subscribe(1, nil, "$share/g/$queue/work")
		for _, w := range want {
			p := c.next(5 * time.Second)
			if string(p.Payload) != w || p.Duplicate {
				t.Fatalf("got %q (dup %v), want %q, a first delivery", p.Payload, p.Duplicate, w)
			}
			c.puback(p, 0)
		}
		c.close()
		waitFor(t, func() bool { g, _ := groupOf(show(t, b, "work"), "g"); return g.Consumers == 0 })
	}
	publish("one-")
	// Enqueue times are kept to the millisecond: between is a millisecond
	// after the first batch's, and the second batch's come after it.
	between := time.Now().Add(2 * time.Millisecond).Truncate(time.Millisecond)
	for time.Now().Before(between.Add(time.Millisecond)) {
		time.Sleep(100 * time.Microsecond)
	}
	publish("two-")
	read("one-0", "one-1", "one-2", "one-3", "two-0", "two-1", "two-2", "two-3")

	seek := "/api/v1/queues/work/groups/g/seek"
	res := get[broker.SeekResult](t, b, "POST", seek, adminToken, `{"to": "earliest"}`, http.StatusOK)
	if len(res.Partitions) != 1 || res.Partitions[0].From != 8 || res.Partitions[0].To != 0 {
		t.Fatalf("seek to earliest: %+v", res)
	}
	read("one-0", "one-1", "one-2", "one-3", "two-0", "two-1", "two-2", "two-3")
	get[broker.SeekResult](t, b, "POST", seek, adminToken, `{"to": "`+between.Format(time.RFC3339Nano)+`"}`, http.StatusOK)
	read("two-0", "two-1", "two-2", "two-3")
	get[broker.SeekResult](t, b, "POST", seek, adminToken, `{"to": {"partition": 0, "offset": 6}}`, http.StatusOK)
	read("two-2", "two-3")

	c := dialRaw(t, b.MQTTAddr(), "busy", connectOpts{})
	c.subscribe(1, nil, "$share/g/$queue/work")
	refused(t, b, "POST", seek, adminToken, `{"to": "earliest"}`, http.StatusConflict, "force")
	get[broker.SeekResult](t, b, "POST", seek, adminToken, `{"to": "latest", "force": true}`, http.StatusOK)
	publish("three-")
	if p := c.next(5 * time.Second); string(p.Payload) != "three-0" {
		t.Fatalf("after a forced seek to latest the consumer got %q, want three-0", p.Payload)
	}
	for _, bad := range []struct{ body, word string }{
		{`{"to": "yesterday"}`, "RFC 3339"},
		{`{"to": {"partition": 0}}`, `{"partition": P, "offset": O}`},
		{`{}`, `"to" is missing`},
		{`{"to": {"partition": 3, "offset": 0}, "force": true}`, "partitions 0 to 0"},
	} {
		refused(t, b, "POST", seek, adminToken, bad.body, http.StatusBadRequest, bad.word)
	}
	refused(t, b, "POST", "/api/v1/queues/work/groups/nope/seek", adminToken, `{"to": "earliest"}`, http.StatusNotFound, "no such consumer group")
	refused(t, b, "POST", seek, "", `{"to": "earliest"}`, http.StatusUnauthorized, "bearer token")
}

// TestRetentionTime (SPEC 12): a queue with retention time keeps what its
// groups acked, across a restart, while a queue with the default deletes
// it: a group made later reads all of it.
func TestRetentionTime(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	get[broker.QueueView](t, b, "PUT", "/api/v1/queues/events", adminToken, `{"retention": "time", "max_age": "24h", "partitions": 2}`, http.StatusCreated)
	get[broker.QueueView](t, b, "PUT", "/api/v1/queues/plain", adminToken, `{"partitions": 2}`, http.StatusCreated)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for _, q := range []string{"events", "plain"} {
		for i := range 6 {
			if code := prod.publish("$queue/"+q, []byte("e"+strconv.Itoa(i))); code != 0 {
				t.Fatalf("publish: %#x", code)
			}
		}
	}
	prod.close()
	readAll := func(b *testBroker, q, group string) map[string]bool {
		t.Helper()
		c := dialRaw(t, b.MQTTAddr(), q+"-"+group, connectOpts{})
		c.subscribe(1, nil, "$share/"+group+"/$queue/"+q)
		got := map[string]bool{}
		for range 6 {
			p := c.next(5 * time.Second)
			got[string(p.Payload)] = true
			c.puback(p, 0)
		}
		c.close()
		return got
	}
	for _, q := range []string{"events", "plain"} {
		if got := readAll(b, q, "live"); len(got) != 6 {
			t.Fatalf("live read %v of %s", got, q)
		}
	}
	// Retention has run once plain, acked by its only group, is empty.
	waitFor(t, func() bool { return show(t, b, "plain").Depth == 0 })
	if v := show(t, b, "events"); v.Depth != 6 {
		t.Fatalf("events holds %d messages after retention ran, want the 6 acked ones kept", v.Depth)
	}
	dir := b.dir
	b.stop(t)
	b2 := startBroker(t, dir, withToken)
	if v := show(t, b2, "events"); v.Depth != 6 || v.Settings.Retention != "time" {
		t.Fatalf("after a restart events holds %d messages with retention %q, want 6 with time", v.Depth, v.Settings.Retention)
	}
	if got := readAll(b2, "events", "replay"); len(got) != 6 {
		t.Fatalf("a group made later read %v, want all 6", got)
	}
}
