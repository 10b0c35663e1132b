package broker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

// plainHook is the broker's side of ordinary MQTT across the nodes of a
// cluster (SPEC section 7; cluster/plain.go has the node's side):
//
//   - Interest: the node is told each plain filter the clients here
//     subscribe to (shared ones included), as it starts being subscribed
//     and once nobody is (OnSubscribed, OnUnsubscribed, OnClientExpired;
//     the sessions restored at start in OnStarted).
//   - Publishes made here on a plain topic are routed after mochi has
//     delivered them here (OnPublished, OnWillSent): OnSelectSubscribers
//     notes the shared subscriptions served here, which the node then
//     leaves out.
//   - Publishes routed here by another node are injected into mochi by
//     inline clients of this hook (Deliver); OnSelectSubscribers limits
//     their subscribers to those the sending node chose this node for.
//   - Client IDs: OnConnect records the client ID for this node, which
//     takes the session over from the node that held it; with clean start
//     false the session's subscriptions (queue subscriptions included)
//     and undelivered messages come along: OnSessionEstablish puts them in
//     an offline session that mochi then resumes, as it resumes a stored
//     one. TakeOver is the other end: the session leaves this node.
type plainHook struct {
	mqtt.HookBase
	b        *Broker
	log      *slog.Logger
	node     *cluster.Node
	server   *mqtt.Server
	sessions *sessionHook
	queues   *hooks.Hook

	routes   chan *routeClient
	routeIDs map[string]*routeClient // by client ID; fixed once attached

	// served holds, from OnSelectSubscribers to OnPublished, the shared
	// subscriptions served here for the publish of a client under way;
	// retainedIDs, from OnPublish to OnPublished, the record of its
	// retained publish.
	served      sync.Map // client ID -> servedHere
	retainedIDs sync.Map // client ID -> retainedHere
	// fanning holds, from OnPublish to OnPublished (or the client's
	// disconnect), a channel closed once the publish under way of a
	// client here has reached every subscriber here; delivering is held
	// for reading while Deliver hands routed publishes to them. mochi
	// acknowledges a QoS 1 publish before it reaches the subscribers, so
	// a session taken over by another node waits for both (TakeOver):
	// otherwise a message its publisher saw acknowledged could miss it.
	fanning    sync.Map // client ID -> chan struct{}
	delivering sync.RWMutex

	mu      sync.Mutex
	subs    map[string]map[string]bool // plain filters subscribed here, by client ID
	refs    map[string]int             // the clients subscribed, by filter
	claims  map[*mqtt.Client]*cluster.Claim
	resumed map[*mqtt.Client]*movedSession // taken over from another node, until OnSessionEstablish
	adopted map[*mqtt.Client]*movedSession // resumed here, until OnSessionEstablished stores it
	moved   map[*mqtt.Client]chan struct{} // leaving for another node: closed once disconnected
}

// routeClients is how many routed batches are delivered at once.
const routeClients = 8

// routeClient injects routed publishes; cur is the message under way,
// which OnSelectSubscribers reads on the same goroutine.
type routeClient struct {
	cl  *mqtt.Client
	cur atomic.Pointer[cluster.PlainMessage]
}

type servedHere struct {
	topic  string
	groups []string
}

// movedSession is a session moving between nodes (TakeOver).
type movedSession struct {
	User     string            `json:"user,omitempty"`
	Version  byte              `json:"version"`
	Clean    bool              `json:"clean,omitempty"`
	Expiry   uint32            `json:"expiry,omitempty"` // the session expiry interval (MQTT 5)
	Subs     []subRecord       `json:"subs,omitempty"`
	Inflight []storage.Message `json:"inflight,omitempty"`
}

// Timeouts of moving sessions.
const (
	claimTimeout    = 5 * time.Second // recording a client ID, the takeover included
	takeoverTimeout = 3 * time.Second // a client taken over to disconnect
)

