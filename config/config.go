package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/queue"
)

// Config is the resolved configuration of one shardq node. The comment of
// each field gives its YAML key.
type Config struct {
	// Usually set.
	NodeID  string // node_id: this node's name; default the host name, or "node-1"
	DataDir string // data_dir: where the queues are stored; default "./data"
	MQTT    string // listen.mqtt: MQTT listen address; default "127.0.0.1:1883", "" disables
	MQTTS   string // listen.mqtts: MQTT over TLS (mqtt.tls); default "", disabled
	WS      string // listen.ws: MQTT over WebSocket; default "127.0.0.1:8083", "" disables
	WSS     string // listen.wss: MQTT over WebSocket over TLS (mqtt.tls); default "", disabled
	HTTP    string // listen.http: metrics, health and admin API; default "127.0.0.1:8990", "" disables

	Queues   Queues   // queues
	Protocol Protocol // mqtt
	Storage  Storage  // storage
	Admin    Admin    // http
	Auth     Auth     // auth
	Limits   Limits   // limits
	Cluster  Cluster  // cluster
	// Tenants is tenants: limits per tenant by username, and default for
	// the others (Tenant); empty: no tenant limits.
	Tenants map[string]Tenant

	// LogLevel is log_level: debug, info (the default), warn or error.
	LogLevel slog.Level

	// origin records where Load found each value it set, keyed by YAML
	// path, so that Validate can point at it.
	origin map[string]origin
}

// Cluster are the settings of a cluster node, under cluster. Without etcd
// endpoints the node is a single node: no etcd, no gRPC.
type Cluster struct {
	Etcd Etcd `yaml:"etcd"`
	// Addr is cluster.addr (--cluster-addr): the host:port the node's
	// gRPC listener binds, which its peers dial. Default "127.0.0.1:8991".
	Addr string `yaml:"addr"`
	// Advertise is the address peers dial when it differs from Addr (a
	// listener on 0.0.0.0, NAT); default Addr.
	Advertise string `yaml:"advertise"`
	// TLS secures the links between nodes with mutual TLS: every node
	// presents its certificate (valid for server and client use, for the
	// address peers dial) and accepts only peers whose certificate the CA
	// signed. Without it the cluster listener has no credentials, and a
	// cluster.addr that is not a loopback address needs AllowInsecure.
	TLS ClusterTLS `yaml:"tls"`
	// Token is a secret every node of the cluster shares
	// (SHARDQ_CLUSTER_TOKEN): a node presents it on every call to a peer
	// and refuses a call without it. Beside TLS or instead of it.
	Token string `yaml:"token"`
	// AllowInsecure lets cluster.addr listen on an address other than
	// loopback without cluster.tls: the links between nodes then carry
	// messages in clear text, on a network you trust.
	AllowInsecure bool `yaml:"allow_insecure"`
	// Placement pins queues to nodes: the first rule whose pattern matches
	// a queue's name gives the node ids that may own its partitions; a
	// queue no rule matches may be owned by any node.
	Placement []Placement `yaml:"placement"`
	// LeaseTTL is how long the node stays a member after it last reached
	// etcd; a node that cannot renew its lease within it stops committing.
	// Default 5s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// RaftLogKeep is how many applied entries each replicated partition's
	// raft log keeps in memory for a replica that falls behind; one
	// further behind gets a copy of the partition. Default 5000.
	RaftLogKeep int `yaml:"raft_log_keep"`
	// ReplaceAfter is how long a replica's node may be out of the cluster
	// before each partition's leader replaces it with a live node (a node
	// stopped for good, or failed). Default 1m.
	ReplaceAfter time.Duration `yaml:"replace_after"`
	// MaxMoves is how many replicated partitions each leader moves to
	// other nodes at once when placement changes (a node joins or is
	// drained, the placement rules change). Default 2.
	MaxMoves int `yaml:"max_moves"`
}

// ClusterTLS is cluster.tls: the node's certificate and key, and the CA
// of its peers' certificates, PEM files. All three or none.
type ClusterTLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	CA   string `yaml:"ca"`
}

