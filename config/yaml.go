package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/queue"
)

// The config file is decoded by walking yaml.v3's node tree rather than
// with yaml.Unmarshal, so that every error, including an unknown key or a
// duration that does not parse, names the setting's full YAML path and its
// line, and so that each declared queue is decoded on top of the resolved
// defaults whatever the order of the keys in the file.

// origin is where Load found a value: a file and line, or a flag or
// environment variable.
type origin struct {
	file   string
	line   int
	source string
}

// decoder decodes one config file into c, over the values c already holds.
type decoder struct {
	file string
	c    *Config
	// errs are the errors found so far: a setting that cannot be read is
	// skipped, and the rest of the file is read on.
	errs []error
	// unread are the YAML paths of the values that could not be read.
	unread map[string]bool
}

// field is a key of a YAML mapping and how to decode its value.
type field struct {
	key    string
	decode func(n *yaml.Node, path string) error
	// sub are the keys under it, for Keys: a section's, or those of each
	// rule of a list (list), or of each entry of a map (named).
	sub         []field
	list, named bool
}

// sec is the field of section key, holding fields.
func (d *decoder) sec(key string, fields []field) field {
	return field{key: key, decode: d.section(fields), sub: fields}
}

// Keys lists every key a config file may hold, as dotted paths: under a
// list of rules as KEY[].FIELD, under a map of queues as
// queues.declared.NAME.FIELD. docs/CONFIG.md documents each.
func Keys() []string {
	d := &decoder{c: &Config{}, unread: map[string]bool{}}
	var out []string
	var walk func(prefix string, fs []field)
	walk = func(prefix string, fs []field) {
		for _, f := range fs {
			k := join(prefix, f.key)
			switch {
			case f.list:
				out = append(out, k)
				walk(k+"[]", f.sub)
			case f.named:
				walk(k+".NAME", f.sub)
			case f.sub != nil:
				walk(k, f.sub)
			default:
				out = append(out, k)
			}
		}
	}
	walk("", d.top())
	return out
}

// decodeFile decodes the YAML config file data, read from file, into c.
// Only the settings the file holds change. The decoder it returns holds
// every error found: a setting that cannot be read keeps its value, the
// others are read all the same. A file that is not YAML is one error.
func (c *Config) decodeFile(file string, data []byte) *decoder {
	if c.origin == nil {
		c.origin = map[string]origin{}
	}
	d := &decoder{file: file, c: c, unread: map[string]bool{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if !errors.Is(err, io.EOF) { // an empty file changes nothing
			d.fail(d.syntaxError(err))
		}
		return d
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			d.fail(d.syntaxError(err))
		} else {
			d.fail(d.errorf(&next, "", "holds more than one YAML document"))
		}
		return d
	}
	if len(doc.Content) > 0 {
		d.fail(d.section(d.top())(doc.Content[0], ""))
	}
	return d
}

// fail records err, if not nil.
func (d *decoder) fail(err error) {
	if err != nil {
		d.errs = append(d.errs, err)
	}
}

