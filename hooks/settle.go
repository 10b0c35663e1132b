package hooks

import (
	"errors"
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// User properties of an explicit settlement publish.
const (
	propMsgID = "msg-id"
	propAck   = "ack"
)

var (
	errNoMsgID     = errors.New("hooks: settlement names no msg-id (user property msg-id or the payload)")
	errNotYourMsg  = errors.New("hooks: msg-id is not leased by this client in this group")
	errExplicitQoS = errors.New("hooks: explicit settlement needs a QoS 1 subscription")
)

func explicitKey(queueName, group, msgID string) string {
	return queueName + "\x00" + group + "\x00" + msgID
}

// settleExplicit handles a publish to $queue/{q}/$ack, $nack, $reject,
// $release or $extend from a consumer subscribed with ack=explicit. The message is
// named by its msg-id (user property or payload) and its group (user
// property group, default "default"). Only the client holding the lease can
// settle it; anything else is refused with 0x80 and changes nothing. The
// publish itself is never stored.
func (h *Hook) settleExplicit(cl *mqtt.Client, pk packets.Packet, t queue.Topic) (packets.Packet, error) {
	err := h.applySettlement(cl, pk, t)
	if err != nil {
		h.log.Debug("explicit settlement refused", "client", cl.ID, "topic", pk.TopicName, "err", err)
	}
	switch {
	case pk.FixedHeader.Qos == 0:
	case cl.Properties.ProtocolVersion == 5:
		h.answer(cl, pk, err)
	case err != nil:
		// MQTT 3.1.1 has no negative PUBACK.
		h.log.Warn("disconnecting MQTT 3.1.1 client: settlement refused", "client", cl.ID, "err", err)
		cl.Stop(err)
	default:
		h.answer(cl, pk, nil)
	}
	return pk, packets.ErrRejectPacket
}

func (h *Hook) applySettlement(cl *mqtt.Client, pk packets.Packet, t queue.Topic) error {
	msgID, group := "", queue.DefaultGroup
	for _, u := range pk.Properties.User {
		switch u.Key {
		case propMsgID:
			msgID = u.Val
		case propGroup:
			group = u.Val
		}
	}
	if msgID == "" {
		msgID = string(pk.Payload)
	}
	if msgID == "" {
		return errNoMsgID
	}
	if _, _, err := queue.ParseMessageID(msgID); err != nil {
		return fmt.Errorf("%w: %q", err, msgID)
	}
	c := h.lookup(cl)
	if c == nil {
		return errNotYourMsg
	}
	key := explicitKey(t.Queue, group, msgID)
	c.mu.Lock()
	l, ok := c.explicit[key]
	if ok && t.Verb != queue.VerbExtend {
		delete(c.explicit, key)
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", errNotYourMsg, msgID)
	}
	var err error
	switch t.Verb {
	case queue.VerbAck:
		err = h.m.Settle(l, queue.Ack)
	case queue.VerbNack:
		err = h.m.Settle(l, queue.Nack)
	case queue.VerbReject:
		err = h.m.Settle(l, queue.Reject)
	case queue.VerbRelease:
		err = h.m.Settle(l, queue.Release)
	case queue.VerbExtend:
		err = h.m.Extend(l)
	}
	if err != nil {
		return fmt.Errorf("%w: %s", err, msgID)
	}
	return nil
}
