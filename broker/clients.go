package broker

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/shardq/shardq/hooks"
)

// The connected clients, for the admin API (SPEC 13): GET /api/v1/clients
// and /api/v1/queues/{q}/consumers list them, DELETE
// /api/v1/clients/{id} disconnects one. In a cluster each node lists its
// own clients and the node asked gathers the others' (clusterapi.go); a
// disconnect is sent to every node, and the one the client is connected
// to disconnects it.

// Client list bounds.
const (
	defaultClients = 1000
	maxClients     = 10000
)

// ClientList answers GET /api/v1/clients and /api/v1/queues/{q}/consumers.
// Total counts the clients that matched, of which Clients holds the first
// (by id) up to the limit.
type ClientList struct {
	Node         string       `json:"node"`
	Total        int          `json:"total"`
	Clients      []ClientView `json:"clients"`
	NodesMissing []string     `json:"nodes_missing,omitempty"`
}

// ClientView is one connected client.
type ClientView struct {
	ID          string `json:"id"`
	User        string `json:"user"`
	Node        string `json:"node"`
	Remote      string `json:"remote"`
	Listener    string `json:"listener"`
	Protocol    byte   `json:"protocol_version"`
	ConnectedAt string `json:"connected_at,omitempty"`
	CleanStart  bool   `json:"clean_start"`
	// SessionExpiry is the v5 Session Expiry Interval in seconds (0: the
	// session ends with the connection).
	SessionExpiry uint32 `json:"session_expiry_seconds"`
	// Unacknowledged counts the plain QoS 1 and 2 messages sent to the
	// client, or held for it, and not yet acknowledged: at most
	// mqtt.max_queued_messages (a client that stops reading sits there).
	Unacknowledged int                `json:"unacknowledged"`
	Subscriptions  []SubscriptionView `json:"subscriptions"`
	Consumers      []ConsumerView     `json:"consumers"`
}

// SubscriptionView is a subscription of a client.
type SubscriptionView struct {
	Filter string `json:"filter"`
	QoS    byte   `json:"qos"`
}

// ConsumerView is a client's queue subscription: the group it consumes
// for, how many unsettled messages it may hold and holds, and the
// partitions it claimed by name (none: any the group gives it).
type ConsumerView struct {
	Filter     string `json:"filter"`
	Queue      string `json:"queue"`
	Group      string `json:"group"`
	QoS        byte   `json:"qos"`
	Prefetch   int    `json:"prefetch"`
	Leased     int    `json:"leased"`
	Partitions []int  `json:"partitions"`
	Ack        string `json:"ack"`
}

// clientFilter is what a client list asks for.
type clientFilter struct {
	node, user, queue string
	limit             int
}

func parseClientFilter(r *http.Request) (clientFilter, error) {
	q := r.URL.Query()
	f := clientFilter{node: q.Get("node"), user: q.Get("user"), limit: defaultClients}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxClients {
			return f, fmt.Errorf("limit %q: give a number from 1 to %d", s, maxClients)
		}
		f.limit = n
	}
	return f, nil
}

func (a *adminAPI) listClients(w http.ResponseWriter, r *http.Request) {
	f, err := parseClientFilter(r)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	a.replyClients(w, r, f)
}

func (a *adminAPI) queueConsumers(w http.ResponseWriter, r *http.Request) {
	q := a.resolve(w, r, false)
	if q == nil {
		return
	}
	f, err := parseClientFilter(r)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	f.queue = q.Name()
	a.replyClients(w, r, f)
}

// replyClients answers the clients that match f, this node's and, in a
// cluster, every other node's.
func (a *adminAPI) replyClients(w http.ResponseWriter, r *http.Request, f clientFilter) {
	list := ClientList{Node: a.b.cfg.NodeID}
	list.Clients, list.Total = a.localClients(f)
	if a.gathering(r) {
		answers, missing := gather[ClientList](a, r, f.queue)
		list.NodesMissing = missing
		for _, o := range answers {
			list.Total += o.Total
			list.Clients = append(list.Clients, o.Clients...)
		}
	}
	slices.SortFunc(list.Clients, func(x, y ClientView) int {
		return cmp.Or(strings.Compare(x.ID, y.ID), strings.Compare(x.Node, y.Node))
	})
	if len(list.Clients) > f.limit {
		list.Clients = list.Clients[:f.limit]
	}
	a.reply(w, http.StatusOK, list)
}

