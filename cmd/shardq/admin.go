package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// adminOptions are the flags of the admin commands; each command registers
// only its own.
type adminOptions struct {
	server, token, cacert string
	json                  bool
	partition             int
	from                  string
	limit                 int
	dlq                   bool
	ids                   stringList
}

// adminCall is one run of an admin command.
type adminCall struct {
	c    *adminClient
	out  *printer
	pos  []string // the arguments
	opts *adminOptions
}

// q returns argument i, escaped for a URL path.
func (a *adminCall) q(i int) string { return url.PathEscape(a.pos[i]) }

// dlqPath returns "/dlq" with --dlq, else "".
func (a *adminCall) dlqPath() string {
	if a.opts.dlq {
		return "/dlq"
	}
	return ""
}

// adminSpec is one admin command.
type adminSpec struct {
	name  string                                  // "queue peek"
	args  string                                  // its arguments, for the usage
	nargs int                                     // how many; -1: one or more
	short string                                  // what it does, in a line
	about string                                  // what it does, in full
	flags func(fs *flag.FlagSet, o *adminOptions) // its own flags, beside --server, --token and --json
	run   func(ctx context.Context, a *adminCall) error
}

func dlqFlag(what string) func(*flag.FlagSet, *adminOptions) {
	return func(fs *flag.FlagSet, o *adminOptions) {
		fs.BoolVar(&o.dlq, "dlq", false, what+" of the queue's dead-letter queue")
	}
}

var adminCommands = []adminSpec{
	{name: "queues", short: "list the queues with their figures", about: "Lists the node's queues with their figures: partitions, depth, groups,\nconsumers, lag, dead letters, totals.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/queues", nil, a.out, printQueues)
		}},
	{name: "queue show", args: "QUEUE", nargs: 1, short: "one queue: settings, partitions, groups, totals",
		about: "Shows one queue: its settings, partitions, groups per partition and totals,\nand its dead-letter queue's.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/queues/"+a.q(0), nil, a.out, printQueue)
		}},
	{name: "queue peek", args: "QUEUE", nargs: 1, short: "messages, without delivering or settling them",
		about: "Prints messages of a queue without delivering or settling them: the oldest\nof each partition in turn, or those of one partition from an offset on.",
		flags: func(fs *flag.FlagSet, o *adminOptions) {
			fs.IntVar(&o.partition, "partition", -1, "only this `PARTITION` (default every partition)")
			fs.StringVar(&o.from, "from", "", "from this `OFFSET` of --partition on (default its oldest)")
			fs.IntVar(&o.limit, "limit", 10, "at most `N` messages, 1 to 1000")
			dlqFlag("the messages")(fs, o)
		},
		run: func(ctx context.Context, a *adminCall) error {
			v := url.Values{"limit": {strconv.Itoa(a.opts.limit)}}
			if a.opts.partition >= 0 {
				v.Set("partition", strconv.Itoa(a.opts.partition))
			}
			if a.opts.from != "" {
				v.Set("from", a.opts.from)
			}
			return call(ctx, a.c, "GET", "/api/v1/queues/"+a.q(0)+a.dlqPath()+"/messages?"+v.Encode(), nil, a.out, printMessages)
		}},
	{name: "queue purge", args: "QUEUE", nargs: 1, short: "delete every message of the queue",
		about: "Deletes every message of a queue, for every group. Needs the token when\nthe node has one.",
		flags: dlqFlag("every message"),
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "POST", "/api/v1/queues/"+a.q(0)+a.dlqPath()+"/purge", nil, a.out, func(w io.Writer, r broker.PurgeResult) {
				fmt.Fprintf(w, "purged %d messages from %s\n", r.Purged, r.Queue)
			})
		}},
	{name: "queue declare", args: "QUEUE [KEY=VALUE ...]", nargs: -1, short: "create a queue or change its settings",
		about: "Creates a queue or changes its settings, named as in the config file:\npartitions=16 ack_timeout=10s. Kept across restarts, over the config\nfile's. Needs the token when the node has one.",
		run: func(ctx context.Context, a *adminCall) error {
			settings := map[string]any{}
			for _, kv := range a.pos[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageErr{fmt.Sprintf("want KEY=VALUE, got %q", kv)}
				}
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					settings[k] = n
				} else {
					settings[k] = v
				}
			}
			return call(ctx, a.c, "PUT", "/api/v1/queues/"+a.q(0), settings, a.out, printQueue)
		}},
	{name: "queue delete", args: "QUEUE", nargs: 1, short: "delete a queue with its groups and its dead-letter queue",
		about: "Deletes a queue with every message, its consumer groups and its dead-letter\nqueue; its consumers receive nothing more. Durable when it returns. A\npublish to the name later creates the queue anew, empty; a queue declared\nin the config file is back, empty, at the next start. Needs the token when\nthe node has one.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "DELETE", "/api/v1/queues/"+a.q(0), nil, a.out, func(w io.Writer, r broker.QueueDeleted) {
				fmt.Fprintf(w, "deleted queue %s with %d messages and %d dead letters\n", r.Queue, r.Messages, r.DeadLetters)
			})
		}},
	{name: "group delete", args: "QUEUE GROUP", nargs: 2, short: "delete a consumer group with no consumers",
		about: "Deletes a consumer group that has no consumer connected, with its\nposition. Needs the token when the node has one.",
		flags: dlqFlag("a group"),
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "DELETE", "/api/v1/queues/"+a.q(0)+a.dlqPath()+"/groups/"+a.q(1), nil, a.out, func(w io.Writer, r broker.GroupDeleted) {
				fmt.Fprintf(w, "deleted group %s of %s\n", r.Group, r.Queue)
			})
		}},
	{name: "dlq replay", args: "QUEUE", nargs: 1, short: "publish dead letters into the queue again",
		about: "Publishes dead letters into their queue again: the ones --id names, or all.\nNeeds the token when the node has one.",
		flags: func(fs *flag.FlagSet, o *adminOptions) {
			fs.Var(&o.ids, "id", "the dead letter's `MSGID` in the dead-letter queue; repeatable, or comma-separated")
		},
		run: func(ctx context.Context, a *adminCall) error {
			var req broker.ReplayRequest
			if len(a.opts.ids) > 0 {
				req.IDs = (*[]string)(&a.opts.ids)
			}
			return call(ctx, a.c, "POST", "/api/v1/queues/"+a.q(0)+"/dlq/replay", req, a.out, printReplay)
		}},
	{name: "cluster status", short: "the nodes and the owner of each partition",
		about: "Shows the cluster as the node asked sees it: each node with its state (up,\nleaving, down), addresses and partitions owned, then each partition of\nevery queue with its owner, epoch, replicas and in-sync replicas. Any node\nanswers; a single node shows itself owning every partition.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/cluster", nil, a.out, printCluster)
		}},
}