func newPlainHook(b *Broker) *plainHook {
	return &plainHook{b: b, log: b.log.With("component", "cluster"), routes: make(chan *routeClient, routeClients),
		routeIDs: map[string]*routeClient{}, subs: map[string]map[string]bool{}, refs: map[string]int{},
		claims: map[*mqtt.Client]*cluster.Claim{}, resumed: map[*mqtt.Client]*movedSession{},
		adopted: map[*mqtt.Client]*movedSession{}, moved: map[*mqtt.Client]chan struct{}{}}
}

// attach completes the hook once the node, the mochi server and the other
// hooks exist.
func (h *plainHook) attach(sessions *sessionHook) {
	h.node, h.server, h.sessions, h.queues = h.b.node, h.b.server, sessions, h.b.hook
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	for i := range routeClients {
		cl := h.server.NewClient(nil, "cluster", fmt.Sprintf("$shardq-route-%x-%d", nonce, i), true)
		cl.Properties.ProtocolVersion = 5
		rc := &routeClient{cl: cl}
		h.routeIDs[cl.ID] = rc
		h.routes <- rc
	}
}

// ID implements mqtt.Hook.
func (h *plainHook) ID() string { return "shardq-cluster" }

// Provides implements mqtt.Hook.
func (h *plainHook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnStarted,
		mqtt.OnConnect,
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnClientExpired,
		mqtt.OnSubscribed,
		mqtt.OnUnsubscribed,
		mqtt.OnPublish,
		mqtt.OnPublished,
		mqtt.OnWill,
		mqtt.OnWillSent,
		mqtt.OnSelectSubscribers,
	}, []byte{b})
}

func (h *plainHook) isRoute(cl *mqtt.Client) bool {
	rc := h.routeIDs[cl.ID]
	return rc != nil && rc.cl == cl
}

// addInterest records that client subscribes to filter.
func (h *plainHook) addInterest(client, filter string) {
	if filter == "" || queue.IsQueueTopic(filter) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	fs := h.subs[client]
	if fs == nil {
		fs = map[string]bool{}
		h.subs[client] = fs
	}
	if fs[filter] {
		return
	}
	fs[filter] = true
	h.refs[filter]++
	if h.refs[filter] == 1 {
		h.node.Interest(filter, true)
	}
}

// dropInterest records that client no longer subscribes to filter, or
// to anything when filter is "".
func (h *plainHook) dropInterest(client, filter string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fs := h.subs[client]
	drop := func(f string) {
		delete(fs, f)
		h.refs[f]--
		if h.refs[f] <= 0 {
			delete(h.refs, f)
			h.node.Interest(f, false)
		}
	}
	if filter != "" {
		if fs[filter] {
			drop(filter)
		}
	} else {
		for f := range fs {
			drop(f)
		}
	}
	if len(fs) == 0 {
		delete(h.subs, client)
	}
}

// OnStarted gives the node the subscriptions of the sessions mochi
// restored from storage, and records their client IDs (a client another
// node holds meanwhile loses its session here).
func (h *plainHook) OnStarted() {
	clients := h.server.Clients.GetAll()
	for id, cl := range clients {
		for f := range cl.State.Subscriptions.GetAll() {
			h.addInterest(id, f)
		}
	}
	go h.claimRestored(clients)
}

func (h *plainHook) claimRestored(clients map[string]*mqtt.Client) {
	for id, cl := range clients {
		if !cl.Closed() {
			continue // connected meanwhile: recorded by OnConnect
		}
		ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
		c, holder, err := h.node.ClaimRestored(ctx, id, string(cl.Properties.Username))
		cancel()
		switch {
		case err != nil:
			h.log.Warn("recording a restored session's client ID", "client", id, "err", err)
		case holder != "":
			h.log.Info("restored session dropped: its client is on another node", "client", id, "node", holder)
			h.endSession(cl)
		case c != nil:
			h.mu.Lock()
			h.claims[cl] = c
			h.mu.Unlock()
		}
	}
}

