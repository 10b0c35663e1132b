package broker_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// clients GETs a client list and decodes it.
func clients(t *testing.T, b *testBroker, path string) broker.ClientList {
	t.Helper()
	status, body := call(t, b, http.MethodGet, path, adminToken, "")
	var l broker.ClientList
	if status != http.StatusOK || json.Unmarshal(body, &l) != nil {
		t.Fatalf("GET %s: HTTP %d %s", path, status, body)
	}
	return l
}

func findClient(l broker.ClientList, id string) *broker.ClientView {
	for i := range l.Clients {
		if l.Clients[i].ID == id {
			return &l.Clients[i]
		}
	}
	return nil
}

// TestClientsListAndDisconnect (SPEC 13): the admin API lists who is
// connected, with a queue consumer's group, prefetch, leased count and
// claimed partitions; a queue's consumers are the clients subscribed to
// it; filters by user and a limit; DELETE disconnects a client, an MQTT
// 5 one with DISCONNECT 0x98, and what it held goes to the group's other
// consumer at once.
func TestClientsListAndDisconnect(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Admin.Token = adminToken })
	worker := dialRaw(t, b.MQTTAddr(), "worker-1", connectOpts{expiry: 60})
	if codes := worker.subscribe(1, map[string]string{"prefetch": "5", "partitions": "0,1"}, "$share/billing/$queue/jobs"); codes[0] != 1 {
		t.Fatalf("subscribe: %v", codes)
	}
	worker.subscribe(0, nil, "news/#")
	other := dialRaw(t, b.MQTTAddr(), "worker-2", connectOpts{})
	other.subscribe(1, nil, "$share/billing/$queue/jobs")
	lost := make(chan struct{})
	watcher := dialV3(t, b.MQTTAddr(), "watcher", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(paho3.Client, error) { close(lost) })
	})
	if tok := watcher.Subscribe("alerts", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher subscribe: %v", tok.Error())
	}

	// Three messages for partitions 0 and 1, which only worker-1 takes.
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	sent := 0
	for i := 0; sent < 3; i++ {
		key := fmt.Sprintf("k%d", i)
		if p := queue.PartitionFor(key, 8); p != 0 && p != 1 {
			continue
		}
		if code := prod.publish("$queue/jobs", []byte(key), "key", key); code != 0 {
			t.Fatalf("publish: %#x", code)
		}
		sent++
	}
	for range 3 {
		worker.next(5 * time.Second) // held: never acknowledged
	}

	l := clients(t, b, "/api/v1/clients")
	if l.Total != 4 || len(l.Clients) != 4 {
		t.Fatalf("clients: %d of %d, want 4: %+v", len(l.Clients), l.Total, l.Clients)
	}
	w := findClient(l, "worker-1")
	if w == nil || w.Protocol != 5 || w.SessionExpiry != 60 || w.ConnectedAt == "" || w.Remote == "" {
		t.Fatalf("worker-1: %+v", w)
	}
	if len(w.Subscriptions) != 2 || w.Subscriptions[0].Filter != "$share/billing/$queue/jobs" || w.Subscriptions[1].Filter != "news/#" {
		t.Errorf("worker-1's subscriptions: %+v", w.Subscriptions)
	}
	if len(w.Consumers) != 1 {
		t.Fatalf("worker-1's consumers: %+v", w.Consumers)
	}
	if c := w.Consumers[0]; c.Queue != "jobs" || c.Group != "billing" || c.Prefetch != 5 || c.Leased != 3 || !slices.Equal(c.Partitions, []int{0, 1}) || c.Ack != "puback" {
		t.Errorf("worker-1's consumer: %+v, want jobs, billing, prefetch 5, 3 leased, partitions 0 and 1", c)
	}
	if v := findClient(l, "watcher"); v == nil || v.Protocol != 4 || len(v.Consumers) != 0 {
		t.Errorf("watcher: %+v", v)
	}

	// A queue's consumers.
	l = clients(t, b, "/api/v1/queues/jobs/consumers")
	if len(l.Clients) != 2 || l.Clients[0].ID != "worker-1" || l.Clients[1].ID != "worker-2" {
		t.Fatalf("consumers of jobs: %+v", l.Clients)
	}
	if c := l.Clients[1].Consumers; len(c) != 1 || c[0].Prefetch != queue.DefaultOptions().Prefetch || c[0].Leased != 0 {
		t.Errorf("worker-2 takes the queue's prefetch, holds nothing: %+v", c)
	}
	if status, _ := call(t, b, http.MethodGet, "/api/v1/queues/nothing/consumers", adminToken, ""); status != http.StatusNotFound {
		t.Errorf("consumers of a queue that does not exist: HTTP %d, want 404", status)
	}
	if l := clients(t, b, "/api/v1/clients?limit=1"); l.Total != 4 || len(l.Clients) != 1 || l.Clients[0].ID != "producer" {
		t.Errorf("limit 1: %d of %d (%+v)", len(l.Clients), l.Total, l.Clients)
	}
	if l := clients(t, b, "/api/v1/clients?user=nobody"); l.Total != 0 {
		t.Errorf("user nobody: %+v", l.Clients)
	}
	if status, body := call(t, b, http.MethodGet, "/api/v1/clients?limit=0", adminToken, ""); status != http.StatusBadRequest {
		t.Errorf("limit 0: HTTP %d %s, want 400", status, body)
	}

	// Disconnected: told why; the three it held go to worker-2, to which
	// the group gives partitions 0 and 1 once their claimer is gone.
	status, body := call(t, b, http.MethodDelete, "/api/v1/clients/worker-1", adminToken, "")
	if status != http.StatusOK {
		t.Fatalf("DELETE worker-1: HTTP %d %s", status, body)
	}
	select {
	case <-worker.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("worker-1 still connected 5s after its disconnect")
	}
	worker.mu.Lock()
	d := worker.disconnect
	worker.mu.Unlock()
	if d == nil || d.ReasonCode != 0x98 {
		t.Errorf("worker-1 was sent %+v, want DISCONNECT 0x98", d)
	}
	for range 3 {
		other.next(5 * time.Second)
	}
	if v := findClient(clients(t, b, "/api/v1/clients"), "worker-1"); v != nil {
		t.Errorf("worker-1 still listed: %+v", v)
	}
	if status, body := call(t, b, http.MethodDelete, "/api/v1/clients/worker-1", adminToken, ""); status != http.StatusNotFound {
		t.Errorf("DELETE of a client not connected: HTTP %d %s, want 404", status, body)
	}
	// A 3.1.1 client has no DISCONNECT from a server: its connection ends.
	if status, _ := call(t, b, http.MethodDelete, "/api/v1/clients/watcher", adminToken, ""); status != http.StatusOK {
		t.Fatalf("DELETE watcher: HTTP %d", status)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("watcher still connected 5s after its disconnect")
	}
}