// adminAliases are other names users reach for.
var adminAliases = map[string]string{"queue list": "queues", "queue ls": "queues"}

// serverURL turns --server into the node's base URL: an address without
// a scheme (127.0.0.1:8990) is taken as http.
func serverURL(s string) (string, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	s = strings.TrimRight(s, "/")
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("--server %q: want the node's HTTP address, like %s or 127.0.0.1:8990 (http.listen in its config)", s, defaultServer)
	}
	return s, nil
}

// unreachable says what a failed call to server most likely means, and
// what to do about it.
func unreachable(server string, err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, io.EOF) || strings.Contains(msg, "malformed HTTP") || strings.Contains(msg, "connection reset"):
		return fmt.Errorf("%s answered, but not with HTTP: is it the node's MQTT port? The admin API is on its HTTP address (http.listen, default %s); pass that as --server", server, config.DefaultHTTP)
	case strings.Contains(msg, "connection refused"):
		return fmt.Errorf("nothing listens at %s: is the node running, and is this its HTTP address (http.listen, default %s)? Pass it as --server or SHARDQ_SERVER", server, config.DefaultHTTP)
	case strings.Contains(msg, "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%s speaks plain HTTP: use http:// in --server", server)
	}
	return fmt.Errorf("calling the node at %s: %w", server, err)
}

// usageErr is a mistake in a command's arguments found while running it.
type usageErr struct{ msg string }

func (e usageErr) Error() string { return e.msg }

const defaultServer = "http://" + config.DefaultHTTP

