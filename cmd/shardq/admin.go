package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
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
	node, user, queue     string
	yes                   bool
	to                    string
	force                 bool
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
	name    string                                  // "queue peek"
	args    string                                  // its arguments, for the usage
	nargs   int                                     // how many; -1: one or more
	missing string                                  // the usage error when arguments are missing, if not the generic one
	short   string                                  // what it does, in a line
	about   string                                  // what it does, in full
	flags   func(fs *flag.FlagSet, o *adminOptions) // its own flags, beside --server, --token and --json
	run     func(ctx context.Context, a *adminCall) error
	// confirm, for a command that deletes what cannot be had back, is
	// what it does and the name to type to go on (see confirmed).
	confirm func(a *adminCall) (what, answer string)
}

// confirmInput is where a destructive command asks for its confirmation:
// the terminal on standard input, if it is one. Tests replace it.
var confirmInput = func() (in io.Reader, prompt io.Writer, ok bool) {
	if t := stdinTerminal(); t != nil {
		return os.Stdin, t.prompt, true
	}
	return nil, nil, false
}

// confirmed asks, on a terminal and without --yes, for the name the
// command acts on, typed again: a purge or a delete cannot be undone.
// Without a terminal (a script) it does not ask.
func confirmed(spec adminSpec, a *adminCall) (bool, error) {
	if spec.confirm == nil || a.opts.yes {
		return true, nil
	}
	in, prompt, ok := confirmInput()
	if !ok {
		return true, nil
	}
	what, answer := spec.confirm(a)
	fmt.Fprintf(prompt, "%s. This cannot be undone.\nType %s to go on (--yes skips this): ", what, answer)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || line == "") {
		return false, err
	}
	return strings.TrimSpace(line) == answer, nil
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
		confirm: func(a *adminCall) (string, string) {
			if a.opts.dlq {
				return "This deletes every dead letter of " + a.pos[0], a.pos[0]
			}
			return "This deletes every message of " + a.pos[0] + ", for every group", a.pos[0]
		},
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "POST", "/api/v1/queues/"+a.q(0)+a.dlqPath()+"/purge", nil, a.out, printPurge)
		}},
	{name: "queue declare", args: "QUEUE [KEY=VALUE ...]", nargs: -1, short: "create a queue or change its settings", missing: "want a queue name",
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
		about: "Deletes a queue with every message, its consumer groups and its dead-letter\nqueue; its consumers receive nothing more. Durable when it returns. A\npublish to the name later creates the queue anew, empty; a queue declared\nin the config file is back, empty, at the next start. In a cluster the\nqueue is deleted from every node, and a node that is down forgets it as\nit starts. Needs the token when the node has one.",
		confirm: func(a *adminCall) (string, string) {
			return "This deletes queue " + a.pos[0] + " with every message, its groups and its dead letters", a.pos[0]
		},
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "DELETE", "/api/v1/queues/"+a.q(0), nil, a.out, func(w io.Writer, r broker.QueueDeleted) {
				fmt.Fprintf(w, "deleted queue %s with %d messages and %d dead letters\n", r.Queue, r.Messages, r.DeadLetters)
				if len(r.NodesMissing) > 0 {
					fmt.Fprintf(w, "not counted (no answer): %s\n", strings.Join(r.NodesMissing, "; "))
				}
				if len(r.Pending) > 0 {
					fmt.Fprintf(w, "not yet forgotten by %s: a node down forgets the queue as it starts\n", strings.Join(r.Pending, ", "))
				}
			})
		}},
	{name: "group delete", args: "QUEUE GROUP", nargs: 2, short: "delete a consumer group with no consumers",
		about: "Deletes a consumer group that has no consumer connected, with its\nposition. Needs the token when the node has one.",
		flags: dlqFlag("a group"),
		confirm: func(a *adminCall) (string, string) {
			return "This deletes group " + a.pos[1] + " of " + a.pos[0] + " and where it stands in every partition", a.pos[1]
		},
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "DELETE", "/api/v1/queues/"+a.q(0)+a.dlqPath()+"/groups/"+a.q(1), nil, a.out, func(w io.Writer, r broker.GroupDeleted) {
				fmt.Fprintf(w, "deleted group %s of %s\n", r.Group, r.Queue)
			})
		}},
	{name: "group seek", args: "QUEUE GROUP", nargs: 2, short: "move a consumer group to another point of the queue",
		about: "Moves a consumer group: messages before the point count as settled for it,\nthe retained messages from it on are delivered again, their delivery\ncounts starting over. --to is earliest, latest, an RFC 3339 time\n(2026-11-27T08:00:00Z: the first message enqueued then or later), or\nPARTITION:OFFSET (that partition only). Refused while the group has\nconsumers connected, unless --force. Needs the token when the node has one.",
		flags: func(fs *flag.FlagSet, o *adminOptions) {
			fs.StringVar(&o.to, "to", "", "where to: earliest, latest, an RFC 3339 `TIME`, or PARTITION:OFFSET")
			fs.BoolVar(&o.force, "force", false, "take the leases of the group's consumers back rather than refuse")
		},
		confirm: func(a *adminCall) (string, string) {
			return "This moves group " + a.pos[1] + " of " + a.pos[0] + " to " + a.opts.to + ": what it settled after that point is delivered again", a.pos[1]
		},
		run: func(ctx context.Context, a *adminCall) error {
			to, err := seekTarget(a.opts.to)
			if err != nil {
				return err
			}
			req := broker.SeekRequest{To: to, Force: a.opts.force}
			return call(ctx, a.c, "POST", "/api/v1/queues/"+a.q(0)+"/groups/"+a.q(1)+"/seek", req, a.out, func(w io.Writer, r broker.SeekResult) {
				fmt.Fprintf(w, "moved group %s of %s to %s\n", r.Group, r.Queue, r.To)
				for _, p := range r.Partitions {
					fmt.Fprintf(w, "  partition %d: offset %d -> %d\n", p.Partition, p.From, p.To)
				}
			})
		}},
	{name: "dlq peek", args: "QUEUE", nargs: 1, short: "dead letters, with reason and origin (queue peek --dlq)",
		about: "Prints the dead letters of a queue without delivering or settling them,\nwith why each was dead-lettered and the message it was: the same as\nshardq queue peek QUEUE --dlq.",
		flags: func(fs *flag.FlagSet, o *adminOptions) {
			fs.IntVar(&o.limit, "limit", 10, "at most `N` dead letters, 1 to 1000")
		},
		run: func(ctx context.Context, a *adminCall) error {
			v := url.Values{"limit": {strconv.Itoa(a.opts.limit)}}
			return call(ctx, a.c, "GET", "/api/v1/queues/"+a.q(0)+"/dlq/messages?"+v.Encode(), nil, a.out, printMessages)
		}},
	{name: "dlq purge", args: "QUEUE", nargs: 1, short: "delete every dead letter of the queue (queue purge --dlq)",
		about:   "Deletes every dead letter of a queue: the same as shardq queue purge\nQUEUE --dlq. Needs the token when the node has one.",
		confirm: func(a *adminCall) (string, string) { return "This deletes every dead letter of " + a.pos[0], a.pos[0] },
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "POST", "/api/v1/queues/"+a.q(0)+"/dlq/purge", nil, a.out, printPurge)
		}},
	{name: "group list", args: "QUEUE", nargs: 1, short: "the consumer groups of a queue, with consumers, lag and leases",
		about: "Lists the consumer groups of a queue: how many consumers each has, its\nlag (messages not yet delivered to it), its leased messages and the age\nof its oldest unsettled one.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/queues/"+a.q(0), nil, a.out, printGroups)
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
	{name: "clients", short: "the connected clients, with what they subscribe to and consume",
		about: "Lists the connected clients (of every node, in a cluster): id, node, user,\nprotocol, since when, subscriptions, and for queue consumers the group,\nthe messages held against the prefetch, and the partitions claimed.",
		flags: func(fs *flag.FlagSet, o *adminOptions) {
			fs.StringVar(&o.node, "node", "", "only the clients connected to `NODE`")
			fs.StringVar(&o.user, "user", "", "only the clients of `USER`")
			fs.StringVar(&o.queue, "queue", "", "only the consumers of `QUEUE`")
			fs.IntVar(&o.limit, "limit", 1000, "at most `N` clients, 1 to 10000")
		},
		run: func(ctx context.Context, a *adminCall) error {
			v := url.Values{"limit": {strconv.Itoa(a.opts.limit)}}
			for k, x := range map[string]string{"node": a.opts.node, "user": a.opts.user} {
				if x != "" {
					v.Set(k, x)
				}
			}
			path := "/api/v1/clients?"
			if a.opts.queue != "" {
				path = "/api/v1/queues/" + url.PathEscape(a.opts.queue) + "/consumers?"
			}
			return call(ctx, a.c, "GET", path+v.Encode(), nil, a.out, printClients)
		}},
	{name: "client disconnect", args: "CLIENT", nargs: 1, short: "disconnect a client",
		missing: "want the id of the client to disconnect, as shardq clients lists it",
		about:   "Disconnects a client, wherever in the cluster it is connected (an MQTT 5\nclient is told why: DISCONNECT 0x98, administrative action). What it held\ngoes back to its groups at once; it may connect again. Needs the token when\nthe node has one.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "DELETE", "/api/v1/clients/"+a.q(0), nil, a.out, func(w io.Writer, r broker.ClientDisconnected) {
				fmt.Fprintf(w, "disconnected client %s from node %s\n", r.Client, r.Node)
			})
		}},
	{name: "cluster status", short: "the nodes and the owner and replicas of each partition",
		about: "Shows the cluster as the node asked sees it: each node with its state (up,\nleaving, draining, drained, down), addresses, and how many partitions it\nkeeps a replica of and leads; then each partition of every queue with its\nowner, epoch, replicas, in-sync replicas and learners (replicas catching up\nbefore they vote). Any node answers; a single node shows itself owning\nevery partition.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/cluster", nil, a.out, printCluster)
		}},
	{name: "cluster drain", args: "NODE", nargs: 1, short: "move every partition, replica and leadership off a node",
		missing: "want the id of the node to drain, as shardq cluster status lists it",
		about:   "Drains a node: it is given no partition, replica or leadership, and what it\nholds moves to the other nodes, a few at a time (cluster.max_moves per\nleader). Once shardq cluster status shows it drained, it holds nothing and\ncan be stopped. It stays drained, across restarts, until\nshardq cluster undrain. While fewer other nodes than a queue's replication\nfactor are left, its replicas of that queue stay. Needs the token when the\nnode has one.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "POST", "/api/v1/cluster/nodes/"+a.q(0)+"/drain", nil, a.out, func(w io.Writer, r broker.DrainView) {
				fmt.Fprintf(w, "node %s drained: its partitions move to the other nodes; watch shardq cluster status\n", r.Node)
			})
		}},
	{name: "cluster undrain", args: "NODE", nargs: 1, short: "let a drained node hold partitions again",
		missing: "want the id of the node to undrain, as shardq cluster status lists it",
		about:   "Undrains a node: it takes its share of partitions, replicas and leaderships\nagain, a few at a time. Needs the token when the node has one.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "POST", "/api/v1/cluster/nodes/"+a.q(0)+"/undrain", nil, a.out, func(w io.Writer, r broker.DrainView) {
				fmt.Fprintf(w, "node %s undrained: it takes its share of partitions again\n", r.Node)
			})
		}},
	{name: "cluster placement", short: "the placement rules: which nodes hold which queues",
		about: "Shows the cluster's placement rules in order: the first rule whose pattern\nmatches a queue's name gives the nodes its partitions live on; a queue no\nrule matches lives on any node. shardq cluster placement set and clear\nchange them.",
		run: func(ctx context.Context, a *adminCall) error {
			return call(ctx, a.c, "GET", "/api/v1/cluster/placement", nil, a.out, printPlacement)
		}},
	{name: "cluster placement set", args: "QUEUES=NODE[,NODE...] [...] | FILE", nargs: -1, short: "replace the placement rules",
		missing: "want one rule or more, like 'orders-*=a,b' (shardq cluster placement clear removes them all)",
		about:   "Replaces the cluster's placement rules with these, in order. A rule is a\nglob of queue names (path.Match: *, ?, [...]), =, and the ids of the nodes\nthe matching queues live on, comma-separated. Quote each rule, so that the\nshell leaves its * alone:\n\n  shardq cluster placement set 'orders-*=a,b' 'audit=c'\n\nor from a YAML (or JSON) file holding the rules as cluster.placement does:\n\n  - queues: \"orders-*\"\n    nodes: [a, b]\n\nThe first rule that matches a queue decides; a queue no rule matches lives\non any node. Partitions then move to the nodes their rule names, a few at\na time. The rules are kept in etcd: cluster.placement in a config file\nonly seeds them while the cluster has none. Needs the token when the node\nhas one.",
		run: func(ctx context.Context, a *adminCall) error {
			v := broker.PlacementView{Rules: []broker.PlacementRuleView{}}
			args := a.pos
			if len(args) == 1 && !strings.Contains(args[0], "=") {
				rules, err := readPlacementFile(args[0])
				if err != nil {
					return err
				}
				v.Rules, args = rules, nil
			}
			for _, arg := range args {
				rule, err := parseRule(arg)
				if err != nil {
					return err
				}
				v.Rules = append(v.Rules, rule)
			}
			return call(ctx, a.c, "PUT", "/api/v1/cluster/placement", v, a.out, func(w io.Writer, v broker.PlacementView) {
				fmt.Fprintln(w, "placement set: partitions move to the nodes their rule names, a few at a time; watch shardq cluster status")
				fmt.Fprintln(w)
				printPlacement(w, v)
			})
		}},
	{name: "cluster placement clear", short: "remove every placement rule: every queue on every node",
		about: "Removes every placement rule of the cluster: every queue may then live on\nany node, and partitions spread over them, a few at a time. Needs the token\nwhen the node has one.",
		run: func(ctx context.Context, a *adminCall) error {
			v := broker.PlacementView{Rules: []broker.PlacementRuleView{}}
			return call(ctx, a.c, "PUT", "/api/v1/cluster/placement", v, a.out, func(w io.Writer, _ broker.PlacementView) {
				fmt.Fprintln(w, "placement rules cleared: every queue on every node; partitions spread over them, a few at a time")
			})
		}},
}

