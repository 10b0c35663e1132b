package broker_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/internal/testcert"
)

// tlsNode is a node with MQTT over TLS, WebSocket over TLS and HTTPS, its
// CA and the files of its certificates.
type tlsNode struct {
	*testBroker
	dir    string
	ca     *testcert.CA
	server testcert.Pair
	users  string
	cfg    config.Config // as started, for reloads
}

func startTLSNode(t *testing.T, edit func(*config.Config)) *tlsNode {
	t.Helper()
	dir := t.TempDir()
	n := &tlsNode{dir: dir, ca: testcert.NewCA(t, dir, "ca")}
	n.server = n.ca.Server(t, dir, "server")
	n.users = writeUsers(t, dir, "bob")
	n.testBroker = startBroker(t, t.TempDir(), func(c *config.Config) {
		c.MQTTS, c.WS, c.WSS = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		c.Protocol.TLS = config.MQTTTLS{Cert: n.server.CertFile, Key: n.server.KeyFile, ClientCA: n.ca.CertFile, CNAsUsername: true}
		c.Admin.TLS = config.HTTPTLS{Cert: n.server.CertFile, Key: n.server.KeyFile}
		c.Admin.Token = adminToken
		c.Auth.UsersFile = n.users
		c.Auth.ACL = []auth.Rule{
			{User: "*", Action: auth.Publish, Pattern: "devices/%u/#", Permission: auth.Allow},
			{User: "*", Action: auth.Produce, Pattern: "*", Permission: auth.Allow},
			{User: "*", Action: auth.Consume, Pattern: "*", Permission: auth.Allow},
		}
		if edit != nil {
			edit(c)
		}
		n.cfg = *c
	})
	return n
}