// Etcd is how the node reaches etcd, under cluster.etcd.
type Etcd struct {
	// Endpoints are the etcd client URLs (--etcd, comma-separated).
	Endpoints []string `yaml:"endpoints"`
	Username  string   `yaml:"username"`
	Password  string   `yaml:"password"`
	// TLS: CA verifies etcd's certificate; Cert and Key are the node's
	// client certificate, if etcd asks for one.
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// DialTimeout bounds how long the node waits for etcd at start before
	// it exits naming the endpoints tried. Default 10s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// Prefix is the key prefix of the cluster in etcd; clusters sharing an
	// etcd need different ones. Default "/shardq/".
	Prefix string `yaml:"prefix"`
}

// Placement is one rule of cluster.placement.
type Placement struct {
	// Queues is a glob pattern (path.Match) of queue names; or Tenants
	// names the tenants (usernames) whose queues the rule places (a
	// queue belongs to the tenant that created it).
	Queues  string   `yaml:"queues"`
	Tenants []string `yaml:"tenants"`
	// Nodes are the ids of the nodes that may own the queues' partitions.
	Nodes []string `yaml:"nodes"`
}

// Clustered reports whether the node is part of a cluster.
func (c *Config) Clustered() bool { return len(c.Cluster.Etcd.Endpoints) > 0 }

// Queues are the settings of the queues.
type Queues struct {
	// Defaults apply to every queue, declared or auto-created.
	Defaults queue.Options `yaml:"defaults"`
	// AutoCreate creates a queue at its first publish or subscribe;
	// without it, only declared queues exist. Default true.
	AutoCreate bool `yaml:"auto_create"`
	// Declared queues exist from the start. Each one holds Defaults with the
	// fields its YAML entry sets replaced.
	Declared map[string]queue.Options `yaml:"declared"`

	// MaxDelay is queues.defaults.max_delay: the longest delay (user
	// property delay, or deliver-at) a publish may ask for; a later one
	// is refused with 0x99. 0, the default, means the queue's max_age (a
	// message delayed longer would expire first); with max_age 0 too,
	// there is no limit.
	MaxDelay time.Duration `yaml:"-"`
	// DeclaredMaxDelay holds the max_delay of the declared queues that set
	// their own.
	DeclaredMaxDelay map[string]time.Duration `yaml:"-"`
}

// QueueMaxDelay returns the max_delay set for the queue name (declared,
// else queues.defaults); 0 when none is set.
func (c *Config) QueueMaxDelay(name string) time.Duration {
	if d, ok := c.Queues.DeclaredMaxDelay[name]; ok {
		return d
	}
	return c.Queues.MaxDelay
}

// Protocol are MQTT settings, under the YAML key mqtt.
type Protocol struct {
	// MaxKeepAlive caps the keep-alive an MQTT 5 client may ask for: a
	// longer one is answered with this as Server Keep Alive. 0 means no cap.
	// MQTT 3.1.1 clients cannot be told and are not capped. Default 60s.
	MaxKeepAlive time.Duration `yaml:"max_keep_alive"`
	// DenySubscribe lists topic filters no client may subscribe to (SUBACK
	// 0x80). The default holds test/nosubscribe, the filter the Eclipse
	// Paho interoperability suite uses to check subscription failures.
	DenySubscribe []string `yaml:"deny_subscribe"`
	// AllowAnonymous lets clients without credentials connect on any
	// listener. Without it they may connect only while every listener is
	// on a loopback address and no users are configured; a listener on
	// another address then needs users (auth.users_file or
	// mqtt.tls.cn_as_username) or this set, else the node does not start.
	AllowAnonymous bool `yaml:"allow_anonymous"`
	// MaxPacketSize is the largest MQTT packet a client may send, in
	// bytes, announced in the CONNACK (MQTT 5 Maximum Packet Size); a
	// larger one ends the connection with DISCONNECT 0x95. 0, the default,
	// means storage.max_payload plus 64 KiB, so that a queue payload over
	// max_payload still gets its PUBACK 0x95.
	MaxPacketSize int `yaml:"max_packet_size"`
	// MaxQueuedMessages bounds the plain pub/sub messages held for one
	// client: those waiting to be written to its connection, and its QoS
	// 1 and 2 messages not yet acknowledged (sent, or held back by its
	// Receive Maximum or while its persistent session is offline). Past
	// it, messages for that client are dropped (and counted in
	// shardq_mqtt_messages_dropped_total), so a client that stops reading
	// costs at most this many messages of memory and never slows the
	// publishers or the other subscribers. Queue deliveries are bounded by
	// prefetch instead. Default 1000, at most 65535 (the packet ids).
	MaxQueuedMessages int `yaml:"max_queued_messages"`
	// WriteTimeout is how long a write to a client may block before its
	// connection is closed: the client does not read what it is sent.
	// While the write blocks, publishers with a QoS 1 message for that
	// client wait (mochi holds the client's lock); after a second of it,
	// plain messages for the client are dropped instead. Default 10s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// TLS is the certificate of listen.mqtts and listen.wss.
	TLS MQTTTLS `yaml:"tls"`
}

