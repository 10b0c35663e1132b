package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	pb "github.com/shardq/shardq/cluster/clusterpb"
	"github.com/shardq/shardq/queue"
)

// Options configure a cluster node.
type Options struct {
	// NodeID names the node, unique in the cluster and stable across
	// restarts. Required.
	NodeID string
	// Token, when set, is the secret every call between nodes carries and
	// requires (cluster.token); AdminToken is http.admin_token, which the
	// Admin call requires as the admin API does.
	Token, AdminToken string
	// Instance names the node's data directory, the same across its
	// restarts (see NodeInfo.Instance); empty: a restarted node waits for
	// its earlier run's lease to expire.
	Instance string
	// Etcd reaches the cluster's etcd. Endpoints are required.
	Endpoints   []string
	Username    string
	Password    string
	TLS         *tls.Config
	DialTimeout time.Duration // how long Start waits for etcd; default 10s
	Prefix      string        // key prefix; default "/shardq/"
	// Addr is the gRPC listen address; Advertise the address peers dial
	// (default the listener's).
	Addr      string
	Advertise string
	// ServerTLS and PeerTLS, when set, secure the links between nodes:
	// the listener's config (requiring client certificates) and the one
	// it dials peers with. Both or neither.
	ServerTLS *tls.Config
	PeerTLS   *tls.Config
	// MQTT and HTTP are the node's client addresses, shown to operators.
	MQTT string
	HTTP string
	// LeaseTTL: a node that cannot renew its etcd lease for this long stops
	// committing and loses its membership. Default 5s.
	LeaseTTL time.Duration
	// PlacementRules pin queues to nodes. Checked at Start (every node
	// they name must have joined the cluster once), they become the
	// cluster's rules: the node started last decides for all.
	PlacementRules []PlacementRule
	// MoveWait bounds how long a publish waits for its partition to get a
	// reachable owner (a move, an election, a node starting), and is
	// routed again after its outcome was lost, before it fails with
	// ErrNotOwned (0x83). Default 5s.
	MoveWait time.Duration
	Logger   *slog.Logger
	// Plain, when set, is the broker's side of ordinary MQTT between
	// nodes (plain.go).
	Plain PlainHandler
	// Admin, when set, answers the admin reads peers gather.
	Admin func(ctx context.Context, method, path string, body []byte) (int, []byte)
	// Metrics, when set, is told about forwards and moves.
	Metrics *Metrics
	// RaftStore, when set, keeps the raft logs of replicated partitions;
	// without it every partition has one replica.
	RaftStore RaftStore
	// ReplaceAfter is how long a replica's node may be gone before the
	// partition's leader replaces it with a live node; default 1m.
	ReplaceAfter time.Duration
	// RaftLogKeep is how many applied entries a replicated partition's
	// raft log keeps for a replica behind; default 5000.
	RaftLogKeep int
	// MaxMoves bounds how many replicated partitions each leader moves to
	// other nodes at once (a node joined or drained, placement changed);
	// default 2.
	MaxMoves int
	// QueueOptions returns the settings the config gives a queue (its
	// replication factor decides whether its partitions are replicated).
	QueueOptions func(name string) queue.Options
}

