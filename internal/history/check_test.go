package history

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus ms milliseconds.
func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// acked is a publish of id to orders by p1 on node a, sent at sent and
// acknowledged at answered.
func acked(id, key string, sent, answered int) Publish {
	return Publish{ID: id, Key: key, Queue: "orders", Node: "a", Producer: "p1", Sent: at(sent), Answered: at(answered), Answer: Acked}
}

func refused(id, key string, sent, answered int, code byte) Publish {
	p := acked(id, key, sent, answered)
	p.Answer, p.Code = Refused, code
	return p
}

func unanswered(id, key string, sent int) Publish {
	p := acked(id, key, sent, 0)
	p.Answer, p.Answered = NoAnswer, time.Time{}
	return p
}

// deliver is a v5 delivery on node b; DUP is set from the second delivery
// on, as the broker does.
func deliver(id, key, group, consumer string, ms int, msgID string, count int) Delivery {
	return Delivery{ID: id, Key: key, Group: group, Consumer: consumer, Node: "b", At: at(ms),
		DUP: count > 1, MsgID: msgID, DeliveryCount: count}
}

func dead(id, group, consumer string, ms int, original string) Delivery {
	return Delivery{ID: id, Group: group, Consumer: consumer, Node: "c", At: at(ms), MsgID: "dlq-" + id,
		DeliveryCount: 1, DLQ: true, OriginalMsgID: original}
}

func settle(id, group, consumer string, ms int, o Outcome) Settlement {
	return Settlement{ID: id, Group: group, Consumer: consumer, At: at(ms), Outcome: o}
}

// clean is three messages of key k published one after the other and
// consumed in order by groups billing (two consumers, m1 nacked once and
// redelivered to the other) and audit.
func clean() History {
	return History{
		Publishes: []Publish{acked("m1", "k", 0, 5), acked("m2", "k", 10, 15), acked("m3", "k", 20, 25)},
		Deliveries: []Delivery{
			deliver("m1", "k", "billing", "c1", 30, "0-1", 1),
			deliver("m1", "k", "billing", "c2", 45, "0-1", 2),
			deliver("m2", "k", "billing", "c2", 60, "0-2", 1),
			deliver("m3", "k", "billing", "c2", 70, "0-3", 1),
			deliver("m1", "k", "audit", "c3", 31, "0-1", 1),
			deliver("m2", "k", "audit", "c3", 41, "0-2", 1),
			deliver("m3", "k", "audit", "c3", 51, "0-3", 1),
		},
		Settlements: []Settlement{
			settle("m1", "billing", "c1", 40, Nack),
			settle("m1", "billing", "c2", 50, Ack),
			settle("m2", "billing", "c2", 65, Ack),
			settle("m3", "billing", "c2", 75, Ack),
			settle("m1", "audit", "c3", 35, Ack),
			settle("m2", "audit", "c3", 45, Ack),
			settle("m3", "audit", "c3", 55, Ack),
		},
	}
}

func testOptions() Options {
	o := DefaultOptions()
	o.Groups = map[string][]string{"orders": {"billing", "audit"}}
	o.LeaseTimeout = time.Second
	o.MaxDeliveries = 3
	o.DLQConsumed = true
	o.Slack = time.Millisecond
	return o
}

// with returns clean() changed by edit.
func with(edit func(h *History)) History {
	h := clean()
	edit(&h)
	return h
}

// m2First has billing receive m2 before m1: c2 gets m2 at 30, then c1
// m1 at 55 and, nacked, c2 at 62.
func m2First(h *History) {
	h.Deliveries[0].At, h.Deliveries[1].At, h.Deliveries[2].At = at(55), at(62), at(30)
	h.Settlements[0].At, h.Settlements[1].At, h.Settlements[2].At = at(58), at(64), at(35)
}