// top lists the top-level keys of the file.
func (d *decoder) top() []field {
	c := d.c
	return []field{
		{key: "node_id", decode: d.leaf(&c.NodeID)},
		{key: "data_dir", decode: d.leaf(&c.DataDir)},
		d.sec("listen", []field{
			{key: "mqtt", decode: d.leaf(&c.MQTT)},
			{key: "mqtts", decode: d.leaf(&c.MQTTS)},
			{key: "ws", decode: d.leaf(&c.WS)},
			{key: "wss", decode: d.leaf(&c.WSS)},
			{key: "http", decode: d.leaf(&c.HTTP)},
		}),
		{key: "log_level", decode: d.logLevel},
		d.sec("queues", []field{
			// defaults before declared: declared queues inherit them.
			d.sec("defaults", append(d.tagged(&c.Queues.Defaults), field{key: "max_delay", decode: d.leaf(&c.Queues.MaxDelay)})),
			{key: "auto_create", decode: d.leaf(&c.Queues.AutoCreate)},
			{key: "declared", decode: d.declared, named: true,
				sub: append(d.tagged(&queue.Options{}), field{key: "max_delay", decode: d.leaf(new(time.Duration))})},
		}),
		d.sec("mqtt", d.tagged(&c.Protocol)),
		d.sec("storage", d.tagged(&c.Storage)),
		d.sec("http", d.tagged(&c.Admin)),
		d.sec("auth", []field{
			{key: "users_file", decode: d.leaf(&c.Auth.UsersFile)},
			{key: "acl", decode: d.acl, list: true, sub: d.tagged(&auth.Rule{})},
		}),
		d.sec("limits", d.tagged(&c.Limits)),
		{key: "tenants", decode: d.tenants, named: true, sub: d.tagged(&Tenant{})},
		d.sec("cluster", []field{
			d.sec("etcd", d.tagged(&c.Cluster.Etcd)),
			d.sec("tls", d.tagged(&c.Cluster.TLS)),
			{key: "addr", decode: d.leaf(&c.Cluster.Addr)},
			{key: "advertise", decode: d.leaf(&c.Cluster.Advertise)},
			{key: "token", decode: d.leaf(&c.Cluster.Token)},
			{key: "allow_insecure", decode: d.leaf(&c.Cluster.AllowInsecure)},
			{key: "placement", decode: d.placement, list: true, sub: d.tagged(&Placement{})},
			{key: "lease_ttl", decode: d.leaf(&c.Cluster.LeaseTTL)},
			{key: "raft_log_keep", decode: d.leaf(&c.Cluster.RaftLogKeep)},
			{key: "replace_after", decode: d.leaf(&c.Cluster.ReplaceAfter)},
			{key: "max_moves", decode: d.leaf(&c.Cluster.MaxMoves)},
		}),
	}
}

// acl decodes auth.acl: a list of rules, each a mapping of user, action,
// pattern, group and permission. The rules are checked by Validate.
func (d *decoder) acl(n *yaml.Node, path string) error {
	n = resolve(n)
	if isNull(n) {
		d.c.Auth.ACL = nil
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return d.errorf(n, path, "must be a list of rules ({user, action, pattern, permission}), got %s", kindName(n))
	}
	rules := make([]auth.Rule, 0, len(n.Content))
	for i, e := range n.Content {
		rpath := fmt.Sprintf("%s[%d]", path, i)
		d.c.origin[rpath] = origin{file: d.file, line: resolve(e).Line}
		var r auth.Rule
		d.fail(d.section(d.tagged(&r))(e, rpath))
		rules = append(rules, r)
	}
	d.c.Auth.ACL = rules
	return nil
}

// placement decodes cluster.placement: a list of rules, each a mapping of
// queues and nodes. The rules are checked by Validate.
func (d *decoder) placement(n *yaml.Node, path string) error {
	n = resolve(n)
	if isNull(n) {
		d.c.Cluster.Placement = nil
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return d.errorf(n, path, "must be a list of rules ({queues, nodes}), got %s", kindName(n))
	}
	rules := make([]Placement, 0, len(n.Content))
	for i, e := range n.Content {
		rpath := fmt.Sprintf("%s[%d]", path, i)
		d.c.origin[rpath] = origin{file: d.file, line: resolve(e).Line}
		var r Placement
		d.fail(d.section(d.tagged(&r))(e, rpath))
		rules = append(rules, r)
	}
	d.c.Cluster.Placement = rules
	return nil
}

