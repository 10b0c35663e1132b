// Package config loads the configuration of a shardq node from the flags
// of `shardq serve`, a YAML file and the environment, and validates it.
//
// # Precedence
//
// Each setting takes its value from the first of these that sets it:
//
//  1. its flag: --data-dir, --mqtt, --mqtts, --ws, --wss, --http,
//     --users-file, --allow-anonymous, --admin-token, --node-id, --log-level,
//     --etcd, --cluster-addr, --cluster-advertise;
//  2. the config file, named by --config or else by SHARDQ_CONFIG;
//  3. its environment variable, SHARDQ_ and the flag's name in capitals
//     with _ for -: SHARDQ_DATA_DIR, SHARDQ_MQTT, SHARDQ_WS, SHARDQ_HTTP,
//     SHARDQ_USERS_FILE, SHARDQ_ALLOW_ANONYMOUS, SHARDQ_ADMIN_TOKEN,
//     SHARDQ_NODE_ID, SHARDQ_LOG_LEVEL, SHARDQ_ETCD and the others;
//  4. the built-in default (Default).
//
// So a flag overrides the file, and an environment variable overrides only
// the default. An environment variable set to the empty string counts as
// unset; an empty flag (--ws "") or key (ws: "") does not: it disables
// that listener. Settings without a flag are set in the file only.
//
// With no flags, no file and no environment, a node is a working single
// node: MQTT on 127.0.0.1:1883, MQTT over WebSocket on 127.0.0.1:8083,
// HTTP (metrics, health, admin API) on 127.0.0.1:8990 (clear of
// Prometheus's 9090 and Grafana's 3000), data in ./data, named after its
// host, logging at info.
//
// # Safe defaults
//
// Every default listener is on the loopback address, and clients connect
// without credentials only while every MQTT listener is. A listener on
// any other address needs users (auth.users_file, or client certificates
// with mqtt.tls.cn_as_username) or mqtt.allow_anonymous: true; an HTTP
// listener on another address needs http.admin_token. Otherwise Load
// refuses the configuration, naming the listener (Loopback,
// AnonymousAllowed).
//
// # The file
//
// Every key is optional; a key left out keeps its value from the levels
// below. Durations are Go duration strings ("500ms", "30s", "168h"); sizes
// and counts are integers (bytes for sizes): 2.5 or 1e3 is an error, never
// rounded. A key the schema does not know is an error, so a misspelt
// setting is never silently ignored.
//
//	node_id: node-1         # default: the host name
//	data_dir: ./data
//	log_level: info         # debug | info | warn | error
//	listen:
//	  mqtt: 127.0.0.1:1883  # "" disables
//	  mqtts: ""             # MQTT over TLS (mqtt.tls), e.g. ":8883"
//	  ws: 127.0.0.1:8083    # "" disables
//	  wss: ""               # MQTT over WebSocket over TLS (mqtt.tls)
//	  http: 127.0.0.1:8990  # "" disables
//	queues:
//	  defaults:             # apply to every queue, including auto-created ones
//	    partitions: 8
//	    ordering: key       # key | partition | none
//	    ack_timeout: 30s
//	    max_deliveries: 5
//	    retry_backoff: 1s
//	    retry_backoff_max: 5m
//	    prefetch: 1024
//	    key_inflight: 1     # ordering key: messages of one key unsettled at once
//	    start: earliest     # where a new group starts: earliest | latest | an RFC 3339 time
//	    durability: fsync   # fsync | async
//	    qos0: allow         # allow | refuse: subscriptions at QoS 0
//	    retention: acked    # acked: until every group settled it | time: for max_age, settled or not
//	    max_age: 168h
//	    max_messages: 0     # 0: no limit
//	    max_bytes: 0
//	    overflow: reject    # reject | drop-oldest
//	    dedup_window: 2m
//	    max_delay: 0        # longest delay/deliver-at; 0: the queue's max_age
//	    replication_factor: 0   # 1 to 5; 0: 3 in a cluster, 1 on a single node
//	    ack_policy: quorum  # quorum | leader
//	  auto_create: true
//	  declared:
//	    orders:             # 1 to 128 characters of A-Z a-z 0-9 _ . -
//	      partitions: 16
//	      ack_timeout: 10s
//	storage:
//	  shards: 0             # independent Badger instances, fixed for a data dir; 0: the dir's, else 1
//	  sync_interval: 100ms  # for durability: async
//	  min_free_bytes: 268435456  # below it publishes get 0x97 and /readyz 503; 0: no check
//	  ring_size: 4096       # at most this many newest messages (and 4 MiB of payload) per partition in memory
//	  max_payload: 1048576  # bytes, at most 256 MiB
//	mqtt:
//	  max_keep_alive: 60s
//	  deny_subscribe: [test/nosubscribe]
//	  allow_anonymous: false
//	  max_packet_size: 0    # bytes; 0: storage.max_payload + 64 KiB
//	  max_queued_messages: 1000 # plain pub/sub messages held per client; past it they are dropped
//	  write_timeout: 10s    # a client that reads nothing of a write for this long is disconnected
//	  tls:                  # for listen.mqtts and listen.wss
//	    cert: ""            # PEM files
//	    key: ""
//	    client_ca: ""       # CAs of client certificates
//	    require_client_cert: false
//	    cn_as_username: false
//	http:
//	  admin_token: ""       # when set, /api/v1/ and /debug/pprof/ need it as a bearer token
//	  metrics: true         # false: no /metrics, no figures kept
//	  tls:                  # HTTPS on listen.http
//	    cert: ""
//	    key: ""
//	auth:
//	  users_file: ""        # USER:BCRYPT-HASH lines (shardq passwd)
//	  acl:                  # first match wins; with any rule, no match denies
//	    - {user: "*", action: publish, pattern: "devices/%u/#", permission: allow}
//	    - {user: billing, action: consume, pattern: orders, group: billing, permission: allow}
//	limits:
//	  max_queues: 1000      # auto-created queues past it: 0x97; 0: no limit
//	  max_connections: 10000
//	cluster:                # ignored without etcd endpoints: a single node
//	  etcd:
//	    endpoints: [http://10.0.0.1:2379, http://10.0.0.2:2379]  # --etcd, comma-separated
//	    username: ""
//	    password: ""
//	    ca: ""              # PEM files: etcd's CAs, the node's client certificate
//	    cert: ""
//	    key: ""
//	    dial_timeout: 10s   # waited for etcd at start
//	    prefix: /shardq/    # keys of the cluster; one per cluster sharing an etcd
//	  addr: 127.0.0.1:8991  # gRPC listener, dialled by the other nodes
//	  advertise: ""         # the address they dial when not addr (0.0.0.0, NAT)
//	  tls:                  # mutual TLS between nodes: all three or none
//	    cert: ""            # the node's certificate (server and client use, for advertise)
//	    key: ""
//	    ca: ""              # the CA of every node's certificate
//	  token: ""             # a secret of the cluster: every call between nodes carries it (SHARDQ_CLUSTER_TOKEN)
//	  allow_insecure: false # addr other than loopback without tls: clear text, on a network you trust
//	  lease_ttl: 5s         # 1s to 60s; a node that cannot renew its lease stops committing
//	  raft_log_keep: 5000   # applied raft entries kept per replicated partition
//	  replace_after: 1m     # a replica's node gone this long is replaced
//	  max_moves: 2          # replicated partitions each leader moves at once
//	  placement:            # first match wins; a queue no rule matches: any node
//	    - {queues: "orders-*", nodes: [node-a, node-b]}
//
// A declared queue starts from queues.defaults, wherever defaults appears
// in the file, and replaces only the fields its entry sets: above, orders
// has 16 partitions, a 10s ack timeout and every other setting of the
// defaults.
//
// # Cluster
//
// A node given etcd endpoints (cluster.etcd.endpoints, --etcd) is part of
// a cluster (Clustered); without them it is a single node: the rest of the
// cluster section must still hold known keys of the right types, but its
// values are neither checked nor used. The patterns of cluster.placement
// are path.Match globs of queue names; PlacementFor returns the nodes of
// the first rule that matches a queue.
//
// # Usage
//
//	cfg, err := config.Load(os.Args[2:], os.Getenv)
//	if errors.Is(err, flag.ErrHelp) {
//		config.Usage(os.Stdout) // every flag, its default and its variable
//		os.Exit(0)
//	}
//	if err != nil {
//		fmt.Fprintln(os.Stderr, err)
//		os.Exit(2)
//	}
//	opts, declared := cfg.QueueOptions("orders")
//
// # Errors
//
// Load returns a configuration only when all of it is valid: a node never
// starts half-configured. Otherwise every error is an *Error naming the
// setting by its YAML path, with the file and line it came from, or the
// flag or environment variable:
//
//	config: shardq.yaml:7: queues.declared.orders.ack_timeout: must be at least 100ms, got 10ms
//	config: shardq.yaml:3: queues.defaults.colour: unknown setting (known here: partitions, ...)
//	config: listen.mqtt: must be host:port, got "1883" (from --mqtt)
//	config: shardq.yaml:9: auth.acl[2].action: must be publish, subscribe, produce, consume or admin, got "pub"
//	config: shardq.yaml:31: cluster.placement[1].nodes: node ids must be 1 to 128 characters of A-Z a-z 0-9 _ . -, got "node a"
//	config: --colour: unknown flag (known: --config, --data-dir, ...)
//
// Load reports every error of one run at once, joined with errors.Join:
// every setting of the file that cannot be read (the others are read all
// the same), and every invalid value, several of one queue included.
// An *Error wraps its cause where there is one: a *queue.FieldError for a
// queue setting, an *fs.PathError for a config file that cannot be read.
//
// # Concurrency
//
// A Config is a plain value: Load and Default return a new one each time,
// and once built it may be read from any number of goroutines. Nothing in
// this package changes a Config after Load returns it.
package config
