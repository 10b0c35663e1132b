package broker_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

const adminToken = "s3cret"

// call sends one admin API request; token "" sends none. It returns the
// status and the body, which must be JSON.
func call(t *testing.T, b *testBroker, method, path, token, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+b.HTTPAddr()+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	if !json.Valid(data) {
		t.Errorf("%s %s: body is not JSON: %s", method, path, data)
	}
	return resp.StatusCode, data
}

// get calls the API and decodes a success answer into T.
func get[T any](t *testing.T, b *testBroker, method, path, token, body string, want int) T {
	t.Helper()
	status, data := call(t, b, method, path, token, body)
	if status != want {
		t.Fatalf("%s %s: HTTP %d, want %d: %s", method, path, status, want, data)
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s %s: decoding %s: %v", method, path, data, err)
	}
	return v
}

// refused asserts an error answer: its status and a word of its message.
func refused(t *testing.T, b *testBroker, method, path, token, body string, status int, word string) {
	t.Helper()
	got, data := call(t, b, method, path, token, body)
	var e broker.Error
	if err := json.Unmarshal(data, &e); err != nil || e.Error == "" {
		t.Fatalf("%s %s: error answer %s is not {\"error\": ...}", method, path, data)
	}
	if got != status || !strings.Contains(e.Error, word) {
		t.Fatalf("%s %s: HTTP %d %q, want %d mentioning %q", method, path, got, e.Error, status, word)
	}
}

func show(t *testing.T, b *testBroker, name string) broker.QueueView {
	t.Helper()
	return get[broker.QueueView](t, b, "GET", "/api/v1/queues/"+name, adminToken, "", http.StatusOK)
}

func groupOf(v broker.QueueView, name string) (broker.GroupView, bool) {
	for _, g := range v.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return broker.GroupView{}, false
}

func withToken(c *config.Config) { c.Admin.Token = adminToken }