// clientTLS returns a client configuration trusting the CA, with the
// client certificate when there is one.
func clientTLS(pool *x509.CertPool, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

func dialTLS(t *testing.T, addr string, conf *tls.Config) *tls.Conn {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	return conn
}

// TestSecurityTLSListeners checks MQTT over TLS and over WebSocket over
// TLS, a client certificate's CN as its username, and HTTPS.
func TestSecurityTLSListeners(t *testing.T) {
	n := startTLSNode(t, nil)
	mqtts, wss, ws := n.ListenerAddr("mqtts"), n.ListenerAddr("wss"), n.ListenerAddr("ws")
	alice := n.ca.Client(t, n.dir, "alice")
	aliceCert := alice.TLS(t)

	t.Run("client certificate as the user", func(t *testing.T) {
		c := rawOn(t, dialTLS(t, mqtts, clientTLS(n.ca.Pool, &aliceCert)), "alice-tls", creds{})
		if rc := c.publish("devices/alice/t", []byte("x")); rc != 0 {
			t.Errorf("alice's own topic: PUBACK %#x", rc)
		}
		if rc := c.publish("devices/bob/t", []byte("x")); rc != 0x87 {
			t.Errorf("bob's topic as alice: PUBACK %#x, want 0x87", rc)
		}
	})
	t.Run("password over TLS", func(t *testing.T) {
		c := rawOn(t, dialTLS(t, mqtts, clientTLS(n.ca.Pool, nil)), "bob-tls", creds{user: "bob", pass: "bob-pw"})
		if rc := c.publish("devices/bob/t", []byte("x")); rc != 0 {
			t.Errorf("bob's own topic: PUBACK %#x", rc)
		}
		conn := dialTLS(t, mqtts, clientTLS(n.ca.Pool, nil))
		defer conn.Close()
		if ca := connectOn(t, conn, "nobody", creds{}); ca.ReasonCode != 0x86 {
			t.Errorf("no certificate, no password: CONNACK %#x, want 0x86", ca.ReasonCode)
		}
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		other := testcert.NewCA(t, t.TempDir(), "other")
		stranger := other.Client(t, t.TempDir(), "alice").TLS(t)
		conf := clientTLS(n.ca.Pool, nil)
		// Sent whatever CAs the server asks for (Go's client would send none).
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stranger, nil }
		conn, err := tls.Dial("tcp", mqtts, conf)
		if err == nil {
			// TLS 1.3: the server's verdict arrives with the first read.
			defer conn.Close()
			_, _ = conn.Write(connect311("x", creds{}))
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 8))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a certificate of another CA: %v, want a TLS certificate error", err)
		}
	})
	t.Run("websocket over TLS, MQTT 3.1.1", func(t *testing.T) {
		c, _ := dialV3As(t, "wss://"+wss+"/mqtt", "bob-wss", "bob", clientTLS(n.ca.Pool, nil))
		if tok := c.Publish("devices/bob/w", 1, false, "x"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Errorf("publish over wss: %v", tok.Error())
		}
		c2, lost := dialV3As(t, "wss://"+wss+"/mqtt", "alice-wss", "", clientTLS(n.ca.Pool, &aliceCert))
		if tok := c2.Publish("devices/alice/w", 1, false, "x"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Errorf("alice over wss with her certificate: %v", tok.Error())
		}
		c2.Publish("devices/bob/w", 1, false, "x")
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Error("alice publishing to bob's topic over wss: still connected")
		}
	})
	t.Run("websocket", func(t *testing.T) {
		c, _ := dialV3As(t, "ws://"+ws+"/mqtt", "bob-ws", "bob", nil)
		if tok := c.Publish("devices/bob/w", 1, false, "x"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Errorf("publish over ws: %v", tok.Error())
		}
	})
	t.Run("mosquitto clients with --cafile", func(t *testing.T) {
		p := port(mqtts)
		if out, err := mosquitto(t, "mosquitto_pub", "-h", "localhost", "-p", p, "--cafile", n.ca.CertFile, "-V", "mqttv5",
			"-u", "bob", "-P", "bob-pw", "-q", "1", "-t", "devices/bob/m", "-m", "x"); err != nil {
			t.Errorf("mosquitto_pub --cafile -u -P: %v\n%s", err, out)
		}
		if out, err := mosquitto(t, "mosquitto_pub", "-h", "localhost", "-p", p, "--cafile", n.ca.CertFile, "-V", "mqttv5",
			"--cert", alice.CertFile, "--key", alice.KeyFile, "-q", "1", "-t", "$queue/tls", "-m", "x"); err != nil {
			t.Errorf("mosquitto_pub --cert: %v\n%s", err, out)
		}
		if out, err := mosquitto(t, "mosquitto_pub", "-h", "localhost", "-p", p, "--cafile", n.ca.CertFile, "-V", "mqttv5",
			"-u", "bob", "-P", "wrong", "-q", "1", "-t", "devices/bob/m", "-m", "x"); err == nil {
			t.Errorf("mosquitto_pub with a wrong password succeeded:\n%s", out)
		}
	})
	t.Run("https", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(n.ca.Pool, nil)}, Timeout: 5 * time.Second}
		base := "https://" + n.HTTPAddr()
		for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/api/v1/queues": 401} {
			resp, err := hc.Get(base + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
			}
		}
		req, _ := http.NewRequest("GET", base+"/api/v1/queues", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /api/v1/queues with the token over https: %v %v", resp, err)
		}
		resp.Body.Close()
		if resp, err := http.Get("http://" + n.HTTPAddr() + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Error("plain http served on the https listener")
			}
		}
	})
}

// TestSecurityRequireClientCert checks mqtt.tls.require_client_cert: a
// TLS client without a certificate does not get through.
func TestSecurityRequireClientCert(t *testing.T) {
	n := startTLSNode(t, func(c *config.Config) { c.Protocol.TLS.RequireClientCert = true })
	conn, err := tls.Dial("tcp", n.ListenerAddr("mqtts"), clientTLS(n.ca.Pool, nil))
	if err == nil {
		defer conn.Close()
		_, _ = conn.Write(connect311("x", creds{user: "bob", pass: "bob-pw"}))
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 8))
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("no client certificate: %v, want a TLS certificate error", err)
	}
	alice := n.ca.Client(t, n.dir, "alice").TLS(t)
	rawOn(t, dialTLS(t, n.ListenerAddr("mqtts"), clientTLS(n.ca.Pool, &alice)), "alice", creds{})
}

