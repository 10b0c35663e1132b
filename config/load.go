package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// setting is a value that a flag, its environment variable and the config
// file can all set.
type setting struct {
	flag  string // the flag's name, without dashes
	path  string // the YAML path
	usage string // the flag's usage; the name of its value in backquotes
	def   string // the default, for the usage text
	field func(*Config) *string
}

var settings = []setting{
	{"data-dir", "data_dir", "`DIR` holding the queues' data", "./data",
		func(c *Config) *string { return &c.DataDir }},
	{"mqtt", "listen.mqtt", "`ADDR` (host:port) to listen on for MQTT", ":1883",
		func(c *Config) *string { return &c.MQTT }},
	{"ws", "listen.ws", "`ADDR` to listen on for MQTT over WebSocket, empty disables", ":8083",
		func(c *Config) *string { return &c.WS }},
	{"http", "listen.http", "`ADDR` to listen on for HTTP (metrics, health, admin API), empty disables", ":9090",
		func(c *Config) *string { return &c.HTTP }},
	{"node-id", "node_id", "`ID` of this node, of A-Z a-z 0-9 _ . -", "the host name",
		func(c *Config) *string { return &c.NodeID }},
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
		"config": flags.String("config", "", "YAML config `FILE` (env "+envName("config")+")"),
	}
	for _, s := range settings {
		values[s.flag] = flags.String(s.flag, "", s.usage+" (default "+s.def+"; env "+envName(s.flag)+")")
	}
	return flags, values
}

// Usage writes the flags of shardq serve to w.
func Usage(w io.Writer) {
	flags, _ := newFlagSet()
	flags.SetOutput(w)
	flags.PrintDefaults()
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

	for _, s := range settings {
		env := envName(s.flag)
		if v := getenv(env); v != "" {
			*s.field(c) = v
			c.origin[s.path] = origin{source: env}
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
		if err := c.decodeFile(file, data); err != nil {
			return nil, err
		}
	}

	for _, s := range settings {
		if set[s.flag] {
			*s.field(c) = *values[s.flag]
			c.origin[s.path] = origin{source: "--" + s.flag}
		}
	}

	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
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
