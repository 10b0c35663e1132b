package broker_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// search finds messages through the admin API.
func search(t *testing.T, b *testBroker, path string) broker.MessageSearch {
	t.Helper()
	return get[broker.MessageSearch](t, b, "GET", path, adminToken, "", http.StatusOK)
}

func offsets(s broker.MessageSearch) []uint64 {
	var out []uint64
	for _, m := range s.Messages {
		out = append(out, m.Offset)
	}
	return out
}

// TestAdminSearchMessages finds messages by msg-id and by key: a key's
// messages in its partition, newest first up to the limit, the rest
// reached with before; in the dead-letter queue too; bad parameters
// refused.
func TestAdminSearchMessages(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		withToken(c)
		c.NodeID = "node-a"
		o := c.Queues.Defaults
		o.Partitions = 4
		c.Queues.Declared["orders"] = o
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := range 12 {
		key := fmt.Sprintf("k%d", i%4) // k0, k1, k2, k3 three times each
		if code := prod.publish("$queue/orders", fmt.Appendf(nil, "m%d", i), "key", key, "n", fmt.Sprint(i)); code != 0 {
			t.Fatalf("publish %d: 0x%02x", i, code)
		}
	}
	p := queue.PartitionFor("k1", 4)

	all := search(t, b, "/api/v1/queues/orders/messages?key=k1")
	if all.Partition != p || all.Key == nil || *all.Key != "k1" || all.Truncated || all.NextBefore != "" || all.Node != "node-a" {
		t.Fatalf("key k1: %+v", all)
	}
	if got := offsets(all); len(got) != 3 || !slices.IsSorted(got) {
		t.Fatalf("key k1: offsets %v, want 3 in order", got)
	}
	for i, m := range all.Messages {
		if m.Key != "k1" || m.Partition != p || string(m.Payload) != fmt.Sprintf("m%d", 1+4*i) || m.ID != queue.MessageID(p, m.Offset) {
			t.Errorf("key k1, message %d: %+v", i, m)
		}
	}
	// The partition holds the messages of the other keys that map to it:
	// they are read, not answered.
	if all.Scanned < 3 {
		t.Errorf("scanned %d", all.Scanned)
	}

	// The newest two, then the older one from where they stopped.
	newest := search(t, b, "/api/v1/queues/orders/messages?key=k1&limit=2")
	if got := offsets(newest); !slices.Equal(got, offsets(all)[1:]) || !newest.Truncated || newest.NextBefore != queue.MessageID(p, got[0]) {
		t.Fatalf("key k1, limit 2: offsets %v, truncated %v, next_before %v; want %v", got, newest.Truncated, newest.NextBefore, offsets(all)[1:])
	}
	older := search(t, b, "/api/v1/queues/orders/messages?key=k1&limit=2&before="+newest.NextBefore)
	if got := offsets(older); !slices.Equal(got, offsets(all)[:1]) || older.Truncated {
		t.Fatalf("key k1 before %s: offsets %v, truncated %v", newest.NextBefore, got, older.Truncated)
	}
	if none := search(t, b, "/api/v1/queues/orders/messages?key=nobody"); len(none.Messages) != 0 || none.Truncated {
		t.Errorf("key nobody: %+v", none)
	}

	// By msg-id.
	want := all.Messages[1]
	byID := search(t, b, "/api/v1/queues/orders/messages?id="+want.ID)
	if len(byID.Messages) != 1 || byID.ID != want.ID || byID.Messages[0].ID != want.ID || string(byID.Messages[0].Payload) != string(want.Payload) ||
		len(byID.Messages[0].UserProperties) != 1 || byID.Messages[0].UserProperties[0].Value != "5" {
		t.Fatalf("id %s: %+v", want.ID, byID)
	}
	refused(t, b, "GET", fmt.Sprintf("/api/v1/queues/orders/messages?id=%d-99", p), adminToken, "", http.StatusNotFound, fmt.Sprintf("no message %d-99 in orders", p))
	refused(t, b, "GET", "/api/v1/queues/orders/messages?id=4-0", adminToken, "", http.StatusNotFound, "orders has 4 partitions")
	for _, bad := range []struct{ query, word string }{
		{"id=abc", "PARTITION-OFFSET"},
		{"id=-1-2", "PARTITION-OFFSET"},
		{"id=", "PARTITION-OFFSET"},
		{"key=k1&id=1-0", "not both"},
		{"key=k1&partition=1", "for a peek"},
		{"id=1-0&limit=5", "go with key"},
		{"key=k1&limit=0", "limit"},
		{"key=k1&limit=10001", "limit"},
		{"key=k1&before=x", "before"},
		{fmt.Sprintf("key=k1&before=%d-1", (p+1)%4), "the key's"},
		{"before=3", "before goes with key"},
	} {
		refused(t, b, "GET", "/api/v1/queues/orders/messages?"+bad.query, adminToken, "", http.StatusBadRequest, bad.word)
	}
	refused(t, b, "GET", "/api/v1/queues/nope/messages?key=k1", adminToken, "", http.StatusNotFound, "no such queue")
	refused(t, b, "GET", "/api/v1/queues/orders/messages?key=k1", "", "", http.StatusUnauthorized, "bearer")
	// Without key or id, still a peek.
	if peek := get[broker.MessageList](t, b, "GET", "/api/v1/queues/orders/messages?limit=100", adminToken, "", http.StatusOK); len(peek.Messages) != 12 {
		t.Errorf("peek: %d messages", len(peek.Messages))
	}

	// A dead letter keeps its key, and its partition: found there.
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/billing/$queue/orders")
	for range 12 {
		m := cons.next(5 * time.Second)
		code := byte(0)
		if userProp(m, "n") == "9" { // the last of k1
			code = 0x87 // rejected: dead-lettered
		}
		cons.puback(m, code)
	}
	waitFor(t, func() bool { v := show(t, b, "orders"); return v.DLQ != nil && v.DLQ.Depth == 1 })
	dead := search(t, b, "/api/v1/queues/orders/dlq/messages?key=k1")
	if len(dead.Messages) != 1 || dead.Queue != "orders/$dlq" || dead.Messages[0].DeadLetter == nil || dead.Messages[0].DeadLetter.OriginalID != all.Messages[2].ID {
		t.Fatalf("dead letters of k1: %+v", dead)
	}
	if again := search(t, b, "/api/v1/queues/orders/dlq/messages?id="+dead.Messages[0].ID); len(again.Messages) != 1 {
		t.Errorf("dead letter by id: %+v", again)
	}
	// Acked by the only group, the oldest of k1 is deleted: its msg-id
	// finds nothing, not the message retained after it (held, unacked).
	if code := prod.publish("$queue/orders", []byte("m12"), "key", "k1"); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	cons.next(5 * time.Second)
	waitFor(t, func() bool { return show(t, b, "orders").Partitions[p].First > all.Messages[0].Offset })
	refused(t, b, "GET", "/api/v1/queues/orders/messages?id="+all.Messages[0].ID, adminToken, "", http.StatusNotFound, "no message "+all.Messages[0].ID)
}

