package broker

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
)

// policy is who may connect and what they may do: the users, the ACL and
// the admin token. The broker swaps it whole on SIGHUP (Reload).
type policy struct {
	users     *auth.Users // nil without auth.users_file
	acl       *auth.ACL
	anonymous bool // clients without credentials may connect
	cnAsUser  bool // a verified client certificate's CN is the username
	token     string
}

// newPolicy reads the users file and compiles the ACL of cfg.
func newPolicy(cfg *config.Config) (*policy, error) {
	p := &policy{anonymous: cfg.AnonymousAllowed(), cnAsUser: cfg.Protocol.TLS.CNAsUsername, token: cfg.Admin.Token}
	if f := cfg.Auth.UsersFile; f != "" {
		u, err := auth.LoadUsers(f)
		if err != nil {
			return nil, fmt.Errorf("broker: auth.users_file %s: %w", f, err)
		}
		p.users = u
	}
	acl, err := auth.Compile(cfg.Auth.ACL)
	if err != nil {
		return nil, fmt.Errorf("broker: auth.acl: %w", err)
	}
	p.acl = acl
	return p, nil
}

// accessHook decides who connects and what each client may publish and
// subscribe to; the queue hook asks it about queue publishes (admit). It
// replaces mochi's allow-all hook: mochi grants access when any hook does.
// It also enforces limits.max_connections, announces mqtt.max_packet_size
// in the CONNACK, and sends MQTT 5 clients the DISCONNECT of a malformed
// packet (see trackedConn).
//
// Answers and where they come from:
//   - CONNECT: CONNACK 0x86 (v3.1.1: 0x04) for bad or missing credentials,
//     0x87 (0x05) for a will the client may not publish, 0x85 (0x02) for
//     a client ID whose session is another user's, 0x97 (0x03) past
//     max_connections; written here, in OnConnect.
//   - PUBLISH to a plain topic: mochi's PUBACK 0x87 (v3.1.1: disconnect)
//     when OnACLCheck says no. To a queue: the queue hook's PUBACK, in
//     order with the producer's others, when admit says no.
//   - SUBSCRIBE: OnSubscribe empties a refused filter (mochi answers
//     0x8F) and OnPacketEncode puts the reason in the SUBACK: 0x87, or
//     0x97 for a queue past max_queues (0x80 for MQTT 3.1.1).
type accessHook struct {
	mqtt.HookBase
	b    *Broker
	deny map[string]bool
}

func newAccessHook(b *Broker) *accessHook {
	h := &accessHook{b: b, deny: map[string]bool{}}
	for _, f := range b.cfg.Protocol.DenySubscribe {
		h.deny[f] = true
	}
	return h
}

func (h *accessHook) ID() string { return "shardq-access" }

func (h *accessHook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnect,
		mqtt.OnConnectAuthenticate,
		mqtt.OnSessionEstablished,
		mqtt.OnACLCheck,
		mqtt.OnSubscribe,
		mqtt.OnPacketEncode,
		mqtt.OnPacketSent,
		mqtt.OnDisconnect,
	}, []byte{b})
}

// connOf returns the tracked connection of a client (every listener's
// connections are tracked).
func connOf(cl *mqtt.Client) *trackedConn {
	tc, _ := cl.Net.Conn.(*trackedConn)
	return tc
}

// who returns the client as the ACL sees it.
func who(cl *mqtt.Client) auth.Client {
	if tc := connOf(cl); tc != nil {
		return auth.Client{User: tc.user, ClientID: cl.ID}
	}
	return auth.Client{User: string(cl.Properties.Username), ClientID: cl.ID}
}

// errRefused ends a connection whose CONNACK refused it.
var errRefused = errors.New("broker: connection refused")

// refuse writes a CONNACK with the reason code (v5) or return code (v3.1.1)
// and returns the error that ends the connection.
func refuse(cl *mqtt.Client, v5, v3 byte, reason string) error {
	code := v3
	if cl.Properties.ProtocolVersion == 5 {
		code = v5
	}
	_ = cl.WritePacket(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connack},
		ReasonCode:  code,
		Properties:  packets.Properties{ReasonString: reason},
	})
	return fmt.Errorf("%w: %s", errRefused, reason)
}

