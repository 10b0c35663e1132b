package bench

import (
	"context"
	"io"
	"log/slog"
	"os"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// faultHook makes a vanilla mochi broker misbehave on chosen messages,
// picked by the bench header of their payload. Every fault acknowledges the
// publish normally, so the producer cannot tell.
type faultHook struct {
	mqtt.HookBase
	server *mqtt.Server

	drop func(header) bool // acknowledged, never delivered
	dup  func(header) bool // delivered twice, without DUP
	hold func(header) bool // delivered after the next message of its producer and key

	mu   sync.Mutex
	held map[MessageID]packets.Packet // {producer, key} -> held message; guarded by mu
}

func (h *faultHook) ID() string { return "fault" }

func (h *faultHook) Provides(b byte) bool { return b == mqtt.OnPublish || b == mqtt.OnPublished }

func (h *faultHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	hd, err := parseHeader(pk.Payload)
	if cl.Net.Inline || err != nil {
		return pk, nil
	}
	switch {
	case h.drop != nil && h.drop(hd):
		return pk, packets.CodeSuccessIgnore
	case h.hold != nil && h.hold(hd):
		h.mu.Lock()
		h.held[heldKey(hd)] = pk.Copy(false)
		h.mu.Unlock()
		return pk, packets.CodeSuccessIgnore
	}
	return pk, nil
}

func (h *faultHook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	hd, err := parseHeader(pk.Payload)
	if cl.Net.Inline || pk.Ignore || err != nil {
		return
	}
	if h.dup != nil && h.dup(hd) {
		h.inject(pk)
	}
	h.mu.Lock()
	held, ok := h.held[heldKey(hd)]
	delete(h.held, heldKey(hd))
	h.mu.Unlock()
	if ok {
		h.inject(held)
	}
}

func heldKey(h header) MessageID {
	return MessageID{Producer: h.Producer, Seq: uint64(h.Key)}
}

// inject delivers pk again through the broker's inline client.
func (h *faultHook) inject(pk packets.Packet) {
	_ = h.server.Publish(pk.TopicName, pk.Payload, false, pk.FixedHeader.Qos)
}

// startMochi runs an in-process vanilla mochi broker on a free port with an
// optional fault hook and returns its address.
func startMochi(t *testing.T, hook *faultHook) string {
	t.Helper()
	caps := mqtt.NewDefaultServerCapabilities()
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	s := mqtt.New(&mqtt.Options{
		InlineClient: true,
		Capabilities: caps,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if hook != nil {
		hook.server = s
		hook.held = make(map[MessageID]packets.Packet)
		if err := s.AddHook(hook, nil); err != nil {
			t.Fatal(err)
		}
	}
	l := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	if err := s.AddListener(l); err != nil { // binds the port
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeMochi(s) })
	return l.Address()
}

// closeMochi stops a test broker. mochi's Close read-locks its client table
// twice and can deadlock against a client leaving at the same moment, so it
// is given a few seconds and then left behind.
func closeMochi(s *mqtt.Server) {
	done := make(chan struct{})
	go func() {
		_ = s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
}

// smallRun is a bounded run: 200 messages, no warm-up.
func smallRun(broker string) Config {
	cfg := DefaultConfig()
	cfg.Broker = broker
	cfg.Producers = 1
	cfg.Keys = 1
	cfg.Window = 8
	cfg.Messages = 200
	cfg.Duration = 0
	cfg.Warmup = 0
	cfg.Drain = time.Second // ends early unless messages are missing
	cfg.ConnectTimeout = 5 * time.Second
	return cfg
}

// anyOrder as the wanted reordered count skips the order check.
const anyOrder = -1

func seqMod(n, r uint64) func(header) bool {
	return func(h header) bool { return h.Seq%n == r }
}

// TestRunAccountingAgainstFaultyBroker checks that the ledger reports
// exactly the faults a broker injects.
func TestRunAccountingAgainstFaultyBroker(t *testing.T) {
	type want struct {
		missing, duplicates, reordered int64
		status                         string
		missingSample                  []string
	}
	cases := []struct {
		name string
		hook *faultHook
		tune func(*Config)
		want want
	}{
		{
			name: "clean",
			hook: &faultHook{},
			want: want{status: StatusOK},
		},
		{
			name: "drop every 50th",
			hook: &faultHook{drop: seqMod(50, 25)},
			want: want{missing: 4, status: StatusLoss, missingSample: []string{"p0#25", "p0#75", "p0#125", "p0#175"}},
		},
		{
			name: "duplicate every 50th",
			hook: &faultHook{dup: seqMod(50, 10)},
			want: want{duplicates: 4, status: StatusOK},
		},
		{
			name: "swap two messages",
			hook: &faultHook{hold: func(h header) bool { return h.Seq == 100 }},
			want: want{reordered: 1, status: StatusOK},
		},
		{
			name: "swap two messages with ordering check",
			hook: &faultHook{hold: func(h header) bool { return h.Seq == 100 }},
			tune: func(c *Config) { c.OrderingCheck = true },
			want: want{reordered: 1, status: StatusReorder},
		},
		{
			name: "faults across producers",
			hook: &faultHook{
				drop: func(h header) bool { return h.Producer == 1 && h.Seq == 30 },
				dup:  seqMod(40, 5),
				hold: func(h header) bool { return h.Producer == 0 && h.Seq == 60 },
			},
			tune: func(c *Config) { c.Producers, c.Keys = 2, 4 },
			want: want{missing: 1, duplicates: 6, reordered: 1, status: StatusLoss, missingSample: []string{"p1#30"}},
		},
		{
			name: "qos 2 with a duplicate",
			hook: &faultHook{dup: seqMod(100, 50)},
			tune: func(c *Config) { c.QoS = 2 },
			want: want{duplicates: 2, status: StatusOK},
		},
		{
			name: "qos 0 with a loss",
			hook: &faultHook{drop: seqMod(100, 50)},
			tune: func(c *Config) { c.QoS, c.Drain = 0, 500*time.Millisecond },
			want: want{missing: 2, status: StatusLoss, missingSample: []string{"p0#50", "p0#150"}},
		},
		{
			name: "paho.mqtt.golang 3.1.1 consumer with a loss and a duplicate",
			hook: &faultHook{drop: seqMod(100, 50), dup: seqMod(100, 20)},
			tune: func(c *Config) { c.ConsumerClient = ClientPaho311 },
			want: want{missing: 2, duplicates: 2, status: StatusLoss, missingSample: []string{"p0#50", "p0#150"}},
		},
		{
			name: "paho.mqtt.golang 3.1.1 consumers of a queue's shared group",
			hook: &faultHook{},
			tune: func(c *Config) {
				c.Scenario, c.Consumers, c.Producers, c.Keys, c.ConsumerClient = ScenarioCycle, 2, 2, 8, ClientPaho311
			},
			want: want{reordered: anyOrder, status: StatusOK},
		},
		{
			// mochi spreads a shared group's messages over its members
			// regardless of key: order is not checked here.
			name: "cycle with a shared group of two",
			hook: &faultHook{},
			tune: func(c *Config) { c.Scenario, c.Consumers, c.Producers, c.Keys = ScenarioCycle, 2, 2, 8 },
			want: want{reordered: anyOrder, status: StatusOK},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallRun(startMochi(t, tc.hook))
			if tc.tune != nil {
				tc.tune(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := want{
				missing:       res.Missing,
				duplicates:    res.Duplicates,
				reordered:     res.Reordered,
				status:        res.Status,
				missingSample: res.MissingSample,
			}
			if tc.want.reordered == anyOrder {
				got.reordered = anyOrder
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
			if res.Sent != 200 || res.Acked != 200 {
				t.Fatalf("sent %d, acked %d; want 200, 200", res.Sent, res.Acked)
			}
			if wantRecv := 200 - tc.want.missing; res.Received != wantRecv {
				t.Fatalf("received %d, want %d", res.Received, wantRecv)
			}
			if res.Valid != (tc.want.status == StatusOK) || (res.Throughput != nil) != res.Valid {
				t.Fatalf("valid %t with status %s and throughput %v", res.Valid, res.Status, res.Throughput)
			}
			wantPubAcks := uint64(200)
			if cfg.QoS == 0 {
				wantPubAcks = 0
			}
			if res.E2E.Count != 200-uint64(tc.want.missing) || res.PubAck.Count != wantPubAcks {
				t.Fatalf("latency counts: e2e %d, puback %d", res.E2E.Count, res.PubAck.Count)
			}
		})
	}
}

func TestRunProduceAndBacklogAgainstPlainBroker(t *testing.T) {
	t.Run("produce counts PUBACKs, expects no deliveries", func(t *testing.T) {
		cfg := smallRun(startMochi(t, nil))
		cfg.Scenario, cfg.Producers, cfg.QoS = ScenarioProduce, 2, 2
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !res.Valid || res.Measured != 200 || res.Missing != 0 || res.PubAck.Count != 200 || res.E2E.Count != 0 {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("backlog on a broker without queues is a loss", func(t *testing.T) {
		cfg := smallRun(startMochi(t, nil))
		cfg.Scenario, cfg.Drain = ScenarioBacklog, 200*time.Millisecond
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		// mochi acknowledges before it routes, so the last message or so
		// may still reach the consumers; the rest is gone.
		if res.Status != StatusLoss || res.Missing+res.Received != 200 || res.Missing < 100 || res.FillMsgsPerS <= 0 || res.Drained {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("unreachable broker is an error", func(t *testing.T) {
		cfg := smallRun("127.0.0.1:1")
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Fatal("Run against a closed port succeeded")
		}
	})
}

// TestRunReportsBrokerCPU: with the broker's pid, a timed run reports the
// CPU the broker's process used in the measured window per message. The
// broker here runs in the test's own process, which holds the load
// generator too: a process that did the work used CPU for it.
func TestRunReportsBrokerCPU(t *testing.T) {
	cfg := smallRun(startMochi(t, nil))
	cfg.Scenario, cfg.Messages = ScenarioPubSub, 0
	cfg.Warmup, cfg.Duration, cfg.Rate = 100*time.Millisecond, 700*time.Millisecond, 3000
	cfg.BrokerPID = os.Getpid()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.Valid || res.Measured == 0 {
		t.Fatalf("result %+v", res)
	}
	if res.BrokerCPUUsPerMsg <= 0 || res.BrokerCores <= 0 || res.BrokerCores > float64(runtime.NumCPU())+0.5 {
		t.Fatalf("broker CPU %.2f µs/msg, %.3f cores over %d messages: want some, and no more than the machine has", res.BrokerCPUUsPerMsg, res.BrokerCores, res.Measured)
	}
	if got := float64(res.Measured) * res.BrokerCPUUsPerMsg / 1e6; got > cfg.Duration.Seconds()*float64(runtime.NumCPU())+0.1 {
		t.Fatalf("%.2f s of CPU in a window of %s", got, cfg.Duration)
	}

	// Without a pid, nothing is reported.
	cfg.BrokerPID = 0
	res, err = Run(context.Background(), cfg)
	if err != nil || res.BrokerCPUUsPerMsg != 0 || res.BrokerCores != 0 {
		t.Fatalf("without a pid: %+v, %v", res, err)
	}
}

func TestProcessCPU(t *testing.T) {
	before, ok := processCPU(os.Getpid())
	if !ok {
		t.Fatal("no CPU time read for this process")
	}
	// Busy until the CPU time moves on, one clock tick at least.
	deadline := time.Now().Add(10 * time.Second)
	for after := before; after <= before; after, _ = processCPU(os.Getpid()) {
		if time.Now().After(deadline) {
			t.Fatalf("CPU time still %s after 10 s of a busy loop", after)
		}
	}
	if _, ok := processCPU(1 << 30); ok {
		t.Fatal("CPU time read for a process that does not exist")
	}
}
