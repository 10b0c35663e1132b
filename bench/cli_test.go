package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestCLIParseArgs(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		check   func(t *testing.T, o cliOptions)
		wantErr error
	}{
		{
			name: "defaults",
			args: []string{"pubsub", "--broker", "h:1"},
			check: func(t *testing.T, o cliOptions) {
				if o.cfg.Producers != 4 || o.cfg.Consumers != 1 || o.cfg.Size != 64 || o.cfg.QoS != 1 ||
					o.cfg.Window != 64 || o.cfg.Rate != 0 || o.cfg.Duration != 10*time.Second ||
					o.cfg.Warmup != 2*time.Second || o.cfg.Keys != 64 || o.rounds != 1 || o.json {
					t.Fatalf("options %+v", o)
				}
			},
		},
		{
			name: "fanin defaults to 64 producers",
			args: []string{"fanin", "--broker", "h:1", "--consumers", "3"},
			check: func(t *testing.T, o cliOptions) {
				if o.cfg.Scenario != ScenarioFanIn || o.cfg.Producers != FanInProducers || o.cfg.Consumers != 3 {
					t.Fatalf("options %+v", o.cfg)
				}
			},
		},
		{
			name: "fanin keeps explicit producers",
			args: []string{"fanin", "--broker", "h:1", "--producers", "8"},
			check: func(t *testing.T, o cliOptions) {
				if o.cfg.Producers != 8 {
					t.Fatalf("producers %d", o.cfg.Producers)
				}
			},
		},
		{
			name: "vs defaults to 3 rounds",
			args: []string{"cycle", "--broker", "a:1", "--vs", "b:1", "--json", "--qos", "2", "--ordering-check"},
			check: func(t *testing.T, o cliOptions) {
				if o.vs != "b:1" || o.rounds != 3 || !o.json || o.cfg.QoS != 2 || !o.cfg.OrderingCheck {
					t.Fatalf("options %+v", o)
				}
			},
		},
		{
			name: "scenario after the flags",
			args: []string{"--broker", "h:1", "--rounds", "2", "--rate", "500", "produce"},
			check: func(t *testing.T, o cliOptions) {
				if o.cfg.Scenario != ScenarioProduce || o.rounds != 2 || o.cfg.Rate != 500 {
					t.Fatalf("options %+v", o)
				}
			},
		},
		{name: "no scenario", args: []string{"--broker", "h:1"}, wantErr: errAny},
		{name: "unknown scenario", args: []string{"flood", "--broker", "h:1"}, wantErr: ErrInvalidConfig},
		{name: "no broker", args: []string{"pubsub"}, wantErr: ErrInvalidConfig},
		{name: "qos 3", args: []string{"pubsub", "--broker", "h:1", "--qos", "3"}, wantErr: ErrInvalidConfig},
		{name: "size below header", args: []string{"pubsub", "--broker", "h:1", "--size", "8"}, wantErr: ErrInvalidConfig},
		{name: "no end", args: []string{"pubsub", "--broker", "h:1", "--duration", "0"}, wantErr: ErrInvalidConfig},
		{name: "stray argument", args: []string{"pubsub", "--broker", "h:1", "extra"}, wantErr: errAny},
		{name: "unknown flag", args: []string{"pubsub", "--brokr", "h:1"}, wantErr: errAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseArgs(tc.args, io.Discard)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("parseArgs: %v", err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("parseArgs error = %v, want %v", err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

// errAny in a case wants some error.
var errAny = errors.New("any error")

func TestCLIMainSingleRun(t *testing.T) {
	addr := startMochi(t, nil)
	args := []string{"pubsub", "--broker", addr, "--messages", "200", "--duration", "0", "--warmup", "0", "--keys", "4"}

	t.Run("table", func(t *testing.T) {
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), args, &out, &errOut); code != ExitOK {
			t.Fatalf("exit %d, stderr %s", code, errOut.String())
		}
		for _, want := range []string{"status", "OK", "msgs/s", "puback", "e2e", "missing 0"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("output lacks %q:\n%s", want, out.String())
			}
		}
		if strings.Contains(out.String(), "\r") {
			t.Fatal("progress line drawn on a non-terminal")
		}
	})
	t.Run("json", func(t *testing.T) {
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), append(args, "--json"), &out, &errOut); code != ExitOK {
			t.Fatalf("exit %d, stderr %s", code, errOut.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out.String())
		}
		for _, k := range []string{"throughput_msgs_per_s", "sent", "received", "missing", "duplicates", "reordered",
			"puback_p50_ms", "puback_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms", "valid", "scenario", "broker"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("JSON lacks %q: %s", k, out.String())
			}
		}
		if m["valid"] != true || m["sent"] != 200.0 || m["received"] != 200.0 || m["scenario"] != "pubsub" || m["broker"] != addr {
			t.Fatalf("JSON %s", out.String())
		}
	})
	t.Run("loss exits non-zero without a throughput", func(t *testing.T) {
		lossy := startMochi(t, &faultHook{drop: seqMod(100, 7)})
		var out, errOut bytes.Buffer
		args := []string{"pubsub", "--broker", lossy, "--messages", "100", "--producers", "1",
			"--duration", "0", "--warmup", "0", "--drain", "300ms"}
		if code := Main(context.Background(), args, &out, &errOut); code != ExitInvalid {
			t.Fatalf("exit %d, want %d; stderr %s", code, ExitInvalid, errOut.String())
		}
		if !strings.Contains(out.String(), "LOSS") || strings.Contains(out.String(), "msgs/s") {
			t.Fatalf("output:\n%s", out.String())
		}
	})
}

func TestCLIMainCompare(t *testing.T) {
	a, b := startMochi(t, nil), startMochi(t, nil)
	args := []string{"cycle", "--broker", a, "--vs", b, "--rounds", "2", "--messages", "100",
		"--duration", "0", "--warmup", "0", "--json"}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), args, &out, &errOut); code != ExitOK {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	var cmp struct {
		A           []Result   `json:"a"`
		B           []Result   `json:"b"`
		Ratios      []*float64 `json:"ratios"`
		RatioMedian *float64   `json:"ratio_median"`
	}
	if err := json.Unmarshal(out.Bytes(), &cmp); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if len(cmp.A) != 2 || len(cmp.B) != 2 || len(cmp.Ratios) != 2 || cmp.RatioMedian == nil {
		t.Fatalf("comparison %s", out.String())
	}
	for i := range 2 {
		if cmp.A[i].Broker != a || cmp.B[i].Broker != b || cmp.A[i].Round != i+1 || cmp.Ratios[i] == nil {
			t.Fatalf("round %d: %s", i+1, out.String())
		}
	}
	if cmp.A[0].RunID == cmp.A[1].RunID {
		t.Fatal("rounds share a run id")
	}
}