// Node is this node's part of a cluster: its membership in etcd, the
// partitions it owns, and its links to the other nodes.
type Node struct {
	opts Options
	log  *slog.Logger
	m    *queue.Manager
	etcd *clientv3.Client
	keys keys

	grpc *grpc.Server
	ln   net.Listener
	addr string // the address peers dial

	guard guard
	raft  *raftHost // nil without a RaftStore

	// forgetMu serializes forgetting deleted queues (deletequeue.go);
	// forgotten holds, by queue, one more than the last incarnation
	// forgotten here (guarded by forgetMu).
	forgetMu  sync.Mutex
	forgotten map[string]uint64
	// origins: what the partitions here stored lately, by origin; run
	// and originSeq name the publishes that enter the cluster here
	// (origins.go).
	origins   *origins
	run       uint64
	retained  *retainedState // retained messages in etcd (retained.go)
	sessions  *keyWriter     // persistent sessions' records (sessions.go)
	cuts      *cutAsker      // growths' cuts passed elsewhere (growth.go)
	originSeq atomic.Uint64
	// unreachable is why a member cannot be reached, nil when every one
	// can (checkPeers). Guarded by mu.
	unreachable error

	mu      sync.Mutex
	view    view
	session clientv3.LeaseID // the lease of this node's membership; 0 while it has none
	peers   map[string]*peer
	moving  map[queue.PartitionID]bool // handovers under way
	subs    map[*remoteSub]struct{}    // consumers here with streams to peers
	watched map[*queue.Credit]bool     // connections' credits watched for deliveries waiting
	leases  sync.Map                   // leaseKey -> *remoteSub: remote leases of consumers here
	gone    map[string]time.Time       // since when a replica's node is not a member
	// etcdRenewed is when this node last renewed its lease (monoNow);
	// etcdFailing when the first renewal that failed since then was asked
	// (monoNow; 0 while renewals succeed); peersEtcd what each peer said
	// of its own, with its raft messages (guarded by mu).
	etcdRenewed atomic.Int64
	etcdFailing atomic.Int64
	peersEtcd   map[string]peerEtcd
	// topology counts the changes of the cluster's nodes, drains,
	// placement and queues (the watch); visited what the reconcile loop
	// saw of each partition last (reconcile goroutine, settled).
	topology atomic.Uint64
	visited  map[queue.PartitionID]visit
	active   map[queue.PartitionID]bool
	due      revisits
	opened   bool // a full pass opened every group of this node
	// moveBudget: the partition moves this node may still start in the
	// reconcile pass under way (reconcile goroutine).
	moveBudget int
	// claimsSlow: a leader's claim in the reconcile pass under way did
	// not get an answer from etcd in claimLeaderWait; the pass's other
	// claims wait less (reconcile goroutine).
	claimsSlow bool
	changed    chan struct{} // the view changed: reconcile
	notify     chan struct{} // closed and replaced when ownership changes here

	member atomic.Bool
	closed atomic.Bool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ErrNodeIDInUse is returned by Start when a live node holds the node id.
var ErrNodeIDInUse = errors.New("cluster: node id in use")

// New checks o and returns a node that has not joined yet: the broker
// wraps its storage with Guard and builds its queue manager with
// ManagerOptions, then calls Start.
func New(o Options) (*Node, error) {
	if o.NodeID == "" {
		return nil, errors.New("cluster: a node id is required")
	}
	if len(o.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Prefix == "" {
		o.Prefix = "/shardq/"
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 5 * time.Second
	}
	if o.MoveWait <= 0 {
		o.MoveWait = 5 * time.Second
	}
	if o.RaftLogKeep <= 0 {
		o.RaftLogKeep = 5000
	}
	if o.MaxMoves <= 0 {
		o.MaxMoves = 2
	}
	if o.ReplaceAfter <= 0 {
		o.ReplaceAfter = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil, o.NodeID)
	}
	n := &Node{opts: o, log: o.Logger.With("component", "cluster"), keys: keys{o.Prefix},
		peers: map[string]*peer{}, moving: map[queue.PartitionID]bool{}, subs: map[*remoteSub]struct{}{}, watched: map[*queue.Credit]bool{}, gone: map[string]time.Time{},
		visited: map[queue.PartitionID]visit{}, active: map[queue.PartitionID]bool{}, forgotten: map[string]uint64{},
		changed: make(chan struct{}, 1), notify: make(chan struct{}), view: newView(),
		origins: newOrigins(), run: rand.Uint64()}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.retained = newRetainedState(n)
	n.sessions = newKeyWriter(n, "sessions")
	n.cuts = newCutAsker(n)
	if o.RaftStore != nil {
		n.raft = newRaftHost(n, o.RaftStore)
	}
	return n, nil
}

// replicationFactor returns the replication factor of the named queue's
// partitions: the catalog's declared setting, else the config's; 0
// there means 3 in a cluster. It is 1 without a raft store.
func (n *Node) replicationFactor(name string) int {
	if n.raft == nil {
		return 1
	}
	name = queue.ParentName(name)
	rf := 0
	n.mu.Lock()
	if qi, ok := n.view.queues[name]; ok && qi.Declared != nil {
		rf = qi.Declared.ReplicationFactor
	}
	n.mu.Unlock()
	return n.effectiveFactor(name, rf)
}

// ackPolicy returns the ack_policy of the named queue: the catalog's
// declared setting, else the config's; quorum when none is set.
func (n *Node) ackPolicy(name string) queue.AckPolicy {
	name = queue.ParentName(name)
	var ap queue.AckPolicy
	n.mu.Lock()
	if qi, ok := n.view.queues[name]; ok && qi.Declared != nil {
		ap = qi.Declared.AckPolicy
	}
	n.mu.Unlock()
	if ap == "" && n.opts.QueueOptions != nil {
		ap = n.opts.QueueOptions(name).AckPolicy
	}
	if ap == "" {
		ap = queue.AckQuorum
	}
	return ap
}

// DefaultReplicationFactor is the replication factor of a queue in a
// cluster that sets none.
const DefaultReplicationFactor = 3

// ManagerOptions sets what a cluster needs of the queue manager: the
// node decides which partitions it serves, and hears of new queues.
func (n *Node) ManagerOptions(mo *queue.ManagerOptions) {
	mo.ManualOwnership = true
	mo.HandoverGrace = handoverGrace
	mo.StaleAfter = remoteStale
	mo.Forward = n.Publish
	mo.CutPassed = n.cuts.passed
	mo.OnQueue = func(*queue.Queue) { n.poke() }
	admit := mo.Admit
	mo.Admit = func(name string) error {
		if !n.replicated(name) {
			// A replicated partition's writes are fenced by raft: a leader
			// commits nothing without a quorum of its replicas, with or
			// without etcd. A partition of one replica only by the lease.
			if err := n.guard.check(); err != nil {
				return err
			}
		}
		if admit != nil {
			return admit(name)
		}
		return nil
	}
}

// Start connects to etcd, registers the node, starts its gRPC listener
// and begins to claim the partitions it should own. It fails when etcd
// cannot be reached within the dial timeout, when a live node holds the
// same id, or when a queue's partition count here differs from the
// cluster's.
func (n *Node) Start(ctx context.Context, m *queue.Manager) error {
	n.m = m
	cfg := clientv3.Config{Endpoints: n.opts.Endpoints, DialTimeout: n.opts.DialTimeout, TLS: n.opts.TLS,
		Username: n.opts.Username, Password: n.opts.Password, Logger: zapDiscard(),
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		// As on the links between nodes (peerStreamWindow): no ping for
		// every lease renewal and watch event etcd sends.
		DialOptions: []grpc.DialOption{grpc.WithInitialWindowSize(peerStreamWindow), grpc.WithInitialConnWindowSize(peerConnWindow)}}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return fmt.Errorf("cluster: connecting to etcd at %v: %w", n.opts.Endpoints, err)
	}
	n.etcd = cli
	sctx, cancel := context.WithTimeout(ctx, n.opts.DialTimeout)
	defer cancel()
	if _, err := cli.Get(sctx, n.keys.prefix, clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return fmt.Errorf("cluster: etcd at %v did not answer within %s: %w", n.opts.Endpoints, n.opts.DialTimeout, err)
	}
	if err := n.checkPlacement(sctx); err != nil {
		_ = cli.Close()
		return err
	}
	if err := n.listen(); err != nil {
		_ = cli.Close()
		return err
	}
	if err := n.join(ctx); err != nil {
		n.stopServing()
		_ = cli.Close()
		return err
	}
	fail := func(err error) error {
		n.stopServing()
		n.cancel()
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = cli.Revoke(rctx, n.session)
		cancel()
		_ = cli.Close()
		return err
	}
	// Queues deleted while this node was away are forgotten before it
	// records or opens anything.
	tombs, err := n.readTombstones(ctx)
	if err != nil {
		return fail(fmt.Errorf("cluster: reading the deleted queues: %w", err))
	}
	if err := n.forgetTombstones(ctx, tombs); err != nil {
		return fail(err)
	}
	if err := n.checkCatalog(ctx); err != nil {
		return fail(err)
	}
	if err := n.publishPlacement(ctx); err != nil {
		return fail(fmt.Errorf("cluster: publishing the placement rules: %w", err))
	}
	// The cluster as it is now, before the node serves anything: where
	// partitions go is decided from it.
	rev, err := n.loadView(ctx)
	if err != nil {
		return fail(fmt.Errorf("cluster: reading the cluster's keys: %w", err))
	}
	if n.raft != nil {
		if err := n.raft.checkForgotten(); err != nil {
			return fail(err)
		}
	}
	n.wg.Add(2)
	go n.watch(rev)
	go n.reconcileLoop()
	if n.raft != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.raft.run(n.ctx)
		}()
	}
	return nil
}