// OnConnect admits or refuses a client: the connection limit, its
// credentials, its will, and the owner of the session it would take.
func (h *accessHook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	b := h.b
	tc := connOf(cl)
	max := int64(b.cfg.Limits.MaxConnections)
	if tc != nil && max > 0 && tc.l.admitted.Load() >= max {
		b.sec.limit(limitMaxConnections)
		return refuse(cl, packets.ErrQuotaExceeded.Code, packets.Err3ServerUnavailable.Code,
			fmt.Sprintf("limits.max_connections (%d) reached", max))
	}
	pol := b.policy.Load()
	user, err := h.authenticate(cl, pk, pol)
	if err != nil {
		return err
	}
	c := auth.Client{User: user, ClientID: cl.ID}
	if pk.Connect.WillFlag {
		if action, res := publishAction(pk.Connect.WillTopic); !pol.acl.Allowed(c, action, res, "") {
			b.sec.denied(action)
			return refuse(cl, packets.ErrNotAuthorized.Code, packets.Err3NotAuthorized.Code, "not authorized to publish the will")
		}
	}
	if old, ok := b.server.Clients.Get(cl.ID); ok && string(old.Properties.Username) != user {
		b.sec.authFailure(authClientIDTaken)
		return refuse(cl, packets.ErrClientIdentifierNotValid.Code, packets.Err3ClientIdentifierNotValid.Code,
			"the client ID belongs to another user's session")
	}
	if tc != nil {
		if !tc.admit(max) {
			b.sec.limit(limitMaxConnections)
			return refuse(cl, packets.ErrQuotaExceeded.Code, packets.Err3ServerUnavailable.Code,
				fmt.Sprintf("limits.max_connections (%d) reached", max))
		}
		tc.user = user
		if t := b.tenants; t != nil {
			tn := t.get(user)
			if err := t.connect(tn); err != nil {
				return refuse(cl, packets.ErrQuotaExceeded.Code, packets.Err3ServerUnavailable.Code, strings.TrimPrefix(err.Error(), "hooks: quota exceeded: "))
			}
			tc.tenant = tn
			left := func() { t.disconnect(tn) }
			tc.left.Store(&left)
		}
	}
	cl.Properties.Username = []byte(user)
	return nil
}

// authenticate returns the client's username ("" anonymous), or the error
// of the CONNACK that refused it.
func (h *accessHook) authenticate(cl *mqtt.Client, pk packets.Packet, pol *policy) (string, error) {
	if pol.cnAsUser {
		if tc := connOf(cl); tc != nil {
			if st, ok := tc.tlsState(); ok && len(st.VerifiedChains) > 0 && len(st.PeerCertificates) > 0 {
				cn := st.PeerCertificates[0].Subject.CommonName
				if auth.ValidUsername(cn) == nil {
					return cn, nil
				}
				h.b.sec.authFailure(authBadCredentials)
				return "", refuse(cl, packets.ErrBadUsernameOrPassword.Code, packets.ErrMalformedUsernameOrPassword.Code,
					"the client certificate's common name is no username")
			}
		}
	}
	if pk.Connect.UsernameFlag && pol.users != nil {
		if pol.users.Authenticate(string(pk.Connect.Username), string(pk.Connect.Password)) {
			return string(pk.Connect.Username), nil
		}
		h.b.sec.authFailure(authBadCredentials)
		return "", refuse(cl, packets.ErrBadUsernameOrPassword.Code, packets.ErrMalformedUsernameOrPassword.Code, "bad user name or password")
	}
	if pol.anonymous {
		// Without a users file a username proves nothing: the client is
		// anonymous to the ACL.
		return "", nil
	}
	if pk.Connect.UsernameFlag {
		h.b.sec.authFailure(authBadCredentials)
		return "", refuse(cl, packets.ErrBadUsernameOrPassword.Code, packets.ErrMalformedUsernameOrPassword.Code, "bad user name or password")
	}
	h.b.sec.authFailure(authNoCredentials)
	return "", refuse(cl, packets.ErrBadUsernameOrPassword.Code, packets.ErrMalformedUsernameOrPassword.Code, "credentials required")
}

