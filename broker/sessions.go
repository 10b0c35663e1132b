package broker

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

// sessionHook keeps, in shard 0 of the node's store (badger.Sessions),
// what must outlive the node's process: the sessions of clients whose
// session outlives their connection (MQTT 5: a session expiry; 3.1.1:
// clean session false), their subscriptions, queue subscriptions included,
// their undelivered QoS 1/2 messages of plain topics, and the retained
// messages. Each change of a session or a retained message is fsynced
// before the hook returns, so before mochi acknowledges the packet that
// caused it (a retained PUBLISH's PUBACK, a SUBACK); the records of
// outgoing messages, which mochi writes after the publisher's PUBACK
// anyway, are group-committed without waiting. mochi reads it all back at
// Serve (readStore).
type sessionHook struct {
	mqtt.HookBase
	store *badger.Sessions
	log   *slog.Logger
	// restore hands the user properties of a stored queue subscription to
	// the queue hook.
	restore func(clientID, filter string, props []packets.UserProperty)
	now     func() time.Time

	mu sync.Mutex
	// stored holds the IDs of the clients with a stored session, and the
	// packet IDs of their stored inflight messages.
	stored map[string]map[uint16]struct{}
}

func newSessionHook(store *badger.Sessions, restore func(string, string, []packets.UserProperty), log *slog.Logger) *sessionHook {
	return &sessionHook{store: store, restore: restore, log: log, now: time.Now, stored: map[string]map[uint16]struct{}{}}
}

// ID implements mqtt.Hook.
func (h *sessionHook) ID() string { return "shardq-sessions" }

// Provides implements mqtt.Hook.
func (h *sessionHook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnSubscribed,
		mqtt.OnUnsubscribed,
		mqtt.OnRetainMessage,
		mqtt.OnRetainedExpired,
		mqtt.OnQosPublish,
		mqtt.OnQosComplete,
		mqtt.OnQosDropped,
		mqtt.OnClientExpired,
		mqtt.StoredClients,
		mqtt.StoredSubscriptions,
		mqtt.StoredInflightMessages,
		mqtt.StoredRetainedMessages,
	}, []byte{b})
}

// clientRecord is the value of a SessionClient record.
type clientRecord struct {
	Client storage.Client `json:"client"`
	// Disconnected is when the client disconnected (Unix seconds); 0 while
	// connected, or if the node stopped first: its expiry then runs from
	// the restart.
	Disconnected int64 `json:"disconnected,omitempty"`
}

// subRecord is the value of a SessionSubscription record: the
// subscription and the SUBSCRIBE's user properties (a queue subscription's
// group, prefetch, ack mode, partitions).
type subRecord struct {
	Sub   storage.Subscription   `json:"sub"`
	Props []packets.UserProperty `json:"props,omitempty"`
}

// subscription returns the subscription the record keeps.
func (rec subRecord) subscription() packets.Subscription {
	return packets.Subscription{Filter: rec.Sub.Filter, Qos: rec.Sub.Qos, Identifier: rec.Sub.Identifier,
		NoLocal: rec.Sub.NoLocal, RetainHandling: rec.Sub.RetainHandling, RetainAsPublished: rec.Sub.RetainAsPublished}
}

