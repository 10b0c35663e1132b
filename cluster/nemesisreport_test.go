package cluster_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	hist "github.com/shardq/shardq/internal/history"
)

// What a nemesis run measured and found, as Markdown (docs/FAULTS.md).

// stallAt is how long a partition goes without an acknowledged publish
// before a fault counts it as stalled.
const stallAt = time.Second

// measureResume sets each fault's Resume and Stalled from the
// acknowledgements in h: per partition (parts maps keys to partitions),
// the longest time without one from the fault's start until the cluster
// recovered, counting up to the first one after. It counts Unknown too.
func measureResume(faults []*fault, h hist.History, parts map[string]int) {
	acks := map[int][]time.Time{}
	var last time.Time
	for _, p := range h.Publishes {
		if p.Unknown() {
			for _, f := range faults {
				if !p.Sent.Before(f.Start) && (f.Recovered.IsZero() || p.Sent.Before(f.Recovered)) {
					f.Unknown++
				}
			}
		}
		if p.Answer != hist.Acked {
			continue
		}
		if part, ok := parts[p.Key]; ok {
			acks[part] = append(acks[part], p.Answered)
		}
		if p.Answered.After(last) {
			last = p.Answered
		}
	}
	for _, ts := range acks {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	}
	for _, f := range faults {
		to := f.Recovered
		if to.IsZero() {
			to = last
		}
		for _, ts := range acks {
			gap := longestGap(ts, f.Start, to)
			f.Resume = max(f.Resume, gap)
			if gap >= stallAt {
				f.Stalled++
			}
		}
	}
}

// longestGap is the longest time between from, the acknowledgements ts
// (sorted) after it, and the first one after to.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	i := sort.Search(len(ts), func(i int) bool { return ts[i].After(from) })
	prev, longest := from, time.Duration(0)
	for ; i < len(ts); i++ {
		longest = max(longest, ts[i].Sub(prev))
		if ts[i].After(to) {
			return longest
		}
		prev = ts[i]
	}
	return max(longest, to.Sub(prev))
}

// chaosReport is a nemesis run's report: every cycle's faults and
// history checks.
type chaosReport struct {
	cfg    nemesisConfig
	began  time.Time
	took   time.Duration
	cycles int
	faults []*fault
	sum    hist.Summary
	// violations are the Markdown reports of the cycles with violations.
	violations []string
	earlier    int // deliveries of an earlier cycle's messages
	ackedAgain int // redeliveries of a stored message its consumer had acked
	// deadAfterAck counts the messages dead-lettered although a consumer
	// of the group had acknowledged them.
	deadAfterAck int
}

// deadAfterAck counts the messages delivered from the dead-letter queue
// that a consumer had acknowledged from the queue before.
func deadAfterAck(h hist.History) int {
	acked := map[string]bool{}
	for _, s := range h.Settlements {
		if s.Outcome == hist.Ack && !s.DLQ {
			acked[s.ID] = true
		}
	}
	dead := map[string]bool{}
	for _, d := range h.Deliveries {
		if d.DLQ && acked[d.ID] {
			dead[d.ID] = true
		}
	}
	return len(dead)
}

// ackedAgain counts the redeliveries of a stored message (one msg-id)
// after a consumer of the group had acknowledged an earlier delivery of
// it: the broker lost that ack. At-least-once allows it; a settled
// message should not come back.
func ackedAgain(h hist.History) int {
	type copyKey struct{ id, msgID string }
	acks := map[copyKey][]time.Time{}
	for _, s := range h.Settlements {
		if s.Outcome == hist.Ack && !s.DLQ && s.MsgID != "" {
			k := copyKey{s.ID, s.MsgID}
			acks[k] = append(acks[k], s.At)
		}
	}
	n := 0
	for _, d := range h.Deliveries {
		if d.DLQ || d.MsgID == "" {
			continue
		}
		for _, at := range acks[copyKey{d.ID, d.MsgID}] {
			if at.Before(d.At) {
				n++
				break
			}
		}
	}
	return n
}

func newChaosReport(cfg nemesisConfig) *chaosReport {
	return &chaosReport{cfg: cfg, began: time.Now()}
}

