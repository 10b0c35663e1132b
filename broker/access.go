package broker

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// accessHook lets every client connect and publish, and refuses
// subscriptions to the filters of mqtt.deny_subscribe. It replaces mochi's
// allow-all hook: mochi grants access when any hook does.
type accessHook struct {
	mqtt.HookBase
	deny map[string]bool
}

func newAccessHook(deny []string) *accessHook {
	h := &accessHook{deny: map[string]bool{}}
	for _, f := range deny {
		h.deny[f] = true
	}
	return h
}

func (h *accessHook) ID() string { return "shardq-access" }

func (h *accessHook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck}, []byte{b})
}

func (h *accessHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool { return true }

func (h *accessHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	return write || !h.deny[topic]
}
