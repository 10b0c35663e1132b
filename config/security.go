package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/auth"
)

// listener is a listen address and its YAML path.
type listener struct {
	path, addr string
	mqtt       bool // an MQTT listener (not HTTP)
	tls        bool // served with mqtt.tls
}

func (c *Config) listeners() []listener {
	return []listener{
		{"listen.mqtt", c.MQTT, true, false},
		{"listen.mqtts", c.MQTTS, true, true},
		{"listen.ws", c.WS, true, false},
		{"listen.wss", c.WSS, true, true},
		{"listen.http", c.HTTP, false, false},
	}
}

// Loopback reports whether addr (host:port) listens on a loopback address
// only: 127.0.0.0/8, ::1 or localhost. An empty host (every address) and
// any other host name are not.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	host, _, _ = strings.Cut(host, "%") // an IPv6 zone
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// AnonymousAllowed reports whether clients without credentials may
// connect: mqtt.allow_anonymous, or no users configured while every MQTT
// listener is on a loopback address.
func (c *Config) AnonymousAllowed() bool {
	if c.Protocol.AllowAnonymous {
		return true
	}
	if c.UsersConfigured() {
		return false
	}
	for _, l := range c.listeners() {
		if l.mqtt && l.addr != "" && !Loopback(l.addr) {
			return false
		}
	}
	return true
}

// EffectiveMaxPacketSize returns mqtt.max_packet_size, or, when it is 0,
// storage.max_payload plus 64 KiB.
func (c *Config) EffectiveMaxPacketSize() int {
	if c.Protocol.MaxPacketSize > 0 {
		return c.Protocol.MaxPacketSize
	}
	return c.Storage.MaxPayload + 64<<10
}

