package config

import (
	"cmp"
	"errors"
	"flag"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/internal/testcert"
	"github.com/shardq/shardq/queue"
)

// writeConfig writes a config file holding text and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shardq.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// env returns a getenv that reads vars.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestConfigDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatalf("Load with no arguments: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"data_dir", c.DataDir, "./data"},
		{"listen.mqtt", c.MQTT, "127.0.0.1:1883"},
		{"listen.ws", c.WS, "127.0.0.1:8083"},
		{"listen.http", c.HTTP, "127.0.0.1:8990"},
		{"log_level", c.LogLevel, slog.LevelInfo},
		{"queues.defaults", c.Queues.Defaults, queue.DefaultOptions()},
		{"queues.auto_create", c.Queues.AutoCreate, true},
		{"queues.declared", len(c.Queues.Declared), 0},
		{"storage.shards", c.Storage.Shards, 0},
		{"storage.sync_interval", c.Storage.SyncInterval, 100 * time.Millisecond},
		{"storage.ring_size", c.Storage.RingSize, 1024},
		{"storage.max_payload", c.Storage.MaxPayload, 1 << 20},
		{"storage.min_free_bytes", c.Storage.MinFreeBytes, int64(256 << 20)},
		{"storage.log_resident_bytes", c.Storage.LogResidentBytes, int64(4 << 20)},
		{"http.admin_token", c.Admin.Token, ""},
		{"http.metrics", c.Admin.Metrics, true},
		{"cluster.etcd.endpoints", len(c.Cluster.Etcd.Endpoints), 0},
		{"cluster.etcd.dial_timeout", c.Cluster.Etcd.DialTimeout, 10 * time.Second},
		{"cluster.etcd.prefix", c.Cluster.Etcd.Prefix, "/shardq/"},
		{"cluster.addr", c.Cluster.Addr, "127.0.0.1:8991"},
		{"cluster.advertise", c.Cluster.Advertise, ""},
		{"cluster.lease_ttl", c.Cluster.LeaseTTL, 5 * time.Second},
		{"clustered", c.Clustered(), false},
	}
	for _, tc := range checks {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if !validName(c.NodeID) {
		t.Errorf("node_id = %q, not a valid name", c.NodeID)
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestConfigPrecedence(t *testing.T) {
	const file = "data_dir: /from/file\nlisten:\n  mqtt: \"127.0.0.1:1001\"\n"
	tests := []struct {
		name     string
		flags    []string
		env      map[string]string
		file     bool // pass the file with --config
		wantDir  string
		wantMQTT string
	}{
		{name: "default", wantDir: "./data", wantMQTT: "127.0.0.1:1883"},
		{name: "env beats default",
			env:     map[string]string{"SHARDQ_DATA_DIR": "/from/env", "SHARDQ_MQTT": "127.0.0.1:1002"},
			wantDir: "/from/env", wantMQTT: "127.0.0.1:1002"},
		{name: "file beats env",
			env:  map[string]string{"SHARDQ_DATA_DIR": "/from/env", "SHARDQ_MQTT": "127.0.0.1:1002"},
			file: true, wantDir: "/from/file", wantMQTT: "127.0.0.1:1001"},
		{name: "env fills what the file leaves out",
			env:  map[string]string{"SHARDQ_DATA_DIR": "/from/env", "SHARDQ_WS": "127.0.0.1:1005"},
			file: true, wantDir: "/from/file", wantMQTT: "127.0.0.1:1001"},
		{name: "flag beats file and env",
			flags: []string{"--data-dir", "/from/flag", "--mqtt=127.0.0.1:1003"},
			env:   map[string]string{"SHARDQ_DATA_DIR": "/from/env", "SHARDQ_MQTT": "127.0.0.1:1002"},
			file:  true, wantDir: "/from/flag", wantMQTT: "127.0.0.1:1003"},
		{name: "flag beats default",
			flags:   []string{"-data-dir", "/from/flag"},
			wantDir: "/from/flag", wantMQTT: "127.0.0.1:1883"},
		{name: "empty env counts as unset",
			env:     map[string]string{"SHARDQ_DATA_DIR": ""},
			wantDir: "./data", wantMQTT: "127.0.0.1:1883"},
	}
	path := writeConfig(t, file)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.flags
			if tc.file {
				args = append([]string{"--config", path}, args...)
			}
			c, err := Load(args, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.DataDir != tc.wantDir || c.MQTT != tc.wantMQTT {
				t.Errorf("data_dir, listen.mqtt = %q, %q; want %q, %q", c.DataDir, c.MQTT, tc.wantDir, tc.wantMQTT)
			}
		})
	}
}

func TestConfigFileChoice(t *testing.T) {
	fromEnv := writeConfig(t, "node_id: env-file\n")
	fromFlag := writeConfig(t, "node_id: flag-file\n")
	tests := []struct {
		name  string
		flags []string
		env   map[string]string
		want  string
	}{
		{"SHARDQ_CONFIG", nil, map[string]string{"SHARDQ_CONFIG": fromEnv}, "env-file"},
		{"--config beats SHARDQ_CONFIG", []string{"--config", fromFlag}, map[string]string{"SHARDQ_CONFIG": fromEnv}, "flag-file"},
		{"empty --config means no file", []string{"--config="}, map[string]string{"SHARDQ_CONFIG": fromEnv, "SHARDQ_NODE_ID": "env-id"}, "env-id"},
		{"--node-id beats the file", []string{"--config", fromFlag, "--node-id", "flag-id"}, nil, "flag-id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.flags, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.NodeID != tc.want {
				t.Errorf("node_id = %q, want %q", c.NodeID, tc.want)
			}
		})
	}
}

