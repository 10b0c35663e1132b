package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

const cliToken = "t0ken"

// startNode runs a node on loopback ports: queue jobs takes one delivery
// per message (max_deliveries 1), so a consumer that leaves without
// acking dead-letters what it held, and has no ordering, so that a
// consumer holds several messages of one key. configure, if given,
// changes the config before the node starts.
func startNode(t *testing.T, configure ...func(*config.Config)) (b *broker.Broker, server string) {
	t.Helper()
	cfg := config.Default()
	cfg.NodeID = "node-cli"
	cfg.DataDir = t.TempDir()
	cfg.MQTT, cfg.WS, cfg.HTTP = "127.0.0.1:0", "", "127.0.0.1:0"
	cfg.Admin.Token = cliToken
	o := cfg.Queues.Defaults
	o.MaxDeliveries = 1
	o.Ordering = queue.OrderNone
	cfg.Queues.Declared["jobs"] = o
	for _, f := range configure {
		f(cfg)
	}
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.Serve() }()
	for deadline := time.Now().Add(10 * time.Second); !b.Ready(); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-errc:
			t.Fatalf("Serve: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("node not ready after 10s")
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return b, "http://" + b.HTTPAddr()
}

// mqttClient connects an MQTT 3.1.1 client that acks only when told to
// and hands every message it receives to got (when not nil).
func mqttClient(t *testing.T, b *broker.Broker, id string, got chan<- paho3.Message) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + b.MQTTAddr()).SetClientID(id).
		SetAutoReconnect(false).SetAutoAckDisabled(true).SetOrderMatters(false)
	if got != nil {
		// The default handler too: a delivery can arrive before the SUBACK,
		// before paho has the subscription's route.
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m })
	}
	c := paho3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

func publish(t *testing.T, c paho3.Client, topic string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if tok := c.Publish(topic, 1, false, p); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", topic, tok.Error())
		}
	}
}

