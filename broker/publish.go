package broker

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
)

// POST /api/v1/queues/{q}/messages publishes one message as a producer
// would: through the queue service the MQTT hook uses (limitedQueues), so
// the same limits refuse it, a new name is auto-created as a first
// publish would create it, and in a cluster the message goes to its
// partition's owner. It answers once the message is stored as the
// queue's durability says, with its msg-id.

// PublishRequest is the body of POST .../messages.
type PublishRequest struct {
	// Key picks the partition (and, with ordering key, the order); ""
	// takes the subject, as over MQTT, and without one the empty key.
	Key string `json:"key,omitempty"`
	// Subject is the topic's part after $queue/{q}/.
	Subject string `json:"subject,omitempty"`
	// Payload is text; PayloadBase64 bytes. One of them, or neither for
	// an empty payload.
	Payload       *string `json:"payload,omitempty"`
	PayloadBase64 []byte  `json:"payload_base64,omitempty"`
	ContentType   string  `json:"content_type,omitempty"`
	// Properties are user properties, carried to consumers in order.
	Properties []Property `json:"properties,omitempty"`
}

// Published is the answer 201 to POST .../messages.
type Published struct {
	Node  string `json:"node"`
	Queue string `json:"queue"`
	Topic string `json:"topic"`
	Key   string `json:"key"`
	// ID is the message's msg-id; "" in the rare cases the node cannot
	// tell it (a publish routed twice in a cluster, stored once; the
	// queue's partitions grown meanwhile), Partition and Offset then 0.
	ID        string `json:"msg_id"`
	Partition int    `json:"partition"`
	Offset    uint64 `json:"offset"`
}

// steering are the user properties a producer sets to steer a message
// over MQTT (hooks/produce.go), which the broker takes rather than
// carries: here they would be carried as they are, so they are refused.
var steering = map[string]string{
	"key":        "give it as the field key",
	"dedup-id":   "publish over MQTT to deduplicate",
	"delay":      "publish over MQTT to delay a message",
	"deliver-at": "publish over MQTT to delay a message",
}

// unknownOffset marks a message whose offset the queue service did not
// set: every store of a message gives it its offset.
const unknownOffset = ^uint64(0)

func (a *adminAPI) publish(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if err := queue.CheckQueueName(name); err != nil {
		a.fail(w, r, http.StatusBadRequest, fmt.Errorf("%w: %v", queue.ErrInvalidName, err))
		return
	}
	var req PublishRequest
	if err := decodeBody(r, &req, false); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			// The JSON body, payload included, is bounded like every admin
			// call's; storage.max_payload may allow more over MQTT.
			a.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("the body is over %d bytes: publish a larger message over MQTT", tooLarge.Limit))
			return
		}
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	msg, err := messageOf(name, req)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if t := a.b.tenants; t != nil && (*t.full.Load())[name] {
		// What a producer of any tenant is refused (tenants.publish).
		a.fail(w, r, http.StatusInsufficientStorage, fmt.Errorf("%w: queue %s is over its owner's max_bytes", hooks.ErrQuotaExceeded, name))
		return
	}
	// A queue's partitions only grow: the same count before and after
	// says which partition the key had when it was stored.
	count := 0
	if q := a.b.manager.Queue(name); q != nil {
		count = q.Partitions()
	}
	msg.Offset = unknownOffset
	done := make(chan error, 1) // done must not block
	a.b.queues.Publish(r.Context(), name, msg, func(err error) { done <- err })
	select {
	case err = <-done:
	case <-r.Context().Done():
		err = fmt.Errorf("%w: the request ended before the message was stored: it may or may not be", r.Context().Err())
	}
	if err != nil {
		a.fail(w, r, publishStatus(err), err)
		return
	}
	out := Published{Node: a.b.cfg.NodeID, Queue: name, Topic: queue.TopicName(name, msg.Subject), Key: msg.Key}
	if q := a.b.manager.Queue(name); q != nil && (count == 0 || count == q.Partitions()) && msg.Offset != unknownOffset {
		out.Partition, out.Offset = queue.PartitionFor(msg.Key, q.Partitions()), msg.Offset
		out.ID = queue.MessageID(out.Partition, msg.Offset)
	}
	a.log.Debug("message published over the admin API", "queue", name, "msg_id", out.ID, "bytes", len(msg.Payload))
	a.reply(w, http.StatusCreated, out)
}

// messageOf builds the message of req for the queue name.
func messageOf(name string, req PublishRequest) (*queue.Message, error) {
	if req.Payload != nil && req.PayloadBase64 != nil {
		return nil, errors.New("give payload (text) or payload_base64, not both")
	}
	if req.Subject != "" {
		t, err := queue.ParseTopic(queue.TopicName(name, req.Subject))
		if err != nil || t.Verb != "" || t.Queue != name {
			return nil, fmt.Errorf("%w: subject %q: levels may not be empty, start with $ or hold + or #", queue.ErrInvalidTopic, req.Subject)
		}
	}
	msg := &queue.Message{Key: req.Key, Subject: req.Subject, Payload: req.PayloadBase64, Headers: queue.Headers{ContentType: req.ContentType}}
	if req.Payload != nil {
		msg.Payload = []byte(*req.Payload)
	}
	if msg.Payload == nil {
		msg.Payload = []byte{}
	}
	if msg.Key == "" {
		msg.Key = req.Subject
	}
	for i, p := range req.Properties {
		if p.Name == "" {
			return nil, fmt.Errorf("properties[%d]: the name is empty", i)
		}
		if how, ok := steering[p.Name]; ok {
			return nil, fmt.Errorf("properties[%d]: %q steers a message over MQTT: %s", i, p.Name, how)
		}
		msg.Headers.User = append(msg.Headers.User, queue.Property{Name: p.Name, Value: p.Value})
	}
	return msg, nil
}

// publishStatus maps the refusal of a publish to its HTTP status: what a
// producer gets as a reason code (hooks/codes.go), in HTTP.
func publishStatus(err error) int {
	switch {
	case errors.Is(err, queue.ErrTooLarge):
		return http.StatusRequestEntityTooLarge // 0x95
	case errors.Is(err, queue.ErrQueueFull), errors.Is(err, queue.ErrStorageFull):
		return http.StatusInsufficientStorage // 0x97: no room
	case errors.Is(err, hooks.ErrQuotaExceeded):
		return http.StatusTooManyRequests // 0x97: limits.max_queues, a tenant's
	case errors.Is(err, queue.ErrInvalidTopic):
		return http.StatusBadRequest // 0x90
	case errors.Is(err, queue.ErrNoSuchQueue):
		return http.StatusNotFound // 0x90: auto_create is off
	}
	return statusOf(err)
}