// OnConnect records the client ID for this node, taking the session over
// from the node that held it. A client ID whose session is another
// user's is refused (0x85), as is a client whose ID cannot be recorded
// (0x88): it might be connected elsewhere.
func (h *plainHook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	c, data, found, err := h.node.ClaimClient(ctx, cl.ID, string(cl.Properties.Username))
	switch {
	case errors.Is(err, cluster.ErrSessionOfOtherUser):
		h.b.sec.authFailure(authClientIDTaken)
		return refuse(cl, packets.ErrClientIdentifierNotValid.Code, packets.Err3ClientIdentifierNotValid.Code,
			"the client ID belongs to another user's session")
	case err != nil:
		h.log.Warn("client refused: its client ID cannot be recorded in the cluster", "client", cl.ID, "err", err)
		return refuse(cl, packets.ErrServerUnavailable.Code, packets.Err3ServerUnavailable.Code,
			"the cluster cannot record the client ID")
	}
	var st *movedSession
	if found && len(data) > 0 {
		st = &movedSession{}
		if err := json.Unmarshal(data, st); err != nil {
			h.log.Error("session taken over from another node unreadable; starting anew", "client", cl.ID, "err", err)
			st = nil
		}
	}
	h.mu.Lock()
	h.claims[cl] = c
	if st != nil {
		h.resumed[cl] = st
	}
	h.mu.Unlock()
	return nil
}

// OnSessionEstablish puts a session taken over from another node, with
// clean start false, in an offline session of the client ID, which mochi
// then resumes (session present, subscriptions, undelivered messages)
// as it resumes a stored one. A session here already is resumed instead.
func (h *plainHook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
	st := h.resumed[cl]
	delete(h.resumed, cl)
	h.mu.Unlock()
	if st == nil || pk.Connect.Clean || (st.Clean && st.Version < 5) {
		return
	}
	if _, ok := h.server.Clients.Get(cl.ID); ok {
		return
	}
	h.offlineSession(cl.ID, cl.Net.Listener, cl.Properties.Username, st)
	h.mu.Lock()
	h.adopted[cl] = st
	h.mu.Unlock()
	h.log.Debug("session taken over from another node", "client", cl.ID, "subscriptions", len(st.Subs), "inflight", len(st.Inflight))
}

// offlineSession makes st the session of clientID here, offline: its
// subscriptions and undelivered messages, which mochi resumes when the
// client connects, as it resumes a stored session.
func (h *plainHook) offlineSession(clientID, listener string, username []byte, st *movedSession) *mqtt.Client {
	old := h.server.NewClient(nil, listener, clientID, false)
	old.Properties.ProtocolVersion = st.Version
	old.Properties.Username = username
	old.Properties.Clean = st.Clean
	if st.Version == 5 {
		old.Properties.Props.SessionExpiryInterval, old.Properties.Props.SessionExpiryIntervalFlag = st.Expiry, true
	}
	for _, rec := range st.Subs {
		sub := rec.subscription()
		old.State.Subscriptions.Add(sub.Filter, sub)
		if queue.IsQueueTopic(sub.Filter) {
			h.queues.RestoreSubscription(clientID, sub.Filter, rec.Props)
			continue
		}
		if h.server.Topics.Subscribe(clientID, sub) {
			atomic.AddInt64(&h.server.Info.Subscriptions, 1)
		}
		h.addInterest(clientID, sub.Filter)
	}
	for _, m := range st.Inflight {
		old.State.Inflight.Set(m.ToPacket())
	}
	old.Stop(packets.ErrSessionTakenOver)
	h.server.Clients.Add(old)
	return old
}

// storeSubs stores the subscriptions of st, the session of cl, in this
// node's storage.
func (h *plainHook) storeSubs(cl *mqtt.Client, st *movedSession) {
	for _, rec := range st.Subs {
		sub := rec.subscription()
		h.sessions.OnSubscribed(cl, packets.Packet{Filters: packets.Subscriptions{sub}, Properties: packets.Properties{User: rec.Props}},
			[]byte{sub.Qos})
	}
}