// MQTTTLS are the TLS settings of the MQTT listeners, under mqtt.tls.
// SIGHUP reads the files again.
type MQTTTLS struct {
	Cert string `yaml:"cert"` // PEM certificate (chain) file
	Key  string `yaml:"key"`  // PEM private key file
	// ClientCA is a PEM file of the CAs that sign client certificates; a
	// client that presents a certificate must have one they signed.
	ClientCA string `yaml:"client_ca"`
	// RequireClientCert refuses a TLS connection without a client
	// certificate (signed by ClientCA).
	RequireClientCert bool `yaml:"require_client_cert"`
	// CNAsUsername authenticates a client that presents a certificate
	// signed by ClientCA as the user named by the certificate's Common
	// Name, without a password.
	CNAsUsername bool `yaml:"cn_as_username"`
}

// HTTPTLS makes listen.http serve HTTPS, under http.tls. SIGHUP reads the
// files again.
type HTTPTLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Auth are the users and their permissions, under auth. SIGHUP reads them
// again.
type Auth struct {
	// UsersFile names a file of USER:BCRYPT-HASH lines (shardq passwd
	// prints one). With it, a client must give a user's name and password
	// (or, with mqtt.tls.cn_as_username, a certificate) unless
	// mqtt.allow_anonymous is set.
	UsersFile string `yaml:"users_file"`
	// ACL is the list of rules: the first that applies decides; with any
	// rule, what no rule allows is denied. See package auth.
	ACL []auth.Rule `yaml:"acl"`
}

// UsersConfigured reports whether clients authenticate: with a users file
// or with client certificates as usernames.
func (c *Config) UsersConfigured() bool {
	return c.Auth.UsersFile != "" || c.Protocol.TLS.CNAsUsername
}

// Limits bound what clients may make the node hold, under limits. 0 means
// no limit.
type Limits struct {
	// MaxQueues bounds the queues of the node (dead-letter queues not
	// counted); an auto-created queue past it is refused with PUBACK or
	// SUBACK 0x97. Declared queues are always created. Default 1000.
	MaxQueues int `yaml:"max_queues"`
	// MaxConnections bounds the connected MQTT clients; one more gets
	// CONNACK 0x97 (0x03 for MQTT 3.1.1). Default 10000.
	MaxConnections int `yaml:"max_connections"`
}

// Storage are the settings of the storage engine.
type Storage struct {
	// Usually set.

	// Shards is the number of independent Badger instances. It is fixed
	// when a data directory is created. 0 (the default): the count the
	// data directory was created with, or 1 for a new one: on 2 cores one
	// shard commits larger batches with fewer fsyncs and holds less memory.
	Shards int `yaml:"shards"`
	// SyncInterval is how long after its first unsynced write a queue with
	// durability async is fsynced; a crash may lose the publishes of one
	// interval. Default 100ms.
	SyncInterval time.Duration `yaml:"sync_interval"`
	// CommitLinger is how long a shard's synced commit waits for more
	// writes while writes keep coming (one came while the last commit was
	// written), unless 32 are pending: fewer commits and syncs, so less
	// CPU per message at a steady load, for at most that much more
	// latency. 0 commits at once. Default 1ms (Go's timers do not sleep
	// much less than that on an idle process).
	CommitLinger time.Duration `yaml:"commit_linger"`
	// MinFreeBytes is the free space the data directory's file system must
	// keep: below it publishes are refused (PUBACK 0x97) and the node is
	// not ready, while settlements and deletes go on; it is checked about
	// every 500ms. Default 256 MiB; 0 turns the check off.
	MinFreeBytes int64 `yaml:"min_free_bytes"`

	// Fine tuning.

	// RingSize is how many of its newest messages each partition keeps in
	// memory at most (and no more than 4 MiB of their payloads), so that
	// consumers that keep up never read storage; a partition's ring starts
	// small and grows to it. Default 1024: a consumer that keeps up is a
	// few hundred messages behind at most, and a ring of 4096 held 13 MB
	// more for a queue of 8 partitions with a backlog, which it does not
	// help to read.
	RingSize int `yaml:"ring_size"`
	// LogResidentBytes is how much of each of Badger's logs, counted back
	// from its newest write, a node keeps mapped in memory: older pages of
	// the logs, and all but the index of each table, go back to the kernel
	// after writes (Linux), so that memory does not grow with what the
	// node wrote. Default 4 MiB (0 also means that); -1 keeps every page.
	LogResidentBytes int64 `yaml:"log_resident_bytes"`
	// MaxPayload is the largest message payload accepted, in bytes.
	// Default 1 MiB, at most 256 MiB (60 MiB in a cluster).
	MaxPayload int `yaml:"max_payload"`
}