// TestClientsAcrossNodes: in a cluster any node lists every node's
// clients, each with the node it is connected to, and disconnects a
// client connected to another node.
func TestClientsAcrossNodes(t *testing.T) {
	a, b := twoNodes(t, adminToken)
	dialRaw(t, a.MQTTAddr(), "on-a", connectOpts{})
	onB := dialRaw(t, b.MQTTAddr(), "on-b", connectOpts{})
	onB.subscribe(1, nil, "$share/g/$queue/jobs")

	l := clients(t, a, "/api/v1/clients")
	if l.Total != 2 || len(l.Clients) != 2 || l.Clients[0].ID != "on-a" || l.Clients[0].Node != "node-a" ||
		l.Clients[1].ID != "on-b" || l.Clients[1].Node != "node-b" || len(l.NodesMissing) != 0 {
		t.Fatalf("clients through node-a: %+v", l)
	}
	if l := clients(t, a, "/api/v1/clients?node=node-b"); len(l.Clients) != 1 || l.Clients[0].ID != "on-b" {
		t.Errorf("clients of node-b through node-a: %+v", l.Clients)
	}
	if l := clients(t, a, "/api/v1/queues/jobs/consumers"); len(l.Clients) != 1 || l.Clients[0].ID != "on-b" || l.Clients[0].Consumers[0].Group != "g" {
		t.Errorf("consumers of jobs through node-a: %+v", l.Clients)
	}
	status, body := call(t, a, http.MethodDelete, "/api/v1/clients/on-b", adminToken, "")
	var d broker.ClientDisconnected
	if status != http.StatusOK || json.Unmarshal(body, &d) != nil || d.Node != "node-b" {
		t.Fatalf("DELETE on-b through node-a: HTTP %d %s", status, body)
	}
	select {
	case <-onB.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("on-b still connected 5s after its disconnect")
	}
	if status, body := call(t, a, http.MethodDelete, "/api/v1/clients/on-b", adminToken, ""); status != http.StatusNotFound {
		t.Errorf("DELETE of a client connected nowhere: HTTP %d %s, want 404", status, body)
	}
}