// Adopt implements cluster.PlainHandler: it holds, offline, the session
// of a client whose node left the cluster, records the client ID and the
// session for this node, and stores the session here as mochi stores one.
func (h *plainHook) Adopt(clientID, user string, data []byte) bool {
	st := &movedSession{}
	if err := json.Unmarshal(data, st); err != nil {
		h.log.Error("a session recorded in the cluster unreadable; not adopted", "client", clientID, "err", err)
		return false
	}
	if _, ok := h.server.Clients.Get(clientID); ok {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	c, holder, err := h.node.ClaimRestored(ctx, clientID, user)
	cancel()
	if err != nil || holder != "" {
		return false
	}
	cl := h.offlineSession(clientID, "cluster", []byte(user), st)
	h.mu.Lock()
	h.claims[cl] = c
	h.mu.Unlock()
	// Stored here as if the client had connected and left.
	h.sessions.OnSessionEstablished(cl, packets.Packet{})
	h.storeSubs(cl, st)
	if v, err := encodeClient(cl, cl.StopTime()); err == nil {
		h.sessions.write("session", clientID, badger.SessionWrite{Record: badger.SessionClient, Owner: clientID, Value: v})
	}
	h.node.SaveSession(clientID, user, data)
	return true
}

// saveSession records in the cluster the session of cl, when it outlives
// its connection, or drops its record. The channel returned is closed
// once the record is in etcd (nil: nothing to wait for).
func (h *plainHook) saveSession(cl *mqtt.Client) <-chan struct{} {
	if !outlives(cl) {
		h.node.DropSession(cl.ID)
		return nil
	}
	st := h.sessionOf(cl)
	st.Inflight = nil // what is queued for the session stays here
	data, err := json.Marshal(st)
	if err != nil {
		h.log.Error("a session's record not encoded", "client", cl.ID, "err", err)
		return nil
	}
	return h.node.SaveSession(cl.ID, string(cl.Properties.Username), data)
}

// sessionRecordWait bounds how long a SUBACK waits for the session's
// record (OnSubscribed).
const sessionRecordWait = 5 * time.Second

// OnSessionEstablished stores a session taken over from another node
// (when it outlives its connection), and disconnects a client another
// node took while it connected here.
func (h *plainHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
	st := h.adopted[cl]
	delete(h.adopted, cl)
	c := h.claims[cl]
	h.mu.Unlock()
	if c != nil && !h.node.Holds(c) {
		h.log.Info("client connected on another node meanwhile; disconnected", "client", cl.ID)
		_ = h.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
		cl.Stop(packets.ErrSessionTakenOver)
		return
	}
	defer h.saveSession(cl)
	if st == nil || !h.sessions.isStored(cl.ID) {
		return
	}
	h.storeSubs(cl, st)
	for _, m := range cl.State.Inflight.GetAll(false) {
		h.sessions.OnQosPublish(cl, m, m.Created, 0)
	}
}

// OnDisconnect releases the client ID of a session that ends with its
// connection, and tells TakeOver that a client leaving for another node
// is gone.
func (h *plainHook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	h.fanned(cl.ID)
	h.mu.Lock()
	done, moving := h.moved[cl]
	delete(h.moved, cl)
	c := h.claims[cl]
	release := expire && !cl.IsTakenOver() && !moving
	if moving || expire || cl.IsTakenOver() {
		delete(h.claims, cl)
	}
	h.mu.Unlock()
	if moving {
		close(done)
		return
	}
	if release {
		h.node.DropSession(cl.ID) // before the client ID: nobody adopts it
	}
	if release && c != nil {
		h.node.ReleaseClient(c)
	}
}

// OnClientExpired forgets an expired session.
func (h *plainHook) OnClientExpired(cl *mqtt.Client) {
	h.dropInterest(cl.ID, "")
	h.node.DropSession(cl.ID)
	h.mu.Lock()
	c := h.claims[cl]
	delete(h.claims, cl)
	h.mu.Unlock()
	if c != nil {
		h.node.ReleaseClient(c)
	}
}

// OnSubscribed records the plain filters granted. mochi calls it before
// it writes the SUBACK: a session that outlives its connection has its
// record, with these subscriptions, in etcd first (for up to
// sessionRecordWait), so that a node lost right after the SUBACK leaves
// them to the node adopting the session.
func (h *plainHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	for i, f := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code {
			h.addInterest(cl.ID, f.Filter)
		}
	}
	if !outlives(cl) {
		return
	}
	if recorded := h.saveSession(cl); recorded != nil {
		select {
		case <-recorded:
		case <-time.After(sessionRecordWait):
			h.log.Warn("a session's subscriptions not recorded in the cluster in time; SUBACK sent, the record follows: a node adopting the session before it lacks them",
				"client", cl.ID, "waited", sessionRecordWait)
		}
	}
}

