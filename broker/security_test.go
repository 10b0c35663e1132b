package broker_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/gorilla/websocket"
	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/config"
)

// TestSecurityAuthentication checks the CONNACK of each kind of
// credentials when a users file is configured, for MQTT 5, MQTT 3.1.1
// and the mosquitto clients.
func TestSecurityAuthentication(t *testing.T) {
	dir := t.TempDir()
	users := writeUsers(t, dir, "alice", "bob")
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Auth.UsersFile = users })
	addr := b.MQTTAddr()

	tests := []struct {
		name   string
		c      creds
		v5, v3 byte
	}{
		{"right password", creds{user: "alice", pass: "alice-pw"}, 0x00, 0x00},
		{"wrong password", creds{user: "alice", pass: "bob-pw"}, 0x86, 0x04},
		{"unknown user", creds{user: "carol", pass: "carol-pw"}, 0x86, 0x04},
		{"username without password", creds{user: "alice"}, 0x86, 0x04},
		{"no credentials", creds{}, 0x86, 0x04},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := connackCode(t, addr, "c5", tc.c); got != tc.v5 {
				t.Errorf("MQTT 5 CONNACK %#x, want %#x", got, tc.v5)
			}
			v3 := tc.c
			v3.version = 4
			if got := connackCode(t, addr, "c3", v3); got != tc.v3 {
				t.Errorf("MQTT 3.1.1 CONNACK %#x, want %#x", got, tc.v3)
			}
		})
	}
	if n := counter(t, b, "shardq_auth_failures_total", "reason", "bad_credentials"); n != 6 {
		t.Errorf("bad_credentials failures %v, want 6", n)
	}
	if n := counter(t, b, "shardq_auth_failures_total", "reason", "no_credentials"); n != 2 {
		t.Errorf("no_credentials failures %v, want 2", n)
	}

	t.Run("paho 3.1.1", func(t *testing.T) {
		o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("p3").SetUsername("bob").SetPassword("wrong").
			SetAutoReconnect(false).SetConnectRetry(false)
		tok := paho3.NewClient(o).Connect()
		if !tok.WaitTimeout(5*time.Second) || tok.(*paho3.ConnectToken).ReturnCode() != 4 {
			t.Errorf("paho with a wrong password: return code %d (%v), want 4", tok.(*paho3.ConnectToken).ReturnCode(), tok.Error())
		}
		c, _ := dialV3As(t, addr, "p3-ok", "bob", nil)
		if !c.IsConnected() {
			t.Error("bob not connected")
		}
	})

	t.Run("mosquitto clients", func(t *testing.T) {
		h, p := "127.0.0.1", port(addr)
		if out, err := mosquitto(t, "mosquitto_pub", "-h", h, "-p", p, "-V", "mqttv5", "-u", "alice", "-P", "alice-pw", "-q", "1", "-t", "$queue/auth", "-m", "hi"); err != nil {
			t.Fatalf("mosquitto_pub as alice: %v\n%s", err, out)
		}
		out, err := mosquitto(t, "mosquitto_pub", "-h", h, "-p", p, "-V", "mqttv5", "-u", "alice", "-P", "nope", "-q", "1", "-t", "$queue/auth", "-m", "x")
		if err == nil || !strings.Contains(strings.ToLower(out), "bad user name or password") {
			t.Errorf("mosquitto_pub with a wrong password: %v\n%s", err, out)
		}
		out, err = mosquitto(t, "mosquitto_sub", "-h", h, "-p", p, "-V", "mqttv5", "-u", "bob", "-P", "bob-pw", "-q", "1",
			"-t", "$share/g/$queue/auth", "-C", "1", "-W", "10")
		if err != nil || !strings.Contains(out, "hi") {
			t.Errorf("mosquitto_sub as bob: %v\n%s", err, out)
		}
	})
}