// declared decodes queues.declared: each queue starts from the defaults
// and takes the fields its entry sets.
func (d *decoder) declared(n *yaml.Node, path string) error {
	pairs, err := d.pairs(n, path)
	if err != nil {
		return err
	}
	if d.c.Queues.Declared == nil {
		d.c.Queues.Declared = map[string]queue.Options{}
	}
	for _, p := range pairs {
		qpath := join(path, p.key.Value)
		d.c.origin[qpath] = origin{file: d.file, line: p.key.Line}
		o := d.c.Queues.Defaults
		maxDelay := time.Duration(-1)
		// A queue with a setting that cannot be read is declared with the
		// others all the same, so that Validate checks them too.
		d.fail(d.section(append(d.tagged(&o), field{key: "max_delay", decode: d.leaf(&maxDelay)}))(p.value, qpath))
		d.c.Queues.Declared[p.key.Value] = o
		if _, set := d.c.origin[qpath+".max_delay"]; set {
			if d.c.Queues.DeclaredMaxDelay == nil {
				d.c.Queues.DeclaredMaxDelay = map[string]time.Duration{}
			}
			d.c.Queues.DeclaredMaxDelay[p.key.Value] = maxDelay
		}
	}
	return nil
}

// section returns a decoder of a mapping holding the keys fields lists.
// The keys are decoded in the order of fields, not of the file. Each
// error is recorded and the other keys are decoded all the same.
func (d *decoder) section(fields []field) func(n *yaml.Node, path string) error {
	return func(n *yaml.Node, path string) error {
		pairs, err := d.pairs(n, path)
		if err != nil {
			return err
		}
		byKey := make(map[string]pair, len(pairs))
		for _, p := range pairs {
			if !hasKey(fields, p.key.Value) {
				known := make([]string, len(fields))
				for i, f := range fields {
					known[i] = f.key
				}
				d.fail(d.errorf(p.key, join(path, p.key.Value), "unknown setting (known here: %s)", strings.Join(known, ", ")))
				continue
			}
			byKey[p.key.Value] = p
		}
		for _, f := range fields {
			p, ok := byKey[f.key]
			if !ok {
				continue
			}
			fpath := join(path, f.key)
			d.c.origin[fpath] = origin{file: d.file, line: p.key.Line}
			if err := f.decode(p.value, fpath); err != nil {
				d.fail(err)
				d.unread[fpath] = true
			}
		}
		return nil
	}
}

type pair struct{ key, value *yaml.Node }

// pairs returns the entries of the mapping n, checking that its keys are
// plain and unique; it records the keys that are not and leaves them out.
// A null n is an empty mapping; any other scalar or a list is an error.
func (d *decoder) pairs(n *yaml.Node, path string) ([]pair, error) {
	n = resolve(n)
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		if path == "" {
			return nil, d.errorf(n, "", "must be a mapping of settings, got %s", kindName(n))
		}
		return nil, d.errorf(n, path, "must be a mapping, got %s", kindName(n))
	}
	pairs := make([]pair, 0, len(n.Content)/2)
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(d.errorf(k, path, "keys must be plain names, got %s", kindName(k)))
			continue
		}
		if k.Tag == "!!merge" {
			d.fail(d.errorf(k, path, "merge keys (<<) are not supported"))
			continue
		}
		if line, ok := seen[k.Value]; ok {
			d.fail(d.errorf(k, join(path, k.Value), "set twice, first on line %d", line))
			continue
		}
		seen[k.Value] = k.Line
		pairs = append(pairs, pair{k, v})
	}
	return pairs, nil
}

// tagged lists the fields of the struct *ptr by their yaml tags.
func (d *decoder) tagged(ptr any) []field {
	v := reflect.ValueOf(ptr).Elem()
	t := v.Type()
	var fields []field
	for i := 0; i < t.NumField(); i++ {
		key, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if key == "" || key == "-" || !t.Field(i).IsExported() {
			continue
		}
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && !isLeaf(fv) {
			fields = append(fields, d.sec(key, d.tagged(fv.Addr().Interface())))
			continue
		}
		fields = append(fields, field{key: key, decode: d.leaf(fv.Addr().Interface())})
	}
	return fields
}