// OnUnsubscribed forgets the filters removed (mochi also calls it when a
// session ends).
func (h *plainHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, f := range pk.Filters {
		if f.Filter != "" {
			h.dropInterest(cl.ID, f.Filter)
		}
	}
	if outlives(cl) {
		h.saveSession(cl)
	}
}

// OnPublish starts a client's publish: nothing is served here for it yet.
func (h *plainHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.isRoute(cl) {
		return pk, nil
	}
	h.served.Delete(cl.ID)
	h.retainedIDs.Delete(cl.ID)
	if old, ok := h.fanning.Swap(cl.ID, make(chan struct{})); ok {
		close(old.(chan struct{})) // its publish ended without OnPublished
	}
	if pk.FixedHeader.Retain && pk.TopicName != "" && !queue.IsQueueTopic(pk.TopicName) && h.server.Options.Capabilities.RetainAvailable != 0 {
		// Recorded cluster-wide before it is acknowledged (cluster/retained.go).
		id := h.node.Retain(cluster.PlainMessage{Topic: pk.TopicName, Payload: pk.Payload, QoS: pk.FixedHeader.Qos, Retain: true,
			Properties: encodePlainProps(pk.Properties), Origin: cl.ID}, retainWait)
		h.retainedIDs.Store(cl.ID, retainedHere{topic: pk.TopicName, id: id})
	}
	return pk, nil
}

// retainWait bounds how long a retained publish waits for its record in
// etcd before it is acknowledged (etcd out of reach: it is recorded once
// etcd is back).
const retainWait = 2 * time.Second

// retainedHere is the record of a retained publish made here, from
// OnPublish to OnPublished.
type retainedHere struct {
	topic string
	id    cluster.RetainedID
}

// OnWill starts a will like OnPublish a publish.
func (h *plainHook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	h.served.Delete(cl.ID)
	return will, nil
}

// OnSelectSubscribers limits a routed publish to the subscribers the
// sending node chose this node for, and notes which shared subscriptions
// a publish made here is served by here.
func (h *plainHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if rc := h.routeIDs[pk.Origin]; rc != nil {
		if m := rc.cur.Load(); m != nil {
			for g := range subs.Shared {
				if !slices.Contains(m.Groups, g) {
					delete(subs.Shared, g)
				}
			}
			if m.SharedOnly {
				clear(subs.Subscriptions)
				clear(subs.InlineSubscriptions)
			}
		}
		return subs
	}
	if len(subs.Shared) == 0 || queue.IsQueueTopic(pk.TopicName) {
		return subs
	}
	groups := make([]string, 0, len(subs.Shared))
	for g, members := range subs.Shared {
		if len(members) > 0 {
			groups = append(groups, g)
		}
	}
	h.served.Store(pk.Origin, servedHere{topic: pk.TopicName, groups: groups})
	return subs
}

// OnPublished routes a publish made here to the other nodes.
func (h *plainHook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	if h.isRoute(cl) {
		return
	}
	h.fanned(cl.ID)
	h.route(cl, pk)
}

// fanned notes that the publish under way of the client has reached
// every subscriber here, or never will.
func (h *plainHook) fanned(clientID string) {
	if ch, ok := h.fanning.LoadAndDelete(clientID); ok {
		close(ch.(chan struct{}))
	}
}

// waitFanned waits until every publish under way here has reached the
// subscribers here, for up to takeoverTimeout.
func (h *plainHook) waitFanned() {
	deadline := time.After(takeoverTimeout)
	h.fanning.Range(func(_, ch any) bool {
		select {
		case <-ch.(chan struct{}):
			return true
		case <-deadline:
			return false
		}
	})
	// A barrier: the deliveries under way are over.
	h.delivering.Lock()
	//lint:ignore SA2001 the lock is taken only to wait for the readers
	h.delivering.Unlock()
}