// TestSecurityReload checks Reload (SIGHUP): new users, rules, token and
// certificates apply to what follows, connections made before stay up,
// and a reload with an invalid file changes nothing.
func TestSecurityReload(t *testing.T) {
	n := startTLSNode(t, nil)
	mqtts := n.ListenerAddr("mqtts")
	before := rawOn(t, dialTLS(t, mqtts, clientTLS(n.ca.Pool, nil)), "bob-1", creds{user: "bob", pass: "bob-pw"})
	if code := connackCode(t, n.MQTTAddr(), "carol", creds{user: "carol", pass: "carol-pw"}); code != 0x86 {
		t.Fatalf("carol before the reload: %#x", code)
	}

	// New users, a rule for carol, a new token, a certificate of a new CA,
	// each file replaced in place.
	writeUsers(t, n.dir, "bob", "carol")
	ca2 := testcert.NewCA(t, t.TempDir(), "ca2")
	fresh := ca2.Server(t, t.TempDir(), "server2")
	for src, dst := range map[string]string{fresh.CertFile: n.server.CertFile, fresh.KeyFile: n.server.KeyFile} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := n.cfg
	cfg.Admin.Token = "new-token"
	cfg.Auth.ACL = append([]auth.Rule{{User: "carol", Action: auth.Publish, Pattern: "carol/#", Permission: auth.Allow}}, cfg.Auth.ACL...)
	if err := n.Reload(func() (*config.Config, error) { return &cfg, nil }); err != nil {
		t.Fatalf("Reload: %v", err)
	}

	carol := dialAs(t, n.MQTTAddr(), "carol", "carol")
	if rc := carol.publish("carol/x", []byte("x")); rc != 0 {
		t.Errorf("carol's new rule: PUBACK %#x", rc)
	}
	if rc := before.publish("devices/bob/x", []byte("x")); rc != 0 {
		t.Errorf("a connection from before the reload: PUBACK %#x", rc)
	}
	// New handshakes present the new certificate; the old CA fails them.
	if conn, err := tls.Dial("tcp", mqtts, clientTLS(n.ca.Pool, nil)); err == nil {
		conn.Close()
		t.Error("the old CA still verifies new handshakes")
	}
	rawOn(t, dialTLS(t, mqtts, clientTLS(ca2.Pool, nil)), "bob-2", creds{user: "bob", pass: "bob-pw"})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(ca2.Pool, nil)}, Timeout: 5 * time.Second}
	for token, want := range map[string]int{"new-token": 200, adminToken: 401} {
		req, _ := http.NewRequest("GET", "https://"+n.HTTPAddr()+"/api/v1/queues", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("token %s after the reload: %d, want %d", token, resp.StatusCode, want)
		}
	}

	// A broken users file: the reload fails and nothing changes.
	if err := os.WriteFile(n.users, []byte("carol:not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(func() (*config.Config, error) { return &cfg, nil }); err == nil {
		t.Fatal("Reload with a broken users file succeeded")
	}
	dialAs(t, n.MQTTAddr(), "carol-2", "carol")
	resp, err := hc.Get("https://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	samples, err := parseMetrics(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := sum(samples, "shardq_config_reloads_total", map[string]string{"result": "ok"})
	failed, _ := sum(samples, "shardq_config_reloads_total", map[string]string{"result": "failed"})
	if ok != 1 || failed != 1 {
		t.Errorf("reloads ok %v, failed %v; want 1 and 1", ok, failed)
	}
}