// redeliverM2 has audit's c3 nack m2 and receive it again at 100 and 200,
// settling those with outcomes; one left without an outcome is still held.
func redeliverM2(h *History, outcomes ...Outcome) {
	h.Settlements[5].Outcome = Nack
	for i, ms := range []int{100, 200} {
		h.Deliveries = append(h.Deliveries, deliver("m2", "k", "audit", "c3", ms, "0-2", i+2))
		if i < len(outcomes) {
			h.Settlements = append(h.Settlements, settle("m2", "audit", "c3", ms+10, outcomes[i]))
		}
	}
}

// without drops the events of h that match.
func without[T any](s []T, drop func(T) bool) []T {
	return slices.DeleteFunc(s, drop)
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		h    History
		opts func(*Options)
		// violations are "kind id group"; explained "cause id".
		violations []string
		explained  []string
	}{
		{name: "clean history passes", h: clean()},
		{
			name: "lost message",
			h: with(func(h *History) {
				h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.ID == "m2" && d.Group == "audit" })
			}),
			violations: []string{"lost m2 audit"},
		},
		{
			name: "group not required is not checked for loss",
			h: with(func(h *History) {
				h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.ID == "m2" && d.Group == "audit" })
			}),
			opts: func(o *Options) { o.Groups = map[string][]string{"orders": {"billing"}} },
		},
		{
			name: "unacknowledged publish not delivered is not lost",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, unanswered("m4", "j", 100), refused("m5", "j", 110, 120, 0x97),
					refused("m6", "j", 130, 140, CodeUnknown))
			}),
		},
		{
			name: "reorder",
			h: with(func(h *History) {
				// billing gets m2 before m1.
				m2First(h)
			}),
			violations: []string{"reorder m1 billing"},
		},
		{
			name: "concurrent publishes have no order",
			h: with(func(h *History) {
				// m2 sent before m1 was acknowledged.
				h.Publishes[0].Answered = at(12)
				m2First(h)
			}),
		},
		{
			name: "publishes of different producers have no order",
			h: with(func(h *History) {
				h.Publishes[1].Producer = "p2"
				m2First(h)
			}),
		},
		{
			name: "redeliveries are not ordered",
			h: with(func(h *History) {
				// m1's redelivery comes after m2's first delivery.
				h.Deliveries[1].At, h.Deliveries[2].At = at(66), at(44)
				h.Settlements[1].At, h.Settlements[2].At = at(68), at(46)
			}),
		},
		{
			name: "unordered queue",
			h: with(func(h *History) {
				m2First(h)
			}),
			opts: func(o *Options) { o.Unordered = []string{"orders"} },
		},
		{
			name: "double lease",
			h: with(func(h *History) {
				// c1 still holds m1 (its nack comes late) when c2 gets it.
				h.Settlements[0].At = at(47)
			}),
			violations: []string{"lease overlap m1 billing"},
		},
		{
			name: "overlap no longer than slack",
			h: with(func(h *History) {
				h.Settlements[0].At = at(47)
			}),
			opts: func(o *Options) { o.Slack = 2 * time.Millisecond },
		},
		{
			name: "lease ended by disconnect",
			h: with(func(h *History) {
				h.Settlements = without(h.Settlements, func(s Settlement) bool { return s.Consumer == "c1" })
				h.Disconnects = append(h.Disconnects, Disconnect{Client: "c1", Node: "b", At: at(42)})
			}),
		},
		{
			name: "lease ended by disconnect settlement",
			h: with(func(h *History) {
				h.Settlements[0].Outcome = Disconnected
			}),
		},
		{
			name: "lease ended by timeout, late ack ignored",
			h: with(func(h *History) {
				h.Settlements[0] = settle("m1", "billing", "c1", 2000, Ack)
				h.Deliveries[1].At = at(1040)
				h.Settlements[1].At = at(1050)
			}),
		},
		{
			name: "extended lease overlaps",
			h: with(func(h *History) {
				h.Settlements[0] = settle("m1", "billing", "c1", 900, Extend)
				h.Settlements = append(h.Settlements, settle("m1", "billing", "c1", 1500, Ack))
				h.Deliveries[1].At = at(1040)
				h.Settlements[1].At = at(1050)
			}),
			violations: []string{"lease overlap m1 billing"},
		},
		{
			name: "same consumer redelivered is no overlap",
			h: with(func(h *History) {
				h.Deliveries[1].Consumer = "c1"
				h.Settlements[1].Consumer = "c1"
				h.Settlements[0].At = at(47)
			}),
		},
		{
			name: "redelivery without DUP",
			h: with(func(h *History) {
				h.Deliveries[1].DUP = false
			}),
			violations: []string{"redelivered without DUP m1 billing"},
		},
		{
			name: "same msg-id again without DUP",
			h: with(func(h *History) {
				h.Deliveries[1].DUP, h.Deliveries[1].DeliveryCount = false, 0
			}),
			violations: []string{"redelivered without DUP m1 billing"},
		},
		{
			name: "second first delivery without msg-id is a duplicate",
			h: with(func(h *History) {
				for i := range h.Deliveries {
					h.Deliveries[i].MsgID, h.Deliveries[i].DeliveryCount = "", 0
				}
				h.Deliveries[1].DUP = false
			}),
			violations: []string{"duplicate m1 billing"},
		},
		{
			name: "duplicate explained by 0x83",
			h: with(func(h *History) {
				// A first attempt answered 0x83 was stored too: billing and
				// audit both get m1 at two msg-ids, each as a first delivery.
				h.Publishes = append(h.Publishes, refused("m1", "k", -20, -10, CodeUnknown))
				h.Deliveries[1].DUP, h.Deliveries[1].DeliveryCount, h.Deliveries[1].MsgID = false, 1, "0-0"
				h.Deliveries = append(h.Deliveries, deliver("m1", "k", "audit", "c3", 20, "0-0", 1))
				h.Settlements = append(h.Settlements, settle("m1", "audit", "c3", 25, Ack))
			}),
			explained: []string{"0x83 m1"},
		},
		{
			name: "duplicate explained by no answer",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, unanswered("m3", "k", 19))
				h.Deliveries = append(h.Deliveries, deliver("m3", "k", "audit", "c3", 80, "0-4", 1))
				h.Settlements = append(h.Settlements, settle("m3", "audit", "c3", 85, Ack))
			}),
			explained: []string{"no answer m3"},
		},
		{
			name: "duplicate explained by a second publish",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, acked("m3", "k", 26, 28))
				h.Deliveries = append(h.Deliveries, deliver("m3", "k", "audit", "c3", 80, "0-4", 1))
				h.Settlements = append(h.Settlements, settle("m3", "audit", "c3", 85, Ack))
			}),
			explained: []string{"published again m3"},
		},
		{
			name: "duplicate storage unexplained",
			h: with(func(h *History) {
				h.Deliveries = append(h.Deliveries, deliver("m3", "k", "audit", "c3", 80, "0-4", 1))
				h.Settlements = append(h.Settlements, settle("m3", "audit", "c3", 85, Ack))
			}),
			violations: []string{"duplicate m3 audit"},
		},
		{
			name: "stored at two msg-ids, one a group each",
			h: with(func(h *History) {
				h.Deliveries[6].MsgID = "0-9"
			}),
			violations: []string{"duplicate m3 "},
		},
		{
			name: "dead letter stored at another msg-id",
			h: with(func(h *History) {
				h.Deliveries = append(h.Deliveries, dead("m3", "dlq", "d1", 300, "0-9"))
			}),
			violations: []string{"duplicate m3 "},
		},
		{
			name: "copies held at once are no overlap",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, refused("m3", "k", 19, 20, CodeUnknown))
				h.Deliveries = append(h.Deliveries, deliver("m3", "k", "billing", "c1", 71, "0-4", 1))
				h.Settlements = append(h.Settlements, settle("m3", "billing", "c1", 76, Ack))
			}),
			explained: []string{"0x83 m3"},
		},
		{
			name: "vanished dead letter",
			h: with(func(h *History) {
				redeliverM2(h, Nack, Nack)
			}),
			violations: []string{"vanished dead letter m2 audit"},
		},
		{
			name: "dead letter accounted for",
			h: with(func(h *History) {
				redeliverM2(h, Nack, Nack)
				h.Deliveries = append(h.Deliveries, dead("m2", "dlq", "d1", 300, "0-2"))
				h.Settlements = append(h.Settlements, Settlement{ID: "m2", Group: "dlq", Consumer: "d1", DLQ: true, At: at(310)})
			}),
		},
		{
			name: "dead-lettered is not lost",
			h: with(func(h *History) {
				h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.ID == "m2" && d.Group == "audit" })
				h.Deliveries = append(h.Deliveries, dead("m2", "dlq", "d1", 300, "0-2"))
			}),
		},
		{
			name: "failures by disconnect and lease timeout count",
			h: with(func(h *History) {
				h.Deliveries = append(h.Deliveries,
					deliver("m2", "k", "audit", "c4", 100, "0-2", 2),
					deliver("m2", "k", "audit", "c3", 1200, "0-2", 3))
				h.Settlements[5].Outcome = Nack
				h.Disconnects = append(h.Disconnects, Disconnect{Client: "c3", At: at(1300)})
			}),
			violations: []string{"vanished dead letter m2 audit"},
		},
		{
			name: "releases do not count",
			h: with(func(h *History) {
				redeliverM2(h, Release, Nack)
			}),
		},
		{
			name: "a lease timeout not yet passed does not count",
			h: with(func(h *History) {
				redeliverM2(h, Nack) // the third still held
			}),
		},
		{
			name: "rejected and vanished",
			h: with(func(h *History) {
				h.Settlements[5].Outcome = Reject
			}),
			violations: []string{"vanished dead letter m2 audit"},
		},
		{
			name: "vanished only when the DLQ is consumed",
			h: with(func(h *History) {
				h.Settlements[5].Outcome = Reject
			}),
			opts: func(o *Options) { o.DLQConsumed = false },
		},
		{
			name: "orphan dead letter",
			h: with(func(h *History) {
				h.Deliveries = append(h.Deliveries, dead("m9", "dlq", "d1", 300, "0-9"))
			}),
			violations: []string{"orphan dead letter m9 dlq"},
		},
		{
			name: "dead letter of a publish answered 0x83 has an original",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, refused("m4", "k", 30, 35, CodeUnknown))
				h.Deliveries = append(h.Deliveries, dead("m4", "dlq", "d1", 300, "0-4"))
			}),
		},
		{
			name: "delivered though refused",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, refused("m4", "j", 30, 35, 0x97))
				h.Deliveries = append(h.Deliveries, deliver("m4", "j", "billing", "c2", 80, "1-1", 1))
				h.Settlements = append(h.Settlements, settle("m4", "billing", "c2", 85, Ack))
			}),
			violations: []string{"unexpected m4 billing"},
		},
		{
			name: "delivered though never published",
			h: with(func(h *History) {
				h.Deliveries = append(h.Deliveries, deliver("x", "j", "audit", "c3", 80, "1-1", 1))
			}),
			violations: []string{"unexpected x audit"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			if tc.opts != nil {
				tc.opts(&opts)
			}
			r := Check(tc.h, opts)
			got := brief(r.Violations, func(f Finding) string { return f.Kind.String() + " " + f.ID + " " + f.Group })
			want := tc.violations
			if !slices.Equal(got, want) {
				t.Errorf("violations %q, want %q\n%s", got, want, r)
			}
			got = brief(r.Explained, func(f Finding) string { return f.Cause + " " + f.ID })
			if !slices.Equal(got, tc.explained) {
				t.Errorf("explained %q, want %q\n%s", got, tc.explained, r)
			}
			if r.OK() != (len(want) == 0) {
				t.Errorf("OK() = %v with %d violations", r.OK(), len(want))
			}
			for _, f := range append(r.Violations, r.Explained...) {
				if f.Text == "" || len(f.Times) == 0 || len(f.Clients) == 0 {
					t.Errorf("finding lacks a sentence, times or clients: %+v", f)
				}
			}
		})
	}
}