// listen starts the gRPC server on Addr.
func (n *Node) listen() error {
	ln, err := net.Listen("tcp", n.opts.Addr)
	if err != nil {
		return fmt.Errorf("cluster: listening on %s: %w", n.opts.Addr, err)
	}
	n.ln = ln
	n.addr = n.opts.Advertise
	if n.addr == "" {
		n.addr = ln.Addr().String()
	}
	opts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 20), grpc.MaxSendMsgSize(64 << 20),
		// A peer that stopped answering is found out within seconds, as
		// the peers find this node out (peer.go): its streams end, and
		// with a consume stream the leases of its consumer, which would
		// otherwise wait for ack_timeout while its link is cut.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: peerKeepalive, Timeout: peerKeepalive}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: peerKeepalive / 2, PermitWithoutStream: true}),
		grpc.InitialWindowSize(peerStreamWindow), grpc.InitialConnWindowSize(peerConnWindow),
	}, n.serverAuth()...)
	if n.opts.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.opts.ServerTLS)))
	}
	n.grpc = grpc.NewServer(opts...)
	pb.RegisterNodeServer(n.grpc, &server{n: n})
	go func() { _ = n.grpc.Serve(ln) }()
	return nil
}

func (n *Node) stopServing() {
	if n.grpc != nil {
		n.grpc.Stop()
	}
}