// shardq runs the command and returns its exit code and output.
func shardq(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// must runs the command and fails unless it exits 0.
func must(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := shardq(args...)
	if code != 0 {
		t.Fatalf("shardq %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// fails runs the command and checks it exits with code, saying word on stderr.
func fails(t *testing.T, code int, word string, args ...string) {
	t.Helper()
	got, out, errs := shardq(args...)
	if got != code || !strings.Contains(errs, word) {
		t.Fatalf("shardq %s: exit %d, stderr %q (stdout %q); want exit %d mentioning %q", strings.Join(args, " "), got, errs, out, code, word)
	}
}

func jsonOf[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	return v
}

func jobs(t *testing.T, server string) broker.QueueView {
	t.Helper()
	return jsonOf[broker.QueueView](t, must(t, "queue", "show", "jobs", "--server", server, "--json", "--token", cliToken))
}

func TestAdminCommands(t *testing.T) {
	b, server := startNode(t)
	prod := mqttClient(t, b, "producer", nil)
	publish(t, prod, "$queue/jobs/eu", "j0", "j1", "j2", "j3", "j4")

	// A consumer takes five, acks two and leaves: three dead letters.
	got := make(chan paho3.Message, 10)
	cons := mqttClient(t, b, "consumer", got)
	if tok := cons.Subscribe("$share/workers/$queue/jobs/#", 1, func(_ paho3.Client, m paho3.Message) { got <- m }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	for i := 0; i < 5; i++ {
		select {
		case m := <-got:
			if i >= 3 {
				m.Ack()
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("delivery %d missing", i)
		}
	}
	waitUntil(t, func() bool { return jobs(t, server).Counts.Acked == 2 })
	cons.Disconnect(0)
	waitUntil(t, func() bool { return jobs(t, server).DLQ.Depth == 3 })

	t.Run("queues", func(t *testing.T) {
		out := must(t, "queues", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "QUEUE") || !strings.Contains(out, "jobs") || !strings.Contains(out, "config") {
			t.Errorf("queues table:\n%s", out)
		}
		l := jsonOf[broker.QueueList](t, must(t, "queues", "--json", "--server", server, "--token", cliToken))
		if l.Node != "node-cli" || len(l.Queues) != 1 || l.Queues[0].DLQ.Depth != 3 {
			t.Errorf("queues --json: %+v", l)
		}
		// SHARDQ_SERVER stands in for --server.
		t.Setenv("SHARDQ_SERVER", server)
		t.Setenv("SHARDQ_TOKEN", cliToken)
		if out := must(t, "queues"); !strings.Contains(out, "jobs") {
			t.Errorf("queues with SHARDQ_SERVER:\n%s", out)
		}
	})

	t.Run("clients", func(t *testing.T) {
		mqttClient(t, b, "visitor", nil)
		out := must(t, "clients", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "CLIENT") || !strings.Contains(out, "visitor") || !strings.Contains(out, "producer") {
			t.Errorf("clients table:\n%s", out)
		}
		if out := must(t, "clients", "--user", "nobody", "--server", server, "--token", cliToken); strings.Contains(out, "visitor") {
			t.Errorf("clients --user nobody:\n%s", out)
		}
		if out := must(t, "client", "disconnect", "visitor", "--server", server, "--token", cliToken); !strings.Contains(out, "disconnected client visitor") {
			t.Errorf("client disconnect:\n%s", out)
		}
		waitUntil(t, func() bool {
			return !strings.Contains(must(t, "clients", "--server", server, "--token", cliToken), "visitor")
		})
		fails(t, 1, "is not connected", "client", "disconnect", "visitor", "--server", server, "--token", cliToken)
		fails(t, 2, "want the id of the client", "client", "disconnect", "--server", server)
	})

	t.Run("queue show", func(t *testing.T) {
		out := must(t, "queue", "show", "jobs", "--server", server, "--token", cliToken)
		for _, want := range []string{"queue jobs on node-cli", "max_deliveries=1", "PARTITION", "workers", "dead-letter queue jobs/$dlq"} {
			if !strings.Contains(out, want) {
				t.Errorf("queue show lacks %q:\n%s", want, out)
			}
		}
		fails(t, 1, "no such queue", "queue", "show", "nope", "--server", server, "--token", cliToken)
		fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "queue", "show", "jobs", "--server", server)
		fails(t, 2, "want 1 argument", "queue", "show", "--server", server)
		fails(t, 2, "unknown command", "queue", "frob", "jobs", "--server", server)
		fails(t, 1, "nothing listens at", "queue", "show", "jobs", "--server", "http://127.0.0.1:1")
	})

	var letters []broker.MessageView
	t.Run("queue peek", func(t *testing.T) {
		out := must(t, "queue", "peek", "jobs", "--server", server, "--limit", "2", "--token", cliToken)
		if strings.Count(out, "$queue/jobs/eu") != 2 || !strings.Contains(out, `"j0"`) {
			t.Errorf("peek --limit 2:\n%s", out)
		}
		out = must(t, "queue", "peek", "jobs", "--dlq", "--server", server, "--token", cliToken)
		if strings.Count(out, "max-deliveries") != 3 {
			t.Errorf("peek --dlq:\n%s", out)
		}
		letters = jsonOf[broker.MessageList](t, must(t, "queue", "peek", "jobs", "--dlq", "--json", "--server", server, "--token", cliToken)).Messages
		if len(letters) != 3 {
			t.Fatalf("%d dead letters, want 3", len(letters))
		}
		fails(t, 1, "partition", "queue", "peek", "jobs", "--partition", "99", "--server", server, "--token", cliToken)
		if dlq := must(t, "dlq", "peek", "jobs", "--server", server, "--token", cliToken); dlq != out {
			t.Errorf("dlq peek differs from queue peek --dlq:\n%s\nwant\n%s", dlq, out)
		}
	})

	t.Run("group list", func(t *testing.T) {
		out := must(t, "group", "list", "jobs", "--server", server, "--token", cliToken)
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "workers ") {
			t.Errorf("group list: want a header and the group workers:\n%s", out)
		}
		fails(t, 1, "no such queue", "group", "list", "nope", "--server", server, "--token", cliToken)
	})

	t.Run("dlq replay", func(t *testing.T) {
		fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "dlq", "replay", "jobs", "--id", letters[0].ID, "--server", server)
		fails(t, 1, "refused the token", "dlq", "replay", "jobs", "--id", letters[0].ID, "--server", server, "--token", "nope")
		fails(t, 1, "malformed msg-id", "dlq", "replay", "jobs", "--id", "zz", "--server", server, "--token", cliToken)
		fails(t, 1, "not in jobs/$dlq", "dlq", "replay", "jobs", "--id", "0-99", "--server", server, "--token", cliToken)
		if v := jobs(t, server); v.DLQ.Depth != 3 || v.Counts.Enqueued != 5 {
			t.Fatalf("after refused replays: dlq depth %d, enqueued %d", v.DLQ.Depth, v.Counts.Enqueued)
		}
		out := must(t, "dlq", "replay", "jobs", "--id", letters[0].ID, "--server", server, "--token", cliToken)
		if !strings.Contains(out, "replayed 1 dead letters into jobs") || !strings.Contains(out, letters[0].ID) {
			t.Errorf("replay one:\n%s", out)
		}
		// SHARDQ_TOKEN stands in for --token.
		t.Setenv("SHARDQ_TOKEN", cliToken)
		r := jsonOf[broker.ReplayResult](t, must(t, "dlq", "replay", "jobs", "--json", "--server", server))
		if r.Replayed != 2 {
			t.Errorf("replay the rest: %+v", r)
		}
		if v := jobs(t, server); v.Counts.Enqueued != 8 {
			t.Errorf("enqueued %d after replays, want 8", v.Counts.Enqueued)
		}
	})

	t.Run("group seek", func(t *testing.T) {
		fails(t, 2, "want --to", "group", "seek", "jobs", "workers", "--server", server, "--token", cliToken)
		fails(t, 2, "PARTITION:OFFSET wants two numbers", "group", "seek", "jobs", "workers", "--to", "0:x", "--server", server, "--token", cliToken)
		fails(t, 1, "RFC 3339", "group", "seek", "jobs", "workers", "--to", "yesterday", "--server", server, "--token", cliToken)
		fails(t, 1, "no such consumer group", "group", "seek", "jobs", "nope", "--to", "latest", "--server", server, "--token", cliToken)
		out := must(t, "group", "seek", "jobs", "workers", "--to", "latest", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "moved group workers of jobs to latest") || !strings.Contains(out, "partition 0: offset") {
			t.Errorf("group seek:\n%s", out)
		}
		if g, ok := findGroup(jobs(t, server), "workers"); !ok || g.Lag != 0 {
			t.Errorf("after a seek to latest, workers: %+v", g)
		}
		out = must(t, "group", "seek", "jobs", "workers", "--to", "0:0", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "to partition 0 offset 0") {
			t.Errorf("group seek to 0:0:\n%s", out)
		}
	})

	t.Run("group delete", func(t *testing.T) {
		fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "group", "delete", "jobs", "workers", "--server", server)
		fails(t, 1, "no such consumer group", "group", "delete", "jobs", "nope", "--server", server, "--token", cliToken)
		out := must(t, "group", "delete", "jobs", "workers", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "deleted group workers of jobs") {
			t.Errorf("group delete:\n%s", out)
		}
		if _, ok := findGroup(jobs(t, server), "workers"); ok {
			t.Error("group workers still there")
		}
	})

	t.Run("queue purge", func(t *testing.T) {
		fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "queue", "purge", "jobs", "--server", server)
		// Retention may have deleted what the group settled before it was deleted.
		depth := jobs(t, server).Depth
		if depth < 3 {
			t.Fatalf("depth %d before purge, want at least the 3 replayed", depth)
		}
		// On a terminal the name is asked for, and a wrong one does nothing.
		var prompt bytes.Buffer
		answer := "job\n"
		defer func(f func() (io.Reader, io.Writer, bool)) { confirmInput = f }(confirmInput)
		confirmInput = func() (io.Reader, io.Writer, bool) { return strings.NewReader(answer), &prompt, true }
		fails(t, 1, "not confirmed", "queue", "purge", "jobs", "--server", server, "--token", cliToken)
		if !strings.Contains(prompt.String(), "every message of jobs") || !strings.Contains(prompt.String(), "Type jobs to go on") {
			t.Errorf("prompt: %q", prompt.String())
		}
		if v := jobs(t, server); v.Depth != depth {
			t.Fatalf("depth %d after a purge not confirmed, want %d", v.Depth, depth)
		}
		answer = "jobs\n"
		out := must(t, "queue", "purge", "jobs", "--server", server, "--token", cliToken)
		if !strings.Contains(out, fmt.Sprintf("purged %d messages from jobs", depth)) {
			t.Errorf("purge of %d:\n%s", depth, out)
		}
		if v := jobs(t, server); v.Depth != 0 {
			t.Errorf("depth %d after purge", v.Depth)
		}
		answer, prompt = "", bytes.Buffer{} // --yes does not ask
		if out := must(t, "queue", "purge", "jobs", "--dlq", "--yes", "--server", server, "--token", cliToken); !strings.Contains(out, "from jobs/$dlq") {
			t.Errorf("purge --dlq:\n%s", out)
		}
		if prompt.Len() != 0 {
			t.Errorf("asked despite --yes: %q", prompt.String())
		}
	})

	t.Run("queue declare", func(t *testing.T) {
		fails(t, 1, "partition", "queue", "declare", "jobs", "partitions=3", "--server", server, "--token", cliToken)
		fails(t, 1, "ordering", "queue", "declare", "fresh", "ordering=sideways", "--server", server, "--token", cliToken)
		fails(t, 2, "KEY=VALUE", "queue", "declare", "fresh", "partitions", "--server", server)
		out := must(t, "queue", "declare", "fresh", "partitions=2", "ack_timeout=5s", "--server", server, "--token", cliToken)
		if !strings.Contains(out, "partitions=2") || !strings.Contains(out, "ack_timeout=5s") || !strings.Contains(out, "settings: api") {
			t.Errorf("declare:\n%s", out)
		}
	})

	t.Run("queue delete", func(t *testing.T) {
		fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "queue", "delete", "jobs", "--server", server)
		fails(t, 2, "want 1 argument", "queue", "delete", "--server", server, "--token", cliToken)
		dead := jobs(t, server).DLQ.Depth
		out := must(t, "queue", "delete", "jobs", "--server", server, "--token", cliToken)
		if !strings.Contains(out, fmt.Sprintf("deleted queue jobs with 0 messages and %d dead letters", dead)) {
			t.Errorf("queue delete:\n%s", out)
		}
		fails(t, 1, "no such queue", "queue", "show", "jobs", "--server", server, "--token", cliToken)
		fails(t, 1, "no such queue", "queue", "delete", "jobs", "--server", server, "--token", cliToken)
	})
}