func brief(fs []Finding, s func(Finding) string) []string {
	var out []string
	for _, f := range fs {
		out = append(out, s(f))
	}
	return out
}

// TestCheckFindings checks what the findings say: the times, nodes and
// clients involved, and the sentence.
func TestCheckFindings(t *testing.T) {
	tests := []struct {
		name    string
		h       History
		clients []string
		nodes   []string
		text    []string // parts of the sentence
	}{
		{
			name: "lost",
			h: with(func(h *History) {
				h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.ID == "m2" && d.Group == "audit" })
			}),
			clients: []string{"p1"}, nodes: []string{"a"},
			text: []string{"sent at 12:00:00.010 by p1 on a", "acknowledged at 12:00:00.015", "group audit"},
		},
		{
			name: "reorder",
			h: with(func(h *History) {
				m2First(h)
			}),
			clients: []string{"p1", "c2", "c1"}, nodes: []string{"a", "b"},
			text: []string{"before m2 was sent at 12:00:00.010", "m2 was first delivered to group billing at 12:00:00.030 (c2 on b)", "m1 only at 12:00:00.055 (c1 on b)"},
		},
		{
			name: "double lease",
			h: with(func(h *History) {
				h.Settlements[0].At = at(47)
			}),
			clients: []string{"c1", "c2"}, nodes: []string{"b"},
			text: []string{"c1 on b from 12:00:00.030 until its nack at 12:00:00.047", "c2 on b from 12:00:00.045 until its ack at 12:00:00.050", "overlapping by 2ms"},
		},
		{
			name: "redelivery without DUP",
			h: with(func(h *History) {
				h.Deliveries[1].DUP, h.Deliveries[1].DeliveryCount = false, 0
			}),
			clients: []string{"c2", "c1"}, nodes: []string{"b"},
			text: []string{"at 12:00:00.045 (c2 on b) without DUP: msg-id 0-1 was first delivered at 12:00:00.030 (c1 on b)"},
		},
		{
			name: "duplicate explained by 0x83",
			h: with(func(h *History) {
				h.Publishes = append(h.Publishes, refused("m1", "k", -20, -10, CodeUnknown))
				h.Deliveries[1].DUP, h.Deliveries[1].DeliveryCount, h.Deliveries[1].MsgID = false, 1, "0-0"
			}),
			clients: []string{"c1", "c2", "p1"}, nodes: []string{"b", "a"},
			text: []string{"stored twice (msg-ids 0-1, 0-0)", "answered 0x83 at 11:59:59.990"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.h, testOptions())
			fs := append(r.Violations, r.Explained...)
			if len(fs) != 1 {
				t.Fatalf("%d findings, want 1:\n%s", len(fs), r)
			}
			f := fs[0]
			if !slices.Equal(f.Clients, tc.clients) || !slices.Equal(f.Nodes, tc.nodes) {
				t.Errorf("clients %q nodes %q, want %q %q", f.Clients, f.Nodes, tc.clients, tc.nodes)
			}
			for _, part := range tc.text {
				if !strings.Contains(f.Text, part) {
					t.Errorf("%q does not say %q", f.Text, part)
				}
			}
		})
	}
}