func TestConfigDisableListeners(t *testing.T) {
	tests := []struct {
		name  string
		flags []string
		file  string
	}{
		{"flags", []string{"--ws", "", "--http="}, ""},
		{"file", nil, "listen:\n  ws: \"\"\n  http:\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.flags
			if tc.file != "" {
				args = append(args, "--config", writeConfig(t, tc.file))
			}
			c, err := Load(args, env(map[string]string{"SHARDQ_WS": ":1", "SHARDQ_HTTP": ":2"}))
			if err != nil {
				t.Fatal(err)
			}
			if c.WS != "" || c.HTTP != "" {
				t.Errorf("listen.ws, listen.http = %q, %q; want both empty", c.WS, c.HTTP)
			}
		})
	}
}

func TestConfigSpecFile(t *testing.T) {
	// The example of SPEC section 8, plus every other key.
	path := writeConfig(t, `
node_id: node-a
data_dir: /var/lib/shardq
log_level: debug
listen:
  mqtt: 127.0.0.1:1883
  ws: "[::1]:8083"
  http: ":0"
queues:
  defaults:            # apply to every queue, including auto-created ones
    partitions: 8
    ordering: key      # key | partition | none
    ack_timeout: 30s
    max_deliveries: 5
    retry_backoff: 1s
    retry_backoff_max: 5m
    prefetch: 1024
    durability: fsync  # fsync | async
    max_age: 168h
    max_messages: 0    # 0: no limit
    max_bytes: 0
    overflow: reject   # reject | drop-oldest
    dedup_window: 2m
  auto_create: true
  declared:
    orders:
      partitions: 16
      ack_timeout: 10s
storage:
  shards: 2            # independent Badger instances; fixed for a data dir
  sync_interval: 100ms # for durability: async
  ring_size: 1024
  max_payload: 65536
http:
  admin_token: "s3cret"      # when set, mutating admin calls need it as a bearer token
`)
	c, err := Load([]string{"--config", path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.NodeID, want.DataDir, want.LogLevel = "node-a", "/var/lib/shardq", slog.LevelDebug
	want.MQTT, want.WS, want.HTTP = "127.0.0.1:1883", "[::1]:8083", ":0"
	orders := queue.DefaultOptions()
	orders.Partitions, orders.AckTimeout = 16, 10*time.Second
	want.Queues.Declared["orders"] = orders
	want.Storage.Shards, want.Storage.RingSize, want.Storage.MaxPayload = 2, 1024, 65536
	want.Admin.Token = "s3cret"
	want.origin = c.origin
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", c, want)
	}
}

func TestConfigDeclaredInheritsDefaults(t *testing.T) {
	// declared comes before defaults in the file: the entries still start
	// from the resolved defaults.
	path := writeConfig(t, `
queues:
  declared:
    orders:
      partitions: 16
      ack_timeout: 10s
    audit:
      ordering: none
    plain:
  defaults:
    ordering: partition
    max_deliveries: 9
    durability: async
`)
	c, err := Load([]string{"--config", path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defaults := queue.DefaultOptions()
	defaults.Ordering, defaults.MaxDeliveries, defaults.Durability = queue.OrderPartition, 9, queue.DurabilityAsync
	orders, audit := defaults, defaults
	orders.Partitions, orders.AckTimeout = 16, 10*time.Second
	audit.Ordering = queue.OrderNone

	tests := []struct {
		queue        string
		want         queue.Options
		wantDeclared bool
	}{
		{"orders", orders, true},
		{"audit", audit, true},
		{"plain", defaults, true},
		{"auto-created", defaults, false},
	}
	for _, tc := range tests {
		t.Run(tc.queue, func(t *testing.T) {
			got, declared := c.QueueOptions(tc.queue)
			if declared != tc.wantDeclared {
				t.Errorf("declared = %v, want %v", declared, tc.wantDeclared)
			}
			if got != tc.want {
				t.Errorf("options =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []errorCase{
		{name: "bad duration",
			file: "queues:\n  defaults:\n    ack_timeout: 10x\n",
			want: []string{"shardq.yaml:3: queues.defaults.ack_timeout:", `"10x"`}},
		{name: "duration without unit",
			file: "storage:\n  sync_interval: 100\n",
			want: []string{"shardq.yaml:2: storage.sync_interval:", "duration"}},
		{name: "duration too short",
			file: "queues:\n  declared:\n    orders:\n      ack_timeout: 10ms\n",
			want: []string{"shardq.yaml:4: queues.declared.orders.ack_timeout: must be at least 100ms, got 10ms"}},
		{name: "inherited backoff below declared retry_backoff",
			file: "queues:\n  declared:\n    orders:\n      retry_backoff: 10m\n",
			want: []string{"shardq.yaml:3: queues.declared.orders.retry_backoff_max:"}},
		{name: "unknown key",
			file: "node_id: a\nqueues:\n  defaults:\n    colour: red\n",
			want: []string{"shardq.yaml:4: queues.defaults.colour: unknown setting"}},
		{name: "unknown top-level key",
			file: "listen_addr: \":1\"\n",
			want: []string{"shardq.yaml:1: listen_addr: unknown setting"}},
		{name: "key set twice",
			file: "storage:\n  shards: 1\n  shards: 2\n",
			want: []string{"shardq.yaml:3: storage.shards: set twice, first on line 2"}},
		{name: "bad ordering",
			file: "queues:\n  defaults:\n    ordering: fifo\n",
			want: []string{`queues.defaults.ordering: must be key, partition or none, got "fifo"`}},
		{name: "bad durability in declared queue",
			file: "queues:\n  declared:\n    q1:\n      durability: maybe\n",
			want: []string{`queues.declared.q1.durability:`, `"maybe"`}},
		{name: "negative shards",
			file: "storage:\n  shards: -1\n",
			want: []string{"storage.shards: must be between 1 and 64 (0: the data directory's), got -1"}},
		{name: "shards not a number",
			file: "storage:\n  shards: two\n",
			want: []string{"shardq.yaml:2: storage.shards: must be an integer", `"two"`}},
		{name: "size with a unit",
			file: "queues:\n  defaults:\n    max_bytes: 1GiB\n",
			want: []string{"queues.defaults.max_bytes: must be an integer"}},
		{name: "ring too small",
			file: "storage:\n  ring_size: 8\n",
			want: []string{"storage.ring_size: must be between 16 and 1048576, got 8"}},
		{name: "negative min free bytes",
			file: "storage:\n  min_free_bytes: -1\n",
			want: []string{"storage.min_free_bytes: must be 0 (no check) or a number of bytes, got -1"}},
		{name: "log resident below -1",
			file: "storage:\n  log_resident_bytes: -2\n",
			want: []string{"storage.log_resident_bytes: must be -1 (keep every page) or a number of bytes, got -2"}},
		{name: "payload too large for a cluster",
			file: "cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\nstorage:\n  max_payload: 62914561\n",
			want: []string{"storage.max_payload: must be at most 62914560 (60 MiB) in a cluster, got 62914561"}},
		{name: "payload too large",
			file: "storage:\n  max_payload: 268435457\n",
			want: []string{"storage.max_payload:"}},
		{name: "zero sync interval",
			file: "storage:\n  sync_interval: 0s\n",
			want: []string{"storage.sync_interval: must be positive"}},
		{name: "bad queue name",
			file: "queues:\n  declared:\n    orders/eu:\n      partitions: 2\n",
			want: []string{"shardq.yaml:3: queues.declared.orders/eu:", "A-Z a-z 0-9 _ . -"}},
		{name: "queue name too long",
			file: "queues:\n  declared:\n    " + strings.Repeat("q", 129) + ":\n",
			want: []string{"queues.declared.qqq", "1 to 128"}},
		{name: "section is not a mapping",
			file: "storage: [1, 2]\n",
			want: []string{"shardq.yaml:1: storage: must be a mapping, got a list"}},
		{name: "setting is not a scalar",
			file: "listen:\n  mqtt: {port: 1}\n",
			want: []string{"shardq.yaml:2: listen.mqtt: must be a string, got a mapping"}},
		{name: "bad bool",
			file: "queues:\n  auto_create: sometimes\n",
			want: []string{"queues.auto_create: must be true or false"}},
		{name: "bad log level",
			file: "log_level: loud\n",
			want: []string{"log_level: must be debug, info, warn or error", `"loud"`}},
		{name: "bad log level from flag",
			flags: []string{"--log-level", "verbose"},
			want:  []string{`log_level: must be debug, info, warn or error, got "verbose" (from --log-level)`}},
		{name: "bad log level from env",
			env:  map[string]string{"SHARDQ_LOG_LEVEL": "trace"},
			want: []string{`log_level: must be debug, info, warn or error, got "trace" (from SHARDQ_LOG_LEVEL)`}},
		{name: "file is not a mapping",
			file: "- node_id: a\n",
			want: []string{"shardq.yaml:1: must be a mapping of settings"}},
		{name: "two documents",
			file: "node_id: a\n---\nnode_id: b\n",
			want: []string{"more than one YAML document"}},
		{name: "YAML syntax error",
			file: "node_id: a\nstorage:\n  shards: 2\n  sync_interval\n",
			want: []string{"shardq.yaml:4: invalid YAML"}},
		{name: "YAML tab indentation",
			file: "storage:\n\tshards: 2\n",
			want: []string{"shardq.yaml:2: invalid YAML"}},
		{name: "unknown flag",
			flags: []string{"--colour", "red"},
			want:  []string{"config: --colour: unknown flag", "--data-dir"}},
		{name: "flag without value",
			flags: []string{"--mqtt"},
			want:  []string{"config: --mqtt: needs a value"}},
		{name: "stray argument",
			flags: []string{"--mqtt", ":1", "extra"},
			want:  []string{`unexpected argument "extra"`}},
		{name: "missing file",
			flags: []string{"--config", "/nonexistent/shardq.yaml"},
			want:  []string{"config: /nonexistent/shardq.yaml: cannot read the config file", "(from --config)"}},
		{name: "missing file from env",
			env:  map[string]string{"SHARDQ_CONFIG": "/nonexistent/env.yaml"},
			want: []string{"/nonexistent/env.yaml", "(from SHARDQ_CONFIG)"}},
		{name: "bad address from flag",
			flags: []string{"--mqtt", "1883"},
			want:  []string{`listen.mqtt: must be host:port, got "1883" (from --mqtt)`}},
		{name: "bad port from env",
			env:  map[string]string{"SHARDQ_HTTP": ":http-port"},
			want: []string{`listen.http: port must be a number`, "(from SHARDQ_HTTP)"}},
		{name: "bad address from file",
			file: "listen:\n  ws: localhost\n",
			want: []string{`shardq.yaml:2: listen.ws: must be host:port, got "localhost"`}},
		{name: "no MQTT listener",
			flags: []string{"--mqtt=", "--ws="},
			want:  []string{"listen.mqtt: must not be empty: it is the only MQTT listener", "(from --mqtt)"}},
		{name: "two listeners on one address",
			flags: []string{"--ws", "127.0.0.1:1883"},
			want:  []string{`listen.ws: same address as listen.mqtt, "127.0.0.1:1883"`}},
		{name: "bad node id",
			flags: []string{"--node-id", "node a"},
			want:  []string{`node_id: must be 1 to 128 characters`, `"node a"`}},
		{name: "empty data dir",
			file: "data_dir: \"\"\n",
			want: []string{"shardq.yaml:1: data_dir: must not be empty"}},
		{name: "every invalid setting is reported",
			file: "storage:\n  shards: -1\n  ring_size: 1\nqueues:\n  defaults:\n    ordering: fifo\n",
			want: []string{"storage.shards:", "storage.ring_size:", "queues.defaults.ordering:"}},
	}
	runErrorCases(t, tests)
}

func TestConfigErrorFields(t *testing.T) {
	path := writeConfig(t, "queues:\n  declared:\n    orders:\n      ordering: fifo\n")
	_, err := Load([]string{"--config", path}, nil)
	e, ok := errors.AsType[*Error](err)
	if !ok {
		t.Fatalf("error %v is not a *config.Error", err)
	}
	want := Error{File: path, Line: 4, Field: "queues.declared.orders.ordering", Reason: `must be key, partition or none, got "fifo"`}
	if e.File != want.File || e.Line != want.Line || e.Field != want.Field || e.Reason != want.Reason || e.Source != "" {
		t.Errorf("error = %+v, want %+v", *e, want)
	}
	if fe, ok := errors.AsType[*queue.FieldError](err); !ok || fe.Field != "ordering" {
		t.Errorf("error %v does not wrap the queue.FieldError of ordering", err)
	}

	_, err = Load([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v is not fs.ErrNotExist", err)
	}
}

func TestConfigHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		t.Run(arg, func(t *testing.T) {
			if _, err := Load([]string{arg}, nil); !errors.Is(err, flag.ErrHelp) {
				t.Errorf("Load(%s) = %v, want flag.ErrHelp", arg, err)
			}
		})
	}
	var b strings.Builder
	Usage(&b)
	usage := b.String()
	// Each flag, with its default and its environment variable, in its own block.
	for _, want := range [][3]string{
		{"--config FILE", "none", "SHARDQ_CONFIG"},
		{"--data-dir DIR", "./data", "SHARDQ_DATA_DIR"},
		{"--mqtt ADDR", "127.0.0.1:1883", "SHARDQ_MQTT"},
		{"--ws ADDR", "127.0.0.1:8083", "SHARDQ_WS"},
		{"--http ADDR", "127.0.0.1:8990", "SHARDQ_HTTP"},
		{"--node-id ID", "the host name", "SHARDQ_NODE_ID"},
		{"--log-level LEVEL", "info", "SHARDQ_LOG_LEVEL"},
		{"--etcd URLS", "none", "SHARDQ_ETCD"},
		{"--cluster-addr HOST:PORT", "127.0.0.1:8991", "SHARDQ_CLUSTER_ADDR"},
		{"--cluster-advertise HOST:PORT", "--cluster-addr", "SHARDQ_CLUSTER_ADVERTISE"},
	} {
		_, block, ok := strings.Cut(usage, "  "+want[0]+"\n")
		block, _, _ = strings.Cut(block, "  --")
		if !ok || !strings.Contains(block, "default "+want[1]+"; env "+want[2]+"\n") {
			t.Errorf("usage lacks %s with default %s and env %s:\n%s", want[0], want[1], want[2], usage)
		}
	}
}

func TestConfigLogLevel(t *testing.T) {
	file := writeConfig(t, "log_level: error\n")
	tests := []struct {
		name  string
		flags []string
		env   map[string]string
		want  slog.Level
	}{
		{"default", nil, nil, slog.LevelInfo},
		{"env", nil, map[string]string{"SHARDQ_LOG_LEVEL": "debug"}, slog.LevelDebug},
		{"env in capitals", nil, map[string]string{"SHARDQ_LOG_LEVEL": "WARN"}, slog.LevelWarn},
		{"flag", []string{"--log-level", "warn"}, nil, slog.LevelWarn},
		{"file beats env", []string{"--config", file}, map[string]string{"SHARDQ_LOG_LEVEL": "debug"}, slog.LevelError},
		{"flag beats file", []string{"--config", file, "--log-level=debug"}, nil, slog.LevelDebug},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.flags, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.LogLevel != tc.want {
				t.Errorf("log level %v, want %v", c.LogLevel, tc.want)
			}
		})
	}
}

// TestConfigReportsEveryError checks that one run names every mistake of
// a file, of a flag and of the environment, so that a user fixes them all
// at once rather than one per start.
func TestConfigReportsEveryError(t *testing.T) {
	path := writeConfig(t, `node_id: a
log_level: loud
listen:
  mqtt: 1883
queues:
  defaults:
    partitions: 2.5
    colour: red
    ack_timeout: 10ms
  declared:
    orders:
      partitions: 0
      ordering: fifo
      ack_timeout: soon
      prefetch: 0
      max_bytes: 1e3
      retry_backoff: 10m
      dedup_window: -1s
    audit:
      durability: maybe
storage:
  shards: -2
  shards: 3
  ring_size: 8.0
`)
	_, err := Load([]string{"--config", path, "--ws", "x"}, env(map[string]string{"SHARDQ_LOG_LEVEL": "chatty"}))
	if err == nil {
		t.Fatal("Load succeeded")
	}
	want := []string{
		"shardq.yaml:2: log_level: must be debug, info, warn or error, got \"loud\"",
		"shardq.yaml:4: listen.mqtt: must be host:port, got \"1883\"",
		"shardq.yaml:7: queues.defaults.partitions: must be an integer, got \"2.5\"",
		"shardq.yaml:8: queues.defaults.colour: unknown setting",
		"shardq.yaml:9: queues.defaults.ack_timeout: must be at least 100ms, got 10ms",
		"shardq.yaml:12: queues.declared.orders.partitions: must be between 1 and 4096, got 0",
		"shardq.yaml:13: queues.declared.orders.ordering: must be key, partition or none",
		"shardq.yaml:14: queues.declared.orders.ack_timeout: must be a duration",
		"shardq.yaml:15: queues.declared.orders.prefetch: must be between 1 and 65535, got 0",
		"shardq.yaml:16: queues.declared.orders.max_bytes: must be an integer, got \"1e3\"",
		"queues.declared.orders.retry_backoff_max: must be at least retry_backoff (10m0s), got 5m0s",
		"shardq.yaml:18: queues.declared.orders.dedup_window: must not be negative",
		"shardq.yaml:20: queues.declared.audit.durability:",
		"shardq.yaml:23: storage.shards: set twice, first on line 22",
		"shardq.yaml:22: storage.shards: must be between 1 and 64 (0: the data directory's), got -2",
		"shardq.yaml:24: storage.ring_size: must be an integer, got \"8.0\"",
		"listen.ws: must be host:port, got \"x\" (from --ws)",
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("the errors do not name %q", w)
		}
	}
	// The bad level of the environment is overridden by the file's, which
	// is named; each setting is named once.
	if strings.Contains(msg, "chatty") {
		t.Errorf("an overridden environment value is reported")
	}
	if n := strings.Count(msg, "queues.defaults.partitions"); n != 1 {
		t.Errorf("queues.defaults.partitions named %d times", n)
	}
	// audit inherits the invalid ack_timeout of the defaults: named once.
	if strings.Contains(msg, "queues.declared.audit.ack_timeout") {
		t.Errorf("an inherited invalid default is named again for the queue")
	}
	// The errors of the file come in the order of its lines.
	lines := regexp.MustCompile(`shardq\.yaml:(\d+):`).FindAllStringSubmatch(msg, -1)
	if !slices.IsSortedFunc(lines, func(a, b []string) int { return cmp.Compare(atoi(t, a[1]), atoi(t, b[1])) }) {
		t.Errorf("errors not in the order of the file's lines")
	}
	if t.Failed() {
		t.Logf("errors:\n%s", msg)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConfigIntegersRefuseFractions(t *testing.T) {
	tests := []struct{ file, field string }{
		{"queues:\n  defaults:\n    partitions: 2.5\n", "queues.defaults.partitions"},
		{"queues:\n  declared:\n    orders:\n      max_deliveries: 3.0\n", "queues.declared.orders.max_deliveries"},
		{"queues:\n  defaults:\n    max_messages: 1e6\n", "queues.defaults.max_messages"},
		{"storage:\n  shards: 1.5\n", "storage.shards"},
		{"storage:\n  max_payload: .5\n", "storage.max_payload"},
	}
	for _, tc := range tests {
		t.Run(tc.field, func(t *testing.T) {
			_, err := Load([]string{"--config", writeConfig(t, tc.file)}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.field+": must be an integer") {
				t.Errorf("error %v, want one naming %s as not an integer", err, tc.field)
			}
		})
	}
	// Integers in other notations YAML knows still are integers.
	c, err := Load([]string{"--config", writeConfig(t, "storage:\n  max_payload: 0x10000\n  ring_size: +1024\n")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Storage.MaxPayload != 65536 || c.Storage.RingSize != 1024 {
		t.Errorf("max_payload, ring_size = %d, %d; want 65536, 1024", c.Storage.MaxPayload, c.Storage.RingSize)
	}
}

func TestConfigEmptyFile(t *testing.T) {
	for _, text := range []string{"", "# only a comment\n", "---\n", "queues:\nstorage:\n"} {
		t.Run(text, func(t *testing.T) {
			c, err := Load([]string{"--config", writeConfig(t, text)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.Storage != Default().Storage || c.Queues.Defaults != queue.DefaultOptions() {
				t.Errorf("an empty file changed the defaults: %+v", c)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"declared queue", func(c *Config) {
			o := c.Queues.Defaults
			o.Partitions = 0
			c.Queues.Declared["orders"] = o
		}, "config: queues.declared.orders.partitions: must be between 1 and 4096, got 0"},
		{"defaults", func(c *Config) { c.Queues.Defaults.Prefetch = 0 }, "config: queues.defaults.prefetch:"},
		{"nil declared map", func(c *Config) { c.Queues.Declared = nil }, ""},
		{"random ports may repeat", func(c *Config) { c.MQTT, c.WS, c.HTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0" }, ""},
		{"max shards", func(c *Config) { c.Storage.Shards = MaxShards }, ""},
		{"too many shards", func(c *Config) { c.Storage.Shards = MaxShards + 1 }, "config: storage.shards: must be between 1 and 64 (0: the data directory's), got 65"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.modify(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigMQTTSection(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("mqtt:\n  max_keep_alive: 300s\n  deny_subscribe: [a/b, \"c/#\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", good}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Protocol.MaxKeepAlive != 300*time.Second || len(c.Protocol.DenySubscribe) != 2 || c.Protocol.DenySubscribe[1] != "c/#" {
		t.Fatalf("mqtt section read as %+v", c.Protocol)
	}
	for file, want := range map[string]string{
		"mqtt:\n  max_keep_alive: 1.5s\n":   "mqtt.max_keep_alive",
		"mqtt:\n  deny_subscribe: a/b\n":    "mqtt.deny_subscribe",
		"mqtt:\n  deny_subscribe: [\"\"]\n": "mqtt.deny_subscribe",
	} {
		p := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load([]string{"--config", p}, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %s", file, err, want)
		}
	}
}

func TestConfigClusterFile(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, dir, "ca")
	client := ca.Client(t, dir, "node-a")
	path := writeConfig(t, `
node_id: node-a
cluster:
  etcd:
    endpoints: [http://10.0.0.1:2379, "https://[::1]:2379"]
    username: shardq
    password: s3cret
    ca: `+ca.CertFile+`
    cert: `+client.CertFile+`
    key: `+client.KeyFile+`
    dial_timeout: 3s
    prefix: /prod/shardq/
  addr: 0.0.0.0:9000
  advertise: node-a.example:9000
  allow_insecure: true
  token: t0ken
  lease_ttl: 10s
  placement:
    - queues: "orders-*"
      nodes: [node-a, node-b]
    - {queues: "*", nodes: [node-c]}
`)
	c, err := Load([]string{"--config", path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Cluster{
		Etcd: Etcd{
			Endpoints:   []string{"http://10.0.0.1:2379", "https://[::1]:2379"},
			Username:    "shardq",
			Password:    "s3cret",
			CA:          ca.CertFile,
			Cert:        client.CertFile,
			Key:         client.KeyFile,
			DialTimeout: 3 * time.Second,
			Prefix:      "/prod/shardq/",
		},
		Addr:          "0.0.0.0:9000",
		Advertise:     "node-a.example:9000",
		AllowInsecure: true,
		Token:         "t0ken",
		Placement: []Placement{
			{Queues: "orders-*", Nodes: []string{"node-a", "node-b"}},
			{Queues: "*", Nodes: []string{"node-c"}},
		},
		LeaseTTL: 10 * time.Second, RaftLogKeep: 5000, ReplaceAfter: time.Minute, MaxMoves: 2,
	}
	if !reflect.DeepEqual(c.Cluster, want) {
		t.Errorf("cluster =\n%+v\nwant\n%+v", c.Cluster, want)
	}
	if !c.Clustered() {
		t.Errorf("Clustered() = false with etcd endpoints")
	}

	// A file that sets some of the section keeps the defaults of the rest.
	c, err = Load([]string{"--config", writeConfig(t, "cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = Default().Cluster
	want.Etcd.Endpoints = []string{"http://127.0.0.1:2379"}
	if !reflect.DeepEqual(c.Cluster, want) {
		t.Errorf("cluster =\n%+v\nwant\n%+v", c.Cluster, want)
	}
}

func TestConfigClusterFlags(t *testing.T) {
	file := writeConfig(t, "cluster:\n  etcd:\n    endpoints: [http://file:2379]\n  addr: 10.0.0.1:8991\n")
	tests := []struct {
		name          string
		flags         []string
		env           map[string]string
		wantEndpoints []string
		wantAddr      string
		wantAdvertise string
	}{
		{name: "default", wantAddr: "127.0.0.1:8991"},
		{name: "flag",
			flags:         []string{"--etcd", "http://a:2379,https://b:2379", "--cluster-addr", ":9000", "--cluster-advertise", "a.example:9000"},
			wantEndpoints: []string{"http://a:2379", "https://b:2379"}, wantAddr: ":9000", wantAdvertise: "a.example:9000"},
		{name: "env, items trimmed",
			env:           map[string]string{"SHARDQ_ETCD": " http://a:2379 , http://b:2379 ", "SHARDQ_CLUSTER_ADDR": "10.0.0.2:8991", "SHARDQ_CLUSTER_ADVERTISE": "b.example:8991"},
			wantEndpoints: []string{"http://a:2379", "http://b:2379"}, wantAddr: "10.0.0.2:8991", wantAdvertise: "b.example:8991"},
		{name: "one endpoint",
			flags:         []string{"--etcd=http://a:2379"},
			wantEndpoints: []string{"http://a:2379"}, wantAddr: "127.0.0.1:8991"},
		{name: "file beats env",
			flags:         []string{"--config", file},
			env:           map[string]string{"SHARDQ_ETCD": "http://env:2379", "SHARDQ_CLUSTER_ADVERTISE": "env.example:8991"},
			wantEndpoints: []string{"http://file:2379"}, wantAddr: "10.0.0.1:8991", wantAdvertise: "env.example:8991"},
		{name: "flag beats file",
			flags:         []string{"--config", file, "--etcd", "http://flag:2379", "--cluster-addr", "10.0.0.3:8991"},
			wantEndpoints: []string{"http://flag:2379"}, wantAddr: "10.0.0.3:8991"},
		{name: "empty flag: a single node",
			flags:    []string{"--config", file, "--etcd="},
			wantAddr: "10.0.0.1:8991"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Addresses other than loopback, in clear text.
			e := map[string]string{"SHARDQ_CLUSTER_ALLOW_INSECURE": "true"}
			maps.Copy(e, tc.env)
			c, err := Load(tc.flags, env(e))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Cluster.Etcd.Endpoints, tc.wantEndpoints) || c.Clustered() != (len(tc.wantEndpoints) > 0) {
				t.Errorf("cluster.etcd.endpoints = %q, want %q", c.Cluster.Etcd.Endpoints, tc.wantEndpoints)
			}
			if c.Cluster.Addr != tc.wantAddr || c.Cluster.Advertise != tc.wantAdvertise {
				t.Errorf("cluster.addr, cluster.advertise = %q, %q; want %q, %q", c.Cluster.Addr, c.Cluster.Advertise, tc.wantAddr, tc.wantAdvertise)
			}
		})
	}
}

func TestConfigClusterErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, dir, "ca")
	client := ca.Client(t, dir, "node-a")
	const etcd = "cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n"
	tests := []errorCase{
		{name: "empty item in --etcd",
			flags: []string{"--etcd", "http://a:2379,,http://b:2379"},
			want:  []string{`cluster.etcd.endpoints: must be a comma-separated list without empty items, got "http://a:2379,,http://b:2379" (from --etcd)`}},
		{name: "trailing comma in SHARDQ_ETCD",
			env:  map[string]string{"SHARDQ_ETCD": "http://a:2379, "},
			want: []string{"cluster.etcd.endpoints: must be a comma-separated list without empty items", "(from SHARDQ_ETCD)"}},
		{name: "endpoint without scheme",
			flags: []string{"--etcd", "http://a:2379,localhost:2379"},
			want:  []string{`cluster.etcd.endpoints: must be http:// or https:// URLs, got "localhost:2379" (from --etcd)`}},
		{name: "endpoint of another scheme",
			file: "cluster:\n  etcd:\n    endpoints: [\"unix://etcd.sock\", \"http://\"]\n",
			want: []string{`shardq.yaml:3: cluster.etcd.endpoints: must be http:// or https:// URLs, got "unix://etcd.sock"`, `got "http://"`}},
		{name: "endpoints not a list",
			file: "cluster:\n  etcd:\n    endpoints: http://a:2379\n",
			want: []string{"shardq.yaml:3: cluster.etcd.endpoints: must be a list of strings"}},
		{name: "bad addr",
			flags: []string{"--etcd", "http://a:2379", "--cluster-addr", "8991"},
			want:  []string{`cluster.addr: must be host:port, got "8991" (from --cluster-addr)`}},
		{name: "empty addr",
			file: etcd + "  addr: \"\"\n",
			want: []string{`shardq.yaml:4: cluster.addr: must be host:port, got ""`}},
		{name: "bad advertise port",
			flags: []string{"--etcd", "http://a:2379"},
			env:   map[string]string{"SHARDQ_CLUSTER_ADVERTISE": "node-a:grpc"},
			want:  []string{"cluster.advertise: port must be a number", "(from SHARDQ_CLUSTER_ADVERTISE)"}},
		{name: "lease too short",
			file: etcd + "  lease_ttl: 500ms\n",
			want: []string{"shardq.yaml:4: cluster.lease_ttl: must be from 1s to 1m0s, got 500ms"}},
		{name: "lease too long",
			file: etcd + "  lease_ttl: 61s\n",
			want: []string{"shardq.yaml:4: cluster.lease_ttl: must be from 1s to 1m0s, got 1m1s"}},
		{name: "no moves",
			file: etcd + "  max_moves: 0\n",
			want: []string{"shardq.yaml:4: cluster.max_moves: must be from 1 to 1000, got 0"}},
		{name: "lease not a duration",
			file: etcd + "  lease_ttl: 5\n",
			want: []string{"shardq.yaml:4: cluster.lease_ttl: must be a duration"}},
		{name: "zero dial timeout",
			file: etcd + "    dial_timeout: 0s\n",
			want: []string{"shardq.yaml:4: cluster.etcd.dial_timeout: must be positive, got 0s"}},
		{name: "prefix without leading slash",
			file: etcd + "    prefix: shardq/\n",
			want: []string{`shardq.yaml:4: cluster.etcd.prefix: must start and end with /, got "shardq/"`}},
		{name: "prefix without trailing slash",
			file: etcd + "    prefix: /shardq\n",
			want: []string{`cluster.etcd.prefix: must start and end with /, got "/shardq"`}},
		{name: "cert without key",
			file: etcd + "    cert: " + client.CertFile + "\n",
			want: []string{"shardq.yaml:4: cluster.etcd.cert: set both cluster.etcd.cert and cluster.etcd.key, or neither"}},
		{name: "key without cert",
			file: etcd + "    key: " + client.KeyFile + "\n",
			want: []string{"cluster.etcd.cert: set both"}},
		{name: "unreadable certificate",
			file: etcd + "    cert: " + client.KeyFile + "\n    key: " + client.KeyFile + "\n",
			want: []string{"shardq.yaml:4: cluster.etcd.cert: cannot load the certificate and key"}},
		{name: "missing key file",
			file: etcd + "    cert: " + client.CertFile + "\n    key: " + filepath.Join(dir, "none.key") + "\n",
			want: []string{"cluster.etcd.cert: cannot load the certificate and key", "none.key"}},
		{name: "missing CA file",
			file: etcd + "    ca: " + filepath.Join(dir, "none.pem") + "\n",
			want: []string{"shardq.yaml:4: cluster.etcd.ca: cannot read " + filepath.Join(dir, "none.pem")}},
		{name: "CA that is no PEM",
			file: etcd + "    ca: " + client.KeyFile + "\n",
			want: []string{"cluster.etcd.ca: " + client.KeyFile + " holds no PEM certificate"}},
		{name: "unknown cluster key",
			file: etcd + "  peers: [a]\n",
			want: []string{"shardq.yaml:4: cluster.peers: unknown setting (known here: etcd, tls, addr, advertise, token, allow_insecure, placement, lease_ttl, raft_log_keep, replace_after, max_moves)"}},
		{name: "unknown etcd key",
			file: etcd + "    endpoint: http://a:2379\n",
			want: []string{"shardq.yaml:4: cluster.etcd.endpoint: unknown setting"}},
		{name: "placement not a list",
			file: etcd + "  placement: {queues: a, nodes: [b]}\n",
			want: []string{"shardq.yaml:4: cluster.placement: must be a list of rules"}},
		{name: "unknown placement key",
			file: etcd + "  placement:\n    - {queues: a, node: [b]}\n",
			want: []string{"shardq.yaml:5: cluster.placement[0].node: unknown setting (known here: queues, tenants, nodes)"}},
		{name: "placement nodes not a list",
			file: etcd + "  placement:\n    - {queues: a, nodes: b}\n",
			want: []string{"shardq.yaml:5: cluster.placement[0].nodes: must be a list of strings"}},
		{name: "placement without queues",
			file: etcd + "  placement:\n    - {nodes: [a]}\n",
			want: []string{"shardq.yaml:5: cluster.placement[0].queues: must be a pattern of queue names"}},
		{name: "bad placement pattern",
			file: etcd + "  placement:\n    - {queues: a, nodes: [a]}\n    - queues: \"orders-[\"\n      nodes: [a]\n",
			want: []string{`shardq.yaml:6: cluster.placement[1].queues: must be a pattern of queue names (path.Match), got "orders-["`}},
		{name: "placement without nodes",
			file: etcd + "  placement:\n    - {queues: a, nodes: []}\n    - {queues: b}\n",
			want: []string{"shardq.yaml:5: cluster.placement[0].nodes: must list at least one node id", "shardq.yaml:6: cluster.placement[1].nodes: must list at least one node id"}},
		{name: "bad node id",
			file: etcd + "  placement:\n    - {queues: a, nodes: [a]}\n    - {queues: b, nodes: [b, \"node b\"]}\n",
			want: []string{`shardq.yaml:6: cluster.placement[1].nodes: node ids must be 1 to 128 characters of A-Z a-z 0-9 _ . -, got "node b"`}},
		{name: "node listed twice",
			file: etcd + "  placement:\n    - queues: a\n      nodes: [a, b, a]\n",
			want: []string{`shardq.yaml:6: cluster.placement[0].nodes: lists "a" twice`}},
		{name: "cluster tls without its CA",
			file: etcd + "  tls:\n    cert: " + client.CertFile + "\n    key: " + client.KeyFile + "\n",
			want: []string{"cluster.tls: set cert, key and ca together, or none of them"}},
		{name: "cluster tls with a key that is no key",
			file: etcd + "  tls:\n    cert: " + client.CertFile + "\n    key: " + client.CertFile + "\n    ca: " + ca.CertFile + "\n",
			want: []string{"cluster.tls.cert: cannot load the certificate and key"}},
	}
	runErrorCases(t, tests)
}

// TestConfigClusterIgnored checks that the cluster settings of a single
// node are not checked, and that a cluster node's errors are all reported
// at once.
func TestConfigClusterIgnored(t *testing.T) {
	const section = `cluster:
  etcd:
    prefix: shardq
    dial_timeout: 0s
    cert: /nonexistent/cert.pem
  addr: "8991"
  lease_ttl: 0s
  placement:
    - {queues: "[", nodes: []}
`
	c, err := Load([]string{"--config", writeConfig(t, section), "--cluster-advertise", "x"}, nil)
	if err != nil {
		t.Fatalf("single node: %v", err)
	}
	if c.Clustered() || len(c.Cluster.Placement) != 1 {
		t.Errorf("Clustered() = %v, placement %+v", c.Clustered(), c.Cluster.Placement)
	}

	_, err = Load([]string{"--config", writeConfig(t, section), "--cluster-advertise", "x", "--etcd", "http://a:2379"}, nil)
	if err == nil {
		t.Fatal("cluster node: Load succeeded")
	}
	msg := err.Error()
	for _, w := range []string{
		"shardq.yaml:3: cluster.etcd.prefix:",
		"shardq.yaml:4: cluster.etcd.dial_timeout:",
		"shardq.yaml:5: cluster.etcd.cert: set both",
		"shardq.yaml:6: cluster.addr:",
		"shardq.yaml:7: cluster.lease_ttl:",
		"shardq.yaml:9: cluster.placement[0].queues:",
		"shardq.yaml:9: cluster.placement[0].nodes:",
		`cluster.advertise: must be host:port, got "x" (from --cluster-advertise)`,
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("the errors do not name %q:\n%s", w, msg)
		}
	}
}

func TestConfigPlacementFor(t *testing.T) {
	c := Default()
	c.Cluster.Etcd.Endpoints = []string{"http://127.0.0.1:2379"}
	c.Cluster.Placement = []Placement{
		{Queues: "orders-eu", Nodes: []string{"eu-1"}},
		{Queues: "orders-*", Nodes: []string{"node-a", "node-b"}},
		{Queues: "*-eu", Nodes: []string{"eu-2"}},
		{Queues: "audit.[0-9]", Nodes: []string{"node-c"}},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		queue string
		want  []string
	}{
		{"orders-eu", []string{"eu-1"}},
		{"orders-us", []string{"node-a", "node-b"}},
		{"billing-eu", []string{"eu-2"}},
		{"audit.7", []string{"node-c"}},
		{"audit.x", nil},
		{"orders", nil},
		{"", nil},
	}
	for _, tc := range tests {
		if got := c.PlacementFor(tc.queue); !slices.Equal(got, tc.want) {
			t.Errorf("PlacementFor(%q) = %q, want %q", tc.queue, got, tc.want)
		}
	}
	if got := Default().PlacementFor("orders"); got != nil {
		t.Errorf("PlacementFor without rules = %q, want nil", got)
	}
}

// TestReplicationFactorOverPlacement: a replication factor larger than the
// nodes placement allows a queue is refused, naming the setting.
func TestReplicationFactorOverPlacement(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "shardq.yaml")
	yaml := "cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n  placement:\n    - queues: \"pinned-*\"\n      nodes: [a, b]\n" +
		"queues:\n  declared:\n    pinned-1:\n      replication_factor: 3\n    free:\n      replication_factor: 3\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load([]string{"--config", file}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "queues.declared.pinned-1.replication_factor") || strings.Contains(err.Error(), "free") {
		t.Fatalf("got %v", err)
	}
}

// errorCase is a config that Load must refuse with an error holding want.
type errorCase struct {
	name  string
	flags []string
	env   map[string]string
	file  string // written to a file passed with --config when not ""
	want  []string
}

func runErrorCases(t *testing.T, tests []errorCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.flags
			if tc.file != "" {
				args = append([]string{"--config", writeConfig(t, tc.file)}, args...)
			}
			c, err := Load(args, env(tc.env))
			if err == nil {
				t.Fatalf("Load succeeded, want an error containing %q", tc.want)
			}
			if c != nil {
				t.Errorf("Load returned a config with its error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if _, ok := errors.AsType[*Error](err); !ok {
				t.Errorf("error %q is not a *config.Error", err)
			}
		})
	}
}

// TestConfigDocumented: docs/CONFIG.md has a row for every key the file
// may hold (a declared queue's keys through queues.defaults), and no row
// for a key it may not.
func TestConfigDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "CONFIG.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if k, ok := strings.CutPrefix(line, "| `"); ok {
			if k, _, ok := strings.Cut(k, "`"); ok {
				rows[k] = true
			}
		}
	}
	known := map[string]bool{}
	for _, k := range Keys() {
		if rest, ok := strings.CutPrefix(k, "queues.declared.NAME."); ok {
			k = "queues.defaults." + rest
		}
		known[k] = true
		if !rows[k] {
			t.Errorf("docs/CONFIG.md has no row for %s", k)
		}
	}
	for k := range rows {
		if !known[k] {
			t.Errorf("docs/CONFIG.md documents %s, which the config file may not hold", k)
		}
	}
	if !strings.Contains(string(doc), "`queues.declared.NAME`") {
		t.Error("docs/CONFIG.md does not say how a queue is declared")
	}
}

// A single node takes payloads up to 256 MiB; only a cluster's nodes,
// which pass messages to each other in gRPC messages of at most 64 MiB,
// are held to 60 MiB.
func TestLargePayloadOnASingleNode(t *testing.T) {
	c, err := Load([]string{"--config", writeConfig(t, "storage:\n  max_payload: 104857600\n")}, nil)
	if err != nil {
		t.Fatalf("max_payload 100 MiB on a single node: %v", err)
	}
	if c.Storage.MaxPayload != 100<<20 {
		t.Fatalf("max_payload %d, want %d", c.Storage.MaxPayload, 100<<20)
	}
}
