package hooks

import "github.com/mochi-mqtt/server/v2/packets"

// RestoreSubscription gives the hook the user properties of a queue
// subscription of a session restored from storage, so that the session,
// when its client comes back, consumes with the same group, prefetch, ack
// mode and partitions. Call it before the client connects.
func (h *Hook) RestoreSubscription(clientID, filter string, props []packets.UserProperty) {
	if props != nil {
		h.saveProps(clientID, filter, props)
	}
}
