package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/bench"
)

// report is everything the markdown shows.
type report struct {
	date     time.Time
	commit   string
	machine  machine
	fsync    *probe
	fsType   string
	duration string
	warmup   string

	notes       []string
	runs        []*run
	ratios      []ratio
	attachments []attachment
	rounds      int // the highest round of any result
}

// machine describes the computer the report was made on.
type machine struct {
	cpu       string
	cores     int
	goVersion string
}

// probe is the output of fsyncprobe --json.
type probe struct {
	Iterations int     `json:"iterations"`
	Size       int     `json:"size"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
}

// run is one broker and scenario, measured once per round.
type run struct {
	name   string
	desc   string
	rounds map[int]*outcome
}

// outcome is one measurement: a result, or why there is none.
type outcome struct {
	res *bench.Result
	err string
}

// ratio is the throughput of run num over that of run den.
type ratio struct {
	num, den string
	goal     float64 // 0: none
	metric   metric
}

// metric is what a ratio compares.
type metric string

const (
	// throughput: msgs/s, higher is better.
	throughput metric = ""
	// cpuPerMsg: the broker's CPU per message, lower is better.
	cpuPerMsg metric = "cpu"
	// puback99: PUBACK p99, lower is better.
	puback99 metric = "p99"
)

// of is the metric's value in res, false when res has none.
func (m metric) of(res *bench.Result) (float64, bool) {
	switch m {
	case cpuPerMsg:
		return res.BrokerCPUUsPerMsg, res.BrokerCPUUsPerMsg > 0
	case puback99:
		return res.PubAckP99Ms, res.PubAck.Count > 0 || res.PubAckP99Ms > 0
	}
	return *res.Throughput, true
}

// lowerIsBetter tells the direction of a goal.
func (m metric) lowerIsBetter() bool { return m != throughput }

// label names the metric in the ratios table.
func (m metric) label() string {
	switch m {
	case cpuPerMsg:
		return "CPU per message: "
	case puback99:
		return "PUBACK p99: "
	}
	return ""
}

// attachment is a file shown verbatim under Configuration.
type attachment struct {
	title, file, text string
}

func thisMachine() machine {
	return machine{
		cpu:       cpuModel(),
		cores:     runtime.NumCPU(),
		goVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// cpuModel is the first model name in /proc/cpuinfo.
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.Lines(string(data)) {
		key, value, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(key) == "model name" {
			return strings.Join(strings.Fields(value), " ")
		}
	}
	return "unknown CPU"
}

// parseRatio parses [cpu:|p99:]NUM/DEN[@GOAL].
func parseRatio(s string) (ratio, error) {
	var m metric
	for _, x := range []metric{cpuPerMsg, puback99} {
		if rest, ok := strings.CutPrefix(s, string(x)+":"); ok {
			m, s = x, rest
		}
	}
	pair, goal, hasGoal := strings.Cut(s, "@")
	num, den, ok := strings.Cut(pair, "/")
	if !ok || num == "" || den == "" {
		return ratio{}, fmt.Errorf("want NUM/DEN[@GOAL], got %q", s)
	}
	q := ratio{num: num, den: den, metric: m}
	if hasGoal {
		g, err := strconv.ParseFloat(goal, 64)
		if err != nil || g <= 0 {
			return ratio{}, fmt.Errorf("goal of %q: want a positive number", s)
		}
		q.goal = g
	}
	return q, nil
}

// parseResultName splits NAME-rROUND.json.
func parseResultName(path string) (name string, round int, err error) {
	base, ok := strings.CutSuffix(filepath.Base(path), ".json")
	i := strings.LastIndex(base, "-r")
	if ok && i > 0 {
		round, err = strconv.Atoi(base[i+2:])
		if err == nil && round > 0 {
			return base[:i], round, nil
		}
	}
	return "", 0, fmt.Errorf("result file %s: want NAME-rROUND.json", path)
}

func (r *report) run(name string) *run {
	for _, x := range r.runs {
		if x.name == name {
			return x
		}
	}
	return nil
}

// load reads fsyncprobe's output and the result files.
func (r *report) load(fsyncFile string, files []string) error {
	if fsyncFile != "" {
		data, err := os.ReadFile(fsyncFile)
		if err != nil {
			return err
		}
		r.fsync = new(probe)
		if err := json.Unmarshal(data, r.fsync); err != nil {
			return fmt.Errorf("%s: %w", fsyncFile, err)
		}
	}
	for _, file := range files {
		name, round, err := parseResultName(file)
		if err != nil {
			return err
		}
		x := r.run(name)
		if x == nil {
			return fmt.Errorf("result file %s: no -run %s", file, name)
		}
		x.rounds[round] = readOutcome(file)
		r.rounds = max(r.rounds, round)
	}
	for _, q := range r.ratios {
		for _, name := range []string{q.num, q.den} {
			if r.run(name) == nil {
				return fmt.Errorf("ratio %s/%s: no -run %s", q.num, q.den, name)
			}
		}
	}
	return nil
}

// readOutcome reads a result file; a file without a result yields the
// first line of the matching .err file as the reason.
func readOutcome(file string) *outcome {
	data, err := os.ReadFile(file)
	if err == nil {
		res := new(bench.Result)
		if json.Unmarshal(data, res) == nil && res.Scenario != "" {
			return &outcome{res: res}
		}
	}
	reason := "no result"
	errFile := strings.TrimSuffix(file, ".json") + ".err"
	if msg, err := os.ReadFile(errFile); err == nil {
		if line, _, _ := strings.Cut(strings.TrimSpace(string(msg)), "\n"); line != "" {
			reason = line
		}
	}
	return &outcome{err: reason}
}

func (o *outcome) valid() bool {
	return o != nil && o.res != nil && o.res.Valid && o.res.Throughput != nil
}

// ratioIn is num's metric over den's in round, or nil.
func (r *report) ratioIn(q ratio, round int) *float64 {
	a, b := r.run(q.num).rounds[round], r.run(q.den).rounds[round]
	if !a.valid() || !b.valid() {
		return nil
	}
	x, okA := q.metric.of(a.res)
	y, okB := q.metric.of(b.res)
	if !okA || !okB || y == 0 {
		return nil
	}
	v := x / y
	return &v
}

// medianOf is the median of f over the valid rounds of x.
func (r *report) medianOf(x *run, f func(*bench.Result) float64) *float64 {
	var vs []*float64
	for round := 1; round <= r.rounds; round++ {
		if o := x.rounds[round]; o.valid() {
			v := f(o.res)
			vs = append(vs, &v)
		}
	}
	return bench.Median(vs)
}

// write renders the report as markdown.
func (r *report) write(w io.Writer) error {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	p("# Benchmarks")
	p("")
	p("<!-- Written by `make bench-compare` (scripts/bench-compare.sh): run it again rather than editing. -->")
	p("")
	when := "Measured on " + r.date.Format("2006-01-02 15:04 MST")
	if r.commit != "" {
		when += ", shardq " + r.commit
	}
	p("%s, with `make bench-compare`.", when)
	p("")
	p("- **Machine:** %s, %d cores, %s; %s.", r.machine.cpu, r.machine.cores, r.machine.goVersion, r.fsyncText())
	p("- **Load:** %s", r.loadText())
	p("- **Figures:** msgs/s counts the messages received in the measured window; end to end (e2e) is from the send time in the payload to its receipt, PUBACK from publish to PUBACK, in ms. Every run also counts missing, duplicate and reordered messages; a run that lost messages has no throughput.")
	for _, n := range r.notes {
		p("- %s", n)
	}
	if ahead := r.outran(); len(ahead) > 0 {
		p("")
		p("> **Producers outran the consumer** in %s (medians of the valid rounds). A durable queue acknowledges a publish once it is stored, not once it is consumed, so the queue grew during these runs: their msgs/s is the rate the consumer received, and their e2e latency is mostly time spent in the queue, which grows with the duration. `BENCH_ARGS=\"--rate N\"` compares latencies at equal load.", strings.Join(ahead, "; "))
	}
	if bad := r.invalid(); len(bad) > 0 {
		p("")
		p("> **Invalid runs.** %s", strings.Join(bad, " "))
	}
	p("")
	p("| run | what |")
	p("| --- | --- |")
	for _, x := range r.runs {
		p("| `%s` | %s |", x.name, cell(x.desc))
	}

	if len(r.ratios) > 0 {
		p("")
		p("## Ratios")
		p("")
		p("Throughput of one run over another's in the same round, or, where named, the broker's CPU per message (user and system time of its process in the measured window over the messages measured) or the PUBACK p99; the median of the rounds.")
		p("")
		p("| ratio | median | per round | goal |")
		p("| --- | ---: | --- | --- |")
		for _, q := range r.ratios {
			p("| %s | %s |", r.ratioRow(q), r.goalText(q))
		}
	}

	p("")
	p("## Medians over the valid rounds")
	p("")
	p("| run | msgs/s | MB/s | e2e p50 | e2e p99 | e2e p99.9 | PUBACK p50 | PUBACK p99 | broker CPU µs/msg | valid rounds |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.runs {
		m := func(f func(*bench.Result) float64) *float64 { return r.medianOf(x, f) }
		valid := 0
		for _, o := range x.rounds {
			if o.valid() {
				valid++
			}
		}
		cpu := "-"
		if v := m(func(r *bench.Result) float64 { return r.BrokerCPUUsPerMsg }); v != nil && *v > 0 {
			cpu = fixed(v, 1)
		}
		p("| `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %d of %d |", x.name,
			thousands(m(func(r *bench.Result) float64 { return *r.Throughput })),
			fixed(m(func(r *bench.Result) float64 { return *r.MBPerS }), 2),
			latency(m(func(r *bench.Result) float64 { return r.E2EP50Ms })),
			latency(m(func(r *bench.Result) float64 { return r.E2EP99Ms })),
			latency(m(func(r *bench.Result) float64 { return r.E2EP999Ms })),
			latency(m(func(r *bench.Result) float64 { return r.PubAckP50Ms })),
			latency(m(func(r *bench.Result) float64 { return r.PubAckP99Ms })),
			cpu, valid, len(x.rounds))
	}

	p("")
	p("## Memory")
	p("")
	p("Each broker's peak resident memory (VmHWM) after each round. A broker runs every round, so a round's peak includes the rounds before it: equal figures mean it did not grow.")
	p("")
	hdr, sep := "| run |", "| --- |"
	for round := 1; round <= r.rounds; round++ {
		hdr += fmt.Sprintf(" round %d |", round)
		sep += " ---: |"
	}
	p("%s", hdr)
	p("%s", sep)
	for _, x := range r.runs {
		row := "| `" + x.name + "` |"
		for round := 1; round <= r.rounds; round++ {
			peak := "-"
			if o := x.rounds[round]; o != nil && o.res != nil {
				peak = rssText(o.res.RSSPeakKB)
			}
			row += " " + peak + " |"
		}
		p("%s", row)
	}

	for round := 1; round <= r.rounds; round++ {
		p("")
		p("## Round %d", round)
		p("")
		p("In the order the runs ran.")
		p("")
		p("| run | status | msgs/s | e2e p50 | e2e p99 | PUBACK p50 | PUBACK p99 | sent | received | missing | duplicates | redelivered | reordered | broker RSS |")
		p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, x := range r.runs {
			o := x.rounds[round]
			switch {
			case o == nil:
				continue
			case o.res == nil:
				p("| `%s` | **ERROR**: %s | | | | | | | | | | | | |", x.name, cell(o.err))
				continue
			}
			res := o.res
			p("| `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", x.name,
				statusText(res), thousands(res.Throughput),
				latency(&res.E2EP50Ms), latency(&res.E2EP99Ms), latency(&res.PubAckP50Ms), latency(&res.PubAckP99Ms),
				count(res.Sent), count(res.Received), count(res.Missing), count(res.Duplicates),
				count(res.Redeliveries), count(res.Reordered), rssText(res.RSSKB))
		}
	}

	if len(r.attachments) > 0 {
		p("")
		p("## Configuration")
		for _, a := range r.attachments {
			p("")
			p("%s:", a.title)
			p("")
			p("```%s", fenceLanguage(a.file))
			b.WriteString(strings.TrimRight(a.text, "\n"))
			p("")
			p("```")
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

func (r *report) fsyncText() string {
	if r.fsync == nil {
		return "disk fsync not measured"
	}
	on := ""
	if r.fsType != "" {
		on = r.fsType + ", "
	}
	return fmt.Sprintf("disk fsync p50 %.0f µs, p99 %.0f µs (%s%d × %s append+fdatasync in the brokers' data directory)",
		r.fsync.P50us, r.fsync.P99us, on, r.fsync.Iterations, sizeText(r.fsync.Size))
}

// loadText describes the load of the first result, and names the runs
// whose load differs from it.
func (r *report) loadText() string {
	var first *bench.Result
	var differ []string
	for _, x := range r.runs {
		// A run whose rounds all had the same other load is named once,
		// with it; otherwise each round that differs is.
		var loads []string
		var rounds []int
		n := 0
		for round := 1; round <= r.rounds; round++ {
			o := x.rounds[round]
			if o == nil || o.res == nil {
				continue
			}
			n++
			if first == nil {
				first = o.res
			} else if l := loadOf(o.res); l != loadOf(first) {
				loads, rounds = append(loads, l), append(rounds, round)
			}
		}
		switch {
		case len(loads) == 0:
		case len(loads) == n && !slices.ContainsFunc(loads, func(l string) bool { return l != loads[0] }):
			differ = append(differ, fmt.Sprintf("`%s` (%s)", x.name, loads[0]))
		default:
			for i, l := range loads {
				differ = append(differ, fmt.Sprintf("`%s` round %d (%s)", x.name, rounds[i], l))
			}
		}
	}
	if first == nil {
		return "no results."
	}
	s := fmt.Sprintf("`shardq bench` on the same machine, over TCP to 127.0.0.1: %s", loadOf(first))
	if r.duration != "" {
		s += fmt.Sprintf("; %s measured after a %s warm-up", r.duration, r.warmup)
	}
	rounds := fmt.Sprintf("%d rounds, each running every broker once, in turn,", r.rounds)
	if r.rounds == 1 {
		rounds = "1 round, running every broker once, in turn;"
	}
	s += "; " + rounds + " since absolute numbers drift on a shared machine."
	if len(differ) > 0 {
		s += " Other loads: " + strings.Join(differ, "; ") + "."
	}
	return s
}

func loadOf(res *bench.Result) string {
	s := fmt.Sprintf("%d producers with %d QoS %d publishes in flight each, %d consumer", res.Producers, res.Window, res.QoS, res.Consumers)
	if res.Consumers != 1 {
		s += "s"
	}
	s += fmt.Sprintf(", %d-byte payloads, %d keys", res.Size, res.Keys)
	if res.Rate > 0 {
		s += fmt.Sprintf(", %s msgs/s in all", strconv.FormatFloat(res.Rate, 'f', -1, 64))
	}
	return s
}

// outran describes the runs whose producers published, on average over the
// whole run, more than 10% faster than the consumers received in the
// measured window: there a backlog built up. It needs the duration and the
// warm-up, and skips runs at a fixed rate.
func (r *report) outran() []string {
	duration, err1 := time.ParseDuration(r.duration)
	warmup, err2 := time.ParseDuration(r.warmup)
	if err1 != nil || err2 != nil || duration <= 0 {
		return nil
	}
	total := (duration + warmup).Seconds()
	var out []string
	for _, x := range r.runs {
		sent := r.medianOf(x, func(res *bench.Result) float64 {
			if res.Rate > 0 || res.Consumers == 0 {
				return 0
			}
			return float64(res.Sent) / total
		})
		got := r.medianOf(x, func(res *bench.Result) float64 { return *res.Throughput })
		if sent != nil && got != nil && *sent > 1.1**got {
			out = append(out, fmt.Sprintf("`%s`, whose producers published %s msgs/s and whose consumer received %s", x.name, thousands(sent), thousands(got)))
		}
	}
	return out
}

// invalid describes every run that has no throughput.
func (r *report) invalid() []string {
	var out []string
	for _, x := range r.runs {
		for round := 1; round <= r.rounds; round++ {
			o := x.rounds[round]
			if o == nil || o.valid() {
				continue
			}
			what := "ERROR: " + o.err
			if o.res != nil {
				what = statusText(o.res)
				if len(o.res.MissingSample) > 0 {
					what += ", first missing " + strings.Join(o.res.MissingSample, " ")
				}
			}
			out = append(out, fmt.Sprintf("`%s` round %d: %s.", x.name, round, what))
		}
	}
	return out
}

func (r *report) ratioRow(q ratio) string {
	var per []*float64
	var cells []string
	for round := 1; round <= r.rounds; round++ {
		v := r.ratioIn(q, round)
		per = append(per, v)
		cells = append(cells, fixed(v, 2))
	}
	m := bench.Median(per)
	med := "-"
	if m != nil {
		med = "**" + fixed(m, 2) + "**"
	}
	return fmt.Sprintf("%s`%s` / `%s` | %s | %s", q.metric.label(), q.num, q.den, med, strings.Join(cells, ", "))
}

func (r *report) goalText(q ratio) string {
	if q.goal == 0 {
		return ""
	}
	cmp := "≥ "
	if q.metric.lowerIsBetter() {
		cmp = "≤ "
	}
	goal := cmp + strconv.FormatFloat(q.goal, 'f', -1, 64)
	var per []*float64
	for round := 1; round <= r.rounds; round++ {
		per = append(per, r.ratioIn(q, round))
	}
	switch m := bench.Median(per); {
	case m == nil:
		return goal
	case !q.metric.lowerIsBetter() && *m >= q.goal, q.metric.lowerIsBetter() && *m <= q.goal:
		return goal + ", met"
	case q.metric.lowerIsBetter():
		return fmt.Sprintf("%s, not met (%.2f times it)", goal, *m/q.goal)
	default:
		return fmt.Sprintf("%s, not met (%.0f%% of it)", goal, 100**m/q.goal)
	}
}

func statusText(res *bench.Result) string {
	s := res.Status
	switch res.Status {
	case bench.StatusOK:
	case bench.StatusLoss:
		s = fmt.Sprintf("**LOSS**: %s acknowledged messages never arrived", count(res.Missing))
	case bench.StatusReorder:
		s = fmt.Sprintf("**REORDER**: %s messages before an older one of their key", count(res.Reordered))
	default:
		s = "**" + s + "**"
	}
	if res.Unacked > 0 || res.Rejected > 0 {
		s += fmt.Sprintf(" (%s unacked, %s rejected)", count(res.Unacked), count(res.Rejected))
	}
	return s
}

// cell makes s safe inside a table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

func fixed(v *float64, prec int) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', prec, 64)
}

// latency formats milliseconds; 0 means nothing was measured.
func latency(ms *float64) string {
	if ms == nil || *ms == 0 {
		return "-"
	}
	return fixed(ms, 3)
}

func thousands(v *float64) string {
	if v == nil {
		return "-"
	}
	return count(int64(*v + 0.5))
}

func rssText(kb int64) string {
	if kb == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(kb)/1024, 'f', 0, 64) + " MB"
}

func sizeText(n int) string {
	if n%1024 == 0 {
		return strconv.Itoa(n/1024) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// count formats n with thousands separators.
func count(n int64) string {
	if n < 0 {
		return "-" + count(-n)
	}
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fenceLanguage(file string) string {
	switch filepath.Ext(file) {
	case ".yaml", ".yml":
		return "yaml"
	case ".conf":
		return "text"
	}
	return ""
}