// OnConnectAuthenticate lets in every client OnConnect admitted.
func (h *accessHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool { return true }

// publishAction returns the action and resource of a publish to topic:
// produce into its queue for a $queue/ topic, else publish.
func publishAction(topic string) (auth.Action, string) {
	if queue.IsQueueTopic(topic) {
		if t, err := queue.ParseTopic(topic); err == nil {
			return auth.Produce, t.Queue
		}
	}
	return auth.Publish, topic
}

// admit is the queue hook's admission of a queue publish: the produce
// permission.
func (h *accessHook) admit(cl *mqtt.Client, queueName string) error {
	pol := h.b.policy.Load()
	if !pol.acl.Empty() && !pol.acl.Allowed(who(cl), auth.Produce, queueName, "") {
		h.b.sec.denied(auth.Produce)
		return fmt.Errorf("%w: produce into %s", hooks.ErrNotAuthorized, queueName)
	}
	if t := h.b.tenants; t != nil {
		if tc := connOf(cl); tc != nil && tc.tenant != nil {
			return t.publish(tc.tenant, queueName)
		}
	}
	return nil
}

// OnACLCheck checks a publish to a plain topic (queue publishes are the
// queue hook's, through admit), keeps mqtt.deny_subscribe out, and drops
// the plain messages for a client that does not read (stalled). A
// subscription's ACL was checked in OnSubscribe.
func (h *accessHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if !write {
		if tc, ok := cl.Net.Conn.(*trackedConn); ok && tc.writeSince.Load() != 0 && tc.stalled(time.Now()) {
			// mochi asks before it takes the client's lock, which the
			// blocked write holds: the publisher does not wait for it.
			atomic.AddInt64(&h.b.server.Info.MessagesDropped, 1)
			return false
		}
		return !h.deny[topic]
	}
	if strings.HasPrefix(topic, queue.TopicPrefix) {
		return true
	}
	pol := h.b.policy.Load()
	if pol.acl.Empty() || pol.acl.Allowed(who(cl), auth.Publish, topic, "") {
		return true
	}
	h.b.sec.denied(auth.Publish)
	if cl.Properties.ProtocolVersion != 5 {
		// MQTT 3.1.1 has no negative PUBACK: the client is disconnected
		// (mochi's DISCONNECT leaves the connection to the client).
		cl.Stop(packets.ErrNotAuthorized)
	}
	return false
}

// subRefusal is the SUBACK reason code of a refused filter.
type subRefusal struct {
	index int
	code  byte
}

// OnSubscribe refuses the filters the client may not subscribe to, or
// that would create a queue past max_queues: each is emptied (so that
// neither mochi nor the queue hook takes it) and its reason code kept for
// the SUBACK.
func (h *accessHook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	pol := h.b.policy.Load()
	var refused []subRefusal
	for i, sub := range pk.Filters {
		if code := h.subscribeCode(cl, pol, sub.Filter, pk.Properties.User); code != 0 {
			refused = append(refused, subRefusal{i, code})
		}
	}
	tc := connOf(cl)
	if len(refused) == 0 || tc == nil {
		return pk
	}
	filters := make(packets.Subscriptions, len(pk.Filters))
	copy(filters, pk.Filters)
	for _, r := range refused {
		filters[r.index].Filter = ""
	}
	pk.Filters = filters
	tc.mu.Lock()
	if tc.subacks == nil {
		tc.subacks = map[uint16][]subRefusal{}
	}
	tc.subacks[pk.PacketID] = refused
	tc.mu.Unlock()
	return pk
}

// subscribeCode returns the reason code refusing a subscription to
// filter, or 0.
func (h *accessHook) subscribeCode(cl *mqtt.Client, pol *policy, filter string, props []packets.UserProperty) byte {
	if !queue.IsQueueTopic(filter) {
		if pol.acl.Empty() || pol.acl.Allowed(who(cl), auth.Subscribe, filter, "") {
			return 0
		}
		h.b.sec.denied(auth.Subscribe)
		return packets.ErrNotAuthorized.Code
	}
	name, group, err := hooks.QueueSubscription(filter, props)
	if err != nil {
		return 0 // the queue hook refuses it (0x8F)
	}
	if !pol.acl.Empty() && !pol.acl.Allowed(who(cl), auth.Consume, name, group) {
		h.b.sec.denied(auth.Consume)
		return packets.ErrNotAuthorized.Code
	}
	if h.b.queues.wouldExceed(name) {
		h.b.sec.limit(limitMaxQueues)
		return packets.ErrQuotaExceeded.Code
	}
	return 0
}

// OnPacketEncode announces the Maximum Packet Size in an MQTT 5 CONNACK,
// and puts the reason codes of refused filters in their SUBACK.
func (h *accessHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Connack:
		if cl.Properties.ProtocolVersion == 5 && pk.ReasonCode < packets.ErrUnspecifiedError.Code {
			pk.Properties.MaximumPacketSize = uint32(h.b.cfg.EffectiveMaxPacketSize())
		}
	case packets.Suback:
		tc := connOf(cl)
		if tc == nil {
			break
		}
		tc.mu.Lock()
		refused := tc.subacks[pk.PacketID]
		delete(tc.subacks, pk.PacketID)
		tc.mu.Unlock()
		if cl.Properties.ProtocolVersion != 5 {
			break // MQTT 3.1.1 has one failure code, 0x80, which mochi set
		}
		for _, r := range refused {
			if r.index < len(pk.ReasonCodes) && pk.ReasonCodes[r.index] == packets.ErrTopicFilterInvalid.Code {
				pk.ReasonCodes[r.index] = r.code
			}
		}
	}
	return pk
}

