package broker_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/shardq/shardq/auth"
)

// Passwords of the users of the security tests: each user's name with
// "-pw" after it.
func password(user string) string { return user + "-pw" }

// writeUsers writes a users file of the users (bcrypt's lowest cost, so
// that tests stay fast) and returns its path.
func writeUsers(t testing.TB, dir string, users ...string) string {
	t.Helper()
	var b strings.Builder
	for _, u := range users {
		h, err := auth.HashPassword(password(u), auth.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(auth.Line(u, h) + "\n")
	}
	p := filepath.Join(dir, "users")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// creds are what a test client connects with.
type creds struct {
	user, pass string
	version    byte // 5 unless 4
	will       string
}

// connectOn sends a CONNECT on conn and returns the CONNACK, for MQTT 5 or
// 3.1.1.
func connectOn(t testing.TB, conn net.Conn, id string, c creds) *packets.Connack {
	t.Helper()
	cp := packets.NewControlPacket(packets.CONNECT)
	cc := cp.Content.(*packets.Connect)
	cc.ClientID, cc.CleanStart, cc.KeepAlive = id, true, 30
	if c.user != "" {
		cc.UsernameFlag, cc.Username = true, c.user
	}
	if c.pass != "" {
		cc.PasswordFlag, cc.Password = true, []byte(c.pass)
	}
	if c.will != "" {
		cc.WillFlag, cc.WillTopic, cc.WillMessage, cc.WillQOS = true, c.will, []byte("gone"), 1
		cc.WillProperties = &packets.Properties{}
	}
	var err error
	if c.version == 4 {
		_, err = conn.Write(connect311(id, c))
	} else {
		_, err = cp.WriteTo(conn)
	}
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	if c.version == 4 {
		// paho.golang reads MQTT 5 only: a 3.1.1 CONNACK is 4 bytes.
		var b [4]byte
		if _, err := io.ReadFull(conn, b[:]); err != nil || b[0] != 0x20 || b[1] != 2 {
			t.Fatalf("3.1.1 connack: % x, %v", b, err)
		}
		return &packets.Connack{SessionPresent: b[2] == 1, ReasonCode: b[3]}
	}
	p, err := packets.ReadPacket(conn)
	if err != nil {
		t.Fatalf("connack: %v", err)
	}
	ca, ok := p.Content.(*packets.Connack)
	if !ok {
		t.Fatalf("got %v, want a CONNACK", p.Content)
	}
	return ca
}

// connect311 encodes an MQTT 3.1.1 CONNECT (clean session, keep-alive
// 30 s); paho.golang encodes MQTT 5 only.
func connect311(id string, c creds) []byte {
	str := func(b []byte, s string) []byte { return append(append(b, byte(len(s)>>8), byte(len(s))), s...) }
	flags := byte(0x02)
	body := str(nil, "MQTT")
	body = append(body, 4, 0, 0, 30)
	body = str(body, id)
	if c.will != "" {
		flags |= 0x04 | 1<<3
		body = str(str(body, c.will), "gone")
	}
	if c.user != "" {
		flags |= 0x80
		body = str(body, c.user)
	}
	if c.pass != "" {
		flags |= 0x40
		body = str(body, c.pass)
	}
	body[7] = flags
	out := []byte{0x10}
	for n := len(body); ; {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		out = append(out, b)
		if n == 0 {
			break
		}
	}
	return append(out, body...)
}

// connackCode connects to addr over TCP and returns the CONNACK's code.
func connackCode(t *testing.T, addr, id string, c creds) byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return connectOn(t, conn, id, c).ReasonCode
}

// rawOn connects an MQTT 5 client on conn with credentials, failing the
// test unless the CONNACK says success, and returns it as a rawClient.
func rawOn(t *testing.T, conn net.Conn, id string, c creds) *rawClient {
	t.Helper()
	ca := connectOn(t, conn, id, c)
	if ca.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK %#x", id, ca.ReasonCode)
	}
	rc := &rawClient{t: t, conn: conn, id: id, acks: map[uint16]chan *packets.Puback{},
		recs: map[uint16]chan *packets.Pubrec{},
		subs: map[uint16]chan *packets.Suback{}, unsubs: map[uint16]chan *packets.Unsuback{},
		msgs: make(chan *packets.Publish, 1000), closed: make(chan struct{}), connack: ca}
	go rc.read()
	t.Cleanup(rc.close)
	return rc
}

// dialAs connects an MQTT 5 client over TCP as the user.
func dialAs(t *testing.T, addr, id, user string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return rawOn(t, conn, id, creds{user: user, pass: password(user)})
}

// dialV3As connects an MQTT 3.1.1 client (paho.mqtt.golang) as the user;
// lost receives the connection's end.
func dialV3As(t *testing.T, broker, id, user string, tlsConf *tls.Config) (paho3.Client, chan error) {
	t.Helper()
	lost := make(chan error, 1)
	c := dialV3(t, broker, id, func(o *paho3.ClientOptions) {
		if strings.Contains(broker, "://") {
			o.Servers = nil
			o.AddBroker(broker)
		}
		o.SetUsername(user).SetPassword(password(user)).SetTLSConfig(tlsConf)
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	return c, lost
}

// counter reads a counter of the node's /metrics with the given label.
func counter(t *testing.T, b *testBroker, name, label, value string) float64 {
	t.Helper()
	v, _ := sum(scrape(t, b), name, map[string]string{label: value})
	return v
}

// mosquitto runs a mosquitto client (Debian's mosquitto-clients), skipping
// the test without it; it returns the exit error and the output.
func mosquitto(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (Debian package mosquitto-clients)", name)
	}
	cmd := exec.Command(path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("%s %v still running after 20s:\n%s", name, args, out.String())
		return "", nil
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