// TestSecurityAnonymous checks mqtt.allow_anonymous beside users: a
// client without credentials connects, one with wrong ones does not.
func TestSecurityAnonymous(t *testing.T) {
	users := writeUsers(t, t.TempDir(), "alice")
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Auth.UsersFile = users
		c.Protocol.AllowAnonymous = true
	})
	if code := connackCode(t, b.MQTTAddr(), "anon", creds{}); code != 0 {
		t.Errorf("anonymous: CONNACK %#x, want 0", code)
	}
	if code := connackCode(t, b.MQTTAddr(), "bad", creds{user: "alice", pass: "x"}); code != 0x86 {
		t.Errorf("wrong password: CONNACK %#x, want 0x86", code)
	}
	// Loopback defaults without users: anyone, and a username is ignored.
	open := startBroker(t, t.TempDir(), nil)
	if code := connackCode(t, open.MQTTAddr(), "x", creds{user: "whoever", pass: "whatever"}); code != 0 {
		t.Errorf("loopback node without users: CONNACK %#x, want 0", code)
	}
}

// aclRules are the rules of the authorization tests.
var aclRules = []auth.Rule{
	{User: "*", Action: auth.Publish, Pattern: "devices/%u/#", Permission: auth.Allow},
	{User: "*", Action: auth.Publish, Pattern: "clients/%c", Permission: auth.Allow},
	{User: "*", Action: auth.Subscribe, Pattern: "devices/+/status", Permission: auth.Allow},
	{User: "ops", Action: auth.Subscribe, Pattern: "#", Permission: auth.Allow},
	{User: "*", Action: auth.Produce, Pattern: "orders", Permission: auth.Allow},
	{User: "billing", Action: auth.Consume, Pattern: "orders", Group: "billing", Permission: auth.Allow},
	{User: "ops", Action: auth.Consume, Pattern: "*/$dlq", Permission: auth.Allow},
	{User: "ops", Action: auth.Produce, Pattern: "*", Permission: auth.Allow},
}

func aclBroker(t *testing.T) *testBroker {
	t.Helper()
	users := writeUsers(t, t.TempDir(), "alice", "bob", "billing", "ops")
	return startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Auth.UsersFile = users
		c.Auth.ACL = aclRules
	})
}

// TestSecurityACLMQTT5 checks every action's allow and deny with MQTT 5
// clients: PUBACK 0x87 for a denied publish or produce, in order with
// the producer's other PUBACKs, SUBACK 0x87 for a denied subscription.
func TestSecurityACLMQTT5(t *testing.T) {
	b := aclBroker(t)
	addr := b.MQTTAddr()
	alice := dialAs(t, addr, "alice-1", "alice")

	publishes := []struct {
		topic string
		want  byte
	}{
		{"devices/alice/temp", 0x00},
		{"devices/bob/temp", 0x87},
		{"clients/alice-1", 0x00},
		{"clients/other", 0x87},
		{"anything/else", 0x87},
		{"$queue/orders", 0x00},
		{"$queue/orders/$dlq", 0x87}, // forging dead letters
		{"$queue/secret", 0x87},
	}
	// Pipelined: the refusals come back in the order of the publishes.
	var acks []chan *packets.Puback
	for _, p := range publishes {
		acks = append(acks, alice.publishAsync(p.topic, []byte("x")))
	}
	for i, p := range publishes {
		if got := alice.waitAck(acks[i]).ReasonCode; got != p.want {
			t.Errorf("publish %s: PUBACK %#x, want %#x", p.topic, got, p.want)
		}
	}

	subs := []struct {
		who    *rawClient
		user   map[string]string
		filter string
		want   byte
	}{
		{alice, nil, "devices/+/status", 0x01},
		{alice, nil, "devices/bob/status", 0x01},
		{alice, nil, "devices/#", 0x87},
		{alice, nil, "$share/g/devices/+/status", 0x01},
		{alice, nil, "#", 0x87},
		{alice, nil, "$share/billing/$queue/orders", 0x87},
	}
	billing := dialAs(t, addr, "billing-1", "billing")
	ops := dialAs(t, addr, "ops-1", "ops")
	subs = append(subs,
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{billing, nil, "$share/billing/$queue/orders", 0x01},
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{billing, map[string]string{"group": "billing"}, "$queue/orders", 0x01},
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{billing, nil, "$queue/orders", 0x87}, // group default
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{billing, nil, "$share/billing/$queue/orders/$dlq", 0x87},
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{ops, nil, "$queue/orders/$dlq", 0x01},
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{ops, nil, "$share/x/$queue/orders", 0x87},
		struct {
			who    *rawClient
			user   map[string]string
			filter string
			want   byte
		}{ops, nil, "#", 0x01},
	)
	for _, s := range subs {
		if got := s.who.subscribe(1, s.user, s.filter); len(got) != 1 || got[0] != s.want {
			t.Errorf("%s subscribing %s (%v): SUBACK % x, want %#x", s.who.id, s.filter, s.user, got, s.want)
		}
	}
	// One SUBSCRIBE with allowed and denied filters answers each.
	if got := alice.subscribe(0, nil, "devices/x/status", "secret/#", "devices/y/status"); string(got) != "\x00\x87\x00" {
		t.Errorf("mixed SUBSCRIBE: SUBACK % x, want 00 87 00", got)
	}

	// The allowed consumer gets the message alice produced.
	p := billing.next(5 * time.Second)
	if p.Topic != "$queue/orders" {
		t.Errorf("billing got %s", p.Topic)
	}
	billing.puback(p, 0)

	for action, want := range map[string]float64{"publish": 3, "produce": 2, "subscribe": 3, "consume": 4} {
		if got := counter(t, b, "shardq_acl_denials_total", "action", action); got != want {
			t.Errorf("denials of %s: %v, want %v", action, got, want)
		}
	}
}