// adminCommand runs the admin commands: args[0] is queues, queue, group,
// dlq or cluster. It returns 0 on success, 1 when the call failed and 2
// for bad usage.
func adminCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	name := args[0]
	rest := args[1:]
	if name != "queues" {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") || rest[0] == "help" {
			return groupUsage(name, rest, stdout, stderr)
		}
		name += " " + rest[0]
		rest = rest[1:]
	}
	if alias, ok := adminAliases[name]; ok {
		name = alias
	}
	i := slices.IndexFunc(adminCommands, func(s adminSpec) bool { return s.name == name })
	if i < 0 {
		fmt.Fprintf(stderr, "shardq %s: unknown command\n\n", name)
		writeGroupUsage(stderr, args[0])
		return 2
	}
	spec := adminCommands[i]
	head := fmt.Sprintf("usage: shardq %s", spec.name)
	if spec.args != "" {
		head += " " + spec.args
	}
	head += " [flags]\n\n" + spec.about + "\n"
	c := newCommand(spec.name, head)
	o := &adminOptions{}
	if spec.flags != nil {
		spec.flags(c.flags, o)
	}
	c.flags.StringVar(&o.server, "server", defaultServer, "the node's HTTP `URL`")
	c.flags.StringVar(&o.token, "token", "", "the node's http.admin_token, sent as a bearer `TOKEN` (every call needs it when the node has one)")
	c.flags.BoolVar(&o.json, "json", false, "print the API's JSON instead of tables")
	c.flags.StringVar(&o.cacert, "cacert", "", "a PEM `FILE` of the CAs that signed an https server's certificate (default: the system's)")
	c.env["server"], c.env["token"], c.env["cacert"] = "SHARDQ_SERVER", "SHARDQ_TOKEN", "SHARDQ_CACERT"
	pos, err := c.parse(rest, getenv)
	if errors.Is(err, flag.ErrHelp) {
		c.usage(stdout)
		return 0
	}
	switch {
	case err != nil:
		return c.fail(stderr, "%v", err)
	case spec.nargs >= 0 && len(pos) != spec.nargs:
		return c.fail(stderr, "want %d argument(s) (%s), got %d", spec.nargs, spec.args, len(pos))
	case spec.nargs < 0 && len(pos) < 1:
		return c.fail(stderr, "want a queue name")
	}
	server, err := serverURL(o.server)
	if err != nil {
		return c.fail(stderr, "%v", err)
	}
	hc, err := httpClient(o.cacert, 5*time.Minute)
	if err != nil {
		return c.fail(stderr, "%v", err)
	}
	a := &adminCall{
		c:    &adminClient{server: server, token: o.token, http: hc},
		out:  &printer{w: stdout, json: o.json},
		pos:  pos,
		opts: o,
	}
	if err := spec.run(ctx, a); err != nil {
		if ue, ok := err.(usageErr); ok {
			return c.fail(stderr, "%s", ue.msg)
		}
		fmt.Fprintf(stderr, "shardq %s: %v\n", spec.name, err)
		return 1
	}
	return 0
}

// groupUsage answers "shardq queue" (or group, dlq) with no subcommand,
// with --help or with help: the list of its subcommands.
func groupUsage(group string, rest []string, stdout, stderr io.Writer) int {
	if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help" || rest[0] == "help") {
		writeGroupUsage(stdout, group)
		return 0
	}
	if len(rest) == 0 {
		fmt.Fprintf(stderr, "shardq %s: want a subcommand\n\n", group)
	} else {
		fmt.Fprintf(stderr, "shardq %s: want a subcommand before the flags, got %q\n\n", group, rest[0])
	}
	writeGroupUsage(stderr, group)
	return 2
}

// writeGroupUsage lists the subcommands of group (queue, group, dlq,
// cluster).
func writeGroupUsage(w io.Writer, group string) {
	fmt.Fprintf(w, "usage: shardq %s <subcommand> [arguments] [flags]\n\nsubcommands:\n", group)
	t := table(w)
	for _, s := range adminCommands {
		if sub, ok := strings.CutPrefix(s.name, group+" "); ok {
			fmt.Fprintf(t, "  %s %s\t%s\n", sub, s.args, s.short)
		}
	}
	if group == "cluster" {
		fmt.Fprintf(t, "  dev [--nodes N] [--dir DIR]\t%s\n", "run an embedded etcd and N nodes in this process, to try a cluster")
	}
	t.Flush()
	fmt.Fprintf(w, "\nRun \"shardq %s <subcommand> --help\" for its flags.\n", group)
}