// outlives reports whether the client's session outlives its connection.
func outlives(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

func (h *sessionHook) isStored(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.stored[id]
	return ok
}

func (h *sessionHook) write(what, client string, ws ...badger.SessionWrite) {
	if err := h.store.Write(ws...); err != nil {
		h.log.Error("session state not stored", "what", what, "client", client, "err", err)
	}
}

// submit queues writes that no acknowledgement waits for (an outgoing
// message's record and its removal): they are committed with the next
// group commit, within milliseconds, without holding up the caller.
func (h *sessionHook) submit(what, client string, ws ...badger.SessionWrite) {
	h.store.Submit(ws, func(err error) {
		if err != nil {
			h.log.Error("session state not stored", "what", what, "client", client, "err", err)
		}
	})
}

// dropWrites are the writes that remove every record of a client.
func dropWrites(id string) []badger.SessionWrite {
	return []badger.SessionWrite{
		{Record: badger.SessionSubscription, Owner: id, DeleteOwner: true},
		{Record: badger.SessionInflight, Owner: id, DeleteOwner: true},
		{Record: badger.SessionClient, Owner: id, Delete: true},
	}
}

// drop removes a stored session.
func (h *sessionHook) drop(what, id string) {
	h.mu.Lock()
	_, ok := h.stored[id]
	delete(h.stored, id)
	h.mu.Unlock()
	if ok {
		h.write(what, id, dropWrites(id)...)
	}
}

func encodeClient(cl *mqtt.Client, disconnected int64) ([]byte, error) {
	p := cl.Properties.Props.Copy(false)
	return json.Marshal(clientRecord{Disconnected: disconnected, Client: storage.Client{
		ID:              cl.ID,
		T:               storage.ClientKey,
		Remote:          cl.Net.Remote,
		Listener:        cl.Net.Listener,
		Username:        cl.Properties.Username,
		Clean:           cl.Properties.Clean,
		ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			SessionExpiryInterval:     p.SessionExpiryInterval,
			SessionExpiryIntervalFlag: p.SessionExpiryIntervalFlag,
			AuthenticationMethod:      p.AuthenticationMethod,
			AuthenticationData:        p.AuthenticationData,
			RequestProblemInfo:        p.RequestProblemInfo,
			RequestProblemInfoFlag:    p.RequestProblemInfoFlag,
			RequestResponseInfo:       p.RequestResponseInfo,
			ReceiveMaximum:            p.ReceiveMaximum,
			TopicAliasMaximum:         p.TopicAliasMaximum,
			User:                      p.User,
			MaximumPacketSize:         p.MaximumPacketSize,
		},
		Will: storage.ClientWill(cl.Properties.Will),
	}})
}

// Stop, called by mochi's Close before the broker closes the storage,
// waits for the records submitted without waiting.
func (h *sessionHook) Stop() error {
	if err := h.store.Flush(); err != nil {
		h.log.Error("session state not stored", "err", err)
	}
	return nil
}

// OnSessionEstablished stores the session of a client whose session
// outlives its connection; a clean start drops what was stored before.
func (h *sessionHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	keep := outlives(cl)
	h.mu.Lock()
	_, had := h.stored[cl.ID]
	switch {
	case keep && (pk.Connect.Clean || !had):
		h.stored[cl.ID] = map[uint16]struct{}{}
	case !keep:
		delete(h.stored, cl.ID)
	}
	h.mu.Unlock()
	var ws []badger.SessionWrite
	if had && (pk.Connect.Clean || !keep) {
		ws = dropWrites(cl.ID)
	}
	if keep {
		v, err := encodeClient(cl, 0)
		if err != nil {
			h.log.Error("session not stored", "client", cl.ID, "err", err)
			return
		}
		ws = append(ws, badger.SessionWrite{Record: badger.SessionClient, Owner: cl.ID, Value: v})
	}
	h.write("session", cl.ID, ws...)
}

// OnDisconnect drops a session that ends with its connection, and records
// when a kept one was left, from which its expiry runs.
func (h *sessionHook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if cl.Net.Conn == nil || errors.Is(cl.StopCause(), packets.ErrSessionTakenOver) || !h.isStored(cl.ID) {
		return // a session restored at start, or one living on in another connection
	}
	if expire {
		h.drop("session end", cl.ID)
		return
	}
	v, eerr := encodeClient(cl, h.now().Unix())
	if eerr == nil {
		h.write("session", cl.ID, badger.SessionWrite{Record: badger.SessionClient, Owner: cl.ID, Value: v})
	}
}

// OnClientExpired drops an expired session.
func (h *sessionHook) OnClientExpired(cl *mqtt.Client) { h.drop("session expiry", cl.ID) }

