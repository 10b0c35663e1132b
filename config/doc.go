// Package config loads the configuration of a shardq node from the flags
// of `shardq serve`, a YAML file and the environment, and validates it.
//
// # Precedence
//
// Each setting takes its value from the first of these that sets it:
//
//  1. its flag: --data-dir, --mqtt, --ws, --http, --node-id, --log-level;
//  2. the config file, named by --config or else by SHARDQ_CONFIG;
//  3. its environment variable, SHARDQ_ and the flag's name in capitals
//     with _ for -: SHARDQ_DATA_DIR, SHARDQ_MQTT, SHARDQ_WS, SHARDQ_HTTP,
//     SHARDQ_NODE_ID, SHARDQ_LOG_LEVEL;
//  4. the built-in default (Default).
//
// So a flag overrides the file, and an environment variable overrides only
// the default. An environment variable set to the empty string counts as
// unset; an empty flag (--ws "") or key (ws: "") does not: it disables
// that listener. Settings without a flag are set in the file only.
//
// With no flags, no file and no environment, a node is a working single
// node: MQTT on :1883, MQTT over WebSocket on :8083, HTTP (metrics,
// health, admin API) on :8990 (clear of Prometheus's 9090 and Grafana's
// 3000), data in ./data, named after its host, logging at info.
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
//	  mqtt: ":1883"
//	  ws: ":8083"           # "" disables
//	  http: ":8990"         # "" disables
//	queues:
//	  defaults:             # apply to every queue, including auto-created ones
//	    partitions: 8
//	    ordering: key       # key | partition | none
//	    ack_timeout: 30s
//	    max_deliveries: 5
//	    retry_backoff: 1s
//	    retry_backoff_max: 5m
//	    prefetch: 64
//	    durability: fsync   # fsync | async
//	    max_age: 168h
//	    max_messages: 0     # 0: no limit
//	    max_bytes: 0
//	    overflow: reject    # reject | drop-oldest
//	    dedup_window: 2m
//	  auto_create: true
//	  declared:
//	    orders:             # 1 to 128 characters of A-Z a-z 0-9 _ . -
//	      partitions: 16
//	      ack_timeout: 10s
//	storage:
//	  shards: 0             # independent Badger instances, fixed for a data dir; 0: the dir's, else 1
//	  sync_interval: 100ms  # for durability: async
//	  ring_size: 4096       # newest messages kept in memory per partition
//	  max_payload: 1048576  # bytes, at most 256 MiB
//	http:
//	  admin_token: ""       # when set, mutating admin calls need it as a bearer token
//	  metrics: true         # false: no /metrics, no figures kept
//
// A declared queue starts from queues.defaults, wherever defaults appears
// in the file, and replaces only the fields its entry sets: above, orders
// has 16 partitions, a 10s ack timeout and every other setting of the
// defaults.
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