// Admin are the settings of the HTTP admin API, under the YAML key http.
type Admin struct {
	// Token, when set, must be sent as a bearer token with every mutating
	// admin call.
	Token string `yaml:"admin_token"`
	// Metrics serves /metrics and keeps the figures behind it. Default
	// true; false turns every metric off (and /metrics answers 404).
	Metrics bool `yaml:"metrics"`
	// TLS makes listen.http serve HTTPS.
	TLS HTTPTLS `yaml:"tls"`
}

// Default listen addresses: loopback only, so that a node started with no
// settings is reachable from its own machine alone (a listener on another
// address needs credentials, see Validate). DefaultHTTP is clear of
// Prometheus (9090), Grafana (3000) and the range of the Prometheus
// exporters (9100-9999), so that they run beside a node with their own
// defaults. DefaultClusterAddr is the gRPC listener of a cluster node.
const (
	DefaultMQTT        = "127.0.0.1:1883"
	DefaultWS          = "127.0.0.1:8083"
	DefaultHTTP        = "127.0.0.1:8990"
	DefaultClusterAddr = "127.0.0.1:8991"
)

// Defaults and limits of the cluster settings.
const (
	DefaultLeaseTTL    = 5 * time.Second
	MinLeaseTTL        = time.Second
	MaxLeaseTTL        = 60 * time.Second
	DefaultDialTimeout = 10 * time.Second
	DefaultEtcdPrefix  = "/shardq/"
)

// Defaults of the limits.
const (
	DefaultMaxQueues      = 1000
	DefaultMaxConnections = 10000
	// MaxMaxPacketSize is the largest packet MQTT can carry.
	MaxMaxPacketSize = 268435455 + 5
	MinMaxPacketSize = 1024
)

// Limits of the storage settings.
const (
	MaxShards     = 64
	MinRingSize   = 16
	MaxRingSize   = 1 << 20
	MaxMaxPayload = 256 << 20
	// MaxClusterPayload is the largest storage.max_payload of a cluster's
	// node: a forwarded publish, a raft entry and a copied message each
	// travel whole in one gRPC message, which a node takes up to 64 MiB;
	// 4 MiB are left for the rest of it (headers, properties, framing).
	MaxClusterPayload = 60 << 20
	// DefaultMinFreeBytes is the default of storage.min_free_bytes.
	DefaultMinFreeBytes = 256 << 20
)

// Default returns the configuration of a node started with no flags, no
// config file and no environment: a working single node.
func Default() *Config {
	return &Config{
		NodeID:   defaultNodeID(),
		DataDir:  "./data",
		MQTT:     DefaultMQTT,
		WS:       DefaultWS,
		HTTP:     DefaultHTTP,
		LogLevel: slog.LevelInfo,
		Queues: Queues{
			Defaults:   queue.DefaultOptions(),
			AutoCreate: true,
			Declared:   map[string]queue.Options{},
		},
		Limits: Limits{MaxQueues: DefaultMaxQueues, MaxConnections: DefaultMaxConnections},
		Admin:  Admin{Metrics: true},
		Protocol: Protocol{MaxKeepAlive: 60 * time.Second, DenySubscribe: []string{"test/nosubscribe"}, MaxQueuedMessages: 1000,
			WriteTimeout: 10 * time.Second},
		Storage: Storage{
			Shards:           0,
			SyncInterval:     100 * time.Millisecond,
			CommitLinger:     time.Millisecond,
			MinFreeBytes:     DefaultMinFreeBytes,
			RingSize:         1024,
			LogResidentBytes: 4 << 20,
			MaxPayload:       1 << 20,
		},
		Cluster: Cluster{
			Addr:         DefaultClusterAddr,
			LeaseTTL:     DefaultLeaseTTL,
			RaftLogKeep:  5000,
			ReplaceAfter: time.Minute,
			MaxMoves:     2,
			Etcd:         Etcd{DialTimeout: DefaultDialTimeout, Prefix: DefaultEtcdPrefix},
		},
	}
}