func findGroup(v broker.QueueView, name string) (broker.GroupView, bool) {
	for _, g := range v.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return broker.GroupView{}, false
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	waitWithin(t, cond, 10*time.Second)
}

// waitWithin waits until cond holds, or fails the test after within.
func waitWithin(t *testing.T, cond func() bool, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", within)
		}
	}
}

// TestCLIErrorsSayWhatToDo: the mistakes a new user makes with the admin
// commands get a sentence that says what to do, not a Go error.
func TestCLIErrorsSayWhatToDo(t *testing.T) {
	b, server := startNode(t)
	hostPort := strings.TrimPrefix(server, "http://")

	// An address without a scheme is the node's HTTP address.
	must(t, "queues", "--server", hostPort, "--token", cliToken)
	// queue list is queues.
	if out := must(t, "queue", "list", "--server", server, "--token", cliToken); !strings.Contains(out, "jobs") {
		t.Errorf("queue list: want the queues, got %q", out)
	}
	fails(t, 1, "--token TOKEN or set SHARDQ_TOKEN", "queues", "--server", server)
	fails(t, 1, "refused the token", "queues", "--server", server, "--token", "nope")
	fails(t, 1, "is it the node's MQTT port?", "queues", "--server", b.MQTTAddr(), "--token", cliToken)
	fails(t, 1, `did you mean "ack_timeout"`, "queue", "declare", "jobs", "ack_timout=5s", "--server", server, "--token", cliToken)
	fails(t, 2, "want the node's HTTP address", "queues", "--server", "http://")

	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	fails(t, 1, "nothing listens at http://"+free, "queues", "--server", free)
}