// OnWillSent routes a will published here to the other nodes.
func (h *plainHook) OnWillSent(cl *mqtt.Client, pk packets.Packet) { h.route(cl, pk) }

func (h *plainHook) route(cl *mqtt.Client, pk packets.Packet) {
	v, _ := h.served.LoadAndDelete(cl.ID)
	if pk.Ignore || pk.TopicName == "" || queue.IsQueueTopic(pk.TopicName) {
		return
	}
	var local []string
	if s, ok := v.(servedHere); ok && s.topic == pk.TopicName {
		local = s.groups
	}
	m := cluster.PlainMessage{Topic: pk.TopicName, Payload: pk.Payload, QoS: pk.FixedHeader.Qos,
		Retain: pk.FixedHeader.Retain, Properties: encodePlainProps(pk.Properties), Origin: pk.Origin}
	if r, ok := h.retainedIDs.LoadAndDelete(cl.ID); ok && r.(retainedHere).topic == pk.TopicName {
		m.Retained = r.(retainedHere).id
	}
	h.node.RoutePlain(m, local)
}

// Deliver implements cluster.PlainHandler: it publishes the messages
// another node routed here to the subscribers here, through mochi, as
// an inline client.
func (h *plainHook) Deliver(msgs []cluster.PlainMessage) {
	h.delivering.RLock()
	defer h.delivering.RUnlock()
	rc := <-h.routes
	defer func() { h.routes <- rc }()
	for i := range msgs {
		h.deliver(rc, &msgs[i])
	}
}

// packetOf returns the publish packet of a message from another node.
func packetOf(m *cluster.PlainMessage) (packets.Packet, error) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: m.QoS, Retain: m.Retain},
		TopicName:   m.Topic,
		Payload:     m.Payload,
		PacketID:    uint16(m.QoS), // inline publishes are not acknowledged; QoS 1 and 2 need an ID
	}
	if len(m.Properties) > 0 {
		p, err := decodePlainProps(m.Properties)
		if err != nil {
			return pk, err
		}
		pk.Properties = p
	}
	return pk, nil
}

func (h *plainHook) deliver(rc *routeClient, m *cluster.PlainMessage) {
	pk, err := packetOf(m)
	if err != nil {
		h.log.Warn("routed publish with unreadable properties; dropped", "topic", m.Topic, "err", err)
		return
	}
	if m.SharedOnly && !servesAny(h.server.Topics.Subscribers(m.Topic), m.Groups) {
		// Nobody here to deliver to (mochi would give it to every plain
		// subscriber): a retained message is only stored.
		if m.Retain {
			h.retain(rc, pk)
			h.node.CheckRetained(*m)
		}
		return
	}
	rc.cur.Store(m)
	err = h.server.InjectPacket(rc.cl, pk)
	rc.cur.Store(nil)
	if err != nil {
		h.log.Warn("routed publish not delivered", "topic", m.Topic, "err", err)
	}
	if m.Retain {
		h.node.CheckRetained(*m)
	}
}

// Retained implements cluster.PlainHandler: it stores the retained
// messages the cluster records, and with all clears the others, in
// mochi's store and in this node's storage, which mochi reads at start.
func (h *plainHook) Retained(msgs []cluster.PlainMessage, all bool) {
	if h.server.Options.Capabilities.RetainAvailable == 0 {
		return
	}
	rc := <-h.routes
	defer func() { h.routes <- rc }()
	recorded := map[string]bool{} // a tombstone included
	for i := range msgs {
		m := &msgs[i]
		pk, err := packetOf(m)
		if err != nil {
			h.log.Warn("retained record with unreadable properties; skipped", "topic", m.Topic, "err", err)
			continue
		}
		recorded[m.Topic] = true
		if len(m.Payload) == 0 {
			h.clearRetained(rc, m.Topic)
			continue
		}
		h.retain(rc, pk)
	}
	if !all {
		return
	}
	// A retained message here that the cluster never recorded (published
	// here while etcd was out of reach, or kept from before the cluster
	// recorded them) is recorded now.
	here := map[string]packets.Packet{}
	if stored, err := h.sessions.StoredRetainedMessages(); err == nil {
		for _, m := range stored {
			here[m.TopicName] = m.ToPacket()
		}
	}
	maps.Copy(here, h.server.Topics.Retained.GetAll())
	for topic, pk := range here {
		if !recorded[topic] && len(pk.Payload) > 0 {
			h.node.Retain(cluster.PlainMessage{Topic: topic, Payload: pk.Payload, QoS: pk.FixedHeader.Qos, Retain: true,
				Properties: encodePlainProps(pk.Properties), Origin: pk.Origin}, 0)
		}
	}
}

