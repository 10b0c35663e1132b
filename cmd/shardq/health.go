package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/shardq/shardq/config"
)

const healthUsage = `usage: shardq health [--server URL] [--ready] [--timeout DURATION]

Asks a node whether it is alive (GET /healthz) or, with --ready, ready to
serve (GET /readyz: storage recovered, listeners up, not shutting down).
Exits 0 when the node answers 200, 1 otherwise, saying why on stderr. Made
for container and service health checks: the shardq image has no curl.

The node is --server, else SHARDQ_SERVER, else the loopback address of the
port SHARDQ_HTTP names (the node's own --http variable, so that a check
inside its container follows it), else http://127.0.0.1:8990.
`

// healthCommand runs shardq health.
func healthCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := newCommand("health", healthUsage)
	server := c.flags.String("server", defaultServer, "the node's HTTP `URL`")
	c.env["server"] = "SHARDQ_SERVER"
	ready := c.flags.Bool("ready", false, "check /readyz rather than /healthz")
	timeout := c.flags.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	cacert := c.flags.String("cacert", "", "a PEM `FILE` of the CAs that signed an https node's certificate (default: the system's)")
	c.env["cacert"] = "SHARDQ_CACERT"
	if code := c.parseNoArgs(args, getenv, stdout, stderr); code >= 0 {
		return code
	}
	if !isSet(c.flags, "server") && getenv("SHARDQ_SERVER") == "" {
		*server = healthServer(getenv)
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	url := strings.TrimRight(*server, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "shardq health: %v\n", err)
		return 2
	}
	hc, err := httpClient(*cacert, 0)
	if err != nil {
		return c.fail(stderr, "%v", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "shardq health: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	answer := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "shardq health: %s: %s %s\n", url, resp.Status, answer)
		return 1
	}
	fmt.Fprintln(stdout, answer)
	return 0
}

// httpClient returns the client of the commands that call a node:
// trusting the CAs of the PEM file cacert for https, or the system's.
func httpClient(cacert string, timeout time.Duration) (*http.Client, error) {
	c := &http.Client{Timeout: timeout}
	if cacert == "" {
		return c, nil
	}
	pool, err := config.LoadCertPool(cacert)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %v", err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c.Transport = t
	return c, nil
}

// healthServer returns the node shardq health asks when neither --server
// nor SHARDQ_SERVER name one.
func healthServer(getenv func(string) string) string {
	if addr := getenv("SHARDQ_HTTP"); addr != "" {
		if host, port, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				host = "127.0.0.1"
			}
			return "http://" + net.JoinHostPort(host, port)
		}
	}
	return defaultServer
}