func TestCheckSummary(t *testing.T) {
	h := with(func(h *History) {
		h.Publishes = append(h.Publishes, refused("m1", "k", -20, -10, CodeUnknown), refused("m4", "j", 30, 35, 0x97))
		h.Deliveries[1].DUP, h.Deliveries[1].MsgID = false, "0-0"
		h.Deliveries[1].DeliveryCount = 1
		h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.ID == "m3" && d.Group == "audit" })
		h.Deliveries = append(h.Deliveries, dead("m2", "dlq", "d1", 300, "0-2"))
	})
	s := Check(h, testOptions()).Summary
	want := Summary{
		Publishes: 5, Refused: 1, Unknown: 1, Acknowledged: 3,
		Delivered: 3, Deliveries: 6, Redeliveries: 1, DeadLettered: 1,
		Lost: 1, ExplainedDuplicates: map[string]int{CauseUnknown: 1},
	}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Errorf("summary\n%+v, want\n%+v", s, want)
	}
}

func TestReportRendering(t *testing.T) {
	h := with(func(h *History) {
		h.Deliveries = without(h.Deliveries, func(d Delivery) bool { return d.Group == "audit" })
		h.Publishes[0].Key = "a|b"
	})
	r := Check(h, testOptions())
	text, md := r.String(), r.Markdown()
	if strings.Contains(text, "... and") {
		t.Errorf("text cut a list shorter than %d:\n%s", listed, text)
	}
	for _, want := range []string{"history: 3 violations\n", "  lost: 3\n", "\nlost m1: sent at"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	for _, want := range []string{"History check: **3 violations**", "| lost | 3 |", "| lost | m2 | k | audit | sent at", `| m1 | a\|b | audit |`} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}

	// Past listed findings of a kind, the rest are counted.
	var many History
	for i := range listed + 3 {
		many.Publishes = append(many.Publishes, acked(fmt.Sprintf("m%02d", i), "k", i, i))
	}
	r = Check(many, Options{Groups: map[string][]string{"orders": {"g"}}})
	if text := r.String(); !strings.Contains(text, "... and 3 more lost\n") || strings.Count(text, "\nlost ") != listed {
		t.Errorf("long list:\n%s", text)
	}
	if md := r.Markdown(); !strings.Contains(md, "| lost | | | | and 3 more |") {
		t.Errorf("long list:\n%s", md)
	}
}

