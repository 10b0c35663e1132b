package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/internal/testcert"
)

func TestConfigLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1883": true,
		"127.1.2.3:1":    true,
		"[::1]:1883":     true,
		"localhost:80":   true,
		":1883":          false,
		"0.0.0.0:1883":   false,
		"[::]:1883":      false,
		"10.0.0.1:1883":  false,
		"example.com:1":  false,
		"garbage":        false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// usersFile writes a users file with one user and returns its path.
func usersFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func goodUsers(t *testing.T) string {
	t.Helper()
	h, err := auth.HashPassword("pw", auth.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return usersFile(t, auth.Line("alice", h)+"\n")
}

// TestConfigSafeDefaults checks that a listener on a non-loopback address
// needs credentials, and an HTTP one a token, naming the listener.
func TestConfigSafeDefaults(t *testing.T) {
	users := goodUsers(t)
	tests := []struct {
		name      string
		flags     []string
		env       map[string]string
		want      []string // errors; nil when it loads
		anonymous bool     // AnonymousAllowed when it loads
	}{
		{name: "defaults: loopback, anonymous", anonymous: true},
		{name: "mqtt on every address",
			flags: []string{"--mqtt", ":1883"},
			want:  []string{`listen.mqtt: ":1883" is not a loopback address: clients of other machines need credentials`, "(from --mqtt)"}},
		{name: "websocket on an interface",
			env:  map[string]string{"SHARDQ_WS": "10.1.2.3:8083"},
			want: []string{`listen.ws: "10.1.2.3:8083" is not a loopback address`, "(from SHARDQ_WS)"}},
		{name: "with users",
			flags: []string{"--mqtt", ":1883", "--users-file", users}},
		{name: "users on loopback: no anonymous",
			flags: []string{"--users-file", users}},
		{name: "anonymous said explicitly",
			flags: []string{"--mqtt", "0.0.0.0:1883", "--allow-anonymous", "true"}, anonymous: true},
		{name: "anonymous beside users",
			env: map[string]string{"SHARDQ_USERS_FILE": users, "SHARDQ_ALLOW_ANONYMOUS": "1"}, anonymous: true},
		{name: "bad bool",
			flags: []string{"--allow-anonymous", "maybe"},
			want:  []string{`mqtt.allow_anonymous: must be true or false, got "maybe" (from --allow-anonymous)`}},
		{name: "http on every address",
			flags: []string{"--http", ":8990"},
			want:  []string{`listen.http: ":8990" is not a loopback address: the admin API needs http.admin_token`}},
		{name: "http with a token",
			flags: []string{"--http", ":8990"}, env: map[string]string{"SHARDQ_ADMIN_TOKEN": "t0ken"}, anonymous: true},
		{name: "cluster port on an interface without TLS",
			flags: []string{"--etcd", "http://127.0.0.1:2379", "--cluster-addr", "10.1.2.3:8991"},
			want:  []string{`cluster.addr: "10.1.2.3:8991" is not a loopback address: the links between nodes carry every message`, "cluster.allow_insecure"}},
		{name: "cluster port on an interface, clear text said explicitly",
			flags: []string{"--etcd", "http://127.0.0.1:2379", "--cluster-addr", "10.1.2.3:8991", "--cluster-allow-insecure", "true"},
			env:   map[string]string{"SHARDQ_CLUSTER_TOKEN": "s3cret"}, anonymous: true},
		{name: "every listener named in one run",
			flags: []string{"--mqtt", ":1", "--ws", ":2", "--http", ":3"},
			want:  []string{"listen.mqtt:", "listen.ws:", "listen.http:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.flags, env(tc.env))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if got := c.AnonymousAllowed(); got != tc.anonymous {
					t.Errorf("AnonymousAllowed = %v, want %v", got, tc.anonymous)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigAuthSection(t *testing.T) {
	users := goodUsers(t)
	path := writeConfig(t, `
auth:
  users_file: `+users+`
  acl:
    - {user: "*", action: publish, pattern: "devices/%u/#", permission: allow}
    - user: billing
      action: consume
      pattern: orders
      group: billing
      permission: allow
tenants:
  alice:
    publish_rate: 100
    max_connections: 20
  default:
    publish_rate: 1000
    max_queues: 5
limits:
  max_queues: 50
  max_connections: 7
mqtt:
  max_packet_size: 4096
queues:
  defaults:
    max_delay: 1h
  declared:
    orders:
      max_delay: 10m
    jobs:
      max_age: 2h
`)
	c, err := Load([]string{"--config", path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Auth.UsersFile != users || len(c.Auth.ACL) != 2 || c.Auth.ACL[1] != (auth.Rule{User: "billing", Action: auth.Consume, Pattern: "orders", Group: "billing", Permission: "allow"}) {
		t.Errorf("auth = %+v", c.Auth)
	}
	if c.Limits != (Limits{MaxQueues: 50, MaxConnections: 7}) || c.EffectiveMaxPacketSize() != 4096 {
		t.Errorf("limits = %+v, max packet size %d", c.Limits, c.EffectiveMaxPacketSize())
	}
	if c.Tenants["alice"] != (Tenant{PublishRate: 100, MaxQueues: 5, MaxConnections: 20}) || c.Tenants[DefaultTenant] != (Tenant{PublishRate: 1000, MaxQueues: 5}) {
		t.Errorf("tenants = %+v: alice takes default's max_queues and sets the rest", c.Tenants)
	}
	if lim, ok := c.TenantLimits("bob"); !ok || lim != c.Tenants[DefaultTenant] {
		t.Errorf("bob, not named, gets %+v, %v: want default's", lim, ok)
	}
	for q, want := range map[string]time.Duration{"orders": 10 * time.Minute, "jobs": time.Hour, "auto": time.Hour} {
		if got := c.QueueMaxDelay(q); got != want {
			t.Errorf("max_delay of %s = %s, want %s", q, got, want)
		}
	}
	if d := Default(); d.EffectiveMaxPacketSize() != d.Storage.MaxPayload+64<<10 || d.Limits.MaxQueues != DefaultMaxQueues || d.Limits.MaxConnections != DefaultMaxConnections {
		t.Errorf("default limits %+v, max packet size %d", d.Limits, d.EffectiveMaxPacketSize())
	}
}

func TestConfigAuthErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, dir, "ca")
	srv := ca.Server(t, dir, "server")
	badUsers := usersFile(t, "# users\nalice:nothash\nbob\n")
	tests := []struct {
		name  string
		flags []string
		file  string
		want  []string
	}{
		{name: "missing users file",
			flags: []string{"--users-file", filepath.Join(dir, "none")},
			want:  []string{"auth.users_file: cannot read " + filepath.Join(dir, "none")}},
		{name: "bad users file: every line",
			file: "auth:\n  users_file: " + badUsers + "\n",
			want: []string{"shardq.yaml:2: auth.users_file: " + badUsers + ":2: the hash of \"alice\"", badUsers + ":3: want USER:BCRYPT-HASH"}},
		{name: "bad rules: every field, with its line",
			file: "auth:\n  acl:\n    - {user: \"*\", action: publish, pattern: a, permission: allow}\n" +
				"    - user: bob\n      action: pub\n      pattern: \"a/#/b\"\n      permission: allow\n" +
				"    - {user: \"*\", action: produce, pattern: \"orders/x\", permission: maybe, colour: red}\n",
			want: []string{
				"shardq.yaml:5: auth.acl[1].action: must be publish, subscribe, produce, consume or admin",
				"shardq.yaml:8: auth.acl[2].colour: unknown setting",
				"shardq.yaml:8: auth.acl[2].permission: must be allow or deny",
				"shardq.yaml:8: auth.acl[2].pattern:",
			}},
		{name: "acl not a list",
			file: "auth:\n  acl: {user: a}\n",
			want: []string{"shardq.yaml:2: auth.acl: must be a list of rules"}},
		{name: "mqtts without a certificate",
			flags: []string{"--mqtts", "127.0.0.1:8883"},
			want:  []string{"mqtt.tls.cert: listen.mqtts needs a certificate"}},
		{name: "a certificate no listener uses",
			file: "mqtt:\n  tls:\n    cert: " + srv.CertFile + "\n    key: " + srv.KeyFile + "\n",
			want: []string{"shardq.yaml:2: mqtt.tls: no listener uses it"}},
		{name: "unreadable certificate",
			flags: []string{"--wss", "127.0.0.1:8084"},
			file:  "mqtt:\n  tls:\n    cert: " + srv.KeyFile + "\n    key: " + srv.KeyFile + "\n",
			want:  []string{"shardq.yaml:3: mqtt.tls.cert: cannot load the certificate and key"}},
		{name: "client CA that is no PEM, required certs without CA",
			flags: []string{"--mqtts", "127.0.0.1:8883"},
			file: "mqtt:\n  tls:\n    cert: " + srv.CertFile + "\n    key: " + srv.KeyFile + "\n    client_ca: " + badUsers +
				"\n    cn_as_username: true\n",
			want: []string{"mqtt.tls.client_ca: " + badUsers + " holds no PEM certificate"}},
		{name: "required client certs need a CA",
			flags: []string{"--mqtts", "127.0.0.1:8883"},
			file:  "mqtt:\n  tls:\n    cert: " + srv.CertFile + "\n    key: " + srv.KeyFile + "\n    require_client_cert: true\n    cn_as_username: true\n",
			want:  []string{"mqtt.tls.require_client_cert: needs mqtt.tls.client_ca", "mqtt.tls.cn_as_username: needs mqtt.tls.client_ca"}},
		{name: "https half set",
			file: "http:\n  tls:\n    cert: " + srv.CertFile + "\n",
			want: []string{"http.tls.cert: set both http.tls.cert and http.tls.key"}},
		{name: "limits",
			file: "limits:\n  max_queues: -1\n  max_connections: -5\nmqtt:\n  max_packet_size: 10\n",
			want: []string{"shardq.yaml:2: limits.max_queues: must be 0 (no limit) or more", "shardq.yaml:3: limits.max_connections:", "shardq.yaml:5: mqtt.max_packet_size: must be 0"}},
		{name: "tenants",
			file: "tenants:\n  default:\n    publish_rate: -1\n  \"a:b\":\n    max_queues: 1\n  alice:\n    max_bytes: -3\n    max_qeues: 2\n",
			want: []string{
				"shardq.yaml:3: tenants.default.publish_rate: must be 0 (no limit) or more",
				"shardq.yaml:4: tenants.a:b: is not a username",
				"shardq.yaml:7: tenants.alice.max_bytes: must be 0 (no limit) or more",
				"shardq.yaml:8: tenants.alice.max_qeues: unknown setting",
			}},
		{name: "max_delay past max_age",
			file: "queues:\n  defaults:\n    max_delay: 200h\n  declared:\n    orders:\n      max_delay: 2h\n      max_age: 1h\n    jobs:\n      max_delay: -1s\n",
			want: []string{
				"shardq.yaml:3: queues.defaults.max_delay: must not be longer than max_age (168h0m0s)",
				"shardq.yaml:6: queues.declared.orders.max_delay: must not be longer than max_age (1h0m0s)",
				"shardq.yaml:9: queues.declared.jobs.max_delay: must not be negative",
			}},
		{name: "declared max_age under the default max_delay",
			file: "queues:\n  defaults:\n    max_delay: 2h\n  declared:\n    orders:\n      max_age: 1h\n",
			want: []string{"shardq.yaml:6: queues.declared.orders.max_age: is shorter than queues.defaults.max_delay (2h0m0s)"}},
		{name: "max_delay not a duration",
			file: "queues:\n  declared:\n    orders:\n      max_delay: soon\n",
			want: []string{"shardq.yaml:4: queues.declared.orders.max_delay: must be a duration"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.flags
			if tc.file != "" {
				args = append([]string{"--config", writeConfig(t, tc.file)}, args...)
			}
			_, err := Load(args, nil)
			if err == nil {
				t.Fatalf("Load succeeded, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain %q", err, w)
				}
			}
			if strings.Contains(tc.name, "not a duration") && strings.Contains(err.Error(), "negative") {
				t.Errorf("an unreadable max_delay is reported twice: %v", err)
			}
		})
	}
}

func TestConfigTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, dir, "ca")
	srv := ca.Server(t, dir, "server")
	path := writeConfig(t, `
listen:
  mqtts: "127.0.0.1:8883"
  wss: "127.0.0.1:8084"
mqtt:
  tls:
    cert: `+srv.CertFile+`
    key: `+srv.KeyFile+`
    client_ca: `+ca.CertFile+`
    require_client_cert: true
    cn_as_username: true
http:
  tls:
    cert: `+srv.CertFile+`
    key: `+srv.KeyFile+`
`)
	c, err := Load([]string{"--config", path, "--mqtt", "0.0.0.0:1883"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := MQTTTLS{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: ca.CertFile, RequireClientCert: true, CNAsUsername: true}
	if c.Protocol.TLS != want || c.Admin.TLS != (HTTPTLS{srv.CertFile, srv.KeyFile}) || c.MQTTS != "127.0.0.1:8883" || c.WSS != "127.0.0.1:8084" {
		t.Errorf("tls = %+v, %+v", c.Protocol.TLS, c.Admin.TLS)
	}
	// Client certificates count as users: the open listen.mqtt is allowed,
	// but not anonymous clients.
	if !c.UsersConfigured() || c.AnonymousAllowed() {
		t.Errorf("users configured %v, anonymous %v", c.UsersConfigured(), c.AnonymousAllowed())
	}
}
