package hooks

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// Options configure the queue hook.
type Options struct {
	// Queues serves the queues (a queue.Manager on a single node).
	// Required.
	Queues queue.Service
	// Server is the mochi server the hook is added to. With it, queue
	// subscriptions are kept out of mochi's topic index, so that nothing
	// mochi publishes itself (wills, retained messages) reaches a consumer
	// outside the queue.
	Server *mqtt.Server
	// ProducerWindow caps each producer's publishes that are not yet
	// acknowledged; a producer past it is not read until commits catch up.
	ProducerWindow int
	// MaxKeepAlive caps, in seconds, the keep-alive of MQTT 5 clients (sent
	// back as Server Keep Alive); 0 means no cap.
	MaxKeepAlive uint16
	Logger       *slog.Logger

	// Admit, when set, decides each $queue/ publish before it is
	// enqueued (access control); see Admit.
	Admit Admit
	// OnPanic, when set, is told about a panic on a client's writer
	// goroutine (the goroutine the hook starts itself; mochi's run the
	// hook methods, which their caller guards): the client has been
	// stopped, the node goes on.
	OnPanic func(cl *mqtt.Client, v any, stack []byte)
	// OnPuback, when set, is told how long after it read each QoS 1
	// publish to a queue the hook wrote its PUBACK (or, for a refusal,
	// its negative PUBACK).
	OnPuback func(time.Duration)
}

// Hook is the mochi hook that turns $queue/ topics into queues. It is the
// only code in shardq that knows MQTT packets.
type Hook struct {
	mqtt.HookBase
	opts Options
	m    queue.Service
	log  *slog.Logger
	ctx  context.Context

	conns sync.Map // *mqtt.Client -> *conn
	// qos0Warned: the queue and group pairs warned of a QoS 0 consumer.
	qos0Warned sync.Map
	// since: when each connected client's session was established
	// (*mqtt.Client -> time.Time).
	since sync.Map

	mu   sync.Mutex
	byID map[string]*conn // the live conn of each client ID
	// props keeps the user properties of each client's queue
	// subscriptions, by client ID and filter, so that a resumed session
	// subscribes with the same group, prefetch, ack mode and partitions.
	props map[string]map[string][]packets.UserProperty
}

// saveProps remembers (nil: forgets) a queue subscription's properties.
func (h *Hook) saveProps(clientID, filter string, props []packets.UserProperty) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if props == nil {
		delete(h.props[clientID], filter)
		if len(h.props[clientID]) == 0 {
			delete(h.props, clientID)
		}
		return
	}
	if h.props[clientID] == nil {
		h.props[clientID] = map[string][]packets.UserProperty{}
	}
	h.props[clientID][filter] = props
}

func (h *Hook) savedProps(clientID, filter string) []packets.UserProperty {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.props[clientID][filter]
}

// New returns the hook; add it to a mochi server with AddHook(h, nil).
func New(o Options) *Hook {
	if o.ProducerWindow <= 0 {
		o.ProducerWindow = 256
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Hook{opts: o, m: o.Queues, log: o.Logger, ctx: context.Background(), byID: map[string]*conn{},
		props: map[string]map[string][]packets.UserProperty{}}
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "shardq-queues" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnect,
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnPublish,
		mqtt.OnPacketRead,
		mqtt.OnPacketEncode,
		mqtt.OnSubscribe,
		mqtt.OnSubscribed,
		mqtt.OnPacketSent,
		mqtt.OnUnsubscribed,
		mqtt.OnWill,
		mqtt.OnSelectSubscribers,
	}, []byte{b})
}

// connFor returns the client's conn, creating it on first use.
func (h *Hook) connFor(cl *mqtt.Client) *conn {
	if c, ok := h.conns.Load(cl); ok {
		return c.(*conn)
	}
	c := newConn(h, cl)
	if old, loaded := h.conns.LoadOrStore(cl, c); loaded {
		return old.(*conn)
	}
	h.mu.Lock()
	h.byID[cl.ID] = c
	h.mu.Unlock()
	return c
}

func (h *Hook) lookup(cl *mqtt.Client) *conn {
	if c, ok := h.conns.Load(cl); ok {
		return c.(*conn)
	}
	return nil
}

// OnConnect caps an MQTT 5 client's keep-alive at MaxKeepAlive and tells
// it so in the CONNACK (Server Keep Alive).
func (h *Hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if max := h.opts.MaxKeepAlive; max > 0 && cl.Properties.ProtocolVersion == 5 && cl.State.Keepalive > max {
		cl.State.Keepalive = max
		cl.State.ServerKeepalive = true
	}
	return nil
}

// OnSessionEstablish runs before mochi hands a taken-over session to the
// new connection: the old connection's deliveries go back to their groups
// here, before the new connection subscribes again.
func (h *Hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
	if pk.Connect.Clean {
		delete(h.props, cl.ID) // a new session: no subscriptions to resume
	}
	old := h.byID[cl.ID]
	if old != nil && old.cl != cl {
		delete(h.byID, cl.ID)
	} else {
		old = nil
	}
	h.mu.Unlock()
	if old != nil {
		h.conns.Delete(old.cl)
		old.close()
	}
}

