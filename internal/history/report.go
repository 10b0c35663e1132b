package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kind is the kind of a Finding.
type Kind uint8

const (
	// Lost: acknowledged, and never delivered to a group of
	// Options.Groups nor dead-lettered.
	Lost Kind = iota + 1
	// Duplicate: stored more than once (two msg-ids, or two first
	// deliveries in one group). A violation unless the producer may have
	// stored it twice; then an explained finding with a Cause.
	Duplicate
	// WithoutDUP: delivered again to a group without the DUP flag.
	WithoutDUP
	// Reorder: two messages of one key and one producer, the first
	// acknowledged before the second was sent, first delivered to a group
	// in the other order.
	Reorder
	// LeaseOverlap: two consumers of a group held leases on the same
	// stored message at once.
	LeaseOverlap
	// Vanished: rejected, or failed max_deliveries times, in a group, and
	// never delivered from a dead-letter queue.
	Vanished
	// Orphan: a dead letter whose message no publish could have stored.
	Orphan
	// Unexpected: a delivery of a message no publish could have stored
	// (never published, or refused with a reason code other than 0x83).
	Unexpected
)

var kindNames = [...]string{
	Lost:         "lost",
	Duplicate:    "duplicate",
	WithoutDUP:   "redelivered without DUP",
	Reorder:      "reorder",
	LeaseOverlap: "lease overlap",
	Vanished:     "vanished dead letter",
	Orphan:       "orphan dead letter",
	Unexpected:   "unexpected",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// What explains a duplicate: Finding.Cause and the keys of
// Summary.ExplainedDuplicates.
const (
	// CauseUnknown: a publish attempt was answered 0x83.
	CauseUnknown = "0x83"
	// CauseNoAnswer: a publish attempt got no answer.
	CauseNoAnswer = "no answer"
	// CausePublishedAgain: the producer published the message again and
	// was acknowledged each time.
	CausePublishedAgain = "published again"
)

// Finding is one violation, or one explained duplicate.
type Finding struct {
	Kind Kind
	// ID is the message; Other the second message of a Reorder, the one
	// delivered too early.
	ID    string
	Other string
	Key   string
	Queue string
	// Group is the group it happened in; "" where it is not one group's.
	Group string
	// Cause is what explains a duplicate; "" for a violation.
	Cause string
	// Times are the instants Text names, in its order; Nodes and Clients
	// the nodes and client IDs it names, each once.
	Times   []time.Time
	Nodes   []string
	Clients []string
	// Text says what happened, in one sentence.
	Text string
}

// add notes an instant, and a node and a client where not "".
func (f *Finding) add(t time.Time, node, client string) {
	if !t.IsZero() {
		f.Times = append(f.Times, t)
	}
	if node != "" {
		f.Nodes = appendNew(f.Nodes, node)
	}
	if client != "" {
		f.Clients = appendNew(f.Clients, client)
	}
}

func (f Finding) String() string {
	return f.Kind.String() + " " + f.ID + ": " + f.Text
}

// Summary counts what a history holds and what Check found.
type Summary struct {
	// Publishes counts publish attempts: Refused those refused with a
	// definite reason code, Unknown those answered 0x83 or not at all.
	Publishes, Refused, Unknown int
	// Acknowledged counts messages acknowledged at least once.
	Acknowledged int
	// Delivered counts messages delivered from their queue at least once;
	// Deliveries every delivery from a queue, Redeliveries those after a
	// message's first in its group.
	Delivered, Deliveries, Redeliveries int
	// DeadLettered counts messages delivered from a dead-letter queue.
	DeadLettered int

	// Lost counts messages lost to at least one group (the report has a
	// finding per group).
	Lost int
	// Duplicates counts messages stored more than once with nothing to
	// explain it; ExplainedDuplicates those explained, by Cause.
	Duplicates          int
	ExplainedDuplicates map[string]int
	// The others count findings.
	WithoutDUP, Reordered, LeaseOverlaps, Vanished, Orphans, Unexpected int
}

// Report is what Check found.
type Report struct {
	Summary Summary
	// Violations are ordered by kind, then time; Explained are the
	// explained duplicates, in the same order.
	Violations []Finding
	Explained  []Finding
}

// OK reports whether the history breaks no promise.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// report sorts the findings and counts them.
func (c *checker) report() Report {
	r := c.r
	s := &r.Summary
	sortFindings(r.Violations)
	sortFindings(r.Explained)
	for _, f := range r.Explained {
		if s.ExplainedDuplicates == nil {
			s.ExplainedDuplicates = map[string]int{}
		}
		s.ExplainedDuplicates[f.Cause]++
	}
	for _, f := range r.Violations {
		switch f.Kind {
		case Duplicate:
			s.Duplicates++
		case WithoutDUP:
			s.WithoutDUP++
		case Reorder:
			s.Reordered++
		case LeaseOverlap:
			s.LeaseOverlaps++
		case Vanished:
			s.Vanished++
		case Orphan:
			s.Orphans++
		case Unexpected:
			s.Unexpected++
		}
	}
	return r
}

func sortFindings(fs []Finding) {
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), first(a).Compare(first(b)),
			cmp.Compare(a.ID, b.ID), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Text, b.Text))
	})
}