// clearRetained clears a topic's retained message here, in mochi's store
// and in storage.
func (h *plainHook) clearRetained(rc *routeClient, topic string) {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true}, TopicName: topic}
	h.server.Topics.RetainMessage(pk)
	h.sessions.OnRetainMessage(rc.cl, pk, -1)
	atomic.StoreInt64(&h.server.Info.Retained, int64(h.server.Topics.Retained.Len()))
}

// servesAny reports whether one of the shared subscriptions named has
// members among subs.
func servesAny(subs *mqtt.Subscribers, groups []string) bool {
	for _, g := range groups {
		if len(subs.Shared[g]) > 0 {
			return true
		}
	}
	return false
}

// retain stores a routed retained message (an empty payload clears the
// topic's), as mochi stores one published here.
func (h *plainHook) retain(rc *routeClient, pk packets.Packet) {
	if h.server.Options.Capabilities.RetainAvailable == 0 {
		return
	}
	pk.ProtocolVersion = rc.cl.Properties.ProtocolVersion
	pk.Origin = rc.cl.ID
	pk.Created = time.Now().Unix()
	if e := pk.Properties.MessageExpiryInterval; e > 0 {
		pk.Expiry = pk.Created + int64(e)
	}
	var r int64 = 1
	if _, ok := h.server.Topics.Retained.Get(pk.TopicName); ok {
		// The topic has a retained message: its particle in mochi's
		// index holds the topic already, and only the message is
		// replaced. mochi's RetainMessage would write the particle's
		// retain path again, which mochi's wildcard subscribe reads with
		// no lock: a data race between a routed retained message (this
		// runs on a cluster goroutine) and any client subscribing.
		h.server.Topics.Retained.Add(pk.TopicName, pk.Copy(false))
	} else {
		r = h.server.Topics.RetainMessage(pk.Copy(false))
	}
	h.sessions.OnRetainMessage(rc.cl, pk, r)
	atomic.StoreInt64(&h.server.Info.Retained, int64(h.server.Topics.Retained.Len()))
}

// TakeOver implements cluster.PlainHandler: the client connected on
// another node. Its connection here gets a DISCONNECT 0x8E (session taken
// over) and is closed; its session (subscriptions, their queue
// properties, undelivered messages) is returned and dropped here.
func (h *plainHook) TakeOver(clientID, node string) ([]byte, bool) {
	cl, ok := h.server.Clients.Get(clientID)
	if !ok {
		h.sessions.drop("session taken over", clientID)
		h.queues.ForgetSession(clientID)
		return nil, false
	}
	// The subscriptions before the connection ends (a session ending with
	// it loses them then); the messages queued until it has ended.
	st := h.sessionOf(cl)
	done := make(chan struct{})
	h.mu.Lock()
	h.moved[cl] = done
	delete(h.claims, cl)
	h.mu.Unlock()
	if !cl.Closed() {
		_ = h.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
		cl.Stop(packets.ErrSessionTakenOver)
		select {
		case <-done:
		case <-time.After(takeoverTimeout):
			h.log.Warn("client taken over by another node still attached here", "client", clientID)
		}
	}
	// With the messages acknowledged to their publishers before it was
	// taken over.
	h.waitFanned()
	st.addInflight(cl)
	h.endSession(cl)
	data, err := json.Marshal(st)
	if err != nil {
		h.log.Error("session taken over not encoded; the client starts anew", "client", clientID, "err", err)
		data = nil
	}
	h.log.Info("session taken over by another node", "client", clientID, "node", node)
	return data, data != nil
}