// OnPacketSent notes a DISCONNECT mochi sent, so that OnDisconnect sends
// none more.
func (h *accessHook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, b []byte) {
	if pk.FixedHeader.Type == packets.Disconnect {
		if tc := connOf(cl); tc != nil {
			tc.sentDisconnect.Store(true)
		}
	}
}

// OnSessionEstablished holds an MQTT 5 client's connection from now on,
// until OnDisconnect (see trackedConn).
func (h *accessHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	if tc := connOf(cl); tc != nil && cl.Properties.ProtocolVersion == 5 {
		tc.held.Store(true)
	}
}

// OnDisconnect writes the DISCONNECT of a malformed or oversized packet to
// an MQTT 5 client, which mochi closed without one, then closes the
// connection.
func (h *accessHook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	tc := connOf(cl)
	if tc == nil {
		return
	}
	defer tc.release()
	code, ok := errors.AsType[packets.Code](err)
	if !ok || code.Code < packets.ErrUnspecifiedError.Code || cl.Properties.ProtocolVersion != 5 || !tc.held.Load() || tc.sentDisconnect.Load() {
		return
	}
	reason := code.Reason
	if code.Code == packets.ErrPacketTooLarge.Code {
		h.b.sec.limit(limitMaxPacketSize)
		reason = fmt.Sprintf("packet larger than the Maximum Packet Size (%d bytes)", h.b.cfg.EffectiveMaxPacketSize())
	} else {
		h.b.sec.malformedPacket(code.Code)
	}
	var buf bytes.Buffer
	out := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Disconnect},
		ProtocolVersion: 5,
		ReasonCode:      code.Code,
	}
	if p := cl.Properties.Props; !p.RequestProblemInfoFlag || p.RequestProblemInfo != 0 {
		out.Properties.ReasonString = reason
	}
	if out.DisconnectEncode(&buf) != nil {
		return
	}
	cl.Lock()
	_, _ = tc.Conn.Write(buf.Bytes())
	cl.Unlock()
	h.b.log.Debug("disconnected a client for a malformed packet", "client", cl.ID, "code", fmt.Sprintf("0x%02x", code.Code), "err", err)
}
