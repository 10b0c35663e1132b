package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
	"github.com/shardq/shardq/storage/raftlog"
)

// Broker is one shardq node: an MQTT server whose $queue/ topics are
// durable queues, with its storage and HTTP endpoints.
type Broker struct {
	cfg      *config.Config
	log      *slog.Logger
	store    queue.Store
	manager  *queue.Manager
	server   *mqtt.Server
	hook     *hooks.Hook
	registry *prometheus.Registry
	// pubacks observes the time to each queue publish's PUBACK
	// (shardq_publish_ack_seconds); nil with metrics off.
	pubacks func(time.Duration)

	// queues is the queue service of the hooks: the manager behind the
	// limits of the config.
	queues *limitedQueues
	access *accessHook
	// policy is the users, ACL and admin token; Reload swaps it.
	policy    atomic.Pointer[policy]
	sec       *securityMetrics
	mqttCerts *certStore // listen.mqtts and listen.wss; nil without
	httpCerts *certStore // HTTPS; nil without

	// listeners are the MQTT listeners by ID (mqtt, mqtts, ws, wss), in
	// that order; admitted counts their admitted connections.
	listeners []*trackingListener
	addrs     map[string]string
	admitted  atomic.Int64
	history   history
	httpLn    net.Listener
	httpSrv   *http.Server
	ready     atomic.Bool
	shutdown  atomic.Bool
	health    health
	disk      *diskWatch     // storage.min_free_bytes (disk.go)
	tenants   *tenants       // config tenants (tenants.go); nil without
	node      *cluster.Node  // nil on a single node (cluster.go)
	raftLog   *raftlog.Store // the raft logs of replicated partitions; nil on a single node
	plain     *plainHook     // ordinary MQTT across nodes (plain.go); nil on a single node
	done      chan struct{}
}