// OnSessionEstablished resumes the queue subscriptions of a restored
// session (mochi does not call OnSubscribed for them).
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	h.since.Store(cl, time.Now())
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		if queue.IsQueueTopic(filter) {
			h.subscribe(cl, sub, h.savedProps(cl.ID, filter), true)
			h.unindex(cl, filter)
		}
	}
}

// OnDisconnect releases everything the client held.
func (h *Hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	h.since.Delete(cl)
	v, ok := h.conns.LoadAndDelete(cl)
	if !ok {
		return
	}
	c := v.(*conn)
	h.mu.Lock()
	if h.byID[cl.ID] == c {
		delete(h.byID, cl.ID)
	}
	if expire {
		delete(h.props, cl.ID)
	}
	h.mu.Unlock()
	c.close()
}

// OnPacketEncode fixes mochi's success PUBACK reason 0x01 (granted QoS 1),
// which MQTT 5 does not allow on a PUBACK, to 0x00, says in a SUBACK why a
// queue subscription was refused (its reason string), and answers the
// unsubscription of a queue filter with success (mochi, not finding the
// filter in its index, would say 0x11 No subscription existed).
func (h *Hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Puback:
		if pk.ReasonCode == packets.CodeGrantedQos1.Code {
			pk.ReasonCode = packets.CodeSuccess.Code
		}
	case packets.Suback:
		if c := h.lookup(cl); c != nil {
			c.mu.Lock()
			why, ok := c.subRefusals[pk.PacketID]
			delete(c.subRefusals, pk.PacketID)
			c.mu.Unlock()
			if ok && pk.Properties.ReasonString == "" {
				pk.Properties.ReasonString = why
			}
		}
	case packets.Unsuback:
		if c := h.lookup(cl); c != nil {
			c.mu.Lock()
			ok := c.unsubbed[pk.PacketID]
			delete(c.unsubbed, pk.PacketID)
			c.mu.Unlock()
			for _, i := range ok {
				if i < len(pk.ReasonCodes) {
					pk.ReasonCodes[i] = packets.CodeSuccess.Code
				}
			}
		}
	}
	return pk
}

// unindex removes a queue subscription from mochi's topic index (it stays
// in the client's session, to be resumed).
func (h *Hook) unindex(cl *mqtt.Client, filter string) {
	if s := h.opts.Server; s != nil && s.Topics.Unsubscribe(filter, cl.ID) {
		atomic.AddInt64(&s.Info.Subscriptions, -1)
	}
}

// OnSelectSubscribers drops every subscriber of a $queue/ publish that
// mochi fans out itself: a will, whose topic may be a queue's. mochi lets
// $share/{g}/# match $-topics; MQTT says it must not.
func (h *Hook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if queue.IsQueueTopic(pk.TopicName) {
		clear(subs.Shared)
		clear(subs.SharedSelected)
		clear(subs.Subscriptions)
		clear(subs.InlineSubscriptions)
	}
	return subs
}

// OnWill enqueues a will whose topic is a queue's, as a QoS 0 publish of the
// disconnected client (key: the client ID, unless it set one); mochi then
// has no one to send it to. A will delay becomes a delivery delay: the will
// is enqueued when the connection ends even if the client comes back
// within the delay.
func (h *Hook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if !queue.IsQueueTopic(will.TopicName) {
		return will, nil
	}
	pk := packets.Packet{TopicName: will.TopicName, Payload: will.Payload,
		Properties: packets.Properties{User: will.User}}
	t, err := queue.ParseTopic(will.TopicName)
	var msg *queue.Message
	if err == nil && t.Verb == "" {
		msg, err = messageFrom(cl, pk, t)
	}
	if err == nil && t.Verb != "" {
		err = queue.ErrInvalidTopic
	}
	if err != nil {
		h.log.Warn("will to a queue topic dropped", "client", cl.ID, "topic", will.TopicName, "err", err)
	} else {
		if will.WillDelayInterval > 0 {
			msg.NotBefore = time.Now().Add(time.Duration(will.WillDelayInterval) * time.Second)
		}
		h.m.Publish(h.ctx, t.Queue, msg, func(err error) {
			if err != nil {
				h.log.Warn("will not stored", "client", cl.ID, "queue", t.Queue, "err", err)
			}
		})
	}
	will.Retain = false
	return will, nil
}

// OnPacketRead settles deliveries by the consumer's PUBACK.
func (h *Hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type != packets.Puback {
		return pk, nil
	}
	c := h.lookup(cl)
	if c == nil {
		return pk, nil
	}
	c.mu.Lock()
	l, ok := c.leases[pk.PacketID]
	delete(c.leases, pk.PacketID)
	c.mu.Unlock()
	switch {
	case !ok:
	case l.explicit:
		h.m.Received(l.ref) // settled later, by a $ack/$nack/$reject publish
	default:
		if err := h.m.Settle(l.ref, outcomeFor(pk.ReasonCode)); err != nil {
			h.log.Debug("late settlement ignored", "client", cl.ID, "msg_id", l.ref.ID(), "err", err)
		}
	}
	return pk, nil
}