// Addr returns the address peers dial.
func (n *Node) Addr() string { return n.addr }

// ID returns the node's id.
func (n *Node) ID() string { return n.opts.NodeID }

// Ready reports whether the node is a member of the cluster that may
// commit (it holds its lease in etcd) and reaches every other member.
func (n *Node) Ready() error {
	if !n.member.Load() {
		return errors.New("not a member of the cluster (etcd unreachable or lease lost)")
	}
	if err := n.guard.check(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.unreachable
}

// peerDownAfter is how long the link to a member may be down before the
// node reports not ready: longer than a lease, so that a peer that died
// leaves the membership first. A member that renews its lease and that
// this node cannot reach for that long is cut off from it.
const peerDownAfter = 10 * time.Second

// checkPeers records, for Ready, the first member whose link has been
// down past peerDownAfter (reconcile loop, every second).
func (n *Node) checkPeers() {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.unreachable = nil
	for _, id := range slices.Sorted(maps.Keys(n.peers)) {
		p := n.peers[id]
		_, member := n.view.nodes[id]
		switch st := p.conn.GetState(); {
		case !member || st == connectivity.Ready || st == connectivity.Idle:
			p.downSince = time.Time{}
		case p.downSince.IsZero():
			p.downSince = now
		case now.Sub(p.downSince) > peerDownAfter && n.unreachable == nil:
			n.unreachable = fmt.Errorf("the link to node %s (%s) has been down for %s", id, p.addr, now.Sub(p.downSince).Round(time.Second))
		}
	}
}

// Guard wraps a log store so that nothing is committed while the node may
// have lost its membership: a node paused or cut off from etcd longer than
// its lease cannot make a write, or an acknowledgement, after another node
// took its partitions over.
func (n *Node) Guard(s queue.LogStore) queue.LogStore {
	if n.raft != nil {
		s = &raftStore{s: s, h: n.raft, replicated: n.replicated}
	}
	return &guardedStore{s: s, g: &n.guard, replicated: n.replicated}
}

// replicated reports whether the named queue's partitions (or its
// dead-letter queue's) are replicated by raft here.
func (n *Node) replicated(name string) bool {
	return n.raft != nil && n.replicationFactor(queue.ParentName(name)) > 1
}

// poke asks the reconcile loop to run.
func (n *Node) poke() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// ownershipChanged wakes the publishes waiting for an owner.
func (n *Node) ownershipChanged() {
	n.mu.Lock()
	close(n.notify)
	n.notify = make(chan struct{})
	n.mu.Unlock()
}

// Leave hands every partition this node owns over to the others and
// leaves the cluster; it returns when done or when ctx ends. The node
// still serves clients meanwhile, forwarding to the new owners.
func (n *Node) Leave(ctx context.Context) error {
	if n.etcd == nil {
		return nil
	}
	n.mu.Lock()
	n.view.leaving = true
	n.mu.Unlock()
	// Out of the membership first, so that every owner picks the others.
	if err := n.deregister(ctx); err != nil {
		n.log.Warn("leaving the membership", "err", err)
	}
	n.poke()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if n.ownsNothing() {
			return nil
		}
		if len(n.members()) == 0 {
			// Nobody to take them: they stay this node's, served again
			// when it returns.
			return nil
		}
		n.poke()
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: handing partitions over: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Close stops the node's cluster work: it releases nothing (Leave hands
// partitions over); streams to and from peers end.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	n.cancel()
	n.mu.Lock()
	subs := make([]*remoteSub, 0, len(n.subs))
	for s := range n.subs {
		subs = append(subs, s)
	}
	n.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
	n.stopServing()
	n.wg.Wait()
	n.mu.Lock()
	for _, p := range n.peers {
		p.close()
	}
	n.peers = map[string]*peer{}
	n.mu.Unlock()
	if n.etcd != nil {
		if n.session != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = n.etcd.Revoke(ctx, n.session)
			cancel()
		}
		return n.etcd.Close()
	}
	return nil
}