// TestSecurityACLMQTT311 checks the answers MQTT 3.1.1 has: a denied
// publish or produce disconnects the client; a denied subscription gets
// 0x80.
func TestSecurityACLMQTT311(t *testing.T) {
	b := aclBroker(t)
	addr := b.MQTTAddr()

	c, _ := dialV3As(t, addr, "alice-sub", "alice", nil)
	tok := c.SubscribeMultiple(map[string]byte{"devices/+/status": 1, "devices/#": 1}, nil)
	if !tok.WaitTimeout(5 * time.Second) {
		t.Fatal("no SUBACK")
	}
	res := tok.(*paho3.SubscribeToken).Result()
	if res["devices/+/status"] != 1 || res["devices/#"] != 0x80 {
		t.Errorf("SUBACK %v, want devices/+/status 1 and devices/# 0x80", res)
	}

	for _, topic := range []string{"devices/bob/x", "$queue/orders/$dlq"} {
		t.Run(topic, func(t *testing.T) {
			c, lost := dialV3As(t, addr, "alice-pub", "alice", nil)
			if tok := c.Publish("devices/alice/ok", 1, false, "x"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
				t.Fatalf("allowed publish: %v", tok.Error())
			}
			c.Publish(topic, 1, false, "x")
			select {
			case <-lost:
			case <-time.After(5 * time.Second):
				t.Fatalf("publish to %s: still connected", topic)
			}
		})
	}
}