// validateSecurity checks the settings of authentication, authorization,
// TLS and limits, and that no listener is open to other machines without
// credentials.
func (c *Config) validateSecurity(fail func(path, reason string, err error)) {
	// A listener reachable from elsewhere needs credentials.
	for _, l := range c.listeners() {
		if l.addr == "" || checkAddr(l.addr) != "" || Loopback(l.addr) {
			continue
		}
		switch {
		case l.mqtt && !c.UsersConfigured() && !c.Protocol.AllowAnonymous:
			fail(l.path, fmt.Sprintf("%q is not a loopback address: clients of other machines need credentials "+
				"(set auth.users_file, see shardq passwd, or mqtt.tls.cn_as_username) or mqtt.allow_anonymous: true", l.addr), nil)
		case !l.mqtt && c.Admin.Token == "":
			fail(l.path, fmt.Sprintf("%q is not a loopback address: the admin API needs http.admin_token (SHARDQ_ADMIN_TOKEN) there", l.addr), nil)
		}
	}

	// Users and rules.
	if f := c.Auth.UsersFile; f != "" {
		if _, err := auth.LoadUsers(f); err != nil {
			for _, e := range flatten(err) {
				reason := e.Error()
				if pe, ok := errors.AsType[*os.PathError](e); ok {
					reason = "cannot read " + f + ": " + pe.Err.Error()
				} else if le, ok := errors.AsType[*auth.LineError](e); ok {
					reason = fmt.Sprintf("%s:%d: %s", f, le.Line, le.Reason)
				}
				fail("auth.users_file", reason, e)
			}
		}
	}
	if _, err := auth.Compile(c.Auth.ACL); err != nil {
		for _, e := range flatten(err) {
			if re, ok := errors.AsType[*auth.RuleError](e); ok {
				fail(fmt.Sprintf("auth.acl[%d].%s", re.Index, re.Field), re.Reason, e)
			} else {
				fail("auth.acl", e.Error(), e)
			}
		}
	}

	// TLS of the MQTT listeners.
	t := c.Protocol.TLS
	tlsListener := ""
	for _, l := range c.listeners() {
		if l.tls && l.addr != "" && tlsListener == "" {
			tlsListener = l.path
		}
	}
	switch {
	case tlsListener != "" && (t.Cert == "" || t.Key == ""):
		fail("mqtt.tls.cert", fmt.Sprintf("%s needs a certificate: set mqtt.tls.cert and mqtt.tls.key", tlsListener), nil)
	case tlsListener == "" && (t.Cert != "" || t.Key != "" || t.ClientCA != ""):
		fail("mqtt.tls", "no listener uses it: set listen.mqtts or listen.wss", nil)
	case tlsListener != "":
		if _, err := tls.LoadX509KeyPair(t.Cert, t.Key); err != nil {
			fail("mqtt.tls.cert", "cannot load the certificate and key: "+err.Error(), err)
		}
	}
	if t.ClientCA != "" {
		if _, err := LoadCertPool(t.ClientCA); err != nil {
			fail("mqtt.tls.client_ca", err.Error(), err)
		}
	}
	if t.RequireClientCert && t.ClientCA == "" {
		fail("mqtt.tls.require_client_cert", "needs mqtt.tls.client_ca, the CAs that sign client certificates", nil)
	}
	if t.CNAsUsername && t.ClientCA == "" {
		fail("mqtt.tls.cn_as_username", "needs mqtt.tls.client_ca, the CAs that sign client certificates", nil)
	}

	// HTTPS.
	h := c.Admin.TLS
	switch {
	case (h.Cert == "") != (h.Key == ""):
		fail("http.tls.cert", "set both http.tls.cert and http.tls.key, or neither", nil)
	case h.Cert != "" && c.HTTP == "":
		fail("http.tls", "listen.http is disabled", nil)
	case h.Cert != "":
		if _, err := tls.LoadX509KeyPair(h.Cert, h.Key); err != nil {
			fail("http.tls.cert", "cannot load the certificate and key: "+err.Error(), err)
		}
	}

	// Limits.
	c.validateTenants(fail)
	if n := c.Limits.MaxQueues; n < 0 {
		fail("limits.max_queues", fmt.Sprintf("must be 0 (no limit) or more, got %d", n), nil)
	}
	if n := c.Limits.MaxConnections; n < 0 {
		fail("limits.max_connections", fmt.Sprintf("must be 0 (no limit) or more, got %d", n), nil)
	}
	if n := c.Protocol.MaxQueuedMessages; n < 1 || n > 65535 {
		fail("mqtt.max_queued_messages", fmt.Sprintf("must be from 1 to 65535, got %d", n), nil)
	}
	if d := c.Protocol.WriteTimeout; d < time.Second {
		fail("mqtt.write_timeout", fmt.Sprintf("must be at least 1s, got %v", d), nil)
	}
	if n := c.Protocol.MaxPacketSize; n != 0 && (n < MinMaxPacketSize || n > MaxMaxPacketSize) {
		fail("mqtt.max_packet_size", fmt.Sprintf("must be 0 (storage.max_payload + 64 KiB) or from %d to %d, got %d", MinMaxPacketSize, MaxMaxPacketSize, n), nil)
	}
	c.validateMaxDelay(fail)
}

// validateMaxDelay checks each queue's max_delay: not negative, and not
// longer than the queue's max_age, which would expire a message delayed
// that long before its delivery.
func (c *Config) validateMaxDelay(fail func(path, reason string, err error)) {
	check := func(path string, d, maxAge time.Duration) {
		switch {
		case d < 0:
			fail(path, fmt.Sprintf("must not be negative, got %s", d), nil)
		case d > 0 && maxAge > 0 && d > maxAge:
			fail(path, fmt.Sprintf("must not be longer than max_age (%s): a message delayed %s would expire before its delivery", maxAge, d), nil)
		}
	}
	check("queues.defaults.max_delay", c.Queues.MaxDelay, c.Queues.Defaults.MaxAge)
	names := make([]string, 0, len(c.Queues.Declared))
	for name := range c.Queues.Declared {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		o := c.Queues.Declared[name]
		path := "queues.declared." + name + ".max_delay"
		d, own := c.Queues.DeclaredMaxDelay[name]
		if !own {
			if c.Queues.MaxDelay <= o.MaxAge || o.MaxAge == 0 || !c.setHere("queues.declared."+name+".max_age") {
				continue // fine, or reported at queues.defaults
			}
			d, path = c.Queues.MaxDelay, "queues.declared."+name+".max_age"
			fail(path, fmt.Sprintf("is shorter than queues.defaults.max_delay (%s): set this queue's max_delay too", d), nil)
			continue
		}
		check(path, d, o.MaxAge)
	}
}

// LoadCertPool reads a PEM file of CA certificates.
func LoadCertPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
