package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
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

	mqttLn   net.Listener
	tracked  *trackingListener
	httpLn   net.Listener
	httpSrv  *http.Server
	ready    atomic.Bool
	shutdown atomic.Bool
	done     chan struct{}
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
	b := &Broker{cfg: cfg, log: log, registry: prometheus.NewRegistry(), done: make(chan struct{})}

	if cfg.Storage.Shards == 0 {
		// The count the data directory has, or 1 for a new one.
		cfg.Storage.Shards = 1
		if n, err := badger.ShardCount(cfg.DataDir); err == nil {
			cfg.Storage.Shards = n
		}
	}
	bo := badger.DefaultOptions()
	bo.Shards = cfg.Storage.Shards
	bo.Logger = log
	bo.AsyncWrites = anyAsync(cfg)
	store, err := badger.Open(cfg.DataDir, bo)
	if err != nil {
		return nil, err
	}
	b.store = store

	mo := queue.DefaultManagerOptions()
	mo.Store = store
	mo.Defaults = cfg.Queues.Defaults
	mo.Declared = cfg.Queues.Declared
	mo.AutoCreate = cfg.Queues.AutoCreate
	mo.RingSize = cfg.Storage.RingSize
	mo.MaxPayload = cfg.Storage.MaxPayload
	mo.SyncInterval = cfg.Storage.SyncInterval
	mo.Logger = log
	if err := b.instrument(&mo); err != nil {
		_ = store.Close()
		return nil, err
	}
	start := time.Now()
	if b.manager, err = queue.NewManager(mo); err != nil {
		_ = store.Close()
		return nil, err
	}
	for name := range cfg.Queues.Declared {
		if _, err := b.manager.Open(context.Background(), name); err != nil {
			b.closeStorage(context.Background())
			return nil, fmt.Errorf("broker: creating declared queue %q: %w", name, err)
		}
	}
	log.Info("storage recovered", "data_dir", cfg.DataDir, "shards", cfg.Storage.Shards,
		"queues", len(b.manager.Queues())/2, "took", time.Since(start).Round(time.Millisecond))

	b.server = newMQTTServer(log, cfg.Storage.MaxPayload)
	b.hook = hooks.New(hooks.Options{Queues: b.manager, Server: b.server, Logger: log,
		MaxKeepAlive: uint16(cfg.Protocol.MaxKeepAlive / time.Second)})
	if err := b.server.AddHook(newAccessHook(cfg.Protocol.DenySubscribe), nil); err != nil {
		b.closeStorage(context.Background())
		return nil, err
	}
	if err := b.server.AddHook(b.hook, nil); err != nil {
		b.closeStorage(context.Background())
		return nil, err
	}
	return b, nil
}

// anyAsync reports whether any queue of cfg may have durability async: then
// the store lets unsynced writes return and syncs every sync_interval; else
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
// suite, no expiry stamped on messages that have none, and a packet size
// limit just above the payload limit (so an oversized queue payload still
// gets its 0x95 PUBACK rather than a disconnect).
func newMQTTServer(log *slog.Logger, maxPayload int) *mqtt.Server {
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumMessageExpiryInterval = 0
	caps.ReceiveMaximum = 256
	caps.MaximumPacketSize = uint32(maxPayload) + 64<<10
	caps.Compatibilities.ObscureNotAuthorized = true
	caps.Compatibilities.PassiveClientDisconnect = true
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	return mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       log.With("component", "mqtt"),
	})
}

// Serve starts the listeners and blocks until Shutdown. It returns
// ErrServerClosed after a Shutdown, or the error that stopped it.
func (b *Broker) Serve() error {
	var err error
	if b.mqttLn, err = net.Listen("tcp", b.cfg.MQTT); err != nil {
		return fmt.Errorf("broker: mqtt listener: %w", err)
	}
	b.tracked = newTrackingListener(b.mqttLn, connectTimeout)
	if err := b.server.AddListener(listeners.NewNet("mqtt", b.tracked)); err != nil {
		return err
	}
	if b.cfg.WS != "" {
		if err := b.server.AddListener(listeners.NewWebsocket(listeners.Config{ID: "ws", Address: b.cfg.WS})); err != nil {
			return fmt.Errorf("broker: websocket listener: %w", err)
		}
	}
	if b.cfg.HTTP != "" {
		if b.httpLn, err = net.Listen("tcp", b.cfg.HTTP); err != nil {
			_ = b.mqttLn.Close()
			return fmt.Errorf("broker: http listener: %w", err)
		}
		b.httpSrv = &http.Server{Handler: b.handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := b.httpSrv.Serve(b.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("http server stopped", "err", err)
			}
		}()
	}
	if err := b.server.Serve(); err != nil {
		return err
	}
	b.ready.Store(true)
	b.log.Info("shardq serving", "node", b.cfg.NodeID, "mqtt", b.mqttLn.Addr().String(), "ws", b.cfg.WS, "http", b.HTTPAddr())
	<-b.done
	return ErrServerClosed
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("broker: server closed")

// MQTTAddr returns the bound MQTT address once Serve has started.
func (b *Broker) MQTTAddr() string {
	if b.mqttLn == nil {
		return ""
	}
	return b.mqttLn.Addr().String()
}

// HTTPAddr returns the bound HTTP address once Serve has started.
func (b *Broker) HTTPAddr() string {
	if b.httpLn == nil {
		return ""
	}
	return b.httpLn.Addr().String()
}

// Ready reports whether storage is recovered and the listeners are up.
func (b *Broker) Ready() bool { return b.ready.Load() }

// Manager returns the node's queues.
func (b *Broker) Manager() *queue.Manager { return b.manager }

// Shutdown stops accepting connections, disconnects the clients, finishes
// the pending commits and closes the storage. It returns ctx.Err() if ctx
// ends first.
func (b *Broker) Shutdown(ctx context.Context) error {
	if b.shutdown.Swap(true) {
		return nil
	}
	b.ready.Store(false)
	b.log.Info("shutting down")
	if b.httpSrv != nil {
		_ = b.httpSrv.Shutdown(ctx)
	}
	b.closeMQTT(ctx)
	err := b.closeStorage(ctx)
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
	if b.mqttLn != nil {
		_ = b.mqttLn.Close()
	}
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
	if !gone(shutdownGrace) && b.tracked != nil {
		b.log.Warn("closing the connections of clients that did not disconnect")
		b.tracked.closeAll()
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
	err := b.manager.Close(ctx)
	if cerr := b.store.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}