// TestSecurityWillAndClientID checks two refusals at CONNECT: a will on a
// topic the client may not publish (0x87), and a client ID whose session
// is another user's (0x85), so that no user can take over, or kick,
// another's session.
func TestSecurityWillAndClientID(t *testing.T) {
	b := aclBroker(t)
	addr := b.MQTTAddr()
	if code := connackCode(t, addr, "w1", creds{user: "alice", pass: "alice-pw", will: "devices/bob/lwt"}); code != 0x87 {
		t.Errorf("forbidden will: CONNACK %#x, want 0x87", code)
	}
	if code := connackCode(t, addr, "w2", creds{user: "alice", pass: "alice-pw", will: "$queue/secret"}); code != 0x87 {
		t.Errorf("forbidden will to a queue: CONNACK %#x, want 0x87", code)
	}
	if code := connackCode(t, addr, "w3", creds{user: "alice", pass: "alice-pw", will: "devices/alice/lwt", version: 4}); code != 0 {
		t.Errorf("allowed will (3.1.1): CONNACK %#x, want 0", code)
	}
	if code := connackCode(t, addr, "w4", creds{user: "alice", pass: "alice-pw", will: "devices/bob/lwt", version: 4}); code != 0x05 {
		t.Errorf("forbidden will (3.1.1): CONNACK %#x, want 0x05", code)
	}

	billing := dialAs(t, addr, "worker-1", "billing")
	billing.subscribe(1, nil, "$share/billing/$queue/orders")
	if code := connackCode(t, addr, "worker-1", creds{user: "alice", pass: "alice-pw"}); code != 0x85 {
		t.Errorf("another user's client ID: CONNACK %#x, want 0x85", code)
	}
	if code := connackCode(t, addr, "worker-1", creds{user: "alice", pass: "alice-pw", version: 4}); code != 0x02 {
		t.Errorf("another user's client ID (3.1.1): CONNACK %#x, want 0x02", code)
	}
	select {
	case <-billing.closed:
		t.Fatal("billing's connection was taken over")
	default:
	}
	// The same user takes its own session over: the old connection is
	// told (DISCONNECT 0x8E) and closes.
	again := dialAs(t, addr, "worker-1", "billing")
	waitFor(t, func() bool {
		billing.mu.Lock()
		defer billing.mu.Unlock()
		return bytes.IndexByte(billing.seen, packets.DISCONNECT) >= 0
	})
	again.subscribe(1, nil, "$share/billing/$queue/orders")
}

// TestSecurityMaxQueues checks limits.max_queues: an auto-created queue
// past it is refused with PUBACK or SUBACK 0x97 (a 3.1.1 producer is
// disconnected), existing and declared queues work on.
func TestSecurityMaxQueues(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Limits.MaxQueues = 3
		c.Queues.Declared["declared"] = c.Queues.Defaults
	})
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for _, q := range []string{"q1", "q2"} {
		if rc := c.publish("$queue/"+q, []byte("x")); rc != 0 {
			t.Fatalf("publish to %s: %#x", q, rc)
		}
	}
	if rc := c.publish("$queue/q3", []byte("x")); rc != 0x97 {
		t.Errorf("publish to a fourth queue: PUBACK %#x, want 0x97", rc)
	}
	if rc := c.subscribe(1, nil, "$queue/q4"); rc[0] != 0x97 {
		t.Errorf("subscribe to a fourth queue: SUBACK %#x, want 0x97", rc[0])
	}
	for _, q := range []string{"q1", "declared", "q2/$dlq"} {
		if rc := c.publish("$queue/"+q, []byte("x")); rc != 0 && q != "q2/$dlq" {
			t.Errorf("publish to existing %s: %#x", q, rc)
		}
	}
	if rc := c.subscribe(1, nil, "$queue/q1"); rc[0] != 1 {
		t.Errorf("subscribe to existing q1: %#x", rc[0])
	}
	v3, lost := dialV3As(t, b.MQTTAddr(), "v3", "", nil)
	v3.Publish("$queue/q5", 1, false, "x")
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Error("3.1.1 producer to a fifth queue still connected")
	}
	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "max_queues"); n != 3 {
		t.Errorf("max_queues refusals %v, want 3", n)
	}
	if n := len(b.Manager().Queues()); n != 6 {
		t.Errorf("%d queues and dead-letter queues, want 6", n)
	}
}

// TestSecurityMaxConnections checks limits.max_connections: CONNACK 0x97
// (0x03 for MQTT 3.1.1) past it, and room again once a client leaves.
func TestSecurityMaxConnections(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Limits.MaxConnections = 2 })
	addr := b.MQTTAddr()
	first := dialRaw(t, addr, "c1", connectOpts{})
	dialRaw(t, addr, "c2", connectOpts{})
	if code := connackCode(t, addr, "c3", creds{}); code != 0x97 {
		t.Errorf("third connection: CONNACK %#x, want 0x97", code)
	}
	if code := connackCode(t, addr, "c3", creds{version: 4}); code != 0x03 {
		t.Errorf("third connection (3.1.1): CONNACK %#x, want 0x03", code)
	}
	first.close()
	deadline := time.Now().Add(10 * time.Second)
	for connackCode(t, addr, "c3", creds{}) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("no room after a client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "max_connections"); n < 2 {
		t.Errorf("max_connections refusals %v, want at least 2", n)
	}
}