// adminAliases are other names users reach for.
var adminAliases = map[string]string{"queue list": "queues", "queue ls": "queues", "cluster placement show": "cluster placement"}

// adminKnown reports whether name is an admin command or one of its
// aliases.
func adminKnown(name string) bool {
	_, alias := adminAliases[name]
	return alias || slices.ContainsFunc(adminCommands, func(s adminSpec) bool { return s.name == name })
}

// readPlacementFile reads placement rules from a YAML or JSON file: a list
// of {queues, nodes}, bare or under cluster.placement as in a config file.
func readPlacementFile(name string) ([]broker.PlacementRuleView, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, usageErr{fmt.Sprintf("want rules like 'orders-*=a,b', or a file of them: %v", err)}
	}
	var rules []broker.PlacementRuleView
	if err := yaml.Unmarshal(b, &rules); err != nil {
		var doc struct {
			Cluster struct {
				Placement []broker.PlacementRuleView `yaml:"placement"`
			} `yaml:"cluster"`
		}
		if err2 := yaml.Unmarshal(b, &doc); err2 != nil || len(doc.Cluster.Placement) == 0 {
			return nil, usageErr{fmt.Sprintf("%s: want a list of rules, each with queues and nodes (as cluster.placement in a config file): %v", name, err)}
		}
		rules = doc.Cluster.Placement
	}
	for i, r := range rules {
		if r.Queues == "" && len(r.Tenants) == 0 || len(r.Nodes) == 0 {
			return nil, usageErr{fmt.Sprintf("%s: rule %d needs queues (or tenants) and nodes, like queues: \"orders-*\" and nodes: [a, b]", name, i+1)}
		}
	}
	if len(rules) == 0 {
		return nil, usageErr{fmt.Sprintf("%s holds no rule (shardq cluster placement clear removes them all)", name)}
	}
	return rules, nil
}

