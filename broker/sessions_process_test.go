package broker_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
)

// pahoClient is a paho.golang (MQTT 5) client whose deliveries arrive on
// msgs, acknowledged by paho.
type pahoClient struct {
	t       *testing.T
	c       *paho.Client
	msgs    chan *paho.Publish
	connack *paho.Connack
}

// dialPaho connects id; with expiry > 0 it asks for clean start false and
// that session expiry (seconds).
func dialPaho(t *testing.T, addr, id string, expiry uint32) *pahoClient {
	t.Helper()
	return dialPahoAs(t, addr, id, "", expiry)
}

// dialPahoAs is dialPaho as the user (password: password(user)).
func dialPahoAs(t *testing.T, addr, id, user string, expiry uint32) *pahoClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := &pahoClient{t: t, msgs: make(chan *paho.Publish, 100)}
	c.c = paho.NewClient(paho.ClientConfig{
		Conn: conn, ClientID: id,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) {
				c.msgs <- r.Packet
				return true, nil
			},
		},
	})
	cp := &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}
	if expiry > 0 {
		cp.CleanStart = false
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if user != "" {
		cp.Username, cp.UsernameFlag = user, true
		cp.Password, cp.PasswordFlag = []byte(password(user)), true
	}
	ca, err := c.c.Connect(ctx, cp)
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("%s: connect: %v %v", id, ca, err)
	}
	c.connack = ca
	t.Cleanup(func() { _ = c.c.Disconnect(&paho.Disconnect{}) })
	return c
}

func (c *pahoClient) publish(topic, payload string, retain bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Retain: retain, Payload: []byte(payload)})
	if err != nil || r.ReasonCode != 0 {
		c.t.Fatalf("publish %s: %v %v", topic, r, err)
	}
}

func (c *pahoClient) subscribe(filters ...string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := &paho.Subscribe{}
	for _, f := range filters {
		s.Subscriptions = append(s.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	sa, err := c.c.Subscribe(ctx, s)
	if err != nil {
		c.t.Fatalf("subscribe %v: %v", filters, err)
	}
	for i, r := range sa.Reasons {
		if r > 2 {
			c.t.Fatalf("subscribe %s: reason %#x", filters[i], r)
		}
	}
}

// expect waits for deliveries of the given topic -> payload pairs, in any
// order.
func (c *pahoClient) expect(want map[string]string) {
	c.t.Helper()
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case p := <-c.msgs:
			if want[p.Topic] == string(p.Payload) {
				delete(want, p.Topic)
			} else {
				c.t.Logf("unexpected delivery %s %q", p.Topic, p.Payload)
			}
		case <-deadline:
			c.t.Fatalf("not delivered within 10s: %v", want)
		}
	}
}

// close drops the connection without a DISCONNECT.
func (c *pahoClient) drop() { _ = c.c.Disconnect(&paho.Disconnect{ReasonCode: 0x04}) }

func TestRetainedMessageSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	p := startProcess(t, dir)
	pub := dialPaho(t, p.mqtt, "retain-pub", 0)
	pub.publish("sensors/1/temp", "21.5", true)
	pub.publish("sensors/2/temp", "gone", true)
	pub.publish("sensors/2/temp", "", true) // clears it
	p.kill()

	p = startProcess(t, dir)
	sub := dialPaho(t, p.mqtt, "retain-sub", 0)
	sub.subscribe("sensors/+/temp")
	sub.expect(map[string]string{"sensors/1/temp": "21.5"})
	select {
	case m := <-sub.msgs:
		t.Fatalf("unexpected delivery %s %q", m.Topic, m.Payload)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestPersistentSessionSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	p := startProcess(t, dir)
	dev := dialPaho(t, p.mqtt, "device-7", 3600)
	dev.subscribe("cmd/device-7", "$share/devices/$queue/jobs")
	// A clean-start client's session is not kept.
	tmp := dialPaho(t, p.mqtt, "passer-by", 0)
	tmp.subscribe("cmd/passer-by")
	dev.drop()
	// Published while the device is away: held in its session.
	pub := dialPaho(t, p.mqtt, "sender", 0)
	pub.publish("cmd/device-7", "while-away", false)
	time.Sleep(100 * time.Millisecond)
	p.kill()

	p = startProcess(t, dir)
	pub = dialPaho(t, p.mqtt, "sender", 0)
	pub.publish("$queue/jobs", "job-1", false)
	dev = dialPaho(t, p.mqtt, "device-7", 3600)
	if !dev.connack.SessionPresent {
		t.Error("CONNACK after the restart: session present false")
	}
	// No SUBSCRIBE again: both subscriptions come back with the session.
	dev.expect(map[string]string{"cmd/device-7": "while-away", "$queue/jobs": "job-1"})
	pub.publish("cmd/device-7", "after-restart", false)
	dev.expect(map[string]string{"cmd/device-7": "after-restart"})

	// The clean-start client's subscription is gone.
	pt := dialPaho(t, p.mqtt, "passer-by", 3600)
	if pt.connack.SessionPresent {
		t.Error("a clean-start session was restored")
	}
}