// sessionOf returns the session of cl as it moves to another node.
func (h *plainHook) sessionOf(cl *mqtt.Client) *movedSession {
	st := &movedSession{User: string(cl.Properties.Username), Version: cl.Properties.ProtocolVersion, Clean: cl.Properties.Clean,
		Expiry: cl.Properties.Props.SessionExpiryInterval}
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		rec := subRecord{Sub: storage.Subscription{Filter: filter, Qos: sub.Qos, Identifier: sub.Identifier,
			NoLocal: sub.NoLocal, RetainHandling: sub.RetainHandling, RetainAsPublished: sub.RetainAsPublished}}
		if queue.IsQueueTopic(filter) {
			rec.Props = h.queues.SubscriptionProps(cl.ID, filter)
		}
		st.Subs = append(st.Subs, rec)
	}
	st.addInflight(cl)
	return st
}

// addInflight adds the undelivered messages of cl that st lacks.
func (st *movedSession) addInflight(cl *mqtt.Client) {
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type != packets.Publish || pk.TopicName == "" || queue.IsQueueTopic(pk.TopicName) {
			continue // an acknowledgement of the client's publish; a topic alias; a queue delivery
		}
		if slices.ContainsFunc(st.Inflight, func(m storage.Message) bool { return m.PacketID == pk.PacketID }) {
			continue
		}
		p := pk.Properties
		st.Inflight = append(st.Inflight, storage.Message{
			T: storage.InflightKey, Client: cl.ID, Origin: pk.Origin, PacketID: pk.PacketID, FixedHeader: pk.FixedHeader,
			TopicName: pk.TopicName, Payload: pk.Payload, Created: pk.Created,
			Properties: storage.MessageProperties{
				PayloadFormat: p.PayloadFormat, PayloadFormatFlag: p.PayloadFormatFlag,
				MessageExpiryInterval: p.MessageExpiryInterval, ContentType: p.ContentType,
				ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData,
				SubscriptionIdentifier: p.SubscriptionIdentifier, User: p.User,
			},
		})
	}
}

// endSession drops the session of cl here: it lives on another node.
func (h *plainHook) endSession(cl *mqtt.Client) {
	h.server.UnsubscribeClient(cl)
	h.dropInterest(cl.ID, "")
	cl.ClearInflights()
	if cur, ok := h.server.Clients.Get(cl.ID); ok && cur == cl {
		h.server.Clients.Delete(cl.ID)
	}
	h.sessions.drop("session taken over", cl.ID)
	h.queues.ForgetSession(cl.ID)
	h.mu.Lock()
	delete(h.moved, cl)
	delete(h.claims, cl)
	h.mu.Unlock()
}

// encodePlainProps encodes the properties of a publish that other nodes
// pass on (nil when there are none).
func encodePlainProps(p packets.Properties) []byte {
	if !p.PayloadFormatFlag && p.MessageExpiryInterval == 0 && p.ContentType == "" && p.ResponseTopic == "" &&
		len(p.CorrelationData) == 0 && len(p.User) == 0 {
		return nil
	}
	b, _ := json.Marshal(storage.MessageProperties{PayloadFormat: p.PayloadFormat, PayloadFormatFlag: p.PayloadFormatFlag,
		MessageExpiryInterval: p.MessageExpiryInterval, ContentType: p.ContentType, ResponseTopic: p.ResponseTopic,
		CorrelationData: p.CorrelationData, User: p.User})
	return b
}

func decodePlainProps(b []byte) (packets.Properties, error) {
	var mp storage.MessageProperties
	if err := json.Unmarshal(b, &mp); err != nil {
		return packets.Properties{}, fmt.Errorf("broker: routed publish properties: %w", err)
	}
	return packets.Properties{PayloadFormat: mp.PayloadFormat, PayloadFormatFlag: mp.PayloadFormatFlag,
		MessageExpiryInterval: mp.MessageExpiryInterval, ContentType: mp.ContentType, ResponseTopic: mp.ResponseTopic,
		CorrelationData: mp.CorrelationData, User: mp.User}, nil
}
