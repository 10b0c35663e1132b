package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardq/shardq/bench"
)

func TestReportParseResultName(t *testing.T) {
	for _, tc := range []struct {
		file  string
		name  string
		round int
		ok    bool
	}{
		{"mochi-r1.json", "mochi", 1, true},
		{"/tmp/x/shardq-key-r12.json", "shardq-key", 12, true},
		{"mochi-r0.json", "", 0, false},
		{"mochi.json", "", 0, false},
		{"-r1.json", "", 0, false},
		{"mochi-r1.err", "", 0, false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			name, round, err := parseResultName(tc.file)
			if (err == nil) != tc.ok || name != tc.name || round != tc.round {
				t.Errorf("parseResultName(%q) = %q, %d, %v; want %q, %d, ok %t", tc.file, name, round, err, tc.name, tc.round, tc.ok)
			}
		})
	}
}

func TestReportParseRatio(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ratio
		ok   bool
	}{
		{"a/b", ratio{num: "a", den: "b"}, true},
		{"shardq-none/mochi@0.9", ratio{num: "shardq-none", den: "mochi", goal: 0.9}, true},
		{"cpu:a/b@1.5", ratio{num: "a", den: "b", goal: 1.5, metric: cpuPerMsg}, true},
		{"p99:a/b", ratio{num: "a", den: "b", metric: puback99}, true},
		{"a/b@x", ratio{}, false},
		{"a/b@0", ratio{}, false},
		{"a", ratio{}, false},
		{"/b", ratio{}, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseRatio(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("parseRatio(%q) = %+v, %v; want %+v, ok %t", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

// writeResult writes a result file as shardq bench --json does.
func writeResult(t *testing.T, dir, file string, res *bench.Result) string {
	t.Helper()
	path := filepath.Join(dir, file)
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func valid(scenario string, tp, e2eP99 float64) *bench.Result {
	mb := tp * 64 / 1e6
	return &bench.Result{
		Scenario: scenario, Valid: true, Status: bench.StatusOK,
		Throughput: &tp, MBPerS: &mb, E2EP50Ms: 1, E2EP99Ms: e2eP99, PubAckP50Ms: 0.5, PubAckP99Ms: 2,
		Producers: 4, Consumers: 1, Size: 64, QoS: 1, Window: 64, Keys: 64,
		Tally: bench.Tally{Sent: 1000, Acked: 1000, Received: 1000},
	}
}

// TestReportRatiosSkipInvalidRounds checks that a lossy run or a failed
// one is shown as such, takes no part in the ratios, and that the median
// is over the remaining rounds.
func TestReportRatiosSkipInvalidRounds(t *testing.T) {
	dir := t.TempDir()
	loss := valid("cycle", 0, 0)
	loss.Valid, loss.Status, loss.Throughput, loss.MBPerS = false, bench.StatusLoss, nil, nil
	loss.Missing, loss.MissingSample = 3, []string{"p0/17"}
	first, third := valid("cycle", 40000, 4), valid("cycle", 36000, 5)
	first.RSSPeakKB, third.RSSPeakKB = 80<<10, 95<<10
	first.BrokerCPUUsPerMsg, third.BrokerCPUUsPerMsg = 12, 14
	mochi := func(tp float64) *bench.Result {
		res := valid("pubsub", tp, 3)
		res.BrokerCPUUsPerMsg = 10
		return res
	}
	files := []string{
		writeResult(t, dir, "mochi-r1.json", mochi(50000)),
		writeResult(t, dir, "shardq-r1.json", first),
		writeResult(t, dir, "mochi-r2.json", mochi(40000)),
		writeResult(t, dir, "shardq-r2.json", loss),
		writeResult(t, dir, "mochi-r3.json", mochi(40000)),
		writeResult(t, dir, "shardq-r3.json", third),
		filepath.Join(dir, "shardq-r4.json"), // the run failed: no result
		writeResult(t, dir, "mochi-r4.json", mochi(40000)),
	}
	if err := os.WriteFile(filepath.Join(dir, "shardq-r4.err"), []byte("bench: connection lost\nmore\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := &report{machine: machine{cpu: "test CPU", cores: 2, goVersion: "go"}}
	r.runs = []*run{
		{name: "mochi", desc: "vanilla mochi", rounds: map[int]*outcome{}},
		{name: "shardq", desc: "shardq cycle", rounds: map[int]*outcome{}},
	}
	r.ratios = []ratio{{num: "shardq", den: "mochi", goal: 0.9},
		{num: "shardq", den: "mochi", goal: 1.2, metric: cpuPerMsg},
		{num: "shardq", den: "mochi", goal: 1.5, metric: puback99}}
	if err := r.load("", files); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| `shardq` / `mochi` | **0.85** | 0.80, -, 0.90, - | ≥ 0.9, not met (94% of it) |",
		"`shardq` round 2: **LOSS**: 3 acknowledged messages never arrived, first missing p0/17.",
		"`shardq` round 4: ERROR: bench: connection lost.",
		"| CPU per message: `shardq` / `mochi` | **1.30** | 1.20, -, 1.40, - | ≤ 1.2, not met (1.08 times it) |",
		"| PUBACK p99: `shardq` / `mochi` | **1.00** | 1.00, -, 1.00, - | ≤ 1.5, met |",
		"| `shardq` | 38,000 | 2.43 | 1.000 | 4.500 | - | 0.500 | 2.000 | 13.0 | 2 of 4 |",
		"| `mochi` | 40,000 | 2.56 | 1.000 | 3.000 | - | 0.500 | 2.000 | 10.0 | 4 of 4 |",
		"4 producers with 64 QoS 1 publishes in flight each, 1 consumer, 64-byte payloads, 64 keys",
		"| `shardq` | **ERROR**: bench: connection lost |",
		"| `shardq` | 80 MB | - | 95 MB | - |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestReportUnknownRun(t *testing.T) {
	dir := t.TempDir()
	file := writeResult(t, dir, "other-r1.json", valid("pubsub", 1, 1))
	r := &report{runs: []*run{{name: "mochi", rounds: map[int]*outcome{}}}}
	if err := r.load("", []string{file}); err == nil {
		t.Error("load accepted a result of a run not given with -run")
	}
}

// TestReportProducersOutran checks that a run whose producers published
// faster than its consumer received is pointed out, and one that kept up
// is not.
func TestReportProducersOutran(t *testing.T) {
	dir := t.TempDir()
	keptUp := valid("pubsub", 10000, 3)
	keptUp.Sent = 60000 // 6 s at 10,000/s
	behind := valid("cycle", 10000, 900)
	behind.Sent = 120000 // 20,000/s
	files := []string{
		writeResult(t, dir, "mochi-r1.json", keptUp),
		writeResult(t, dir, "shardq-r1.json", behind),
	}
	r := &report{duration: "5s", warmup: "1s"}
	r.runs = []*run{
		{name: "mochi", rounds: map[int]*outcome{}},
		{name: "shardq", rounds: map[int]*outcome{}},
	}
	if err := r.load("", files); err != nil {
		t.Fatal(err)
	}
	got := r.outran()
	want := []string{"`shardq`, whose producers published 20,000 msgs/s and whose consumer received 10,000"}
	if !slices.Equal(got, want) {
		t.Errorf("outran() = %q, want %q", got, want)
	}
}

// TestReportOtherLoads: a run whose every round had another load than
// the first run's is named once, with that load; a run whose rounds
// differ among themselves is named by round.
func TestReportOtherLoads(t *testing.T) {
	dir := t.TempDir()
	at := func(rate float64) *bench.Result {
		res := valid("pubsub", 1000, 3)
		res.Rate = rate
		return res
	}
	r := &report{rounds: 2, runs: []*run{
		{name: "mochi", rounds: map[int]*outcome{}},
		{name: "mochi-10k", rounds: map[int]*outcome{}},
		{name: "odd", rounds: map[int]*outcome{}},
	}}
	files := []string{
		writeResult(t, dir, "mochi-r1.json", at(0)),
		writeResult(t, dir, "mochi-r2.json", at(0)),
		writeResult(t, dir, "mochi-10k-r1.json", at(10000)),
		writeResult(t, dir, "mochi-10k-r2.json", at(10000)),
		writeResult(t, dir, "odd-r1.json", at(0)),
		writeResult(t, dir, "odd-r2.json", at(500)),
	}
	if err := r.load("", files); err != nil {
		t.Fatal(err)
	}
	got := r.loadText()
	want := " Other loads: `mochi-10k` (4 producers with 64 QoS 1 publishes in flight each, 1 consumer, 64-byte payloads, 64 keys, 10000 msgs/s in all); `odd` round 2 (4 producers with 64 QoS 1 publishes in flight each, 1 consumer, 64-byte payloads, 64 keys, 500 msgs/s in all)."
	if !strings.HasSuffix(got, want) {
		t.Fatalf("load text\n%s\nwant it to end with\n%s", got, want)
	}
}