// A QoS 1 message delivered to a persistent session and not acknowledged
// before a SIGKILL is sent again, DUP set, when the client comes back; one
// acknowledged is not. MQTT 3.1.1 sessions (clean session false) are kept
// too.
func TestUnacknowledgedDeliverySurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	p := startProcess(t, dir)
	dev := dialRaw(t, p.mqtt, "dev-raw", connectOpts{keepClean: true, expiry: 600})
	if codes := dev.subscribe(1, nil, "cmd/dev-raw/#"); codes[0] != 1 {
		t.Fatalf("subscribe: %v", codes)
	}
	got311 := make(chan string, 10)
	keep := func(o *paho3.ClientOptions) {
		o.SetCleanSession(false).SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got311 <- string(m.Payload()) })
	}
	old := dialV3(t, p.mqtt, "dev-311", keep)
	if tok := old.Subscribe("cmd/dev-311", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("3.1.1 subscribe: %v", tok.Error())
	}
	pub := dialRaw(t, p.mqtt, "raw-sender", connectOpts{})
	if code := pub.publish("cmd/dev-raw/a", []byte("acked")); code != 0 {
		t.Fatalf("publish: %#x", code)
	}
	dev.puback(dev.next(5*time.Second), 0)
	if code := pub.publish("cmd/dev-raw/b", []byte("not-acked")); code != 0 {
		t.Fatalf("publish: %#x", code)
	}
	if m := dev.next(5 * time.Second); string(m.Payload) != "not-acked" {
		t.Fatalf("delivery %q", m.Payload)
	}
	time.Sleep(100 * time.Millisecond) // the PUBACK of "acked" is read
	p.kill()

	p = startProcess(t, dir)
	dev = dialRaw(t, p.mqtt, "dev-raw", connectOpts{keepClean: true, expiry: 600})
	if !dev.connack.SessionPresent {
		t.Error("session present false after the restart")
	}
	m := dev.next(5 * time.Second)
	if string(m.Payload) != "not-acked" || !m.Duplicate {
		t.Errorf("redelivery %q dup=%v, want \"not-acked\" with DUP", m.Payload, m.Duplicate)
	}
	dev.puback(m, 0)
	dev.none(300 * time.Millisecond)

	dialV3(t, p.mqtt, "dev-311", keep) // no SUBSCRIBE
	pub = dialRaw(t, p.mqtt, "raw-sender", connectOpts{})
	if code := pub.publish("cmd/dev-311", []byte("to-311")); code != 0 {
		t.Fatalf("publish: %#x", code)
	}
	select {
	case m := <-got311:
		if m != "to-311" {
			t.Errorf("3.1.1 delivery %q", m)
		}
	case <-time.After(5 * time.Second):
		t.Error("3.1.1 session: nothing delivered after the restart")
	}
}

// A restored session keeps its owner: after a restart another user may not
// take its client ID, its own user resumes it.
func TestRestoredSessionKeepsItsUser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	users := writeUsers(t, t.TempDir(), "alice", "bob")
	p := startProcess(t, dir, "--users-file", users)
	a := dialPahoAs(t, p.mqtt, "alice-phone", "alice", 600)
	a.subscribe("inbox/alice")
	a.drop()
	time.Sleep(50 * time.Millisecond)
	p.kill()

	p = startProcess(t, dir, "--users-file", users)
	if code := connackCode(t, p.mqtt, "alice-phone", creds{user: "bob", pass: password("bob")}); code != 0x85 {
		t.Errorf("bob taking alice's restored session: CONNACK %#x, want 0x85", code)
	}
	a = dialPahoAs(t, p.mqtt, "alice-phone", "alice", 600)
	if !a.connack.SessionPresent {
		t.Error("alice's session not present after the restart")
	}
	pub := dialPahoAs(t, p.mqtt, "alice-laptop", "alice", 0)
	pub.publish("inbox/alice", "hello", false)
	a.expect(map[string]string{"inbox/alice": "hello"})
}

// Messages held for an absent session just before a SIGTERM are there
// after the restart.
func TestHeldMessageSurvivesSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	p := startProcess(t, dir)
	dev := dialPaho(t, p.mqtt, "device-term", 600)
	dev.subscribe("cmd/device-term")
	dev.drop()
	pub := dialPaho(t, p.mqtt, "term-sender", 0)
	for i := range 20 {
		pub.publish("cmd/device-term", fmt.Sprintf("m%02d", i), false)
	}
	p.term(t)

	p = startProcess(t, dir)
	dev = dialPaho(t, p.mqtt, "device-term", 600)
	got := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(got) < 20 {
		select {
		case m := <-dev.msgs:
			got[string(m.Payload)] = true
		case <-deadline:
			t.Fatalf("after the restart %d of 20 held messages delivered", len(got))
		}
	}
}
