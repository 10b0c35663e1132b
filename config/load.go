package config

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// setting is a value that a flag, its environment variable and the config
// file can all set.
type setting struct {
	flag  string // the flag's name, without dashes
	path  string // the YAML path
	value string // the name of its value, for the usage text
	usage string // what it sets
	def   string // the default, for the usage text
	// set stores v in c; it returns why v is invalid, or "".
	set func(c *Config, v string) string
}

var settings = []setting{
	{"data-dir", "data_dir", "DIR", "the directory holding the queues' data", "./data",
		text(func(c *Config) *string { return &c.DataDir })},
	{"mqtt", "listen.mqtt", "ADDR", "the address (host:port) to listen on for MQTT; empty disables", DefaultMQTT,
		text(func(c *Config) *string { return &c.MQTT })},
	{"mqtts", "listen.mqtts", "ADDR", "the address to listen on for MQTT over TLS (mqtt.tls in the config file)", "none",
		text(func(c *Config) *string { return &c.MQTTS })},
	{"ws", "listen.ws", "ADDR", "the address to listen on for MQTT over WebSocket; empty disables", DefaultWS,
		text(func(c *Config) *string { return &c.WS })},
	{"wss", "listen.wss", "ADDR", "the address to listen on for MQTT over WebSocket over TLS (mqtt.tls)", "none",
		text(func(c *Config) *string { return &c.WSS })},
	{"http", "listen.http", "ADDR", "the address to listen on for HTTP (metrics, health, admin API); empty disables", DefaultHTTP,
		text(func(c *Config) *string { return &c.HTTP })},
	{"users-file", "auth.users_file", "FILE", "the users file: USER:BCRYPT-HASH lines (shardq passwd prints one)", "none",
		text(func(c *Config) *string { return &c.Auth.UsersFile })},
	{"allow-anonymous", "mqtt.allow_anonymous", "BOOL", "let clients without credentials connect on every listener, loopback or not", "false",
		boolean(func(c *Config) *bool { return &c.Protocol.AllowAnonymous })},
	{"admin-token", "http.admin_token", "TOKEN", "the bearer token the admin API and /debug/pprof/ require (a flag shows in the process list: prefer the variable or the file)", "none",
		text(func(c *Config) *string { return &c.Admin.Token })},
	{"node-id", "node_id", "ID", "the name of this node, of A-Z a-z 0-9 _ . -", "the host name",
		text(func(c *Config) *string { return &c.NodeID })},
	{"log-level", "log_level", "LEVEL", "the least level logged: debug, info, warn or error", "info",
		func(c *Config, v string) string {
			l, reason := parseLevel(v)
			if reason == "" {
				c.LogLevel = l
			}
			return reason
		}},
	{"etcd", "cluster.etcd.endpoints", "URLS", "the etcd client URLs of the cluster, comma-separated; none: a single node", "none",
		list(func(c *Config) *[]string { return &c.Cluster.Etcd.Endpoints })},
	{"cluster-addr", "cluster.addr", "HOST:PORT", "the address the cluster's gRPC listener binds, which the other nodes dial", DefaultClusterAddr,
		text(func(c *Config) *string { return &c.Cluster.Addr })},
	{"cluster-advertise", "cluster.advertise", "HOST:PORT", "the address the other nodes dial, when it differs from --cluster-addr (a listener on 0.0.0.0, NAT)", "--cluster-addr",
		text(func(c *Config) *string { return &c.Cluster.Advertise })},
	{"cluster-token", "cluster.token", "TOKEN", "a secret every node of the cluster shares: presented on every call between nodes, required of every call (a flag shows in the process list: prefer the variable or the file)", "none",
		text(func(c *Config) *string { return &c.Cluster.Token })},
	{"cluster-allow-insecure", "cluster.allow_insecure", "BOOL", "let --cluster-addr listen on an address other than loopback without cluster.tls: clear text between nodes, on a network you trust", "false",
		boolean(func(c *Config) *bool { return &c.Cluster.AllowInsecure })},
}

// text returns the set of a string setting: every value is valid here
// (Validate checks it with the rest).
func text(field func(*Config) *string) func(*Config, string) string {
	return func(c *Config, v string) string {
		*field(c) = v
		return ""
	}
}

// boolean returns the set of a true/false setting.
func boolean(field func(*Config) *bool) func(*Config, string) string {
	return func(c *Config, v string) string {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Sprintf("must be true or false, got %q", v)
		}
		*field(c) = b
		return ""
	}
}

// list returns the set of a comma-separated list: each item is trimmed
// and none may be empty. An empty value sets an empty list.
func list(field func(*Config) *[]string) func(*Config, string) string {
	return func(c *Config, v string) string {
		if strings.TrimSpace(v) == "" {
			*field(c) = nil
			return ""
		}
		items := strings.Split(v, ",")
		for i, item := range items {
			items[i] = strings.TrimSpace(item)
			if items[i] == "" {
				return fmt.Sprintf("must be a comma-separated list without empty items, got %q", v)
			}
		}
		*field(c) = items
		return ""
	}
}

