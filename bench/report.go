package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Result statuses. Only StatusOK results are valid and carry a throughput.
const (
	StatusOK      = "OK"
	StatusLoss    = "LOSS"    // acknowledged messages never arrived
	StatusReorder = "REORDER" // per-key reordering, with Config.OrderingCheck
	StatusNoData  = "NO DATA" // nothing was measured (warm-up longer than the run?)
)

// Result is the outcome of one Run. Counts cover the whole run, warm-up
// included; throughput and latencies cover the measurement window only.
type Result struct {
	Scenario string `json:"scenario"`
	Broker   string `json:"broker"`
	RunID    string `json:"run_id"`
	Round    int    `json:"round,omitempty"`

	Valid  bool   `json:"valid"`
	Status string `json:"status"`
	// Throughput is nil unless Valid: a lossy run has no throughput.
	Throughput    *float64 `json:"throughput_msgs_per_s"`
	MBPerS        *float64 `json:"throughput_mb_per_s"`
	Measured      int64    `json:"measured"` // events counted for the throughput
	WindowSeconds float64  `json:"window_s"`
	// Drained: every acknowledged message arrived before the drain bound.
	Drained bool `json:"drained"`

	Tally
	Unacked          int64    `json:"unacked"`
	MissingSample    []string `json:"missing_sample,omitempty"`
	LastRejectReason string   `json:"last_reject_reason,omitempty"`

	PubAck        LatencySummary `json:"-"`
	E2E           LatencySummary `json:"-"`
	PubAckP50Ms   float64        `json:"puback_p50_ms"`
	PubAckP90Ms   float64        `json:"puback_p90_ms"`
	PubAckP99Ms   float64        `json:"puback_p99_ms"`
	PubAckP999Ms  float64        `json:"puback_p999_ms"`
	PubAckMaxMs   float64        `json:"puback_max_ms"`
	E2EP50Ms      float64        `json:"e2e_p50_ms"`
	E2EP90Ms      float64        `json:"e2e_p90_ms"`
	E2EP99Ms      float64        `json:"e2e_p99_ms"`
	E2EP999Ms     float64        `json:"e2e_p999_ms"`
	E2EMaxMs      float64        `json:"e2e_max_ms"`
	FillMsgsPerS  float64        `json:"fill_msgs_per_s,omitempty"`
	DrainMsgsPerS float64        `json:"drain_msgs_per_s,omitempty"`

	RSSAfterFillKB int64 `json:"rss_after_fill_kb,omitempty"`
	RSSKB          int64 `json:"rss_kb,omitempty"`
	RSSPeakKB      int64 `json:"rss_peak_kb,omitempty"`
	// BrokerCPUUsPerMsg is the CPU time (user and system) the broker's
	// process used in the measured window per message measured, and
	// BrokerCores that time over the window: with --broker-pid, on Linux.
	BrokerCPUUsPerMsg float64 `json:"broker_cpu_us_per_msg,omitempty"`
	BrokerCores       float64 `json:"broker_cores,omitempty"`

	Producers int     `json:"producers"`
	Consumers int     `json:"consumers"`
	Size      int     `json:"size"`
	QoS       byte    `json:"qos"`
	Window    int     `json:"window"`
	Rate      float64 `json:"rate"`
	Keys      int     `json:"keys"`
}

func (r *Result) setLatencies(puback, e2e LatencySummary) {
	r.PubAck, r.E2E = puback, e2e
	r.PubAckP50Ms, r.PubAckP90Ms, r.PubAckP99Ms = ms(puback.P50), ms(puback.P90), ms(puback.P99)
	r.PubAckP999Ms, r.PubAckMaxMs = ms(puback.P999), ms(puback.Max)
	r.E2EP50Ms, r.E2EP90Ms, r.E2EP99Ms = ms(e2e.P50), ms(e2e.P90), ms(e2e.P99)
	r.E2EP999Ms, r.E2EMaxMs = ms(e2e.P999), ms(e2e.Max)
}

// headlineP99 is the latency a comparison shows: end to end, or PUBACK
// where nothing is consumed.
func (r *Result) headlineP99() (string, float64) {
	if r.Scenario == string(ScenarioProduce) {
		return "puback p99", r.PubAckP99Ms
	}
	return "e2e p99", r.E2EP99Ms
}

