package broker

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// health is what makes the node not ready besides starting and shutting
// down: a storage shard whose latest commit failed. A failed commit marks
// its shard failing; the next successful commit of that shard clears it.
type health struct {
	failing []atomic.Bool // by shard
}

// watchCommits makes the commits of mo's logs feed h, before whatever
// OnCommit mo already has (the metrics').
func (h *health) watchCommits(mo *queue.ManagerOptions, shards int) {
	h.failing = make([]atomic.Bool, max(shards, 1))
	next := mo.OnCommit
	mo.OnCommit = func(s queue.CommitStats) {
		h.commit(s)
		if next != nil {
			next(s)
		}
	}
}

// commit records the outcome of one commit.
func (h *health) commit(s queue.CommitStats) {
	if s.Shard < 0 || s.Shard >= len(h.failing) {
		return
	}
	h.failing[s.Shard].Store(s.Err != nil)
}

// storageOK reports whether no shard's latest commit failed.
func (h *health) storageOK() bool {
	for i := range h.failing {
		if h.failing[i].Load() {
			return false
		}
	}
	return true
}

// errHookPanic ends the connection of a client whose packet made a hook panic.
var errHookPanic = errors.New("internal error while handling the client's packet")

// addHook adds h to the MQTT server behind guardedHook.
func (b *Broker) addHook(h mqtt.Hook) error {
	return b.server.AddHook(&guardedHook{Hook: h, b: b}, nil)
}

// writerPanicked is told about a panic on a client's writer goroutine
// (hooks.Options.OnPanic): the client is already stopped.
func (b *Broker) writerPanicked(cl *mqtt.Client, v any, stack []byte) {
	b.sec.panics.WithLabelValues("writer").Inc()
	b.log.Error("panic while writing to a client; client closed", "client", cl.ID,
		"panic", fmt.Sprint(v), "stack", string(bytes.TrimSpace(stack)))
}

// guardedHook runs a hook's methods so that a panic in one (mochi runs
// them on the client's goroutines) ends that client's connection, is
// logged with its stack and counted in shardq_client_panics_total, and
// never takes the node down. Each method answers as a refusal when it
// panicked.
type guardedHook struct {
	mqtt.Hook
	b *Broker
}

// recovered handles a panic of hook method what for cl (nil when the
// method has no client), then runs refuse (may be nil) to set the
// method's answer. Every method defers it directly (recover works only
// there).
func (g *guardedHook) recovered(cl *mqtt.Client, what string, refuse func()) {
	r := recover()
	if r == nil {
		return
	}
	if refuse != nil {
		defer refuse()
	}
	stack := debug.Stack()
	g.b.sec.panics.WithLabelValues(what).Inc()
	id := ""
	if cl != nil {
		id = cl.ID
		cl.Stop(fmt.Errorf("%w: %v", errHookPanic, r))
	}
	g.b.log.Error("panic while handling a client's packet; client closed", "hook", g.Hook.ID(), "method", what,
		"client", id, "panic", fmt.Sprint(r), "stack", string(bytes.TrimSpace(stack)))
}

func (g *guardedHook) OnConnect(cl *mqtt.Client, pk packets.Packet) (err error) {
	defer g.recovered(cl, "OnConnect", func() {
		err = packets.ErrImplementationSpecificError
	})
	return g.Hook.OnConnect(cl, pk)
}

func (g *guardedHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) (ok bool) {
	defer g.recovered(cl, "OnConnectAuthenticate", func() {
		ok = false
	})
	return g.Hook.OnConnectAuthenticate(cl, pk)
}

func (g *guardedHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) (ok bool) {
	defer g.recovered(cl, "OnACLCheck", func() {
		ok = false
	})
	return g.Hook.OnACLCheck(cl, topic, write)
}

func (g *guardedHook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	defer g.recovered(cl, "OnSessionEstablish", nil)
	g.Hook.OnSessionEstablish(cl, pk)
}

func (g *guardedHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	defer g.recovered(cl, "OnSessionEstablished", nil)
	g.Hook.OnSessionEstablished(cl, pk)
}

func (g *guardedHook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	defer g.recovered(cl, "OnDisconnect", nil)
	g.Hook.OnDisconnect(cl, err, expire)
}

func (g *guardedHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (out packets.Packet, err error) {
	defer g.recovered(cl, "OnPacketRead", func() {
		out, err = pk, packets.ErrImplementationSpecificError
	})
	return g.Hook.OnPacketRead(cl, pk)
}

func (g *guardedHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) (out packets.Packet) {
	defer g.recovered(cl, "OnPacketEncode", func() {
		out = pk
	})
	return g.Hook.OnPacketEncode(cl, pk)
}

func (g *guardedHook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, b []byte) {
	defer g.recovered(cl, "OnPacketSent", nil)
	g.Hook.OnPacketSent(cl, pk, b)
}

func (g *guardedHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (out packets.Packet, err error) {
	defer g.recovered(cl, "OnPublish", func() {
		out, err = pk, packets.ErrImplementationSpecificError
	})
	return g.Hook.OnPublish(cl, pk)
}

func (g *guardedHook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) (out packets.Packet) {
	defer g.recovered(cl, "OnSubscribe", func() {
		out = pk
		out.Filters = nil
	})
	return g.Hook.OnSubscribe(cl, pk)
}

func (g *guardedHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	defer g.recovered(cl, "OnSubscribed", nil)
	g.Hook.OnSubscribed(cl, pk, reasonCodes)
}

func (g *guardedHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	defer g.recovered(cl, "OnUnsubscribed", nil)
	g.Hook.OnUnsubscribed(cl, pk)
}

func (g *guardedHook) OnWill(cl *mqtt.Client, will mqtt.Will) (out mqtt.Will, err error) {
	defer g.recovered(cl, "OnWill", func() {
		out, err = will, errHookPanic
	})
	return g.Hook.OnWill(cl, will)
}

func (g *guardedHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) (out *mqtt.Subscribers) {
	defer g.recovered(nil, "OnSelectSubscribers", func() {
		out = subs
	})
	return g.Hook.OnSelectSubscribers(subs, pk)
}