// New opens the storage, recovers the queues and prepares the listeners of
// cfg. Nothing is served until Serve.
func New(cfg *config.Config, log *slog.Logger) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Broker{cfg: cfg, log: log, registry: prometheus.NewRegistry(), done: make(chan struct{}), addrs: map[string]string{}}
	b.sec = newSecurityMetrics(prometheus.Labels{"node": cfg.NodeID})
	pol, err := newPolicy(cfg)
	if err != nil {
		return nil, err
	}
	b.policy.Store(pol)
	if cfg.MQTTS != "" || cfg.WSS != "" {
		if b.mqttCerts, err = newCertStore(mqttTLSFiles(cfg)); err != nil {
			return nil, err
		}
	}
	if cfg.Admin.TLS.Cert != "" {
		if b.httpCerts, err = newCertStore(httpTLSFiles(cfg)); err != nil {
			return nil, err
		}
	}

	if cfg.Storage.Shards == 0 {
		// The count the data directory has, or 1 for a new one.
		cfg.Storage.Shards = 1
		if n, err := badger.ShardCount(cfg.DataDir); err == nil {
			cfg.Storage.Shards = n
		}
	}
	bo := badger.DefaultOptions()
	bo.Shards = cfg.Storage.Shards
	bo.LogResident = cfg.Storage.LogResidentBytes
	bo.Logger = log
	// A cluster node applies replicated writes unsynced (the raft log is
	// synced) and syncs them every checkpoint.
	bo.AsyncWrites = anyAsync(cfg) || cfg.Clustered()
	store, err := badger.Open(cfg.DataDir, bo)
	if err != nil {
		return nil, err
	}
	b.store = store
	b.disk = newDiskWatch(cfg.DataDir, cfg.Storage.MinFreeBytes, log)

	mo := queue.DefaultManagerOptions()
	mo.Admit = b.disk.admit
	mo.Store = store
	if cfg.Clustered() {
		if b.node, err = b.newClusterNode(cfg); err != nil {
			_ = store.Close()
			return nil, err
		}
		mo.Store = b.node.Guard(store)
		b.node.ManagerOptions(&mo)
	}
	mo.Defaults = cfg.Queues.Defaults
	mo.Declared = cfg.Queues.Declared
	mo.AutoCreate = cfg.Queues.AutoCreate
	mo.RingSize = cfg.Storage.RingSize
	mo.MaxPayload = cfg.Storage.MaxPayload
	mo.SyncInterval = cfg.Storage.SyncInterval
	mo.CommitLinger = cfg.Storage.CommitLinger
	mo.Logger = log
	if err := b.instrument(&mo); err != nil {
		_ = store.Close()
		return nil, err
	}
	b.health.watchCommits(&mo, cfg.Storage.Shards)
	start := time.Now()
	if b.manager, err = queue.NewManager(mo); err != nil {
		_ = store.Close()
		return nil, err
	}
	for name := range cfg.Queues.Declared {
		if b.node != nil {
			break // declared in the cluster's catalog as the node starts
		}
		if _, err := b.manager.Open(context.Background(), name); err != nil {
			b.closeStorage(context.Background())
			return nil, fmt.Errorf("broker: creating declared queue %q: %w", name, err)
		}
	}
	log.Info("storage recovered", "data_dir", cfg.DataDir, "shards", cfg.Storage.Shards,
		"queues", len(b.manager.Queues())/2, "took", time.Since(start).Round(time.Millisecond))

	b.server = newMQTTServer(log, cfg.EffectiveMaxPacketSize(), cfg.Protocol.MaxQueuedMessages)
	if len(cfg.Tenants) > 0 {
		b.tenants = newTenants(cfg, prometheus.Labels{"node": cfg.NodeID}, b.ownedQueues)
		if cfg.Admin.Metrics {
			for _, c := range b.tenants.collectors() {
				if err := b.registry.Register(c); err != nil {
					b.closeStorage(context.Background())
					return nil, err
				}
			}
		}
	}
	b.queues = &limitedQueues{Manager: b.manager, svc: b.service(), cfg: cfg, sec: b.sec, admit: b.disk.admit, tenants: b.tenants}
	b.access = newAccessHook(b)
	b.hook = hooks.New(hooks.Options{Queues: b.queues, Server: b.server, Logger: log,
		MaxKeepAlive: uint16(cfg.Protocol.MaxKeepAlive / time.Second), Admit: b.access.admit, OnPanic: b.writerPanicked,
		OnPuback: b.pubacks})
	// The access hook first: it refuses before the queue hook sees anything.
	if err := b.addHook(b.access); err != nil {
		b.closeStorage(context.Background())
		return nil, err
	}
	if err := b.addHook(b.hook); err != nil {
		b.closeStorage(context.Background())
		return nil, err
	}
	// Sessions and retained messages, kept in shard 0 (sessions.go).
	sessions := newSessionHook(store.Sessions(), b.hook.RestoreSubscription, log)
	if err := b.addHook(sessions); err != nil {
		b.closeStorage(context.Background())
		return nil, err
	}
	// Ordinary MQTT across the nodes of a cluster (plain.go).
	if b.plain != nil {
		b.plain.attach(sessions)
		if err := b.addHook(b.plain); err != nil {
			b.closeStorage(context.Background())
			return nil, err
		}
	}
	b.disk.start(diskCheckEvery)
	return b, nil
}

// anyAsync reports whether any queue of cfg may have durability async: then
// the store lets unsynced writes return and syncs them within sync_interval; else
// every commit fsyncs inside Badger.
func anyAsync(cfg *config.Config) bool {
	if cfg.Queues.Defaults.Durability == queue.DurabilityAsync {
		return true
	}
	for _, o := range cfg.Queues.Declared {
		if o.Durability == queue.DurabilityAsync {
			return true
		}
	}
	return false
}

// newMQTTServer returns a mochi server with shardq's settings: the
// compatibility options under which mochi passes the Paho interoperability
// suite, no expiry stamped on messages that have none, and the packet size
// limit of mqtt.max_packet_size (by default just above the payload limit,
// so an oversized queue payload still gets its 0x95 PUBACK rather than a
// disconnect), and mqtt.max_queued_messages as both of mochi's bounds on
// what it holds for one client (messages waiting for its connection, QoS
// 1 and 2 messages unacknowledged): past either mochi drops the message
// for that client. mochi's default of 8,192 each lets a client that stops
// reading cost that many messages, and each later QoS 1 message for it a
// search through its packet ids under its lock, which every publisher to
// its topics waits for (publishers to such a topic fell to 200 msgs/s).
func newMQTTServer(log *slog.Logger, maxPacketSize, maxQueued int) *mqtt.Server {
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(maxQueued)
	caps.MaximumInflight = uint16(maxQueued)
	caps.MaximumMessageExpiryInterval = 0
	caps.ReceiveMaximum = 256
	caps.MaximumPacketSize = uint32(maxPacketSize)
	caps.Compatibilities.ObscureNotAuthorized = true
	caps.Compatibilities.PassiveClientDisconnect = true
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	return mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(mqttLog{log.Handler()}).With("component", "mqtt"),
	})
}