// stringList is a repeatable flag; a value may also hold several, comma-separated.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			*s = append(*s, x)
		}
	}
	return nil
}

// adminClient calls a node's admin API.
type adminClient struct {
	server, token string
	http          *http.Client
}

// printer writes an answer as a table, or as the API's JSON.
type printer struct {
	w    io.Writer
	json bool
}

// call sends the request and prints its answer, decoded as T, with table
// (or as the API's JSON). An error answer becomes the error returned.
func call[T any](ctx context.Context, c *adminClient, method, path string, body any, out *printer, table func(io.Writer, T)) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return unreachable(c.server, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		if c.token == "" {
			return errors.New("the node wants its admin token: pass --token TOKEN or set SHARDQ_TOKEN (the node's http.admin_token)")
		}
		return errors.New("the node refused the token: --token (or SHARDQ_TOKEN) must be the node's http.admin_token")
	}
	if resp.StatusCode >= 300 {
		var e broker.Error
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			return fmt.Errorf("%s %s: HTTP %s", method, path, resp.Status)
		}
		if e.Replay != nil && out.json {
			_, _ = out.w.Write(data)
		} else if e.Replay != nil {
			printReplay(out.w, *e.Replay)
		}
		return fmt.Errorf("%s (HTTP %d)", e.Error, resp.StatusCode)
	}
	if out.json {
		_, err := out.w.Write(data)
		return err
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	table(out.w, v)
	return nil
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func printQueues(w io.Writer, l broker.QueueList) {
	t := table(w)
	fmt.Fprintln(t, "QUEUE\tSOURCE\tPARTITIONS\tDEPTH\tGROUPS\tCONSUMERS\tLAG\tDLQ\tENQUEUED\tACKED")
	for _, q := range l.Queues {
		consumers, lag := 0, uint64(0)
		for _, g := range q.Groups {
			consumers += g.Consumers
			lag = max(lag, g.Lag)
		}
		var dlq uint64
		if q.DLQ != nil {
			dlq = q.DLQ.Depth
		}
		fmt.Fprintf(t, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", q.Name, q.Source, q.Settings.Partitions, q.Depth,
			len(q.Groups), consumers, lag, dlq, q.Counts.Enqueued, q.Counts.Acked)
	}
	t.Flush()
	if len(l.Queues) == 0 {
		fmt.Fprintf(w, "no queues on %s\n", l.Node)
	}
	printMissing(w, l.NodesMissing)
}

// printMissing names the nodes of a cluster whose figures are missing.
func printMissing(w io.Writer, missing []string) {
	if len(missing) > 0 {
		fmt.Fprintf(w, "\nfigures missing from %d nodes: %s\n", len(missing), strings.Join(missing, "; "))
	}
}

func printQueue(w io.Writer, q broker.QueueView) {
	s := q.Settings
	fmt.Fprintf(w, "queue %s on %s (settings: %s)\n", q.Name, q.Node, q.Source)
	fmt.Fprintf(w, "  partitions=%d ordering=%s durability=%s ack_timeout=%s max_deliveries=%d prefetch=%d\n",
		s.Partitions, s.Ordering, s.Durability, time.Duration(s.AckTimeout), s.MaxDeliveries, s.Prefetch)
	fmt.Fprintf(w, "  max_age=%s max_messages=%d max_bytes=%d overflow=%s retry_backoff=%s..%s dedup_window=%s\n",
		time.Duration(s.MaxAge), s.MaxMessages, s.MaxBytes, s.Overflow, time.Duration(s.RetryBackoff),
		time.Duration(s.RetryBackoffMax), time.Duration(s.DedupWindow))
	printFigures(w, q, true)
	if q.DLQ != nil {
		fmt.Fprintf(w, "\ndead-letter queue %s\n", q.DLQ.Name)
		printFigures(w, *q.DLQ, false)
	}
	printMissing(w, q.NodesMissing)
}

// printFigures prints a queue's figures; the partitions that hold nothing
// only with empty.
func printFigures(w io.Writer, q broker.QueueView, empty bool) {
	c := q.Counts
	fmt.Fprintf(w, "  depth %d; since start: enqueued %d, delivered %d (redelivered %d), acked %d, nacked %d, rejected %d, dead-lettered %d, expired %d, leases lost %d, deduplicated %d, dropped %d\n",
		q.Depth, c.Enqueued, c.Delivered, c.Redelivered, c.Acked, c.Nacked, c.Rejected, c.DeadLettered, c.Expired, c.LeasesLost, c.Deduplicated, c.Dropped)
	if q.Depth > 0 || empty {
		fmt.Fprintln(w)
		t := table(w)
		fmt.Fprintln(t, "PARTITION\tSHARD\tFIRST\tNEXT\tDEPTH")
		for _, p := range q.Partitions {
			if p.Depth > 0 || empty {
				fmt.Fprintf(t, "%d\t%d\t%d\t%d\t%d\n", p.Partition, p.Shard, p.First, p.Next, p.Depth)
			}
		}
		t.Flush()
	}
	if len(q.Groups) == 0 {
		fmt.Fprintln(w, "\nno consumer groups")
		return
	}
	fmt.Fprintln(w)
	t := table(w)
	fmt.Fprintln(t, "GROUP\tPARTITION\tCONSUMERS\tFLOOR\tLAG\tLEASED\tOLDEST UNSETTLED")
	for _, g := range q.Groups {
		fmt.Fprintf(t, "%s\tall\t%d\t\t%d\t%d\t%s\n", g.Name, g.Consumers, g.Lag, g.Leased, age(g.OldestUnsettledAge))
		for _, p := range g.Partitions {
			if p.Lag == 0 && p.Leased == 0 {
				continue
			}
			fmt.Fprintf(t, "\t%d\t\t%d\t%d\t%d\t%s\n", p.Partition, p.Floor, p.Lag, p.Leased, age(p.OldestUnsettledAge))
		}
	}
	t.Flush()
}

func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return time.Duration(seconds * float64(time.Second)).Round(time.Millisecond).String()
}