// localClients returns the clients connected to this node that match f,
// sorted by id, at most f.limit, and how many matched.
func (a *adminAPI) localClients(f clientFilter) ([]ClientView, int) {
	out := []ClientView{}
	self := a.b.cfg.NodeID
	if f.node != "" && f.node != self {
		return out, 0
	}
	for _, cl := range a.b.server.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() {
			continue
		}
		if f.user != "" && string(cl.Properties.Username) != f.user {
			continue
		}
		v := clientView(cl, self, a.b.hook)
		if f.queue != "" {
			v.Consumers = slices.DeleteFunc(v.Consumers, func(c ConsumerView) bool { return c.Queue != f.queue })
			if len(v.Consumers) == 0 {
				continue
			}
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(x, y ClientView) int { return strings.Compare(x.ID, y.ID) })
	total := len(out)
	if total > f.limit {
		out = out[:f.limit]
	}
	return out, total
}

func clientView(cl *mqtt.Client, node string, h *hooks.Hook) ClientView {
	v := ClientView{ID: cl.ID, User: string(cl.Properties.Username), Node: node, Remote: cl.Net.Remote, Listener: cl.Net.Listener,
		Protocol: cl.Properties.ProtocolVersion, CleanStart: cl.Properties.Clean, SessionExpiry: cl.Properties.Props.SessionExpiryInterval,
		Unacknowledged: cl.State.Inflight.Len(), Subscriptions: []SubscriptionView{}, Consumers: []ConsumerView{}}
	if t := h.Since(cl); !t.IsZero() {
		v.ConnectedAt = t.UTC().Format(time.RFC3339)
	}
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		v.Subscriptions = append(v.Subscriptions, SubscriptionView{Filter: filter, QoS: sub.Qos})
	}
	slices.SortFunc(v.Subscriptions, func(x, y SubscriptionView) int { return strings.Compare(x.Filter, y.Filter) })
	for _, c := range h.Consumers(cl) {
		ack := "puback"
		if c.Explicit {
			ack = "explicit"
		}
		parts := c.Partitions
		if parts == nil {
			parts = []int{}
		}
		v.Consumers = append(v.Consumers, ConsumerView{Filter: c.Filter, Queue: c.Queue, Group: c.Group, QoS: c.QoS,
			Prefetch: c.Prefetch, Leased: c.Leased, Partitions: parts, Ack: ack})
	}
	return v
}

// ClientDisconnected answers DELETE /api/v1/clients/{id}.
type ClientDisconnected struct {
	Client string `json:"client"`
	Node   string `json:"node"`
}

// errNoSuchClient: no node has a client of that id connected.
var errNoSuchClient = errors.New("no such client")

// disconnectClient disconnects a client: a v5 client is sent DISCONNECT
// 0x98 (administrative action) first. Its session stays as its clean
// start and expiry say; it may connect again (a user's credentials are
// revoked in the users file, not here).
func (a *adminAPI) disconnectClient(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("client")
	if cl, ok := a.b.server.Clients.Get(id); ok && !cl.Net.Inline && !cl.Closed() {
		if cl.Properties.ProtocolVersion == 5 {
			// Written before the connection ends (the server disconnects
			// passively: newMQTTServer).
			_ = a.b.server.DisconnectClient(cl, packets.ErrAdministrativeAction)
		}
		cl.Stop(packets.ErrAdministrativeAction)
		a.log.Info("client disconnected by the admin API", "client", id)
		a.reply(w, http.StatusOK, ClientDisconnected{Client: id, Node: a.b.cfg.NodeID})
		return
	}
	if a.gathering(r) {
		others, _, failed := spread[ClientDisconnected](a, r, nil, false)
		if len(others) > 0 {
			a.reply(w, http.StatusOK, others[0])
			return
		}
		if len(failed) > 0 {
			a.fail(w, r, http.StatusServiceUnavailable, fmt.Errorf("client %q is not connected to this node, and some nodes did not answer (%s): ask again", id, strings.Join(failed, "; ")))
			return
		}
	}
	a.fail(w, r, http.StatusNotFound, fmt.Errorf("%w: %q is not connected", errNoSuchClient, id))
}