// add counts one cycle.
func (r *chaosReport) add(cycle int, faults []*fault, h hist.History, rep hist.Report, w *workload) {
	r.cycles++
	r.ackedAgain += ackedAgain(h)
	r.deadAfterAck += deadAfterAck(h)
	r.faults = append(r.faults, faults...)
	w.mu.Lock()
	r.earlier += w.earlier
	w.mu.Unlock()
	s, t := &r.sum, rep.Summary
	s.Publishes += t.Publishes
	s.Refused += t.Refused
	s.Unknown += t.Unknown
	s.Acknowledged += t.Acknowledged
	s.Delivered += t.Delivered
	s.Deliveries += t.Deliveries
	s.Redeliveries += t.Redeliveries
	s.DeadLettered += t.DeadLettered
	s.Lost += t.Lost
	s.Duplicates += t.Duplicates
	s.WithoutDUP += t.WithoutDUP
	s.Reordered += t.Reordered
	s.LeaseOverlaps += t.LeaseOverlaps
	s.Vanished += t.Vanished
	s.Orphans += t.Orphans
	s.Unexpected += t.Unexpected
	for cause, n := range t.ExplainedDuplicates {
		if s.ExplainedDuplicates == nil {
			s.ExplainedDuplicates = map[string]int{}
		}
		s.ExplainedDuplicates[cause] += n
	}
	if !rep.OK() {
		r.violations = append(r.violations, fmt.Sprintf("### Cycle %d\n\n%s", cycle, rep.Markdown()))
	}
}