// parseRule parses a placement rule as shardq cluster placement set takes
// it: QUEUES=NODE[,NODE...].
func parseRule(arg string) (broker.PlacementRuleView, error) {
	const want = "want QUEUES=NODE[,NODE...], like 'orders-*=a,b'"
	queues, nodes, ok := strings.Cut(arg, "=")
	queues = strings.TrimSpace(queues)
	if !ok || queues == "" {
		return broker.PlacementRuleView{}, usageErr{fmt.Sprintf("%s, got %q", want, arg)}
	}
	if strings.TrimSpace(nodes) == "" {
		return broker.PlacementRuleView{}, usageErr{fmt.Sprintf("rule %q names no node: %s", arg, want)}
	}
	rule := broker.PlacementRuleView{Queues: queues}
	for _, id := range strings.Split(nodes, ",") {
		if id = strings.TrimSpace(id); id == "" {
			return broker.PlacementRuleView{}, usageErr{fmt.Sprintf("rule %q has an empty node id: %s", arg, want)}
		}
		rule.Nodes = append(rule.Nodes, id)
	}
	return rule, nil
}

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
// dlq, clients, client or cluster. It returns 0 on success, 1 when the
// call failed and 2 for bad usage.
func adminCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	name := args[0]
	rest := args[1:]
	if name != "queues" && name != "clients" {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") || rest[0] == "help" {
			return groupUsage(name, rest, stdout, stderr)
		}
		name += " " + rest[0]
		rest = rest[1:]
	}
	// A subcommand of a subcommand: shardq cluster placement set.
	if len(rest) > 0 && adminKnown(name+" "+rest[0]) {
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
	if spec.confirm != nil {
		c.flags.BoolVar(&o.yes, "yes", false, "do not ask for confirmation on a terminal")
	}
	pos, err := c.parse(rest, getenv)
	if errors.Is(err, flag.ErrHelp) || (err == nil && spec.nargs == 0 && slices.Equal(pos, []string{"help"})) {
		c.usage(stdout)
		return 0
	}
	switch {
	case err != nil:
		return c.fail(stderr, "%v", err)
	case spec.nargs == 0 && len(pos) > 0:
		if subs := subcommands(spec.name); len(subs) > 0 {
			return c.fail(stderr, "unexpected argument %q (subcommands: %s)", pos[0], strings.Join(subs, ", "))
		}
		return c.fail(stderr, "unexpected argument %q", pos[0])
	case len(pos) == 0 && spec.nargs != 0 && spec.missing != "":
		return c.fail(stderr, "%s", spec.missing)
	case spec.nargs >= 0 && len(pos) != spec.nargs:
		return c.fail(stderr, "want %d argument(s) (%s), got %d", spec.nargs, spec.args, len(pos))
	case spec.nargs < 0 && len(pos) < 1:
		return c.fail(stderr, "want %s", spec.args)
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
	if ok, err := confirmed(spec, a); err != nil || !ok {
		fmt.Fprintf(stderr, "shardq %s: not confirmed (%v); nothing was done\n", spec.name, cmp.Or(err, errors.New("the name typed differs")))
		return 1
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

// subcommands returns the commands one word longer than name: set and
// clear for cluster placement.
func subcommands(name string) []string {
	var subs []string
	for _, s := range adminCommands {
		if sub, ok := strings.CutPrefix(s.name, name+" "); ok && !strings.Contains(sub, " ") {
			subs = append(subs, sub)
		}
	}
	return subs
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
		switch {
		case (e.Replay != nil || e.Purge != nil) && out.json:
			_, _ = out.w.Write(data)
		case e.Replay != nil:
			printReplay(out.w, *e.Replay)
		case e.Purge != nil:
			printPurge(out.w, *e.Purge)
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
	fmt.Fprintln(t, "QUEUE\tSOURCE\tPARTITIONS\tDEPTH\tGROUPS\tCONSUMERS\tLAG\tDLQ\tIN/S\tACKED/S\tENQUEUED\tACKED")
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
		fmt.Fprintf(t, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%d\t%d\n", q.Name, q.Source, q.Settings.Partitions, q.Depth,
			len(q.Groups), consumers, lag, dlq, q.Rates.Enqueued, q.Rates.Acked, q.Counts.Enqueued, q.Counts.Acked)
	}
	t.Flush()
	if len(l.Queues) == 0 {
		fmt.Fprintf(w, "no queues on %s\n", l.Node)
	}
	printMissing(w, l.NodesMissing)
}

// printMissing names the nodes of a cluster whose figures are missing.
func printClients(w io.Writer, l broker.ClientList) {
	tw := table(w)
	fmt.Fprintln(tw, "CLIENT\tNODE\tUSER\tMQTT\tSINCE\tSUBSCRIPTIONS\tCONSUMES (HELD/PREFETCH)")
	for _, c := range l.Clients {
		subs := make([]string, len(c.Subscriptions))
		for i, s := range c.Subscriptions {
			subs[i] = s.Filter
		}
		cons := make([]string, len(c.Consumers))
		for i, x := range c.Consumers {
			cons[i] = fmt.Sprintf("%s/%s %d/%d", x.Queue, x.Group, x.Leased, x.Prefetch)
			if len(x.Partitions) > 0 {
				ps := make([]string, len(x.Partitions))
				for j, p := range x.Partitions {
					ps[j] = strconv.Itoa(p)
				}
				cons[i] += " partitions " + strings.Join(ps, ",")
			}
		}
		proto := map[byte]string{3: "3.1", 4: "3.1.1", 5: "5"}[c.Protocol]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Node, dash(c.User), proto, dash(c.ConnectedAt),
			dash(strings.Join(subs, " ")), dash(strings.Join(cons, " ")))
	}
	tw.Flush()
	if l.Total > len(l.Clients) {
		fmt.Fprintf(w, "%d of %d clients (--limit)\n", len(l.Clients), l.Total)
	}
	printMissing(w, l.NodesMissing)
}

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
	fmt.Fprintf(w, "  retention=%s max_age=%s max_messages=%d max_bytes=%d overflow=%s retry_backoff=%s..%s dedup_window=%s\n",
		cmp.Or(s.Retention, queue.RetentionAcked), time.Duration(s.MaxAge), s.MaxMessages, s.MaxBytes, s.Overflow, time.Duration(s.RetryBackoff),
		time.Duration(s.RetryBackoffMax), time.Duration(s.DedupWindow))
	printFigures(w, q, true)
	if q.DLQ != nil {
		fmt.Fprintf(w, "\ndead-letter queue %s\n", q.DLQ.Name)
		printFigures(w, *q.DLQ, false)
	}
	printMissing(w, q.NodesMissing)
}

// printGroups prints a queue's consumer groups, one line each.
func printGroups(w io.Writer, q broker.QueueView) {
	if len(q.Groups) == 0 {
		fmt.Fprintf(w, "no consumer groups of %s on %s\n", q.Name, q.Node)
		printMissing(w, q.NodesMissing)
		return
	}
	t := table(w)
	fmt.Fprintln(t, "GROUP\tCONSUMERS\tLAG\tLEASED\tOLDEST UNSETTLED")
	for _, g := range q.Groups {
		fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%s\n", g.Name, g.Consumers, g.Lag, g.Leased, age(g.OldestUnsettledAge))
	}
	t.Flush()
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

func printPurge(w io.Writer, r broker.PurgeResult) {
	fmt.Fprintf(w, "purged %d messages from %s (%s)\n", r.Purged, r.Queue, partitionList(r.Partitions))
}

// partitionList names partitions: "partition 3", "partitions 0, 1, 2".
func partitionList(ps []int) string {
	if len(ps) == 1 {
		return fmt.Sprintf("partition %d", ps[0])
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return "partitions " + strings.Join(s, ", ")
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
		id := m.ID
		if id == "" {
			id = "-" // stored by another node, which did not say where
		}
		fmt.Fprintf(t, "%s\t%s\n", m.DLQID, id)
	}
	t.Flush()
	if len(r.Messages) > shown {
		fmt.Fprintf(w, "... and %d more (--json lists them all)\n", len(r.Messages)-shown)
	}
}

// seekTarget turns --to into the API's "to": a string, or
// {"partition": P, "offset": O} for PARTITION:OFFSET.
func seekTarget(to string) (json.RawMessage, error) {
	if to == "" {
		return nil, usageErr{"want --to: earliest, latest, an RFC 3339 time or PARTITION:OFFSET"}
	}
	if p, o, ok := strings.Cut(to, ":"); ok && !strings.Contains(to, "T") {
		pn, err1 := strconv.Atoi(p)
		on, err2 := strconv.ParseUint(o, 10, 64)
		if err1 != nil || err2 != nil || pn < 0 {
			return nil, usageErr{fmt.Sprintf("--to %q: PARTITION:OFFSET wants two numbers, as 3:1200", to)}
		}
		return json.Marshal(map[string]any{"partition": pn, "offset": on})
	}
	return json.Marshal(to)
}
