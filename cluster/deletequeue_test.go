package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQueueDeleteAcrossNodes: a queue deleted through one node is gone
// from every node (404), its figures added up in the answer; the node
// that was down during the deletion is named as pending, and forgets the
// queue as it starts rather than bring it back. Publishes then create
// the queue anew, empty: a group reading it through the node that was
// down, once it leads some of its partitions, gets only what was
// published after.
func TestQueueDeleteAcrossNodes(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, "queues:\n  defaults:\n    partitions: 4\n"))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	p := dial(t, c.nodes["a"].mqtt, "p-old", 0)
	for i := range 20 {
		if code, err := p.publish("$queue/gone", fmt.Sprintf("k%d", i%5), []byte(fmt.Sprintf("old-%d", i))); err != nil || code != 0 {
			t.Fatalf("publish %d: 0x%02x %v", i, code, err)
		}
	}
	c.waitPlaced("gone", 4, []string{"a", "b", "c"}, nil, 60*time.Second)

	c.nodes["c"].kill()
	for c.member("c") {
		time.Sleep(100 * time.Millisecond)
	}
	c.waitFigures("gone", 30*time.Second, func(f queueFigures) bool { return f.Depth == 20 }, "b")
	status, body := c.call("b", http.MethodDelete, "/api/v1/queues/gone", "")
	if status != http.StatusOK {
		t.Fatalf("DELETE through b: HTTP %d %s", status, body)
	}
	var deleted struct {
		Messages uint64   `json:"messages"`
		Pending  []string `json:"pending"`
	}
	if err := json.Unmarshal(body, &deleted); err != nil {
		t.Fatal(err)
	}
	if deleted.Messages != 20 || !slices.Equal(deleted.Pending, []string{"c"}) {
		t.Errorf("DELETE answered %s: want 20 messages, c pending", body)
	}
	for _, id := range []string{"a", "b"} {
		if status, body := c.call(id, http.MethodGet, "/api/v1/queues/gone", ""); status != http.StatusNotFound {
			t.Errorf("GET through %s after the delete: HTTP %d %s", id, status, body)
		}
	}

	// c forgets the deleted queue as it starts: it does not bring it back.
	c.start("c")
	for _, id := range []string{"a", "b", "c"} {
		if status, body := c.call(id, http.MethodGet, "/api/v1/queues/gone", ""); status != http.StatusNotFound {
			t.Errorf("GET through %s once c is back: HTTP %d %s", id, status, body)
		}
	}
	if tomb := c.tombstone("gone"); len(tomb.Pending) != 0 {
		t.Errorf("nodes still to forget the deleted queue once c is back: %v", tomb.Pending)
	}

	// Created again by publishes, with c up: only what is published now
	// is in it. A group reads it through c, once c leads some of the new
	// queue's partitions.
	q := dial(t, c.nodes["b"].mqtt, "p-new", 0)
	for i := range 8 {
		if code, err := q.publish("$queue/gone", fmt.Sprintf("k%d", i%5), []byte(fmt.Sprintf("new-%d", i))); err != nil || code != 0 {
			t.Fatalf("publish %d to the new queue: 0x%02x %v", i, code, err)
		}
	}
	c.waitPlaced("gone", 4, []string{"a", "b", "c"}, nil, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for !slices.ContainsFunc(mapValues(c.owners("gone")), func(o ownership) bool { return o.Owner == "c" }) {
		if time.Now().After(deadline) {
			t.Fatalf("c leads no partition of the new queue: %v", c.owners("gone"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	late := dial(t, c.nodes["c"].mqtt, "late", 64)
	late.subscribe("$share/late/$queue/gone")
	waitCount(t, 8, 30*time.Second, late)
	var got []string
	for _, m := range late.received() {
		got = append(got, string(m.Payload))
	}
	slices.Sort(got)
	got = slices.Compact(got)
	if len(got) != 8 || slices.ContainsFunc(got, func(s string) bool { return !strings.HasPrefix(s, "new-") }) {
		t.Errorf("a group of the new queue got %v, want new-0..new-7 only", got)
	}
}

// tombstone reads a deleted queue's tombstone from etcd.
func (c *testCluster) tombstone(queue string) (t struct {
	Incarnation uint64   `json:"incarnation"`
	Pending     []string `json:"pending"`
}) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/shardq/deleted/"+queue)
	if err != nil {
		c.t.Fatalf("reading the tombstone of %s: %v", queue, err)
	}
	if len(resp.Kvs) == 0 {
		c.t.Fatalf("queue %s has no tombstone", queue)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &t); err != nil {
		c.t.Fatal(err)
	}
	return t
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