// markdown renders the report.
func (r *chaosReport) markdown() string {
	var b strings.Builder
	s := r.sum
	b.WriteString("# Fault tests\n\n")
	fmt.Fprintf(&b, "`%s` ran TestNemesis (cluster/nemesis_test.go) for %s from %s.\n\n",
		r.cfg.command, r.took.Round(time.Second), r.began.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- Machine: %s\n", machine())
	fmt.Fprintf(&b, "- Code: %s\n", r.cfg.code)
	fmt.Fprintf(&b, "- Seed: %d (`SHARDQ_CHAOS_SEED=%d` repeats the schedule of faults, not the timing)\n", r.cfg.seed, r.cfg.seed)
	fmt.Fprintf(&b, "- Cluster: three nodes and etcd, each in a network namespace of its own; `$queue/%s`, 8 partitions, "+
		"replication factor 3, ack_policy quorum\n", loadQueue)
	fmt.Fprintf(&b, "- Load: a producer (QoS 1, %d keys, one publish at a time per key, %d publishes/s over all) and a "+
		"consumer of group %s on each node; an unknown outcome is published again, up to %d attempts\n",
		r.cfg.keys, r.cfg.rate, loadGroup, publishAttempts)
	fmt.Fprintf(&b, "- Cycles: %d, each of up to %d faults of 2 to 8 s, healed, the cluster recovered before the next; "+
		"then the queue drained and the history checked\n\n", r.cycles, r.cfg.faults)

	verdict := "**OK**: no violation"
	if n := s.Lost + s.Duplicates + s.WithoutDUP + s.Reordered + s.LeaseOverlaps + s.Vanished + s.Orphans + s.Unexpected; n > 0 {
		verdict = fmt.Sprintf("**%d violations**", n)
		if n == 1 {
			verdict = "**1 violation**"
		}
	}
	unrecovered := 0
	for _, f := range r.faults {
		if f.Err != "" {
			unrecovered++
		}
	}
	if unrecovered > 0 {
		verdict += fmt.Sprintf(", **%d faults the cluster did not recover from or that failed**", unrecovered)
	}
	fmt.Fprintf(&b, "## Result\n\n%s.\n\n", verdict)
	causes := "none"
	if len(s.ExplainedDuplicates) > 0 {
		var cs []string
		for _, cause := range slices.Sorted(maps.Keys(s.ExplainedDuplicates)) {
			cs = append(cs, fmt.Sprintf("%s: %d", cause, s.ExplainedDuplicates[cause]))
		}
		causes = strings.Join(cs, ", ")
	}
	b.WriteString("| what | count |\n| --- | --- |\n")
	for _, row := range [][2]string{
		{"publish attempts", fmt.Sprintf("%d (refused %d, outcome unknown %d)", s.Publishes, s.Refused, s.Unknown)},
		{"acknowledged", fmt.Sprint(s.Acknowledged)},
		{"delivered", fmt.Sprintf("%d (%d deliveries, %d redeliveries)", s.Delivered, s.Deliveries, s.Redeliveries)},
		{"dead-lettered", fmt.Sprintf("%d (%d of them acknowledged by a consumer before)", s.DeadLettered, r.deadAfterAck)},
		{"lost", fmt.Sprint(s.Lost)},
		{"duplicates without a cause", fmt.Sprint(s.Duplicates)},
		{"duplicates explained, by cause", causes},
		{"redelivered without DUP", fmt.Sprint(s.WithoutDUP)},
		{"redelivered after an ack (allowed, at least once)", fmt.Sprint(r.ackedAgain)},
		{"order violations", fmt.Sprint(s.Reordered)},
		{"lease overlaps", fmt.Sprint(s.LeaseOverlaps)},
		{"vanished, orphan and unexpected dead letters or deliveries", fmt.Sprint(s.Vanished + s.Orphans + s.Unexpected)},
	} {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], row[1])
	}

	b.WriteString("\n## Faults\n\n")
	b.WriteString("Resume: from the fault's start, the longest a partition went without an acknowledged publish, " +
		"until the cluster had recovered from it (every node ready, every partition owned, every producer acknowledged " +
		"again). A fault that stalls nothing shows the ordinary gap between two acknowledgements of a partition. " +
		"SPEC section 7 sets the bounds: a new leader within 2 s (p99); while etcd is unreachable, partitions with " +
		"replication factor 3 keep taking writes; producers on healthy nodes see a slower PUBACK, not 0x83.\n\n")
	b.WriteString("| kind | applied | resume p50 | resume p99 | resume max | partitions stalled 1 s or more (sum) | " +
		"answered 0x83 or not at all (sum) | not recovered |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	byKind := map[string][]*fault{}
	for _, f := range r.faults {
		byKind[f.Kind] = append(byKind[f.Kind], f)
	}
	for _, k := range faultKinds {
		fs := byKind[k.name]
		if len(fs) == 0 {
			fmt.Fprintf(&b, "| %s | 0 | | | | | | |\n", k.name)
			continue
		}
		var resumes []time.Duration
		stalled, unknown, failed := 0, 0, 0
		for _, f := range fs {
			resumes = append(resumes, f.Resume)
			stalled += f.Stalled
			unknown += f.Unknown
			if f.Err != "" {
				failed++
			}
		}
		slices.Sort(resumes)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %d | %d |\n", k.name, len(fs),
			ms(percentile(resumes, 0.5)), ms(percentile(resumes, 0.99)), ms(resumes[len(resumes)-1]), stalled, unknown, failed)
	}
	if r.earlier > 0 {
		fmt.Fprintf(&b, "\n%d deliveries of an earlier cycle's messages came in a later cycle (acknowledged, not judged).\n", r.earlier)
	}

	b.WriteString("\n## Violations\n\n")
	if len(r.violations) == 0 && unrecovered == 0 {
		b.WriteString("None.\n")
	}
	for _, f := range r.faults {
		if f.Err != "" {
			fmt.Fprintf(&b, "- Fault %d, %s (%s) at %s: %s\n", f.N, f.Kind, f.Target, f.Start.Format("15:04:05.000"),
				strings.ReplaceAll(firstLine(f.Err), "|", `\|`))
		}
	}
	for _, v := range r.violations {
		b.WriteString("\n" + v)
	}

	b.WriteString("\n## Every fault\n\n| # | kind | target | start | lasted | recovered after the heal | resume | stalled | 0x83 or no answer |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, f := range r.faults {
		rec := "never"
		if !f.Recovered.IsZero() {
			rec = ms(f.Recovered.Sub(f.Healed))
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %d | %d |\n", f.N, f.Kind, strings.ReplaceAll(f.Target, "|", `\|`),
			f.Start.Format("15:04:05"), ms(f.Healed.Sub(f.Start)), rec, ms(f.Resume), f.Stalled, f.Unknown)
	}
	return b.String()
}

// percentile is the nearest-rank percentile of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	i := int(float64(len(ds))*p+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// machine describes this machine: host, CPU, cores, kernel, Go.
func machine() string {
	host, _ := os.Hostname()
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%s, %s, %d cores, Linux %s, %s", host, cpu, runtime.NumCPU(), strings.TrimSpace(string(kernel)), runtime.Version())
}

// revision names the checkout the nodes were built from.
func revision() string {
	out, err := exec.Command("git", "describe", "--always").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	// The report rewrites itself after every cycle: a change to it is
	// not a change to the code.
	changed, err := exec.Command("git", "status", "--porcelain", "--", "..", ":(exclude)../docs/FAULTS.md").Output()
	if err == nil && len(strings.TrimSpace(string(changed))) > 0 {
		rev += " with uncommitted changes"
	}
	return "commit " + rev
}