func defaultNodeID() string {
	if h, err := os.Hostname(); err == nil && validName(h) {
		return h
	}
	return "node-1"
}

// QueueOptions returns the options of the declared queue name and true, or
// the defaults and false when name is not declared.
func (c *Config) QueueOptions(name string) (queue.Options, bool) {
	if o, ok := c.Queues.Declared[name]; ok {
		return o, true
	}
	return c.Queues.Defaults, false
}

// Validate reports every invalid setting, each as an *Error naming its
// YAML path, joined with errors.Join. It returns nil when c is usable.
func (c *Config) Validate() error {
	var errs []error
	fail := func(path, reason string, err error) {
		errs = append(errs, c.errorAt(path, reason, err))
	}

	if !validName(c.NodeID) {
		fail("node_id", fmt.Sprintf("must be 1 to 128 characters of A-Z a-z 0-9 _ . -, got %q", c.NodeID), nil)
	}
	if c.DataDir == "" {
		fail("data_dir", "must not be empty", nil)
	}

	listen := c.listeners()
	if c.MQTT == "" && c.MQTTS == "" && c.WS == "" && c.WSS == "" {
		fail("listen.mqtt", "must not be empty: it is the only MQTT listener (set listen.mqtts, listen.ws or listen.wss to do without it)", nil)
	}
	for i, l := range listen {
		if l.addr == "" {
			continue
		}
		if reason := checkAddr(l.addr); reason != "" {
			fail(l.path, reason, nil)
			continue
		}
		for _, prev := range listen[:i] {
			if l.addr == prev.addr && !strings.HasSuffix(l.addr, ":0") {
				fail(l.path, fmt.Sprintf("same address as %s, %q", prev.path, l.addr), nil)
			}
		}
	}

	c.validateSecurity(fail)
	c.validateCluster(fail)

	if k := c.Protocol.MaxKeepAlive; k < 0 || k%time.Second != 0 || k > 65535*time.Second {
		fail("mqtt.max_keep_alive", fmt.Sprintf("must be whole seconds from 0 (no cap) to 65535s, got %s", k), nil)
	}
	for _, f := range c.Protocol.DenySubscribe {
		if f == "" || strings.ContainsRune(f, 0) {
			fail("mqtt.deny_subscribe", fmt.Sprintf("must hold topic filters, got %q", f), nil)
		}
	}

	s := c.Storage
	if s.Shards < 0 || s.Shards > MaxShards {
		fail("storage.shards", fmt.Sprintf("must be between 1 and %d (0: the data directory's), got %d", MaxShards, s.Shards), nil)
	}
	if s.CommitLinger < 0 || s.CommitLinger > 10*time.Millisecond {
		fail("storage.commit_linger", fmt.Sprintf("must be from 0 to 10ms, got %s", s.CommitLinger), nil)
	}
	if s.SyncInterval <= 0 {
		fail("storage.sync_interval", fmt.Sprintf("must be positive, got %s", s.SyncInterval), nil)
	}
	if s.LogResidentBytes < -1 {
		fail("storage.log_resident_bytes", fmt.Sprintf("must be -1 (keep every page) or a number of bytes, got %d", s.LogResidentBytes), nil)
	}
	if s.MinFreeBytes < 0 {
		fail("storage.min_free_bytes", fmt.Sprintf("must be 0 (no check) or a number of bytes, got %d", s.MinFreeBytes), nil)
	}
	if s.RingSize < MinRingSize || s.RingSize > MaxRingSize {
		fail("storage.ring_size", fmt.Sprintf("must be between %d and %d, got %d", MinRingSize, MaxRingSize, s.RingSize), nil)
	}
	if s.MaxPayload < 1 || s.MaxPayload > MaxMaxPayload {
		fail("storage.max_payload", fmt.Sprintf("must be between 1 and %d (256 MiB), got %d", MaxMaxPayload, s.MaxPayload), nil)
	} else if c.Clustered() && s.MaxPayload > MaxClusterPayload {
		fail("storage.max_payload", fmt.Sprintf("must be at most %d (60 MiB) in a cluster, got %d: a message goes from node to node in one message of at most 64 MiB, and a larger one would stop its partition's replication", MaxClusterPayload, s.MaxPayload), nil)
	}

	// A declared queue inherits what it does not set: an invalid default
	// is named once, at queues.defaults, not again for each queue.
	bad := map[string]bool{}
	for _, err := range queueErrors(c.Queues.Defaults) {
		errs = append(errs, c.queueError("queues.defaults", err))
		if fe, ok := errors.AsType[*queue.FieldError](err); ok {
			bad[fe.Field] = true
		}
	}
	names := make([]string, 0, len(c.Queues.Declared))
	for name := range c.Queues.Declared {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		path := "queues.declared." + name
		if !validName(name) {
			fail(path, fmt.Sprintf("queue name must be 1 to 128 characters of A-Z a-z 0-9 _ . -, got %q", name), nil)
			continue
		}
		for _, err := range queueErrors(c.Queues.Declared[name]) {
			if fe, ok := errors.AsType[*queue.FieldError](err); ok && bad[fe.Field] && !c.setHere(path+"."+fe.Field) {
				continue
			}
			errs = append(errs, c.queueError(path, err))
		}
	}
	return errors.Join(errs...)
}