// TestAdminSearchPages: a key search reads its partition a page at a time,
// newest first: across pages, with gaps of other keys between its
// messages, each message is found once, and going on with next_before
// finds the rest and no other.
func TestAdminSearchPages(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		withToken(c)
		o := c.Queues.Defaults
		o.Partitions = 1
		o.Durability = queue.DurabilityAsync // 2500 publishes, quickly
		c.Queues.Declared["events"] = o
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	var wantOffsets []uint64
	var acks []chan *packets.Puback
	for i := range 2500 {
		key := "other"
		if i%97 == 0 || i == 999 || i == 1000 {
			key = "needle"
			wantOffsets = append(wantOffsets, uint64(i))
		}
		acks = append(acks, prod.publishAsync("$queue/events", fmt.Appendf(nil, "e%d", i), "key", key))
	}
	for i, ch := range acks {
		if a := prod.waitAck(ch); a.ReasonCode != 0 {
			t.Fatalf("publish %d: 0x%02x", i, a.ReasonCode)
		}
	}

	all := search(t, b, "/api/v1/queues/events/messages?key=needle")
	if got := offsets(all); !slices.Equal(got, wantOffsets) || all.Truncated || all.Scanned != 2500 {
		t.Fatalf("needle: offsets %v, truncated %v, scanned %d; want %v, false, 2500", got, all.Truncated, all.Scanned, wantOffsets)
	}
	// Five at a time, newest first, back to the oldest.
	var paged []uint64
	path := "/api/v1/queues/events/messages?key=needle&limit=5"
	for range 10 {
		s := search(t, b, path)
		paged = append(offsets(s), paged...)
		if !s.Truncated {
			break
		}
		path = "/api/v1/queues/events/messages?key=needle&limit=5&before=" + s.NextBefore
	}
	if !slices.Equal(paged, wantOffsets) {
		t.Errorf("five at a time: %v, want %v", paged, wantOffsets)
	}
}