// TestRecorderConcurrent records from many goroutines at once (run it with
// -race) and checks the history is whole.
func TestRecorderConcurrent(t *testing.T) {
	const producers, per = 8, 200
	var rec Recorder
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			client := fmt.Sprintf("p%d", p)
			for i := range per {
				id := fmt.Sprintf("%s-%d", client, i)
				sent := time.Now()
				rec.Publish(Publish{ID: id, Key: client, Queue: "q", Node: "a", Producer: client,
					Sent: sent, Answered: time.Now(), Answer: Acked})
				rec.Deliver(Delivery{ID: id, Key: client, Group: "g", Consumer: "c" + client, Node: "b",
					At: time.Now(), MsgID: id, DeliveryCount: 1})
				rec.Settle(Settlement{ID: id, Group: "g", Consumer: "c" + client, At: time.Now()})
				if i%50 == 0 {
					_ = Check(rec.History(), DefaultOptions())
				}
			}
			rec.Disconnect(Disconnect{Client: "c" + client, Node: "b", At: time.Now()})
		})
	}
	wg.Wait()
	h := rec.History()
	if len(h.Publishes) != producers*per || len(h.Deliveries) != producers*per ||
		len(h.Settlements) != producers*per || len(h.Disconnects) != producers {
		t.Fatalf("recorded %d publishes, %d deliveries, %d settlements, %d disconnects",
			len(h.Publishes), len(h.Deliveries), len(h.Settlements), len(h.Disconnects))
	}
	opts := DefaultOptions()
	opts.Groups = map[string][]string{"q": {"g"}}
	r := Check(h, opts)
	if !r.OK() || r.Summary.Acknowledged != producers*per || r.Summary.Delivered != producers*per {
		t.Errorf("concurrent history:\n%s", r)
	}
}

func TestKindString(t *testing.T) {
	for k := Lost; k <= Unexpected; k++ {
		if s := k.String(); s == "" || strings.HasPrefix(s, "kind(") {
			t.Errorf("kind %d has no name", k)
		}
	}
	if s := Kind(0).String(); s != "kind(0)" {
		t.Errorf("Kind(0) = %q", s)
	}
}
