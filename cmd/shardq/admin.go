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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardq/shardq/broker"
)

const adminUsage = `usage: shardq <command> [flags]

Commands that call a node's admin API (its HTTP address):
  queues                          list the queues with their figures
  queue show QUEUE                one queue: settings, partitions, groups, totals
  queue peek QUEUE                messages, without delivering or settling them
                                  [--partition P [--from OFFSET]] [--limit N] [--dlq]
  queue purge QUEUE               delete every message of the queue [--dlq]
  queue declare QUEUE [K=V ...]   create a queue or change its settings, e.g.
                                  partitions=16 ack_timeout=10s (kept across restarts)
  group delete QUEUE GROUP        delete a consumer group with no consumers [--dlq]
  dlq replay QUEUE [--id MSGID]   publish dead letters into the queue again: the
                                  ones named (--id, repeatable, dead-letter msg-ids) or all

Flags of every command:
  --server URL   the node's HTTP address (env SHARDQ_SERVER; default http://127.0.0.1:9090)
  --token TOKEN  bearer token for changes, as http.admin_token (env SHARDQ_TOKEN)
  --json         print the API's JSON instead of tables
`

const defaultServer = "http://127.0.0.1:9090"

// adminCommand runs the admin commands. It returns 0 on success, 1 when the
// call failed and 2 for bad usage.
func adminCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	name := args[0]
	if (name == "queue" || name == "group" || name == "dlq") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		name += " " + args[1]
		args = args[1:]
	}
	fs := flag.NewFlagSet("shardq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	server := fs.String("server", envOr(getenv, "SHARDQ_SERVER", defaultServer), "")
	token := fs.String("token", getenv("SHARDQ_TOKEN"), "")
	asJSON := fs.Bool("json", false, "")
	partition := fs.Int("partition", -1, "")
	from := fs.String("from", "", "")
	limit := fs.Int("limit", 10, "")
	dlq := fs.Bool("dlq", false, "")
	var ids stringList
	fs.Var(&ids, "id", "")
	pos, err := parseInterspersed(fs, args[1:])
	usageError := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "shardq %s: %s\n\n%s", name, fmt.Sprintf(format, a...), adminUsage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, adminUsage)
		return 0
	}
	if err != nil {
		return usageError("%v", err)
	}
	c := &adminClient{server: strings.TrimRight(*server, "/"), token: *token, http: &http.Client{Timeout: 5 * time.Minute}}
	out := &printer{w: stdout, json: *asJSON}
	want := map[string]int{"queues": 0, "queue show": 1, "queue peek": 1, "queue purge": 1, "queue declare": -1,
		"group delete": 2, "dlq replay": 1}
	n, known := want[name]
	switch {
	case !known && !strings.Contains(name, " ") && name != "queues":
		return usageError("want a subcommand")
	case !known:
		return usageError("unknown command")
	case n >= 0 && len(pos) != n:
		return usageError("want %d argument(s), got %d", n, len(pos))
	case n < 0 && len(pos) < 1:
		return usageError("want a queue name")
	}
	q := func(i int) string { return url.PathEscape(pos[i]) }
	dlqPath := ""
	if *dlq {
		dlqPath = "/dlq"
	}
	switch name {
	case "queues":
		err = call(ctx, c, "GET", "/api/v1/queues", nil, out, printQueues)
	case "queue show":
		err = call(ctx, c, "GET", "/api/v1/queues/"+q(0), nil, out, printQueue)
	case "queue peek":
		v := url.Values{"limit": {strconv.Itoa(*limit)}}
		if *partition >= 0 {
			v.Set("partition", strconv.Itoa(*partition))
		}
		if *from != "" {
			v.Set("from", *from)
		}
		err = call(ctx, c, "GET", "/api/v1/queues/"+q(0)+dlqPath+"/messages?"+v.Encode(), nil, out, printMessages)
	case "queue purge":
		err = call(ctx, c, "POST", "/api/v1/queues/"+q(0)+dlqPath+"/purge", nil, out, func(w io.Writer, r broker.PurgeResult) {
			fmt.Fprintf(w, "purged %d messages from %s\n", r.Purged, r.Queue)
		})
	case "queue declare":
		settings := map[string]any{}
		for _, kv := range pos[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageError("want KEY=VALUE, got %q", kv)
			}
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				settings[k] = n
			} else {
				settings[k] = v
			}
		}
		err = call(ctx, c, "PUT", "/api/v1/queues/"+q(0), settings, out, printQueue)
	case "group delete":
		err = call(ctx, c, "DELETE", "/api/v1/queues/"+q(0)+dlqPath+"/groups/"+q(1), nil, out, func(w io.Writer, r broker.GroupDeleted) {
			fmt.Fprintf(w, "deleted group %s of %s\n", r.Group, r.Queue)
		})
	case "dlq replay":
		var req broker.ReplayRequest
		if len(ids) > 0 {
			req.IDs = (*[]string)(&ids)
		}
		err = call(ctx, c, "POST", "/api/v1/queues/"+q(0)+"/dlq/replay", req, out, printReplay)
	}
	if err != nil {
		fmt.Fprintf(stderr, "shardq %s: %v\n", name, err)
		return 1
	}
	return 0
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// parseInterspersed parses flags wherever they are among the arguments and
// returns the arguments that are not flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
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
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
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