func printMessages(w io.Writer, l broker.MessageList) {
	defer printMissing(w, l.NodesMissing)
	if len(l.Messages) == 0 {
		fmt.Fprintf(w, "no messages in %s\n", l.Queue)
		return
	}
	t := table(w)
	fmt.Fprintln(t, "MSG-ID\tENQUEUED\tKEY\tTOPIC\tDEAD-LETTER\tPAYLOAD")
	for _, m := range l.Messages {
		dl := "-"
		if m.DeadLetter != nil {
			dl = fmt.Sprintf("%s %s (%s, %d deliveries)", m.DeadLetter.Reason, m.DeadLetter.OriginalID, m.DeadLetter.Group, m.DeadLetter.Deliveries)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.EnqueuedAt.Local().Format(time.DateTime), m.Key, m.Topic, dl, payload(m.Payload))
	}
	t.Flush()
}

// payload shows a payload on one line: quoted text, or its size when binary.
func payload(p []byte) string {
	const max = 60
	printable := utf8.Valid(p) && !bytes.ContainsFunc(p, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' })
	if !printable {
		return fmt.Sprintf("(%d bytes, binary; --json has it in base64)", len(p))
	}
	s := string(p)
	if utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max]) + "…"
	}
	return strconv.Quote(s)
}

func printReplay(w io.Writer, r broker.ReplayResult) {
	fmt.Fprintf(w, "replayed %d dead letters into %s\n", r.Replayed, r.Queue)
	if len(r.Messages) == 0 {
		return
	}
	const shown = 20
	t := table(w)
	fmt.Fprintln(t, "DLQ-MSG-ID\tMSG-ID")
	for _, m := range r.Messages[:min(len(r.Messages), shown)] {
		fmt.Fprintf(t, "%s\t%s\n", m.DLQID, m.ID)
	}
	t.Flush()
	if len(r.Messages) > shown {
		fmt.Fprintf(w, "... and %d more (--json lists them all)\n", len(r.Messages)-shown)
	}
}
