package hooks

import (
	"bytes"
	"context"
	"log/slog"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// Options configure the queue hook.
type Options struct {
	// Manager holds the queues. Required.
	Manager *queue.Manager
	// ProducerWindow caps each producer's publishes that are not yet
	// acknowledged; a producer past it is not read until commits catch up.
	ProducerWindow int
	Logger         *slog.Logger
}

// Hook is the mochi hook that turns $queue/ topics into queues. It is the
// only code in shardq that knows MQTT packets.
type Hook struct {
	mqtt.HookBase
	opts Options
	m    *queue.Manager
	log  *slog.Logger
	ctx  context.Context

	conns sync.Map // *mqtt.Client -> *conn

	mu   sync.Mutex
	byID map[string]*conn // the live conn of each client ID
}

// New returns the hook; add it to a mochi server with AddHook(h, nil).
func New(o Options) *Hook {
	if o.ProducerWindow <= 0 {
		o.ProducerWindow = 256
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Hook{opts: o, m: o.Manager, log: o.Logger, ctx: context.Background(), byID: map[string]*conn{}}
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "shardq-queues" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnPublish,
		mqtt.OnPacketRead,
		mqtt.OnPacketEncode,
		mqtt.OnSubscribe,
		mqtt.OnSubscribed,
		mqtt.OnUnsubscribed,
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

// OnSessionEstablish runs before mochi hands a taken-over session to the
// new connection: the old connection's deliveries go back to their groups
// here, before the new connection subscribes again.
func (h *Hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
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
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		if queue.IsQueueTopic(filter) {
			h.subscribe(cl, sub, nil)
		}
	}
}

// OnDisconnect releases everything the client held.
func (h *Hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	v, ok := h.conns.LoadAndDelete(cl)
	if !ok {
		return
	}
	c := v.(*conn)
	h.mu.Lock()
	if h.byID[cl.ID] == c {
		delete(h.byID, cl.ID)
	}
	h.mu.Unlock()
	c.close()
}

// OnPacketEncode fixes mochi's success PUBACK reason 0x01 (granted QoS 1),
// which MQTT 5 does not allow on a PUBACK, to 0x00.
func (h *Hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Puback && pk.ReasonCode == packets.CodeGrantedQos1.Code {
		pk.ReasonCode = packets.CodeSuccess.Code
	}
	return pk
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
	l := c.leases[pk.PacketID]
	delete(c.leases, pk.PacketID)
	c.mu.Unlock()
	if l != nil && l.Explicit() {
		l.Received() // settled later, by a $ack/$nack/$reject publish
	} else if l != nil {
		if err := l.Settle(outcomeFor(pk.ReasonCode)); err != nil {
			h.log.Debug("late settlement ignored", "client", cl.ID, "msg_id", l.ID(), "err", err)
		}
	}
	return pk, nil
}