// TestSecurityMaxDelay checks that a delay past the queue's max_delay (by
// default its max_age) is refused with 0x99, a far deliver-at included.
func TestSecurityMaxDelay(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.MaxAge = time.Hour
		o := c.Queues.Defaults
		c.Queues.Declared["short"] = o
		c.Queues.DeclaredMaxDelay = map[string]time.Duration{"short": time.Minute}
	})
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	tests := []struct {
		queue, prop, value string
		want               byte
	}{
		{"q", "delay", "30m", 0x00},
		{"q", "delay", "2h", 0x99},
		{"q", "deliver-at", "9999-12-31T00:00:00Z", 0x99},
		{"q", "deliver-at", time.Now().Add(10 * time.Minute).UTC().Format(time.RFC3339), 0x00},
		{"short", "delay", "30s", 0x00},
		{"short", "delay", "2m", 0x99},
		{"short/$dlq", "delay", "2m", 0x99},
	}
	for _, tc := range tests {
		if rc := c.publish("$queue/"+tc.queue, []byte("x"), tc.prop, tc.value); rc != tc.want {
			t.Errorf("%s %s=%s: PUBACK %#x, want %#x", tc.queue, tc.prop, tc.value, rc, tc.want)
		}
	}
	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "max_delay"); n != 4 {
		t.Errorf("max_delay refusals %v, want 4", n)
	}
}

// TestSecurityQueueFullCounted checks the queue_full count beside the
// 0x97 a full queue answers.
func TestSecurityQueueFullCounted(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.MaxMessages = 1 })
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	c.publish("$queue/full", []byte("1"))
	if rc := c.publish("$queue/full", []byte("2")); rc != 0x97 {
		t.Fatalf("second publish: %#x", rc)
	}
	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "queue_full"); n != 1 {
		t.Errorf("queue_full refusals %v, want 1", n)
	}
}

// readUntilClosed reads packets until the connection ends and returns the
// DISCONNECT among them, if any.
func readUntilClosed(t *testing.T, conn net.Conn) *packets.Disconnect {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var d *packets.Disconnect
	for {
		p, err := packets.ReadPacket(conn)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("connection still open after 10s")
			}
			return d
		}
		if dp, ok := p.Content.(*packets.Disconnect); ok {
			d = dp
		}
	}
}

// TestSecurityMaxPacketSize checks mqtt.max_packet_size: announced in the
// CONNACK, and a bigger packet ends the connection with DISCONNECT 0x95.
func TestSecurityMaxPacketSize(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Protocol.MaxPacketSize = 2048 })
	conn, err := net.Dial("tcp", b.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ca := connectOn(t, conn, "big", creds{})
	if ca.Properties == nil || ca.Properties.MaximumPacketSize == nil || *ca.Properties.MaximumPacketSize != 2048 {
		t.Fatalf("CONNACK properties %+v: want Maximum Packet Size 2048", ca.Properties)
	}
	small := &packets.Publish{Topic: "t", Payload: make([]byte, 1000), QoS: 0, Properties: &packets.Properties{}}
	if _, err := small.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	big := &packets.Publish{Topic: "t", Payload: make([]byte, 4096), QoS: 0, Properties: &packets.Properties{}}
	if _, err := big.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	d := readUntilClosed(t, conn)
	if d == nil || d.ReasonCode != 0x95 {
		t.Fatalf("DISCONNECT %v, want reason 0x95", d)
	}
	if d.Properties == nil || !strings.Contains(d.Properties.ReasonString, "2048") {
		t.Errorf("reason string %v, want one naming the limit", d.Properties)
	}
	if n := counter(t, b, "shardq_limit_refusals_total", "limit", "max_packet_size"); n != 1 {
		t.Errorf("max_packet_size refusals %v, want 1", n)
	}
	// The default is storage.max_payload + 64 KiB.
	d2 := startBroker(t, t.TempDir(), nil)
	c := dialRaw(t, d2.MQTTAddr(), "x", connectOpts{})
	if mps := c.connack.Properties.MaximumPacketSize; mps == nil || *mps != 1<<20+64<<10 {
		t.Errorf("default Maximum Packet Size %v", mps)
	}
}