// parseLevel parses a log level: debug, info, warn or error, in any case.
// It returns why v is not one, or "".
func parseLevel(v string) (slog.Level, string) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "debug":
		return slog.LevelDebug, ""
	case "info":
		return slog.LevelInfo, ""
	case "warn", "warning":
		return slog.LevelWarn, ""
	case "error":
		return slog.LevelError, ""
	}
	return 0, fmt.Sprintf("must be debug, info, warn or error, got %q", v)
}

// envName returns the environment variable of a flag: SHARDQ_DATA_DIR for data-dir.
func envName(flag string) string {
	return "SHARDQ_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// newFlagSet returns the flags of shardq serve and where they are stored.
func newFlagSet() (*flag.FlagSet, map[string]*string) {
	flags := flag.NewFlagSet("shardq serve", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	values := map[string]*string{
		"config": flags.String("config", "", "the YAML config file"),
	}
	for _, s := range settings {
		values[s.flag] = flags.String(s.flag, "", s.usage)
	}
	return flags, values
}

const serveUsage = `usage: shardq serve [flags]

Runs a node. With no flags, no config file and no environment it is a
working single node. A value comes from, first that applies: its flag, the
config file, its environment variable, the default. Settings without a
flag are set in the config file (see the README).

flags:
`

// Usage writes the help of shardq serve to w: every flag with its default
// and its environment variable.
func Usage(w io.Writer) {
	var b strings.Builder
	b.WriteString(serveUsage)
	rows := []setting{{flag: "config", value: "FILE", usage: "the YAML config file", def: "none"}}
	for _, s := range append(rows, settings...) {
		fmt.Fprintf(&b, "  --%s %s\n", s.flag, s.value)
		fmt.Fprintf(&b, "        %s\n", s.usage)
		fmt.Fprintf(&b, "        default %s; env %s\n", s.def, envName(s.flag))
	}
	_, _ = io.WriteString(w, b.String())
}

// Load returns the configuration of `shardq serve` run with args, the
// arguments after "serve", and the environment variables getenv returns
// (os.Getenv; nil reads none). An environment variable set to "" counts as
// unset.
//
// A value comes from, first that applies: its flag, the config file, its
// SHARDQ_ environment variable, the built-in default. The config file is
// the one --config names or else SHARDQ_CONFIG; there is none when both
// are empty.
//
// The returned configuration is valid. Otherwise Load returns a nil
// configuration and an *Error, or several joined, each naming the setting
// and what is wrong. For -h or --help it returns flag.ErrHelp: print Usage.
func Load(args []string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	flags, values := newFlagSet()
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, flagError(err)
	}
	if flags.NArg() > 0 {
		return nil, &Error{Reason: fmt.Sprintf("unexpected argument %q; shardq serve takes only flags", flags.Arg(0))}
	}
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })

	c := Default()
	c.origin = map[string]origin{}
	var errs []error
	// unread are the settings whose value could not be read: they keep
	// the value below and Validate says nothing more of them.
	unread := map[string]bool{}

	var envErrs []*Error
	for _, s := range settings {
		env := envName(s.flag)
		if v := getenv(env); v != "" {
			c.origin[s.path] = origin{source: env}
			if reason := s.set(c, v); reason != "" {
				envErrs = append(envErrs, &Error{Field: s.path, Source: env, Reason: reason})
			}
		}
	}

	file, source := getenv(envName("config")), envName("config")
	if set["config"] {
		file, source = *values["config"], "--config"
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			reason := err
			if pe, ok := errors.AsType[*fs.PathError](err); ok {
				reason = pe.Err
			}
			return nil, &Error{File: file, Source: source, Reason: "cannot read the config file: " + reason.Error(), Err: err}
		}
		d := c.decodeFile(file, data)
		errs = append(errs, d.errs...)
		for path := range d.unread {
			unread[path] = true
		}
	}

	for _, s := range settings {
		if set[s.flag] {
			c.origin[s.path] = origin{source: "--" + s.flag}
			if reason := s.set(c, *values[s.flag]); reason != "" {
				errs = append(errs, &Error{Field: s.path, Source: "--" + s.flag, Reason: reason})
				unread[s.path] = true
			}
		}
	}
	// An invalid environment value counts only when nothing overrides it.
	for _, e := range envErrs {
		if c.origin[e.Field].source == e.Source {
			errs = append(errs, e)
			unread[e.Field] = true
		}
	}

	for _, err := range flatten(c.Validate()) {
		if e, ok := err.(*Error); !ok || !unread[e.Field] {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// The file's errors in the order of its lines, then the others.
		slices.SortStableFunc(errs, func(a, b error) int {
			return cmp.Compare(errorLine(a), errorLine(b))
		})
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// errorLine returns the line of a config file error, or a line after any
// file's end for the others.
func errorLine(err error) int {
	if e, ok := err.(*Error); ok && e.File != "" && e.Line > 0 {
		return e.Line
	}
	return math.MaxInt
}

// flatten returns the errors err joins, however deep, or err alone.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

// flagError rewords an error of the flag package so that it names the
// flag as users write it.
func flagError(err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		known := []string{"--config"}
		for _, s := range settings {
			known = append(known, "--"+s.flag)
		}
		return &Error{Field: "--" + name, Reason: "unknown flag (known: " + strings.Join(known, ", ") + ")", Err: err}
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return &Error{Field: "--" + name, Reason: "needs a value", Err: err}
	}
	return &Error{Reason: msg, Err: err}
}
