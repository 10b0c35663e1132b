package hooks

import "github.com/mochi-mqtt/server/v2/packets"

// SubscriptionProps returns the user properties of a client's queue
// subscription (nil for none): a session moving to another node carries
// them, to be given there to RestoreSubscription.
func (h *Hook) SubscriptionProps(clientID, filter string) []packets.UserProperty {
	return h.savedProps(clientID, filter)
}

// ForgetSession forgets the queue subscriptions of a client whose session
// moved to another node.
func (h *Hook) ForgetSession(clientID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.props, clientID)
}
