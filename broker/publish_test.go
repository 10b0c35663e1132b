package broker_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// TestAdminPublish publishes over the admin API: the message is stored in
// its key's partition under the msg-id the answer gives, and delivered
// with its properties; a producer's refusals are refused in HTTP.
func TestAdminPublish(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		withToken(c)
		c.NodeID = "node-a"
		c.Storage.MaxPayload = 64
		c.Limits.MaxQueues = 2
		o := c.Queues.Defaults
		o.Partitions = 4
		c.Queues.Declared["orders"] = o
		tiny := c.Queues.Defaults
		tiny.MaxMessages = 1
		tiny.Overflow = queue.OverflowReject
		c.Queues.Declared["tiny"] = tiny
	})
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/billing/$queue/orders")

	body := `{"key": "order-7", "payload": "hello", "content_type": "text/plain", "properties": [{"name": "trace", "value": "t-1"}, {"name": "trace", "value": "t-2"}]}`
	pub := get[broker.Published](t, b, "POST", "/api/v1/queues/orders/messages", adminToken, body, http.StatusCreated)
	p := queue.PartitionFor("order-7", 4)
	if pub.Node != "node-a" || pub.Queue != "orders" || pub.Topic != "$queue/orders" || pub.Key != "order-7" || pub.Partition != p ||
		pub.ID != queue.MessageID(p, pub.Offset) {
		t.Fatalf("published: %+v", pub)
	}
	found := search(t, b, "/api/v1/queues/orders/messages?id="+pub.ID)
	if len(found.Messages) != 1 {
		t.Fatalf("the message %s is not stored: %+v", pub.ID, found)
	}
	m := found.Messages[0]
	if string(m.Payload) != "hello" || m.Key != "order-7" || m.ContentType != "text/plain" || len(m.UserProperties) != 2 || m.UserProperties[1].Value != "t-2" {
		t.Errorf("stored: %+v", m)
	}
	d := cons.next(5 * time.Second)
	if string(d.Payload) != "hello" || userProp(d, "msg-id") != pub.ID || userProp(d, "trace") != "t-1" || d.Properties.ContentType != "text/plain" {
		t.Errorf("delivered: %s %q msg-id %q trace %q content type %q", d.Topic, d.Payload, userProp(d, "msg-id"), userProp(d, "trace"), d.Properties.ContentType)
	}
	cons.puback(d, 0)

	// Bytes, and a subject, which is the key when there is none.
	pub = get[broker.Published](t, b, "POST", "/api/v1/queues/orders/messages", adminToken, `{"subject": "eu/de", "payload_base64": "AAH+/w=="}`, http.StatusCreated)
	if pub.Topic != "$queue/orders/eu/de" || pub.Key != "eu/de" || pub.Partition != queue.PartitionFor("eu/de", 4) {
		t.Errorf("published with a subject: %+v", pub)
	}
	d = cons.next(5 * time.Second)
	// The subscription names no subject: the subject comes as a property.
	if userProp(d, "subject") != "eu/de" || string(d.Payload) != "\x00\x01\xfe\xff" {
		t.Errorf("delivered: %s %q subject %q", d.Topic, d.Payload, userProp(d, "subject"))
	}
	cons.puback(d, 0)

	for _, bad := range []struct {
		name, path, body string
		status           int
		word             string
	}{
		{"no body", "orders", ``, http.StatusBadRequest, "JSON object"},
		{"unknown field", "orders", `{"payload": "x", "qos": 1}`, http.StatusBadRequest, `unknown field "qos"`},
		{"two payloads", "orders", `{"payload": "x", "payload_base64": "eA=="}`, http.StatusBadRequest, "not both"},
		{"steering property", "orders", `{"properties": [{"name": "key", "value": "k"}]}`, http.StatusBadRequest, "field key"},
		{"delay", "orders", `{"properties": [{"name": "delay", "value": "5s"}]}`, http.StatusBadRequest, "over MQTT"},
		{"nameless property", "orders", `{"properties": [{"name": "", "value": "v"}]}`, http.StatusBadRequest, "name is empty"},
		{"bad subject", "orders", `{"subject": "$x"}`, http.StatusBadRequest, "subject"},
		{"wildcard subject", "orders", `{"subject": "a/#"}`, http.StatusBadRequest, "subject"},
		{"bad queue name", "bad%20name", `{}`, http.StatusBadRequest, "invalid queue name"},
		{"too large", "orders", `{"payload": "` + strings.Repeat("x", 65) + `"}`, http.StatusRequestEntityTooLarge, "max_payload"},
		{"past max_queues", "new", `{"payload": "x"}`, http.StatusTooManyRequests, "max_queues"},
		{"body past 1 MiB", "orders", `{"payload": "` + strings.Repeat("x", 1<<20) + `"}`, http.StatusRequestEntityTooLarge, "over MQTT"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			refused(t, b, "POST", "/api/v1/queues/"+bad.path+"/messages", adminToken, bad.body, bad.status, bad.word)
		})
	}
	get[broker.Published](t, b, "POST", "/api/v1/queues/tiny/messages", adminToken, `{"payload": "1"}`, http.StatusCreated)
	refused(t, b, "POST", "/api/v1/queues/tiny/messages", adminToken, `{"payload": "2"}`, http.StatusInsufficientStorage, "full")
	refused(t, b, "POST", "/api/v1/queues/orders/messages", "", `{"payload": "x"}`, http.StatusUnauthorized, "bearer")
	if v := show(t, b, "orders"); v.Counts.Enqueued != 2 {
		t.Errorf("orders enqueued %d, want the 2 published", v.Counts.Enqueued)
	}
	if list := get[broker.QueueList](t, b, "GET", "/api/v1/queues", adminToken, "", http.StatusOK); len(list.Queues) != 2 {
		t.Errorf("%d queues: a refused publish created one", len(list.Queues))
	}
}

// TestAdminPublishNoAutoCreate: without auto_create, a publish to a queue
// nobody declared is refused as a producer's is.
func TestAdminPublishNoAutoCreate(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.AutoCreate = false })
	refused(t, b, "POST", "/api/v1/queues/nope/messages", "", `{"payload": "x"}`, http.StatusNotFound, "no such queue")
	// With auto_create, the first publish creates the queue, as over MQTT.
	b2 := startBroker(t, t.TempDir(), nil)
	pub := get[broker.Published](t, b2, "POST", "/api/v1/queues/fresh/messages", "", `{"key": "k", "payload": "x"}`, http.StatusCreated)
	if v := show(t, b2, "fresh"); v.Depth != 1 || pub.ID != fmt.Sprintf("%d-0", pub.Partition) {
		t.Errorf("fresh: depth %d, published %+v", v.Depth, pub)
	}
}