func TestAdminListAndShowQueues(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.NodeID = "node-a"
		o := c.Queues.Defaults
		o.Partitions = 3
		c.Queues.Declared["orders"] = o
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 10; i++ {
		prod.publish("$queue/events", []byte("e"), "key", "k"+strconv.Itoa(i))
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/billing/$queue/events")
	held := cons.next(5 * time.Second)
	for i := 0; i < 9; i++ {
		cons.puback(cons.next(5*time.Second), 0)
	}

	list := get[broker.QueueList](t, b, "GET", "/api/v1/queues", adminToken, "", http.StatusOK)
	if list.Node != "node-a" || len(list.Queues) != 2 || list.Queues[0].Name != "events" || list.Queues[1].Name != "orders" {
		t.Fatalf("list: %+v", list)
	}
	if list.Queues[0].Source != "defaults" || list.Queues[1].Source != "config" || list.Queues[1].Settings.Partitions != 3 {
		t.Errorf("sources %q %q, orders partitions %d", list.Queues[0].Source, list.Queues[1].Source, list.Queues[1].Settings.Partitions)
	}
	if list.Queues[0].Partitions != nil {
		t.Errorf("the list holds partition details")
	}

	waitFor(t, func() bool {
		g, _ := groupOf(show(t, b, "events"), "billing")
		return g.Lag == 1 && g.Leased == 1
	})
	v := show(t, b, "events")
	if v.Node != "node-a" || v.Counts.Enqueued != 10 || v.Counts.Acked != 9 || len(v.Partitions) != 8 || v.DLQ == nil || v.DLQ.Name != "events/$dlq" {
		t.Fatalf("show events: %+v", v)
	}
	g, _ := groupOf(v, "billing")
	if g.Consumers != 1 || len(g.Partitions) != 8 || g.OldestUnsettledAge <= 0 {
		t.Errorf("group billing: %+v", g)
	}
	var next uint64
	for _, p := range v.Partitions {
		next += p.Next
	}
	if next != 10 || v.Settings.AckTimeout != broker.Duration(30*time.Second) {
		t.Errorf("partitions' next offsets sum to %d, ack_timeout %v", next, v.Settings.AckTimeout)
	}
	cons.puback(held, 0)

	refused(t, b, "GET", "/api/v1/queues/nope", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "GET", "/api/v1/queues/nope/dlq", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "GET", "/api/v1/queues/bad%20name", adminToken, "", http.StatusBadRequest, "invalid queue name")
	refused(t, b, "POST", "/api/v1/queues/events", adminToken, "", http.StatusMethodNotAllowed, "not allowed")
	refused(t, b, "GET", "/api/v1/queues/events/purge", adminToken, "", http.StatusMethodNotAllowed, "not allowed")
	refused(t, b, "GET", "/api/v1/nothing", adminToken, "", http.StatusNotFound, "no such endpoint")
	// Reading never creates a queue.
	if list := get[broker.QueueList](t, b, "GET", "/api/v1/queues", adminToken, "", http.StatusOK); len(list.Queues) != 2 {
		t.Errorf("%d queues after reads of unknown ones, want 2", len(list.Queues))
	}
}

func TestAdminPeekSettlesNothing(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 5; i++ {
		prod.publish("$queue/peeked/eu", []byte("m"+strconv.Itoa(i)), "key", "k", "trace", "t"+strconv.Itoa(i))
	}
	l := get[broker.MessageList](t, b, "GET", "/api/v1/queues/peeked/messages?limit=100", adminToken, "", http.StatusOK)
	if len(l.Messages) != 5 {
		t.Fatalf("peeked %d messages, want 5", len(l.Messages))
	}
	part := queue.PartitionFor("k", 8)
	for i, m := range l.Messages {
		if string(m.Payload) != "m"+strconv.Itoa(i) || m.Topic != "$queue/peeked/eu" || m.Key != "k" ||
			m.ID != queue.MessageID(part, uint64(i)) || len(m.UserProperties) != 1 || m.UserProperties[0].Value != "t"+strconv.Itoa(i) {
			t.Errorf("message %d: %+v", i, m)
		}
	}
	from := get[broker.MessageList](t, b, "GET", "/api/v1/queues/peeked/messages?partition="+strconv.Itoa(part)+"&from=3&limit=1", adminToken, "", http.StatusOK)
	if len(from.Messages) != 1 || from.Messages[0].Offset != 3 {
		t.Errorf("peek from 3 limit 1: %+v", from.Messages)
	}
	for _, bad := range []struct{ query, word string }{
		{"partition=8", "partition"},
		{"partition=-1", "partition"},
		{"limit=0", "limit"},
		{"limit=1001", "limit"},
		{"from=2", "from needs partition"},
		{"partition=0&from=x", "from"},
	} {
		refused(t, b, "GET", "/api/v1/queues/peeked/messages?"+bad.query, adminToken, "", http.StatusBadRequest, bad.word)
	}
	refused(t, b, "GET", "/api/v1/queues/nope/messages", adminToken, "", http.StatusNotFound, "no such queue")

	// A group that subscribes afterwards gets every message as a first delivery.
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/peeked/#")
	for i := 0; i < 5; i++ {
		p := cons.next(5 * time.Second)
		if string(p.Payload) != "m"+strconv.Itoa(i) || userProp(p, "delivery-count") != "1" || p.Duplicate {
			t.Fatalf("delivery %d: %q count %s", i, p.Payload, userProp(p, "delivery-count"))
		}
		cons.puback(p, 0)
	}
}

func TestAdminPurge(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 10; i++ {
		prod.publish("$queue/trash", []byte("old"), "key", "k"+strconv.Itoa(i))
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, map[string]string{"prefetch": "1"}, "$queue/trash")
	held := cons.next(5 * time.Second)

	// Refused calls change nothing.
	refused(t, b, "POST", "/api/v1/queues/trash/purge", "", "", http.StatusUnauthorized, "missing bearer token")
	refused(t, b, "POST", "/api/v1/queues/trash/purge", "wrong", "", http.StatusUnauthorized, "wrong bearer token")
	refused(t, b, "POST", "/api/v1/queues/nope/purge", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "POST", "/api/v1/queues/trash/purge", adminToken, `{"all": true}`, http.StatusBadRequest, "unknown field")
	if v := show(t, b, "trash"); v.Depth != 10 || v.Counts.Acked != 0 {
		t.Fatalf("after refused purges: depth %d acked %d, want 10 and 0", v.Depth, v.Counts.Acked)
	}

	r := get[broker.PurgeResult](t, b, "POST", "/api/v1/queues/trash/purge", adminToken, "", http.StatusOK)
	if r.Purged != 10 || r.Queue != "trash" {
		t.Fatalf("purge: %+v, want 10 purged", r)
	}
	v := show(t, b, "trash")
	g, _ := groupOf(v, queue.DefaultGroup)
	if v.Depth != 0 || g.Lag != 0 || g.Leased != 0 {
		t.Fatalf("after purge: depth %d lag %d leased %d", v.Depth, g.Lag, g.Leased)
	}
	// The held delivery was taken back: its PUBACK settles nothing, and it
	// frees the consumer's credit for what comes next.
	cons.puback(held, 0)
	cons.none(100 * time.Millisecond)
	prod.publish("$queue/trash", []byte("new"))
	if p := cons.next(5 * time.Second); string(p.Payload) != "new" {
		t.Fatalf("after purge got %q, want new", p.Payload)
	} else {
		cons.puback(p, 0)
	}
	waitFor(t, func() bool { return show(t, b, "trash").Counts.Acked == 1 })
	cons.none(100 * time.Millisecond)

	// The purge survives a restart. (The clients leave first: the broker
	// waits for its clients to close after its DISCONNECT.)
	prod.close()
	cons.close()
	dir := b.dir
	b.stop(t)
	b2 := startBroker(t, dir, withToken)
	if g, _ := groupOf(show(t, b2, "trash"), queue.DefaultGroup); g.Lag != 0 {
		t.Errorf("after restart: lag %d, want 0", g.Lag)
	}
	l := get[broker.MessageList](t, b2, "GET", "/api/v1/queues/trash/messages?limit=100", adminToken, "", http.StatusOK)
	for _, m := range l.Messages {
		if string(m.Payload) == "old" {
			t.Errorf("after restart: purged message %s is back", m.ID)
		}
	}
}

func TestAdminDeleteGroup(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 4; i++ {
		prod.publish("$queue/work", []byte(strconv.Itoa(i)))
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/old/$queue/work")
	cons.puback(cons.next(5*time.Second), 0)

	refused(t, b, "DELETE", "/api/v1/queues/work/groups/old", adminToken, "", http.StatusConflict, "consumers connected")
	refused(t, b, "DELETE", "/api/v1/queues/work/groups/old", "", "", http.StatusUnauthorized, "bearer token")
	refused(t, b, "DELETE", "/api/v1/queues/work/groups/nope", adminToken, "", http.StatusNotFound, "no such consumer group")
	refused(t, b, "DELETE", "/api/v1/queues/nope/groups/old", adminToken, "", http.StatusNotFound, "no such queue")
	cons.close()
	waitFor(t, func() bool { g, _ := groupOf(show(t, b, "work"), "old"); return g.Consumers == 0 })
	if g, ok := groupOf(show(t, b, "work"), "old"); !ok || g.Lag != 3 {
		t.Fatalf("group old before delete: %+v", g)
	}

	get[broker.GroupDeleted](t, b, "DELETE", "/api/v1/queues/work/groups/old", adminToken, "", http.StatusOK)
	if _, ok := groupOf(show(t, b, "work"), "old"); ok {
		t.Fatal("group old still listed")
	}
	refused(t, b, "DELETE", "/api/v1/queues/work/groups/old", adminToken, "", http.StatusNotFound, "no such consumer group")

	// Gone across a restart too: a subscriber starts the group again from
	// the oldest retained message.
	prod.close()
	dir := b.dir
	b.stop(t)
	b2 := startBroker(t, dir, withToken)
	if _, ok := groupOf(show(t, b2, "work"), "old"); ok {
		t.Fatal("group old back after restart")
	}
	again := dialRaw(t, b2.MQTTAddr(), "c2", connectOpts{})
	again.subscribe(1, nil, "$share/old/$queue/work")
	for i := 0; i < 4; i++ {
		p := again.next(5 * time.Second)
		if string(p.Payload) != strconv.Itoa(i) {
			t.Fatalf("got %q, want %d", p.Payload, i)
		}
		again.puback(p, 0)
	}
}

func TestAdminReplayDeadLetters(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 6; i++ {
		prod.publish("$queue/orders/eu", []byte(strconv.Itoa(i)), "key", "k"+strconv.Itoa(i), "trace", "x")
	}
	// Group workers rejects the odd ones; group audit acks everything.
	workers := dialRaw(t, b.MQTTAddr(), "w", connectOpts{})
	workers.subscribe(1, nil, "$share/workers/$queue/orders/#")
	audit := dialRaw(t, b.MQTTAddr(), "a", connectOpts{})
	audit.subscribe(1, nil, "$share/audit/$queue/orders/#")
	for i := 0; i < 6; i++ {
		p := workers.next(5 * time.Second)
		n, _ := strconv.Atoi(string(p.Payload))
		if n%2 == 1 {
			workers.puback(p, 0x87)
		} else {
			workers.puback(p, 0)
		}
		audit.puback(audit.next(5*time.Second), 0)
	}
	waitFor(t, func() bool { return show(t, b, "orders").DLQ.Depth == 3 })
	letters := get[broker.MessageList](t, b, "GET", "/api/v1/queues/orders/dlq/messages", adminToken, "", http.StatusOK).Messages
	if len(letters) != 3 {
		t.Fatalf("%d dead letters, want 3", len(letters))
	}
	for _, l := range letters {
		if l.DeadLetter == nil || l.DeadLetter.Reason != "rejected" || l.DeadLetter.Group != "workers" || l.Topic != "$queue/orders/$dlq" {
			t.Fatalf("dead letter %+v", l)
		}
	}

	// Bad input changes nothing.
	replay := "/api/v1/queues/orders/dlq/replay"
	one := `{"ids": ["` + letters[0].ID + `"]}`
	refused(t, b, "POST", replay, "", one, http.StatusUnauthorized, "missing bearer token")
	refused(t, b, "POST", replay, "nope", one, http.StatusUnauthorized, "wrong bearer token")
	refused(t, b, "POST", replay, adminToken, `{"ids": ["`+letters[0].ID+`", "x-1"]}`, http.StatusBadRequest, "malformed msg-id")
	refused(t, b, "POST", replay, adminToken, `{"ids": ["`+letters[0].ID+`", "0-999"]}`, http.StatusNotFound, "0-999")
	refused(t, b, "POST", replay, adminToken, `{"ids": ["99-0"]}`, http.StatusNotFound, "99-0")
	refused(t, b, "POST", replay, adminToken, `{"ids": []}`, http.StatusBadRequest, "ids is empty")
	refused(t, b, "POST", replay, adminToken, `{"ids": "0-1"}`, http.StatusBadRequest, "bad JSON")
	refused(t, b, "POST", "/api/v1/queues/nope/dlq/replay", adminToken, "", http.StatusNotFound, "no such queue")
	if v := show(t, b, "orders"); v.DLQ.Depth != 3 || v.Counts.Enqueued != 6 {
		t.Fatalf("after refused replays: dlq depth %d, enqueued %d", v.DLQ.Depth, v.Counts.Enqueued)
	}
	workers.none(100 * time.Millisecond)

	// One by id: back to the group that rejected it, not to audit.
	r := get[broker.ReplayResult](t, b, "POST", replay, adminToken, one, http.StatusOK)
	if r.Replayed != 1 || len(r.Messages) != 1 || r.Messages[0].DLQID != letters[0].ID {
		t.Fatalf("replay one: %+v", r)
	}
	p := workers.next(5 * time.Second)
	if string(p.Payload) != string(letters[0].Payload) || p.Topic != "$queue/orders/eu" || userProp(p, "delivery-count") != "1" ||
		userProp(p, "msg-id") != r.Messages[0].ID || userProp(p, "trace") != "x" {
		t.Fatalf("replayed delivery %s %q msg-id %s count %s", p.Topic, p.Payload, userProp(p, "msg-id"), userProp(p, "delivery-count"))
	}
	workers.puback(p, 0)
	audit.none(200 * time.Millisecond)
	// The same id again: no longer a dead letter waiting.
	refused(t, b, "POST", replay, adminToken, one, http.StatusNotFound, letters[0].ID)

	// The rest. A dead-letter consumer holding one loses its lease.
	dlqCons := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
	dlqCons.subscribe(1, map[string]string{"prefetch": "1"}, "$queue/orders/$dlq")
	heldLetter := dlqCons.next(5 * time.Second)
	r = get[broker.ReplayResult](t, b, "POST", replay, adminToken, "", http.StatusOK)
	if r.Replayed != 2 {
		t.Fatalf("replay all: %+v, want 2", r)
	}
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		p := workers.next(5 * time.Second)
		got[string(p.Payload)] = true
		workers.puback(p, 0)
	}
	if !got[string(letters[1].Payload)] || !got[string(letters[2].Payload)] {
		t.Fatalf("replayed %v, want %q and %q", got, letters[1].Payload, letters[2].Payload)
	}
	audit.none(100 * time.Millisecond)
	dlqCons.puback(heldLetter, 0) // late: changes nothing
	waitFor(t, func() bool {
		v := show(t, b, "orders")
		g, _ := groupOf(*v.DLQ, queue.DefaultGroup)
		w, _ := groupOf(v, "workers")
		return v.DLQ.Depth == 0 && g.Lag == 0 && w.Lag == 0 && v.Counts.Acked == 6+3+3
	})
	if v := show(t, b, "orders"); v.DLQ.Counts.Acked != 0 {
		t.Errorf("dead-letter queue acked %d, want 0: the late PUBACK settles nothing", v.DLQ.Counts.Acked)
	}
	// Nothing left to replay.
	if r := get[broker.ReplayResult](t, b, "POST", replay, adminToken, "{}", http.StatusOK); r.Replayed != 0 {
		t.Errorf("second replay all: %d replayed, want 0", r.Replayed)
	}
	dlqCons.none(100 * time.Millisecond)
}

func TestAdminDeclareQueue(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Admin.Token = adminToken
		c.Queues.AutoCreate = false
	})
	put := "/api/v1/queues/billing"
	body := `{"partitions": 3, "ack_timeout": "2s", "ordering": "none"}`
	refused(t, b, "PUT", put, "", body, http.StatusUnauthorized, "missing bearer token")
	for _, bad := range []struct{ body, word string }{
		{`{"partitions": 0}`, "partitions"},
		{`{"ordering": "random"}`, "ordering"},
		{`{"ack_timeout": "soon"}`, "duration"},
		{`{"ack_timeout": 30}`, "duration"},
		{`{"acktimeout": "1s"}`, `unknown field "acktimeout": did you mean "ack_timeout"?`},
		{`not json`, "bad JSON"},
		{``, "JSON object"},
	} {
		refused(t, b, "PUT", put, adminToken, bad.body, http.StatusBadRequest, bad.word)
	}
	refused(t, b, "GET", "/api/v1/queues/billing", adminToken, "", http.StatusNotFound, "no such queue")
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if rc := prod.publish("$queue/billing", []byte("x")); rc == 0 {
		t.Fatal("publish to an undeclared queue with auto_create off succeeded")
	}

	v := get[broker.QueueView](t, b, "PUT", put, adminToken, body, http.StatusCreated)
	if v.Source != "api" || v.Settings.Partitions != 3 || v.Settings.AckTimeout != broker.Duration(2*time.Second) ||
		v.Settings.Ordering != queue.OrderNone || v.Settings.Prefetch != queue.DefaultOptions().Prefetch {
		t.Fatalf("declared: %+v", v.Settings)
	}
	if rc := prod.publish("$queue/billing", []byte("x")); rc != 0 {
		t.Fatalf("publish to the declared queue: %#x", rc)
	}

	// Changes: fewer partitions refused, the rest applied and kept.
	refused(t, b, "PUT", put, adminToken, `{"partitions": 2}`, http.StatusConflict, "can grow, not shrink")
	v = get[broker.QueueView](t, b, "PUT", put, adminToken, `{"max_deliveries": 2, "prefetch": 10}`, http.StatusOK)
	if v.Settings.MaxDeliveries != 2 || v.Settings.Prefetch != 10 || v.Settings.AckTimeout != broker.Duration(2*time.Second) {
		t.Fatalf("changed: %+v", v.Settings)
	}

	prod.close()
	dir := b.dir
	b.stop(t)
	b2 := startBroker(t, dir, func(c *config.Config) { c.Queues.AutoCreate = false })
	v = show(t, b2, "billing")
	if v.Source != "api" || v.Settings.Partitions != 3 || v.Settings.MaxDeliveries != 2 || v.Settings.Prefetch != 10 ||
		v.Settings.Ordering != queue.OrderNone || v.Depth != 1 {
		t.Fatalf("after restart: source %s settings %+v depth %d", v.Source, v.Settings, v.Depth)
	}
	// The changed settings are in force: max_deliveries 2.
	cons := dialRaw(t, b2.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/billing")
	cons.puback(cons.next(5*time.Second), 0x80)
	cons.puback(cons.next(5*time.Second), 0x80)
	waitFor(t, func() bool { return show(t, b2, "billing").DLQ.Depth == 1 })
}

func TestAdminOpenWithoutToken(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/open", []byte("x"))
	if r := get[broker.PurgeResult](t, b, "POST", "/api/v1/queues/open/purge", "", "", http.StatusOK); r.Purged != 1 {
		t.Fatalf("purge without a configured token: %+v", r)
	}
}
