// Package devetcd runs an etcd server inside the process, for `shardq
// cluster dev` and for tests: one member, on loopback unless told
// otherwise, tuned to be ready fast. Production uses an external etcd
// cluster.
package devetcd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is an embedded single-member etcd.
type Server struct {
	e        *embed.Etcd
	endpoint string
}

// Options tune the server.
type Options struct {
	// Dir holds its data. Required.
	Dir string
	// Host is the address the client port listens on and is advertised
	// at; empty is 127.0.0.1. The peer port stays on 127.0.0.1.
	Host string
	// ClientPort is the client port on Host; 0 picks a free one.
	ClientPort int
	// Fsync makes etcd sync its log (off by default: a development and
	// test server loses nothing that matters when the process dies with it).
	Fsync bool
}

// Start starts the server and waits until it serves. A port picked free
// may be taken by another process before etcd binds it: then it tries
// again with other ports, a few times.
func Start(o Options) (*Server, error) {
	for try := 1; ; try++ {
		s, err := start(o)
		taken := errors.Is(err, syscall.EADDRINUSE) || err != nil && strings.Contains(err.Error(), "address already in use")
		if err == nil || !taken || try == 5 {
			return s, err
		}
	}
}

func start(o Options) (*Server, error) {
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	cport, err := freePort(host, o.ClientPort)
	if err != nil {
		return nil, err
	}
	pport, err := freePort("127.0.0.1", 0)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Dir = o.Dir
	cfg.Name = "dev"
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = !o.Fsync
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	curl := &url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(cport))}
	purl := &url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*curl}, []url.URL{*curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*purl}, []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("devetcd: starting etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("devetcd: etcd not ready after 30s")
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("devetcd: etcd: %w", err)
	}
	return &Server{e: e, endpoint: curl.String()}, nil
}

// Endpoint returns the client URL.
func (s *Server) Endpoint() string { return s.endpoint }

// Close stops the server.
func (s *Server) Close() { s.e.Close() }

// freePort returns p, or when p is 0 a port free on host.
func freePort(host string, p int) (int, error) {
	if p != 0 {
		return p, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