// Serve starts the listeners and blocks until Shutdown. It returns
// ErrServerClosed after a Shutdown, or the error that stopped it.
func (b *Broker) Serve() error {
	for _, l := range []struct {
		id, addr string
		tls, ws  bool
	}{
		{"mqtt", b.cfg.MQTT, false, false},
		{"mqtts", b.cfg.MQTTS, true, false},
		{"ws", b.cfg.WS, false, true},
		{"wss", b.cfg.WSS, true, true},
	} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			b.closeListeners()
			return listenError(l.id, l.addr, err)
		}
		b.addrs[l.id] = ln.Addr().String()
		if l.tls {
			ln = tls.NewListener(ln, b.mqttCerts.config())
		}
		if l.ws {
			ln = newWSListener(ln, b.log)
		}
		tl := newTrackingListener(ln, connectTimeout, &b.admitted)
		b.listeners = append(b.listeners, tl)
		if err := b.server.AddListener(listeners.NewNet(l.id, tl)); err != nil {
			b.closeListeners()
			return err
		}
	}
	if b.cfg.HTTP != "" {
		ln, err := net.Listen("tcp", b.cfg.HTTP)
		if err != nil {
			b.closeListeners()
			return listenError("http", b.cfg.HTTP, err)
		}
		b.httpLn = ln
		if b.httpCerts != nil {
			ln = tls.NewListener(ln, b.httpCerts.config())
		}
		b.httpSrv = &http.Server{Handler: b.handler(), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelDebug)}
		go func() {
			if err := b.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("http server stopped", "err", err)
			}
		}()
	}
	if err := b.startCluster(); err != nil {
		b.closeListeners()
		if b.httpSrv != nil {
			_ = b.httpSrv.Close()
		}
		return err
	}
	if err := b.declareInCluster(); err != nil {
		b.closeListeners()
		if b.httpSrv != nil {
			_ = b.httpSrv.Close()
		}
		return err
	}
	if err := b.server.Serve(); err != nil {
		return err
	}
	b.ready.Store(true)
	go b.cutStuckWrites()
	go b.sampleHistory()
	if b.tenants != nil {
		go b.every(time.Second, func(time.Time) { b.tenants.refresh() })
	}
	console := ""
	if b.httpLn != nil {
		scheme := "http"
		if b.httpCerts != nil {
			scheme = "https"
		}
		console = scheme + "://" + b.HTTPAddr() + "/ui/"
	}
	b.log.Info("shardq serving", "node", b.cfg.NodeID, "mqtt", b.addrs["mqtt"], "mqtts", b.addrs["mqtts"],
		"ws", b.addrs["ws"], "wss", b.addrs["wss"], "http", b.HTTPAddr(), "console", console, "tls_http", b.httpCerts != nil,
		"users", b.policy.Load().users.Len(), "acl_rules", b.policy.Load().acl.Len(), "anonymous", b.policy.Load().anonymous)
	<-b.done
	return ErrServerClosed
}

// cutStuckWrites closes, until Shutdown, every MQTT connection whose
// write has been blocked for mqtt.write_timeout: mochi holds a client's
// lock while it writes to it, and every publisher with a QoS 1 message
// for that client waits for the lock (those that come after the first
// second of the block drop the message instead: accessHook.OnACLCheck).
func (b *Broker) cutStuckWrites() {
	timeout := b.cfg.Protocol.WriteTimeout
	b.every(min(timeout/4, time.Second), func(now time.Time) {
		for _, l := range b.listeners {
			for _, remote := range l.cutStuck(now, timeout) {
				b.log.Warn("closed a connection whose client has not read what it was sent for mqtt.write_timeout",
					"remote", remote, "write_timeout", timeout)
			}
		}
	})
}

// every runs f every d until Shutdown.
func (b *Broker) every(d time.Duration, f func(now time.Time)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case now := <-t.C:
			f(now)
		}
	}
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("broker: server closed")