var (
	durationType        = reflect.TypeFor[time.Duration]()
	stringsType         = reflect.TypeFor[[]string]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func isLeaf(v reflect.Value) bool {
	return v.Type() == durationType || v.Addr().Type().Implements(textUnmarshalerType)
}

// leaf returns a decoder of a scalar into *ptr: a string, bool, integer,
// time.Duration (a Go duration string such as "30s") or a type that
// implements encoding.TextUnmarshaler. A null sets the zero value.
func (d *decoder) leaf(ptr any) func(n *yaml.Node, path string) error {
	v := reflect.ValueOf(ptr).Elem()
	return func(n *yaml.Node, path string) error {
		n = resolve(n)
		want := wantName(v)
		if v.Type() == stringsType {
			if n.Kind != yaml.SequenceNode {
				return d.errorf(n, path, "must be a list of strings, got %s", kindName(n))
			}
			list := make([]string, 0, len(n.Content))
			for _, e := range n.Content {
				e = resolve(e)
				if e.Kind != yaml.ScalarNode {
					return d.errorf(e, path, "must be a list of strings, got an element that is %s", kindName(e))
				}
				list = append(list, e.Value)
			}
			v.Set(reflect.ValueOf(list))
			return nil
		}
		if n.Kind != yaml.ScalarNode {
			return d.errorf(n, path, "must be %s, got %s", want, kindName(n))
		}
		if isNull(n) {
			v.SetZero()
			return nil
		}
		if v.Type() == durationType {
			dur, err := time.ParseDuration(n.Value)
			if err != nil {
				return d.errorf(n, path, "must be %s, got %q", want, n.Value)
			}
			v.SetInt(int64(dur))
			return nil
		}
		if u, ok := ptr.(encoding.TextUnmarshaler); ok {
			if err := u.UnmarshalText([]byte(n.Value)); err != nil {
				return d.errorf(n, path, "invalid value %q: %v", n.Value, err)
			}
			return nil
		}
		switch v.Kind() {
		case reflect.String:
			v.SetString(n.Value)
		case reflect.Bool:
			var b bool
			if err := n.Decode(&b); err != nil {
				return d.errorf(n, path, "must be %s, got %q", want, n.Value)
			}
			v.SetBool(b)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			var i int64
			// Only an integer: yaml.v3 would truncate 2.5 to 2.
			if n.ShortTag() != "!!int" || n.Decode(&i) != nil {
				return d.errorf(n, path, "must be %s, got %q", want, n.Value)
			}
			if v.OverflowInt(i) {
				return d.errorf(n, path, "%d is out of range", i)
			}
			v.SetInt(i)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			var u uint64
			if n.ShortTag() != "!!int" || n.Decode(&u) != nil {
				return d.errorf(n, path, "must be %s, got %q", want, n.Value)
			}
			if v.OverflowUint(u) {
				return d.errorf(n, path, "%d is out of range", u)
			}
			v.SetUint(u)
		default:
			return d.errorf(n, path, "settings of type %s are not supported", v.Type())
		}
		return nil
	}
}

// logLevel decodes log_level.
func (d *decoder) logLevel(n *yaml.Node, path string) error {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode {
		return d.errorf(n, path, "must be debug, info, warn or error, got %s", kindName(n))
	}
	l, reason := parseLevel(n.Value)
	if reason != "" {
		return d.errorf(n, path, "%s", reason)
	}
	d.c.LogLevel = l
	return nil
}

func wantName(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return "a duration such as 500ms, 30s, 5m or 168h"
	case v.Kind() == reflect.String:
		return "a string"
	case v.Kind() == reflect.Bool:
		return "true or false"
	case v.CanInt() && v.Kind() != reflect.Uintptr:
		return "an integer"
	case v.CanUint():
		return "a non-negative integer"
	}
	return "a " + v.Type().String()
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) error {
	return &Error{File: d.file, Line: n.Line, Field: path, Reason: fmt.Sprintf(format, args...)}
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError rewords an error of the YAML parser.
func (d *decoder) syntaxError(err error) error {
	e := &Error{File: d.file, Reason: strings.TrimPrefix(err.Error(), "yaml: "), Err: err}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Reason = m[2]
	}
	e.Reason = "invalid YAML: " + e.Reason
	return e
}

// resolve follows an alias (*name) to its anchor (&name).
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

func hasKey(fields []field, key string) bool {
	for _, f := range fields {
		if f.key == key {
			return true
		}
	}
	return false
}

// join appends key to the YAML path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
