package hooks

import (
	"fmt"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// User properties a producer sets to steer a message; they are consumed by
// the broker and not passed on.
const (
	propKey       = "key"
	propDedupID   = "dedup-id"
	propDelay     = "delay"
	propDeliverAt = "deliver-at"
)

// OnPublish stores $queue/ publishes. Plain topics pass through untouched.
// A QoS 1 publish is acknowledged by the conn's writer once its batch is
// committed, so the producer's read loop is never held for a commit; QoS 2
// (rare) waits for the commit here and lets mochi run the PUBREC/PUBREL flow.
func (h *Hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if !strings.HasPrefix(pk.TopicName, queue.TopicPrefix) {
		return pk, nil
	}
	t, err := queue.ParseTopic(pk.TopicName)
	if err == nil && t.Verb != "" {
		return h.settleExplicit(cl, pk, t)
	}
	if err == nil && h.opts.Admit != nil {
		err = h.opts.Admit(cl, t.Queue)
	}
	var msg *queue.Message
	if err == nil {
		msg, err = messageFrom(cl, pk, t)
	}
	if err != nil {
		return h.refuse(cl, pk, err)
	}
	switch pk.FixedHeader.Qos {
	case 0:
		// No PUBACK, but the same window: a QoS 0 producer faster than the
		// commits is not read until they catch up.
		c := h.connFor(cl)
		select {
		case c.window <- struct{}{}:
		case <-c.done:
			return pk, packets.ErrRejectPacket
		}
		h.m.Publish(c.ctx, t.Queue, msg, func(error) { <-c.window })
	case 1:
		read := h.readAt() // before the window: a full one holds the producer
		c := h.connFor(cl)
		select {
		case c.window <- struct{}{}:
		case <-c.done:
			return pk, packets.ErrRejectPacket
		}
		s := &ackSlot{id: pk.PacketID, read: read}
		c.mu.Lock()
		c.acks = append(c.acks, s)
		c.mu.Unlock()
		h.m.Publish(c.ctx, t.Queue, msg, func(err error) { c.finishAck(s, err) })
	default:
		done := make(chan error, 1)
		h.m.Publish(h.connFor(cl).ctx, t.Queue, msg, func(err error) { done <- err })
		if err := <-done; err != nil {
			return h.refuse(cl, pk, err)
		}
		return pk, packets.CodeSuccessIgnore
	}
	return pk, packets.ErrRejectPacket
}

// refuse answers a publish that was not stored: a v5 producer gets the
// reason code (in order with its other PUBACKs), a v3.1.1 producer is
// disconnected, never acknowledged.
func (h *Hook) refuse(cl *mqtt.Client, pk packets.Packet, err error) (packets.Packet, error) {
	h.log.Debug("publish refused", "client", cl.ID, "topic", pk.TopicName, "err", err)
	if pk.FixedHeader.Qos == 0 {
		return pk, packets.ErrRejectPacket
	}
	if cl.Properties.ProtocolVersion != 5 {
		h.log.Warn("disconnecting MQTT 3.1.1 producer: publish not stored", "client", cl.ID, "topic", pk.TopicName, "err", err)
		cl.Stop(err)
		return pk, packets.ErrRejectPacket
	}
	if pk.FixedHeader.Qos == 2 {
		code := withReason(reasonFor(err), err)
		_ = cl.WritePacket(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Pubrec},
			PacketID:    pk.PacketID,
			ReasonCode:  code.Code,
			Properties:  packets.Properties{ReasonString: code.Reason},
		})
		return pk, packets.ErrRejectPacket
	}
	h.answer(cl, pk, err)
	return pk, packets.ErrRejectPacket
}

// answer queues the PUBACK of a QoS 1 publish from a v5 client, in order
// with the client's other PUBACKs: success when err is nil, else its reason.
func (h *Hook) answer(cl *mqtt.Client, pk packets.Packet, err error) {
	read := h.readAt()
	c := h.connFor(cl)
	select {
	case c.window <- struct{}{}:
	case <-c.done:
		return
	}
	s := &ackSlot{id: pk.PacketID, read: read}
	c.mu.Lock()
	c.acks = append(c.acks, s)
	c.mu.Unlock()
	c.finishAck(s, err)
}

// readAt is the time a publish was read, for Options.OnPuback; zero
// without it.
func (h *Hook) readAt() time.Time {
	if h.opts.OnPuback == nil {
		return time.Time{}
	}
	return time.Now()
}

// messageFrom builds the queue message of a publish. The partition key is
// the user property key, else the subject, else the client ID.
func messageFrom(cl *mqtt.Client, pk packets.Packet, t queue.Topic) (*queue.Message, error) {
	props := pk.Properties
	msg := &queue.Message{
		Subject: t.Subject,
		Payload: pk.Payload,
		Headers: queue.Headers{
			ContentType:     props.ContentType,
			ResponseTopic:   props.ResponseTopic,
			CorrelationData: props.CorrelationData,
			ExpiryInterval:  props.MessageExpiryInterval,
		},
	}
	if props.PayloadFormatFlag {
		msg.Headers.PayloadFormat = props.PayloadFormat + 1
	}
	key, hasKey := "", false
	for _, u := range props.User {
		switch u.Key {
		case propKey:
			key, hasKey = u.Val, true
		case propDelay:
			d, err := time.ParseDuration(u.Val)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("%w: delay %q is not a non-negative Go duration", errBadProperty, u.Val)
			}
			msg.NotBefore = time.Now().Add(d)
		case propDeliverAt:
			at, err := time.Parse(time.RFC3339, u.Val)
			if err != nil {
				return nil, fmt.Errorf("%w: deliver-at %q is not an RFC 3339 time", errBadProperty, u.Val)
			}
			msg.NotBefore = at
		case propDedupID:
			msg.DedupID = u.Val
		default:
			msg.Headers.User = append(msg.Headers.User, queue.Property{Name: u.Key, Value: u.Val})
		}
	}
	switch {
	case hasKey:
		msg.Key = key
	case t.Subject != "":
		msg.Key = t.Subject
	default:
		msg.Key = cl.ID
	}
	return msg, nil
}