// MQTTAddr returns the bound MQTT address once Serve has started.
func (b *Broker) MQTTAddr() string { return b.ListenerAddr("mqtt") }

// ListenerAddr returns the bound address of the MQTT listener id (mqtt,
// mqtts, ws or wss) once Serve has started; "" when it is disabled.
func (b *Broker) ListenerAddr(id string) string {
	if !b.ready.Load() && !b.shutdown.Load() {
		return ""
	}
	return b.addrs[id]
}

// closeListeners stops accepting MQTT connections.
func (b *Broker) closeListeners() {
	for _, l := range b.listeners {
		_ = l.Close()
	}
}

// HTTPAddr returns the bound HTTP address once Serve has started.
func (b *Broker) HTTPAddr() string {
	if b.httpLn == nil {
		return ""
	}
	return b.httpLn.Addr().String()
}

// Ready reports whether storage is recovered, the listeners are up, the
// node is not shutting down, storage writes do not fail (health.go) and the
// disk is not below storage.min_free_bytes (disk.go).
func (b *Broker) Ready() bool {
	return b.ready.Load() && b.health.storageOK() && !b.disk.low() && (b.node == nil || b.node.Ready() == nil)
}

// Manager returns the node's queues.
func (b *Broker) Manager() *queue.Manager { return b.manager }

// Shutdown stops accepting connections, disconnects the clients, finishes
// the pending commits and closes the storage, then stops HTTP: from the
// moment it starts /readyz answers 503, and it keeps answering until the
// drain is over. It returns ctx.Err() if ctx
// ends first.
func (b *Broker) Shutdown(ctx context.Context) error {
	if b.shutdown.Swap(true) {
		return nil
	}
	b.ready.Store(false) // /readyz answers 503 from here on
	b.log.Info("shutting down")
	b.leaveCluster(ctx)
	b.closeMQTT(ctx)
	if b.node != nil {
		_ = b.node.Close()
	}
	err := b.closeStorage(ctx)
	// HTTP last: health checks and scrapes are answered while draining.
	if b.httpSrv != nil {
		_ = b.httpSrv.Shutdown(ctx)
	}
	close(b.done)
	b.log.Info("shut down")
	return err
}

// shutdownGrace is how long Shutdown lets clients close their connections
// after the DISCONNECT before it closes them itself.
const shutdownGrace = 2 * time.Second

// closeMQTT stops the MQTT side: no new connections, DISCONNECT to every
// client, and their connections closed once they are gone or the grace
// period (or ctx) ends; then mochi's own Close. It disconnects the clients
// before calling mochi's Close because mochi (v2.7.9) read-locks its client
// table twice while closing, which deadlocks against a client leaving at
// the same moment.
func (b *Broker) closeMQTT(ctx context.Context) {
	b.closeListeners()
	for _, cl := range b.server.Clients.GetAll() {
		if !cl.Closed() {
			_ = b.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	gone := func(d time.Duration) bool {
		done := make(chan struct{})
		go func() {
			b.server.Listeners.ClientsWg.Wait()
			close(done)
		}()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-done:
			return true
		case <-t.C:
		case <-ctx.Done():
		}
		return false
	}
	if !gone(shutdownGrace) {
		b.log.Warn("closing the connections of clients that did not disconnect")
		for _, l := range b.listeners {
			l.closeAll()
		}
		if !gone(shutdownGrace) {
			b.log.Error("clients still attached after their connections were closed")
		}
	}
	closed := make(chan struct{})
	go func() {
		_ = b.server.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(shutdownGrace):
		b.log.Error("mqtt server did not stop in time")
	case <-ctx.Done():
	}
}

func (b *Broker) closeStorage(ctx context.Context) error {
	b.disk.close()
	err := b.manager.Close(ctx)
	if cerr := b.store.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if b.raftLog != nil {
		if cerr := b.raftLog.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// listenError says why the listener id (mqtt, mqtts, ws, wss, http) could
// not listen on addr, naming the flag and the config key that set it.
func listenError(id, addr string, err error) error {
	where := fmt.Sprintf("--%s, listen.%s in the config or SHARDQ_%s", id, id, strings.ToUpper(id))
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("cannot listen for %s on %s: the address is in use (another shardq or broker?): stop that process, or give another address (%s)", id, addr, where)
	}
	return fmt.Errorf("cannot listen for %s on %s (%s): %w", id, addr, where, err)
}