// OnSubscribed stores the granted subscriptions of a kept session.
func (h *sessionHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if !h.isStored(cl.ID) {
		return
	}
	var ws []badger.SessionWrite
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		rec := subRecord{Sub: storage.Subscription{
			ID: cl.ID + ":" + f.Filter, T: storage.SubscriptionKey, Client: cl.ID, Filter: f.Filter,
			Qos: reasonCodes[i], Identifier: f.Identifier, NoLocal: f.NoLocal,
			RetainHandling: f.RetainHandling, RetainAsPublished: f.RetainAsPublished,
		}}
		if queue.IsQueueTopic(f.Filter) {
			rec.Props = pk.Properties.User
		}
		v, err := json.Marshal(rec)
		if err != nil {
			h.log.Error("subscription not stored", "client", cl.ID, "filter", f.Filter, "err", err)
			continue
		}
		ws = append(ws, badger.SessionWrite{Record: badger.SessionSubscription, Owner: cl.ID, Name: f.Filter, Value: v})
	}
	h.write("subscription", cl.ID, ws...)
}

// OnUnsubscribed forgets the subscriptions of a kept session.
func (h *sessionHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if !h.isStored(cl.ID) {
		return
	}
	var ws []badger.SessionWrite
	for _, f := range pk.Filters {
		ws = append(ws, badger.SessionWrite{Record: badger.SessionSubscription, Owner: cl.ID, Name: f.Filter, Delete: true})
	}
	h.write("unsubscription", cl.ID, ws...)
}

// encodeMessage is the stored form of a retained or inflight message.
func encodeMessage(t, client string, pk packets.Packet, sent int64) ([]byte, error) {
	p := pk.Properties.Copy(false)
	return json.Marshal(storage.Message{
		T: t, Client: client, Origin: pk.Origin, PacketID: pk.PacketID, FixedHeader: pk.FixedHeader,
		TopicName: pk.TopicName, Payload: pk.Payload, Sent: sent, Created: pk.Created,
		Properties: storage.MessageProperties{
			PayloadFormat: p.PayloadFormat, PayloadFormatFlag: p.PayloadFormatFlag,
			MessageExpiryInterval: p.MessageExpiryInterval, ContentType: p.ContentType,
			ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData,
			SubscriptionIdentifier: p.SubscriptionIdentifier, User: p.User,
		},
	})
}

// OnRetainMessage stores (r -1: deletes) a retained message, before mochi
// acknowledges its PUBLISH.
func (h *sessionHook) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	if queue.IsQueueTopic(pk.TopicName) {
		return
	}
	w := badger.SessionWrite{Record: badger.SessionRetained, Owner: pk.TopicName, Delete: r == -1}
	if !w.Delete {
		v, err := encodeMessage(storage.RetainedKey, cl.ID, pk, 0)
		if err != nil {
			h.log.Error("retained message not stored", "topic", pk.TopicName, "err", err)
			return
		}
		w.Value = v
	}
	h.write("retained message", cl.ID, w)
}

// OnRetainedExpired deletes an expired retained message.
func (h *sessionHook) OnRetainedExpired(topic string) {
	h.write("retained expiry", "", badger.SessionWrite{Record: badger.SessionRetained, Owner: topic, Delete: true})
}

func packetName(id uint16) string { return string(binary.BigEndian.AppendUint16(nil, id)) }

// OnQosPublish stores an outgoing QoS 1/2 message of a plain topic to a
// kept session until the client acknowledges it.
func (h *sessionHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, resends int) {
	if pk.FixedHeader.Type != packets.Publish || pk.TopicName == "" || queue.IsQueueTopic(pk.TopicName) {
		return // an acknowledgement of the client's publish; a queue delivery; a topic alias
	}
	h.mu.Lock()
	ids, ok := h.stored[cl.ID]
	if ok {
		ids[pk.PacketID] = struct{}{}
	}
	h.mu.Unlock()
	if !ok {
		return
	}
	v, err := encodeMessage(storage.InflightKey, cl.ID, pk, sent)
	if err != nil {
		h.log.Error("inflight message not stored", "client", cl.ID, "err", err)
		return
	}
	h.submit("inflight message", cl.ID, badger.SessionWrite{Record: badger.SessionInflight, Owner: cl.ID, Name: packetName(pk.PacketID), Value: v})
}