// WriteText writes the result as a table.
func (r *Result) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "%s against %s (run %s): producers %d, consumers %d, size %d B, qos %d, window %d, keys %d, rate %s\n",
		r.Scenario, r.Broker, r.RunID, r.Producers, r.Consumers, r.Size, r.QoS, r.Window, r.Keys, rateText(r.Rate)); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format+"\n", args...) }
	switch r.Status {
	case StatusLoss:
		p("status\t%s: %d acknowledged messages never arrived (first: %s)", r.Status, r.Missing, strings.Join(r.MissingSample, " "))
	case StatusReorder:
		p("status\t%s: %d messages arrived before an older message of their key", r.Status, r.Reordered)
	default:
		p("status\t%s", r.Status)
	}
	if r.Throughput != nil {
		p("throughput\t%s msgs/s  %.2f MB/s  (%s in %.1f s)", count(int64(*r.Throughput)), *r.MBPerS, count(r.Measured), r.WindowSeconds)
	} else {
		p("throughput\tnot reported: the run is not valid")
	}
	if r.Scenario == string(ScenarioBacklog) {
		p("backlog\tfill %s msgs/s  drain %s msgs/s", count(int64(r.FillMsgsPerS)), count(int64(r.DrainMsgsPerS)))
	}
	if r.RSSKB > 0 {
		mem := fmt.Sprintf("%s MB now, peak %s MB", mb(r.RSSKB), mb(r.RSSPeakKB))
		if r.RSSAfterFillKB > 0 {
			mem = fmt.Sprintf("%s MB after fill, %s", mb(r.RSSAfterFillKB), mem)
		}
		p("broker RSS\t%s", mem)
	}
	if r.BrokerCPUUsPerMsg > 0 {
		p("broker CPU\t%.1f µs/msg  (%.2f cores)", r.BrokerCPUUsPerMsg, r.BrokerCores)
	}
	p("latency (ms)\tp50\tp90\tp99\tp99.9\tmax\tcount")
	if r.PubAck.Count > 0 {
		p("  puback\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%d", r.PubAckP50Ms, r.PubAckP90Ms, r.PubAckP99Ms, r.PubAckP999Ms, r.PubAckMaxMs, r.PubAck.Count)
	}
	if r.E2E.Count > 0 {
		p("  e2e\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%d", r.E2EP50Ms, r.E2EP90Ms, r.E2EP99Ms, r.E2EP999Ms, r.E2EMaxMs, r.E2E.Count)
	}
	p("messages\tsent %s  acked %s  received %s  missing %s", count(r.Sent), count(r.Acked), count(r.Received), count(r.Missing))
	p("\tduplicates %s  redelivered %s  reordered %s", count(r.Duplicates), count(r.Redeliveries), count(r.Reordered))
	if r.Rejected > 0 || r.Unacked > 0 || r.Foreign > 0 || !r.Drained {
		rejected := count(r.Rejected)
		if r.LastRejectReason != "" {
			rejected += " (last reason " + r.LastRejectReason + ")"
		}
		p("\trejected %s  unacked %s  foreign %s  drained %t", rejected, count(r.Unacked), count(r.Foreign), r.Drained)
	}
	return tw.Flush()
}

// Comparison is a run of the same scenario against two brokers, A and B,
// alternating A, B, A, B... so that drift (thermal, page cache, other load)
// hits both alike.
type Comparison struct {
	A      []*Result  `json:"a"`
	B      []*Result  `json:"b"`
	Ratios []*float64 `json:"ratios"` // A/B throughput per round; null where either run is invalid
	// RatioMedian is the median of the non-null ratios, null if there is none.
	RatioMedian *float64 `json:"ratio_median"`
}

// CompareOptions tunes Compare.
type CompareOptions struct {
	// Rounds is the number of A,B pairs; at least 1.
	Rounds int
	// OnResult, when set, is called after every run.
	OnResult func(side string, round int, r *Result)
}

// Compare runs a and b alternately, opts.Rounds times each. It stops at
// the first run that fails with an error.
func Compare(ctx context.Context, a, b Config, opts CompareOptions) (*Comparison, error) {
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("%w: rounds %d: want at least 1", ErrInvalidConfig, opts.Rounds)
	}
	c := &Comparison{}
	for round := 1; round <= opts.Rounds; round++ {
		for _, side := range []struct {
			name string
			cfg  Config
			out  *[]*Result
		}{{"A", a, &c.A}, {"B", b, &c.B}} {
			res, err := Run(ctx, side.cfg)
			if err != nil {
				return c, fmt.Errorf("round %d, %s (%s): %w", round, side.name, side.cfg.Broker, err)
			}
			res.Round = round
			*side.out = append(*side.out, res)
			if opts.OnResult != nil {
				opts.OnResult(side.name, round, res)
			}
		}
		c.Ratios = append(c.Ratios, ratio(c.A[round-1], c.B[round-1]))
	}
	c.RatioMedian = Median(c.Ratios)
	return c, nil
}

func ratio(a, b *Result) *float64 {
	if a.Throughput == nil || b.Throughput == nil || *b.Throughput == 0 {
		return nil
	}
	r := *a.Throughput / *b.Throughput
	return &r
}

// Median is the median of the non-nil values, or nil when there are none.
func Median(vs []*float64) *float64 {
	var s []float64
	for _, v := range vs {
		if v != nil {
			s = append(s, *v)
		}
	}
	if len(s) == 0 {
		return nil
	}
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &m
}

// WriteText writes one line per round and the median ratio.
func (c *Comparison) WriteText(w io.Writer) error {
	if len(c.A) == 0 {
		return nil
	}
	label, _ := c.A[0].headlineP99()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "round\tA msgs/s\tA %s ms\tB msgs/s\tB %s ms\tA/B\t\n", label, label)
	for i := range c.A {
		fmt.Fprintf(tw, "%d\t%s\t%s\t", i+1, throughputText(c.A[i]), p99Text(c.A[i]))
		if i < len(c.B) {
			fmt.Fprintf(tw, "%s\t%s\t", throughputText(c.B[i]), p99Text(c.B[i]))
		}
		if i < len(c.Ratios) {
			fmt.Fprintf(tw, "%s\t", ratioText(c.Ratios[i]))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b := "-"
	if len(c.B) > 0 {
		b = c.B[0].Broker
	}
	_, err := fmt.Fprintf(w, "median A/B %s   (A = %s, B = %s, %s)\n", ratioText(c.RatioMedian), c.A[0].Broker, b, c.A[0].Scenario)
	return err
}

func throughputText(r *Result) string {
	if r.Throughput == nil {
		return r.Status
	}
	return count(int64(*r.Throughput))
}

func p99Text(r *Result) string {
	_, v := r.headlineP99()
	return strconv.FormatFloat(v, 'f', 3, 64)
}

func ratioText(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 3, 64)
}

func rateText(r float64) string {
	if r == 0 {
		return "unlimited"
	}
	return count(int64(r)) + "/s"
}

func mb(kb int64) string {
	return strconv.FormatFloat(float64(kb)/1024, 'f', 1, 64)
}

// count formats n with thousands separators.
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