// setHere reports whether a value for path was set by itself rather than
// inherited.
func (c *Config) setHere(path string) bool {
	_, ok := c.origin[path]
	return ok
}

// queueError returns the error of a setting of the queue at path.
func (c *Config) queueError(path string, err error) *Error {
	if fe, ok := errors.AsType[*queue.FieldError](err); ok {
		return c.errorAt(path+"."+fe.Field, fe.Reason, err)
	}
	return c.errorAt(path, err.Error(), err)
}

// queueErrors returns every invalid setting of o. queue.Options.Validate
// stops at the first one: each one found is set back to its default and o
// validated again, until it passes. A setting still invalid at its default
// depends on another (retry_backoff_max on retry_backoff): the other one,
// valid alone, is set back to its default then, without an error of its own.
func queueErrors(o queue.Options) []error {
	def := queue.DefaultOptions()
	fields := optionFields()
	var errs []error
	reported := map[string]bool{}
	for range 2*len(fields) + 1 {
		err := o.Validate()
		if err == nil {
			break
		}
		fe, ok := errors.AsType[*queue.FieldError](err)
		if !ok || fe.Field == "" || !slices.Contains(fields, fe.Field) {
			return append(errs, err)
		}
		i := slices.Index(fields, fe.Field)
		if !reported[fe.Field] {
			reported[fe.Field] = true
			errs = append(errs, err)
			resetField(&o, def, i)
			continue
		}
		fixed := false
		for j := range fields {
			try := o
			resetField(&try, def, j)
			if e, ok := errors.AsType[*queue.FieldError](try.Validate()); !ok || e.Field != fe.Field {
				o, fixed = try, true
				break
			}
		}
		if !fixed {
			break
		}
	}
	return errs
}

// optionFields returns the YAML names of queue.Options' fields, by index
// ("" for a field without one).
func optionFields() []string {
	t := reflect.TypeFor[queue.Options]()
	names := make([]string, t.NumField())
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "-" {
			names[i] = name
		}
	}
	return names
}

// resetField sets field i of *o to its value in def.
func resetField(o *queue.Options, def queue.Options, i int) {
	reflect.ValueOf(o).Elem().Field(i).Set(reflect.ValueOf(def).Field(i))
}

// errorAt returns the error for the value at path, located where Load
// found it or, failing that, where it found the nearest enclosing section.
func (c *Config) errorAt(path, reason string, err error) *Error {
	e := &Error{Field: path, Reason: reason, Err: err}
	for p := path; p != ""; {
		if o, ok := c.origin[p]; ok {
			e.File, e.Line, e.Source = o.file, o.line, o.source
			break
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return e
}

// checkAddr returns why addr is not a listen address, or "".
func checkAddr(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("must be host:port, got %q", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Sprintf("port must be a number from 0 to 65535, got %q", addr)
	}
	return ""
}

// validName reports whether s is a valid queue or node name: 1 to 128
// characters of A-Z a-z 0-9 _ . -.
func validName(s string) bool {
	if len(s) < 1 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == '.', b == '-':
		default:
			return false
		}
	}
	return true
}