// TestClusterAdminSearch: in a cluster, any node finds a message by key
// or msg-id, asking the node that serves its partition; a publish over the
// admin API of one node goes to its partition's owner on another and
// answers its msg-id. With the owner down, a search of its partition is a
// 503 naming it.
func TestClusterAdminSearch(t *testing.T) {
	const token = "cluster-token"
	a, b := twoNodes(t, token)
	var st broker.ClusterView
	owners := map[int]string{}
	waitUntil(t, "every partition of jobs owned", func() bool {
		call(t, a, "PUT", "/api/v1/queues/jobs", token, `{"partitions": 8}`)
		getJSON(t, a, token, "/api/v1/cluster", &st)
		for _, p := range st.Partitions {
			if p.Queue == "jobs" && p.Owner != "" {
				owners[p.Partition] = p.Owner
			}
		}
		return len(owners) == 8
	})
	// A key of a partition node-b serves, asked of node-a.
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); owners[queue.PartitionFor(k, 8)] == "node-b" {
			key = k
		}
	}
	var ids []string
	for i := range 3 {
		pub := get[broker.Published](t, a, "POST", "/api/v1/queues/jobs/messages", token, fmt.Sprintf(`{"key": %q, "payload": "m%d"}`, key, i), http.StatusCreated)
		if pub.Partition != queue.PartitionFor(key, 8) || pub.ID == "" {
			t.Fatalf("published through node-a: %+v", pub)
		}
		ids = append(ids, pub.ID)
	}
	found := get[broker.MessageSearch](t, a, "GET", "/api/v1/queues/jobs/messages?key="+key, token, "", http.StatusOK)
	if found.Node != "node-b" || len(found.Messages) != 3 || found.Messages[2].ID != ids[2] || string(found.Messages[0].Payload) != "m0" {
		t.Fatalf("key %s from node-a: %+v", key, found)
	}
	byID := get[broker.MessageSearch](t, a, "GET", "/api/v1/queues/jobs/messages?id="+ids[1], token, "", http.StatusOK)
	if len(byID.Messages) != 1 || string(byID.Messages[0].Payload) != "m1" {
		t.Fatalf("id %s from node-a: %+v", ids[1], byID)
	}
	p := queue.PartitionFor(key, 8)
	refused(t, a, "GET", fmt.Sprintf("/api/v1/queues/jobs/messages?id=%d-99", p), token, "", http.StatusNotFound, fmt.Sprintf("no message %d-99", p))

	// node-b stops without handing anything over: its partitions have no
	// node serving them.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = b.Shutdown(ctx)
	waitUntil(t, "node-b down", func() bool {
		getJSON(t, a, token, "/api/v1/cluster", &st)
		return len(st.Nodes) == 2 && st.Nodes[1].State == cluster.StateDown
	})
	refused(t, a, "GET", "/api/v1/queues/jobs/messages?key="+key, token, "", http.StatusServiceUnavailable, fmt.Sprintf("jobs/%d (owner node-b)", p))
}