// TestSecurityMalformedPackets checks that an MQTT 5 client sending a
// malformed packet gets a DISCONNECT with its reason code before the
// connection closes; an MQTT 3.1.1 client, which has no DISCONNECT from the
// server, is closed.
func TestSecurityMalformedPackets(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	tests := []struct {
		name string
		raw  []byte
		want byte
	}{
		// PUBLISH whose topic length runs past the packet.
		{"topic past the packet", []byte{0x30, 0x03, 0x00, 0x10, 'a'}, 0x81},
		// PUBLISH with QoS 3, a value that does not exist.
		{"qos 3", []byte{0x36, 0x04, 0x00, 0x01, 'a', 0x00}, 0x82},
		// SUBSCRIBE with an unknown property.
		{"unknown property", []byte{0x82, 0x08, 0x00, 0x01, 0x02, 0x7f, 0x01, 0x00, 0x01, 'a'}, 0x81},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", b.MQTTAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			connectOn(t, conn, "bad", creds{})
			if _, err := conn.Write(tc.raw); err != nil {
				t.Fatal(err)
			}
			d := readUntilClosed(t, conn)
			if d == nil || d.ReasonCode != tc.want {
				t.Fatalf("DISCONNECT %v, want reason %#x", d, tc.want)
			}
		})
	}
	if n := counter(t, b, "shardq_mqtt_malformed_packets_total", "code", "0x81"); n != 2 {
		t.Errorf("malformed 0x81 counted %v times, want 2", n)
	}
	t.Run("over websocket", func(t *testing.T) {
		ws := startBroker(t, t.TempDir(), func(c *config.Config) { c.WS = "127.0.0.1:0" })
		wc, _, err := websocket.DefaultDialer.Dial("ws://"+ws.ListenerAddr("ws")+"/mqtt", http.Header{"Sec-WebSocket-Protocol": {"mqtt"}})
		if err != nil {
			t.Fatal(err)
		}
		defer wc.Close()
		var connect bytes.Buffer
		cp := packets.NewControlPacket(packets.CONNECT)
		cp.Content.(*packets.Connect).ClientID = "ws-bad"
		cp.Content.(*packets.Connect).CleanStart = true
		if _, err := cp.WriteTo(&connect); err != nil {
			t.Fatal(err)
		}
		for _, msg := range [][]byte{connect.Bytes(), {0x30, 0x03, 0x00, 0x10, 'a'}} {
			if err := wc.WriteMessage(websocket.BinaryMessage, msg); err != nil {
				t.Fatal(err)
			}
		}
		_ = wc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var last byte
		for {
			_, m, err := wc.ReadMessage()
			if err != nil {
				break
			}
			last = m[0] >> 4
			if last == packets.DISCONNECT && (len(m) < 3 || m[2] != 0x81) {
				t.Fatalf("DISCONNECT % x, want reason 0x81", m)
			}
		}
		if last != packets.DISCONNECT {
			t.Fatalf("last packet of type %d before the close, want a DISCONNECT", last)
		}
	})
	t.Run("3.1.1", func(t *testing.T) {
		conn, err := net.Dial("tcp", b.MQTTAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		connectOn(t, conn, "bad3", creds{version: 4})
		if _, err := conn.Write([]byte{0x30, 0x03, 0x00, 0x10, 'a'}); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 16)
		n, err := conn.Read(buf)
		if err == nil || n > 0 {
			t.Fatalf("read %d bytes (% x), %v: want the connection closed with nothing sent", n, buf[:n], err)
		}
	})
}