// OnQosComplete forgets an acknowledged message.
func (h *sessionHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
	_, ok := h.stored[cl.ID][pk.PacketID]
	if ok {
		delete(h.stored[cl.ID], pk.PacketID)
	}
	h.mu.Unlock()
	if ok {
		h.submit("inflight ack", cl.ID, badger.SessionWrite{Record: badger.SessionInflight, Owner: cl.ID, Name: packetName(pk.PacketID), Delete: true})
	}
}

// OnQosDropped forgets a message mochi gave up on.
func (h *sessionHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) { h.OnQosComplete(cl, pk) }

// StoredClients returns the stored sessions that have not expired, and
// removes those that have. A record that cannot be read is logged and
// skipped (a session dropped) rather than keeping the node from starting;
// a storage error does keep it from starting.
func (h *sessionHook) StoredClients() ([]storage.Client, error) {
	now := h.now().Unix()
	var out []storage.Client
	var expired []string
	err := h.store.Scan(badger.SessionClient, func(id, _ string, v []byte) error {
		var rec clientRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			h.log.Error("stored session unreadable; dropped", "client", id, "err", err)
			expired = append(expired, id)
			return nil
		}
		c := rec.Client
		if rec.Disconnected > 0 && c.ProtocolVersion == 5 && rec.Disconnected+int64(c.Properties.SessionExpiryInterval) < now {
			expired = append(expired, id)
			return nil
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range expired {
		h.write("session expiry", id, dropWrites(id)...)
	}
	h.mu.Lock()
	for _, c := range out {
		h.stored[c.ID] = map[uint16]struct{}{}
	}
	h.mu.Unlock()
	if len(out)+len(expired) > 0 {
		h.log.Info("sessions restored", "sessions", len(out), "expired", len(expired))
	}
	return out, nil
}

// StoredSubscriptions returns the subscriptions of the restored sessions
// and gives the queue hook the properties of their queue subscriptions.
func (h *sessionHook) StoredSubscriptions() ([]storage.Subscription, error) {
	var out []storage.Subscription
	err := h.store.Scan(badger.SessionSubscription, func(id, filter string, v []byte) error {
		if !h.isStored(id) {
			return nil // left by a session that expired
		}
		var rec subRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			h.log.Error("stored subscription unreadable; skipped", "client", id, "filter", filter, "err", err)
			return nil
		}
		if rec.Props != nil && h.restore != nil {
			h.restore(id, filter, rec.Props)
		}
		out = append(out, rec.Sub)
		return nil
	})
	return out, err
}

// StoredInflightMessages returns the undelivered messages of the restored
// sessions.
func (h *sessionHook) StoredInflightMessages() ([]storage.Message, error) {
	var out []storage.Message
	err := h.store.Scan(badger.SessionInflight, func(id, _ string, v []byte) error {
		var m storage.Message
		if err := json.Unmarshal(v, &m); err != nil {
			h.log.Error("stored inflight message unreadable; skipped", "client", id, "err", err)
			return nil
		}
		h.mu.Lock()
		ids, ok := h.stored[id]
		if ok {
			ids[m.PacketID] = struct{}{}
		}
		h.mu.Unlock()
		if ok {
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

// StoredRetainedMessages returns the retained messages.
func (h *sessionHook) StoredRetainedMessages() ([]storage.Message, error) {
	var out []storage.Message
	err := h.store.Scan(badger.SessionRetained, func(topic, _ string, v []byte) error {
		var m storage.Message
		if err := json.Unmarshal(v, &m); err != nil {
			h.log.Error("stored retained message unreadable; skipped", "topic", topic, "err", err)
			return nil
		}
		out = append(out, m)
		return nil
	})
	return out, err
}
