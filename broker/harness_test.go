package broker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// testBroker runs a broker on loopback ports with its data in dir.
type testBroker struct {
	*broker.Broker
	dir  string
	errc chan error
}

// startBroker starts a broker; edit adjusts the config first.
func startBroker(t testing.TB, dir string, edit func(*config.Config)) *testBroker {
	t.Helper()
	var log *slog.Logger
	if os.Getenv("SHARDQ_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return startBrokerLogging(t, dir, edit, log)
}

// startBrokerLogging is startBroker logging to log.
func startBrokerLogging(t testing.TB, dir string, edit func(*config.Config), log *slog.Logger) *testBroker {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.MQTT = "127.0.0.1:0"
	cfg.WS = ""
	cfg.HTTP = "127.0.0.1:0"
	if edit != nil {
		edit(cfg)
	}
	b, err := broker.New(cfg, log)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	tb := &testBroker{Broker: b, dir: dir, errc: make(chan error, 1)}
	go func() { tb.errc <- b.Serve() }()
	deadline := time.Now().Add(10 * time.Second)
	for !b.Ready() {
		select {
		case err := <-tb.errc:
			t.Fatalf("Serve: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("broker not ready after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() { tb.stop(t) })
	return tb
}

func (tb *testBroker) stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// rawClient is a minimal MQTT 5 client over TCP built on paho's packet
// codec. Unlike a full client library it lets a test choose every PUBACK
// reason code and see every flag of every packet.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	id   string

	wmu    sync.Mutex
	mu     sync.Mutex
	nextID uint16
	acks   map[uint16]chan *packets.Puback
	recs   map[uint16]chan *packets.Pubrec
	subs   map[uint16]chan *packets.Suback
	unsubs map[uint16]chan *packets.Unsuback

	msgs   chan *packets.Publish
	closed chan struct{}
	err    error
	seen   []byte // the type of every packet received, in order
	// disconnect is the server's DISCONNECT, once it came (read it after
	// closed is closed).
	disconnect *packets.Disconnect

	connack *packets.Connack
}

type connectOpts struct {
	receiveMax uint16
	version    byte
	keepClean  bool // clean start false
	expiry     uint32
	// will, when set, is the will's topic (QoS 1, retained, payload willMsg).
	will, willMsg string
	keepAlive     uint16 // default 30
	// user, when set, connects as that user of writeUsers (its password).
	user string
}

func dialRaw(t *testing.T, addr, id string, o connectOpts) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &rawClient{t: t, conn: conn, id: id, acks: map[uint16]chan *packets.Puback{},
		recs: map[uint16]chan *packets.Pubrec{},
		subs: map[uint16]chan *packets.Suback{}, unsubs: map[uint16]chan *packets.Unsuback{},
		msgs: make(chan *packets.Publish, 100000), closed: make(chan struct{})}
	cp := packets.NewControlPacket(packets.CONNECT)
	cc := cp.Content.(*packets.Connect)
	cc.ClientID = id
	cc.CleanStart = !o.keepClean
	cc.KeepAlive = 30
	if o.keepAlive > 0 {
		cc.KeepAlive = o.keepAlive
	}
	if o.user != "" {
		cc.UsernameFlag, cc.Username, cc.PasswordFlag, cc.Password = true, o.user, true, []byte(password(o.user))
	}
	if o.will != "" {
		cc.WillFlag, cc.WillTopic, cc.WillMessage, cc.WillQOS, cc.WillRetain = true, o.will, []byte(o.willMsg), 1, true
		cc.WillProperties = &packets.Properties{}
	}
	if o.version != 0 {
		cc.ProtocolVersion = o.version
		if o.version == 4 {
			cc.Properties = nil
		}
	}
	if cc.Properties != nil {
		if o.receiveMax > 0 {
			rm := o.receiveMax
			cc.Properties.ReceiveMaximum = &rm
		}
		if o.expiry > 0 {
			e := o.expiry
			cc.Properties.SessionExpiryInterval = &e
		}
	}
	if _, err := cp.WriteTo(conn); err != nil {
		t.Fatalf("connect: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	ack, err := packets.ReadPacket(conn)
	if err != nil {
		t.Fatalf("connack: %v", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	ca, ok := ack.Content.(*packets.Connack)
	if !ok || ca.ReasonCode != 0 {
		t.Fatalf("connack: %v", ack.Content)
	}
	c.connack = ca
	go c.read()
	t.Cleanup(func() { c.close() })
	return c
}

func (c *rawClient) read() {
	defer close(c.closed)
	for {
		cp, err := packets.ReadPacket(c.conn)
		if err != nil {
			c.err = err
			return
		}
		c.mu.Lock()
		c.seen = append(c.seen, cp.FixedHeader.Type)
		c.mu.Unlock()
		switch p := cp.Content.(type) {
		case *packets.Publish:
			c.msgs <- p
		case *packets.Puback:
			c.mu.Lock()
			ch := c.acks[p.PacketID]
			delete(c.acks, p.PacketID)
			c.mu.Unlock()
			if ch != nil {
				ch <- p
			}
		case *packets.Pubrec:
			c.mu.Lock()
			ch := c.recs[p.PacketID]
			delete(c.recs, p.PacketID)
			c.mu.Unlock()
			if ch != nil {
				ch <- p
			}
		case *packets.Suback:
			c.mu.Lock()
			ch := c.subs[p.PacketID]
			c.mu.Unlock()
			ch <- p
		case *packets.Unsuback:
			c.mu.Lock()
			ch := c.unsubs[p.PacketID]
			c.mu.Unlock()
			ch <- p
		case *packets.Disconnect:
			c.mu.Lock()
			c.disconnect = p
			c.mu.Unlock()
		}
	}
}

func (c *rawClient) write(p interface {
	WriteTo(io.Writer) (int64, error)
}) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := p.WriteTo(c.conn); err != nil {
		c.t.Logf("%s: write: %v", c.id, err)
	}
}

func (c *rawClient) id16() uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	return c.nextID
}

func (c *rawClient) close() {
	_ = c.conn.Close()
	<-c.closed
}

// subscribe sends one SUBSCRIBE and returns the SUBACK reason codes.
func (c *rawClient) subscribe(qos byte, user map[string]string, filters ...string) []byte {
	c.t.Helper()
	return c.subscribeAck(qos, user, filters...).Reasons
}

// subscribeAck sends one SUBSCRIBE and returns its SUBACK.
func (c *rawClient) subscribeAck(qos byte, user map[string]string, filters ...string) *packets.Suback {
	c.t.Helper()
	id := c.id16()
	ch := make(chan *packets.Suback, 1)
	c.mu.Lock()
	c.subs[id] = ch
	c.mu.Unlock()
	s := &packets.Subscribe{PacketID: id, Properties: &packets.Properties{}}
	for k, v := range user {
		s.Properties.User = append(s.Properties.User, packets.User{Key: k, Value: v})
	}
	for _, f := range filters {
		s.Subscriptions = append(s.Subscriptions, packets.SubOptions{Topic: f, QoS: qos})
	}
	c.write(s)
	select {
	case sa := <-ch:
		return sa
	case <-time.After(5 * time.Second):
		c.t.Fatalf("%s: no SUBACK", c.id)
		return nil
	}
}

// publishAsync sends a QoS 1 PUBLISH with user properties (name, value,
// ...) and returns the channel its PUBACK arrives on.
func (c *rawClient) publishAsync(topic string, payload []byte, user ...string) chan *packets.Puback {
	props := &packets.Properties{}
	for i := 0; i+1 < len(user); i += 2 {
		props.User = append(props.User, packets.User{Key: user[i], Value: user[i+1]})
	}
	return c.publishProps(topic, payload, props)
}

// publishProps sends a QoS 1 PUBLISH with the given properties and returns
// the channel its PUBACK arrives on.
func (c *rawClient) publishProps(topic string, payload []byte, props *packets.Properties) chan *packets.Puback {
	id := c.id16()
	ch := make(chan *packets.Puback, 1)
	c.mu.Lock()
	c.acks[id] = ch
	c.mu.Unlock()
	c.write(&packets.Publish{Topic: topic, Payload: payload, QoS: 1, PacketID: id, Properties: props})
	return ch
}

// publishExpiring sends a QoS 1 PUBLISH with an MQTT 5 Message Expiry
// Interval and waits for its PUBACK reason code.
func (c *rawClient) publishExpiring(topic string, payload []byte, seconds uint32) byte {
	c.t.Helper()
	return c.waitAck(c.publishProps(topic, payload, &packets.Properties{MessageExpiry: &seconds})).ReasonCode
}

// publish sends a QoS 1 PUBLISH and waits for its PUBACK reason code.
func (c *rawClient) publish(topic string, payload []byte, user ...string) byte {
	c.t.Helper()
	return c.waitAck(c.publishAsync(topic, payload, user...)).ReasonCode
}

func (c *rawClient) waitAck(ch chan *packets.Puback) *packets.Puback {
	c.t.Helper()
	select {
	case a := <-ch:
		return a
	case <-c.closed:
		c.t.Fatalf("%s: connection closed before PUBACK: %v", c.id, c.err)
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s: no PUBACK in 10s", c.id)
	}
	return nil
}

// puback settles a delivery with a reason code.
func (c *rawClient) puback(p *packets.Publish, code byte) {
	c.write(&packets.Puback{PacketID: p.PacketID, ReasonCode: code, Properties: &packets.Properties{}})
}

// next waits for the next delivery.
func (c *rawClient) next(within time.Duration) *packets.Publish {
	c.t.Helper()
	select {
	case p := <-c.msgs:
		return p
	case <-time.After(within):
		c.t.Fatalf("%s: no delivery within %s", c.id, within)
		return nil
	}
}

// none asserts that nothing is delivered for d.
func (c *rawClient) none(d time.Duration) {
	c.t.Helper()
	select {
	case p := <-c.msgs:
		c.t.Fatalf("%s: unexpected delivery %s %q", c.id, p.Topic, p.Payload)
	case <-time.After(d):
	}
}

func userProp(p *packets.Publish, key string) string {
	if p.Properties == nil {
		return ""
	}
	for _, u := range p.Properties.User {
		if u.Key == key {
			return u.Value
		}
	}
	return ""
}

func payloads(n int, prefix string) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s-%05d", prefix, i))
	}
	return out
}

// dialV3 connects an MQTT 3.1.1 client (paho.mqtt.golang).
func dialV3(t *testing.T, addr, id string, edit func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectRetry(false).SetCleanSession(true)
	if edit != nil {
		edit(o)
	}
	c := paho3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("v3.1.1 connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}