func first(f Finding) time.Time {
	if len(f.Times) == 0 {
		return time.Time{}
	}
	return f.Times[0]
}

// rows are the Summary's lines, for both renderings.
func (s *Summary) rows() [][2]string {
	n := strconv.Itoa
	explained := 0
	var causes []string
	for _, cause := range slices.Sorted(maps.Keys(s.ExplainedDuplicates)) {
		explained += s.ExplainedDuplicates[cause]
		causes = append(causes, fmt.Sprintf("%s: %d", cause, s.ExplainedDuplicates[cause]))
	}
	dups := n(explained)
	if len(causes) > 0 {
		dups += " (" + strings.Join(causes, ", ") + ")"
	}
	return [][2]string{
		{"publish attempts", fmt.Sprintf("%d (refused %d, outcome unknown %d)", s.Publishes, s.Refused, s.Unknown)},
		{"acknowledged", n(s.Acknowledged)},
		{"delivered", fmt.Sprintf("%d (%d deliveries, %d redeliveries)", s.Delivered, s.Deliveries, s.Redeliveries)},
		{"dead-lettered", n(s.DeadLettered)},
		{"lost", n(s.Lost)},
		{"duplicates", n(s.Duplicates)},
		{"explained duplicates", dups},
		{"redelivered without DUP", n(s.WithoutDUP)},
		{"order violations", n(s.Reordered)},
		{"lease overlaps", n(s.LeaseOverlaps)},
		{"vanished dead letters", n(s.Vanished)},
		{"orphan dead letters", n(s.Orphans)},
		{"unexpected deliveries", n(s.Unexpected)},
	}
}

// listed is how many findings of one kind a rendering lists; the rest are
// counted.
const listed = 20

// String renders the report as text: the summary, then the findings.
func (r Report) String() string {
	var b strings.Builder
	verdict := "OK"
	if !r.OK() {
		verdict = fmt.Sprintf("%d violations", len(r.Violations))
	}
	fmt.Fprintf(&b, "history: %s\n", verdict)
	for _, row := range r.Summary.rows() {
		fmt.Fprintf(&b, "  %s: %s\n", row[0], row[1])
	}
	each(r.Violations, func(f Finding) { fmt.Fprintf(&b, "%s\n", f) }, func(k Kind, more int) {
		fmt.Fprintf(&b, "... and %d more %s\n", more, k)
	})
	each(r.Explained, func(f Finding) { fmt.Fprintf(&b, "explained %s\n", f) }, func(k Kind, more int) {
		fmt.Fprintf(&b, "... and %d more explained %s\n", more, k)
	})
	return b.String()
}

// Markdown renders the report for a report file: a table of counts, then
// a table of violations and one of explained duplicates.
func (r Report) Markdown() string {
	var b strings.Builder
	if r.OK() {
		b.WriteString("History check: **OK**\n\n")
	} else {
		fmt.Fprintf(&b, "History check: **%d violations**\n\n", len(r.Violations))
	}
	b.WriteString("| what | count |\n| --- | --- |\n")
	for _, row := range r.Summary.rows() {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], cell(row[1]))
	}
	table := func(title string, fs []Finding) {
		if len(fs) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s\n\n| kind | message | key | group | what happened |\n| --- | --- | --- | --- | --- |\n", title)
		each(fs, func(f Finding) {
			kind := f.Kind.String()
			if f.Cause != "" {
				kind += " (" + f.Cause + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", kind, cell(f.ID), cell(f.Key), cell(f.Group), cell(f.Text))
		}, func(k Kind, more int) {
			fmt.Fprintf(&b, "| %s | | | | and %d more |\n", k, more)
		})
	}
	table("Violations:", r.Violations)
	table("Explained duplicates:", r.Explained)
	return b.String()
}

// each calls list for the first findings of each kind in fs (sorted by
// kind) and more for the count of the others.
func each(fs []Finding, list func(Finding), more func(Kind, int)) {
	for i := 0; i < len(fs); {
		j := i
		for j < len(fs) && fs[j].Kind == fs[i].Kind {
			j++
		}
		for _, f := range fs[i:min(j, i+listed)] {
			list(f)
		}
		if j-i > listed {
			more(fs[i].Kind, j-i-listed)
		}
		i = j
	}
}

// cell escapes a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// clock formats an instant for a sentence.
func clock(t time.Time) string { return t.Format("15:04:05.000") }

// on names a client and the node it is connected to.
func on(client, node string) string {
	if node == "" {
		return client
	}
	return client + " on " + node
}

// times says how many times: "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return strconv.Itoa(n) + " times"
}

func join(s []string) string { return strings.Join(s, ", ") }
