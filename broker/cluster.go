package broker

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/internal/raftstore"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/raftlog"
)

// newClusterNode returns the cluster node of a clustered config, not yet
// started: its storage guard and manager options apply before the
// manager is built; it starts once the listeners are bound (Serve).
func (b *Broker) newClusterNode(cfg *config.Config) (*cluster.Node, error) {
	c := cfg.Cluster
	o := cluster.Options{
		NodeID:       cfg.NodeID,
		Endpoints:    c.Etcd.Endpoints,
		Username:     c.Etcd.Username,
		Password:     c.Etcd.Password,
		DialTimeout:  c.Etcd.DialTimeout,
		Prefix:       c.Etcd.Prefix,
		Addr:         c.Addr,
		Advertise:    c.Advertise,
		LeaseTTL:     c.LeaseTTL,
		RaftLogKeep:  c.RaftLogKeep,
		ReplaceAfter: c.ReplaceAfter,
		MaxMoves:     c.MaxMoves,
		Token:        c.Token,
		AdminToken:   cfg.Admin.Token,
		Logger:       b.log,
		Metrics:      cluster.NewMetrics(b.registry, cfg.NodeID),
		Admin:        b.peerAdmin(),
	}
	if len(c.Placement) > 0 {
		for i, r := range c.Placement {
			o.PlacementRules = append(o.PlacementRules, cluster.PlacementRule{Name: fmt.Sprintf("cluster.placement[%d] (%s)", i, cluster.PlacementRule{Queues: r.Queues, Tenants: r.Tenants}.What()), Queues: r.Queues, Tenants: r.Tenants, Nodes: r.Nodes})
		}
	}
	b.plain = newPlainHook(b) // ordinary MQTT across nodes (plain.go)
	o.Plain = b.plain
	if c.TLS.Cert != "" {
		server, peer, err := clusterTLS(c.TLS)
		if err != nil {
			return nil, err
		}
		o.ServerTLS, o.PeerTLS = server, peer
	}
	if c.Etcd.CA != "" || c.Etcd.Cert != "" {
		t, err := etcdTLS(c.Etcd)
		if err != nil {
			return nil, err
		}
		o.TLS = t
	}
	// A damaged raft log is salvaged, not refused, and a missing one
	// noticed: the groups concerned take no part in elections until their
	// peers gave them back every entry (cluster/recovery.go).
	rl, err := raftlog.Open(raftlog.Options{Dir: filepath.Join(cfg.DataDir, "raft"), Logger: b.log, Salvage: true})
	if err != nil {
		return nil, fmt.Errorf("broker: opening the raft log: %w", err)
	}
	b.raftLog = rl
	o.RaftStore = raftstore.Store{S: rl}
	// A restarted node takes its id over from its earlier run at once,
	// rather than waiting for that run's lease to lapse: the data
	// directory, which one process at a time holds, names the run.
	if o.Instance, err = dataDirInstance(cfg.DataDir); err != nil {
		_ = rl.Close()
		b.raftLog = nil
		return nil, err
	}
	o.QueueOptions = func(name string) queue.Options {
		q, _ := cfg.QueueOptions(name)
		return q
	}
	n, err := cluster.New(o)
	if err != nil {
		_ = rl.Close()
		b.raftLog = nil
	}
	return n, err
}

// dataDirInstance returns the random name of the data directory, made on
// its first start as a cluster node.
func dataDirInstance(dir string) (string, error) {
	path := filepath.Join(dir, "INSTANCE")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(r[:])
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("broker: recording the data directory's instance: %w", err)
	}
	return id, nil
}

// etcdTLS is the client TLS config of cluster.etcd.
func etcdTLS(e config.Etcd) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.CA != "" {
		pem, err := os.ReadFile(e.CA)
		if err != nil {
			return nil, fmt.Errorf("broker: cluster.etcd.ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker: cluster.etcd.ca: no PEM certificate in %s", e.CA)
		}
		t.RootCAs = pool
	}
	if e.Cert != "" {
		cert, err := tls.LoadX509KeyPair(e.Cert, e.Key)
		if err != nil {
			return nil, fmt.Errorf("broker: cluster.etcd.cert: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// clusterTLS returns the configs of mutual TLS between nodes: the
// listener's, which requires a certificate the CA signed, and the one peers
// are dialed with, which verifies theirs.
func clusterTLS(t config.ClusterTLS) (server, peer *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("broker: cluster.tls.cert: %w", err)
	}
	pool, err := config.LoadCertPool(t.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("broker: cluster.tls.ca: %w", err)
	}
	server = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	peer = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}
	return server, peer, nil
}

// startCluster joins the cluster once the listeners are bound, so that the
// addresses published are the ones bound.
func (b *Broker) startCluster() error {
	if b.node == nil {
		return nil
	}
	b.node.SetAddrs(b.addrs["mqtt"], b.HTTPAddr())
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Cluster.Etcd.DialTimeout+b.cfg.Cluster.LeaseTTL+5*time.Second)
	defer cancel()
	if err := b.node.Start(ctx, b.manager); err != nil {
		return err
	}
	b.log.Info("cluster node started", "node", b.cfg.NodeID, "cluster_addr", b.node.Addr(), "etcd", b.cfg.Cluster.Etcd.Endpoints)
	return nil
}

// leaveCluster hands this node's partitions over to the others; clients
// are still served meanwhile.
func (b *Broker) leaveCluster(ctx context.Context) {
	if b.node == nil {
		return
	}
	if !b.otherMembers() {
		// Nobody to hand the partitions to: they stay on this node's disk
		// and are served again when it returns.
		b.log.Info("leaving the cluster: no other member to hand partitions over to")
		return
	}
	lctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	if err := b.node.Leave(lctx); err != nil {
		b.log.Warn("leaving the cluster", "err", err)
	}
}

// otherMembers reports whether another node is a member now.
func (b *Broker) otherMembers() bool {
	for _, n := range b.node.Status().Nodes {
		if n.ID != b.cfg.NodeID && n.State != cluster.StateDown && n.State != cluster.StateLeaving {
			return true
		}
	}
	return false
}

// leaveTimeout bounds the handover at shutdown.
const leaveTimeout = 25 * time.Second

// Cluster returns the node's cluster part; nil on a single node.
func (b *Broker) Cluster() *cluster.Node { return b.node }

// service is what the MQTT side is served by.
func (b *Broker) service() queue.Service {
	if b.node != nil {
		return b.node
	}
	return b.manager
}

// declareInCluster records the declared queues in the cluster's catalog:
// a count that differs from the cluster's refuses the start.
func (b *Broker) declareInCluster() error {
	if b.node == nil {
		return nil
	}
	for name := range b.cfg.Queues.Declared {
		if err := b.node.Declare(context.Background(), name); err != nil {
			return fmt.Errorf("broker: declared queue %q: %w", name, err)
		}
	}
	return nil
}

// declare declares a queue's settings: in the cluster's catalog in a
// cluster, on this node alone otherwise.
func (b *Broker) declare(ctx context.Context, name string, o queue.Options) (*queue.Queue, bool, error) {
	if b.node != nil {
		return b.node.DeclareQueue(ctx, name, o)
	}
	return b.manager.Declare(ctx, name, o)
}
