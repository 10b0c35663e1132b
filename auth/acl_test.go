package auth

import (
	"errors"
	"path"
	"strconv"
	"strings"
	"testing"
)

func compile(t testing.TB, rules ...Rule) *ACL {
	t.Helper()
	a, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func allow(user string, action Action, pattern string) Rule {
	return Rule{User: user, Action: action, Pattern: pattern, Permission: Allow}
}

func deny(user string, action Action, pattern string) Rule {
	return Rule{User: user, Action: action, Pattern: pattern, Permission: Deny}
}

func TestACLEmptyAllowsEverything(t *testing.T) {
	for _, a := range []*ACL{nil, compile(t)} {
		if !a.Empty() || !a.Allowed(Client{}, Publish, "a/b", "") || !a.Allowed(Client{User: "x"}, Admin, "", "") {
			t.Error("an empty ACL denies")
		}
	}
}

func TestACLAllowed(t *testing.T) {
	consume := func(user, pattern, group, perm string) Rule {
		return Rule{User: user, Action: Consume, Pattern: pattern, Group: group, Permission: perm}
	}
	a := compile(t,
		allow("*", Publish, "devices/%u/#"),
		deny("*", Subscribe, "secret/#"),
		allow("*", Subscribe, "devices/+/status"),
		allow("admin", Subscribe, "#"),
		allow("*", Publish, "clients/%c/up"),
		allow("*", Produce, "orders"),
		allow("*", Produce, "tenant-%u-*"),
		consume("billing", "orders", "billing", Allow),
		consume("*", "orders", "", Deny),
		allow("ops", Consume, "*/$dlq"),
		allow("ops", Admin, "*"),
		allow("lead", Admin, "orders*"),
		allow("anon-ok", Publish, "x"),
		allow("*", Subscribe, "public/#"),
	)
	alice := Client{User: "alice", ClientID: "c-1"}
	anon := Client{ClientID: "c-9"}
	tests := []struct {
		name     string
		c        Client
		action   Action
		res, grp string
		want     bool
	}{
		{"own device topic", alice, Publish, "devices/alice/temp", "", true},
		{"own device root", alice, Publish, "devices/alice", "", true},
		{"another's device", alice, Publish, "devices/bob/temp", "", false},
		{"anonymous has no %u", anon, Publish, "devices//temp", "", false},
		{"wildcard username", Client{User: "a+b"}, Publish, "devices/a+b/x", "", false},
		{"client id placeholder", alice, Publish, "clients/c-1/up", "", true},
		{"another client id", alice, Publish, "clients/c-2/up", "", false},
		{"no rule: denied", alice, Publish, "other", "", false},
		{"covered subscription", alice, Subscribe, "devices/+/status", "", true},
		{"narrower subscription", alice, Subscribe, "devices/bob/status", "", true},
		{"wider subscription", alice, Subscribe, "devices/#", "", false},
		{"denied subtree", alice, Subscribe, "secret/x", "", false},
		{"deny comes first for #", Client{User: "admin"}, Subscribe, "#", "", false},
		{"admin elsewhere", Client{User: "admin"}, Subscribe, "a/b/#", "", true},
		{"shared subscription by its filter", alice, Subscribe, "$share/g/public/news", "", true},
		{"shared subscription denied", alice, Subscribe, "$share/g/secret/#", "", false},
		{"produce", anon, Produce, "orders", "", true},
		{"produce to its dead letters", anon, Produce, "orders/$dlq", "", false},
		{"produce to own tenant", alice, Produce, "tenant-alice-jobs", "", true},
		{"produce to another tenant", alice, Produce, "tenant-bob-jobs", "", false},
		{"consume own group", Client{User: "billing"}, Consume, "orders", "billing", true},
		{"consume another group", Client{User: "billing"}, Consume, "orders", "default", false},
		{"consume denied", alice, Consume, "orders", "billing", false},
		{"consume dead letters", Client{User: "ops"}, Consume, "orders/$dlq", "default", true},
		{"ops may not consume orders", Client{User: "ops"}, Consume, "orders", "default", false},
		{"admin of all", Client{User: "ops"}, Admin, "", "", true},
		{"admin of one", Client{User: "ops"}, Admin, "orders", "", true},
		{"admin of a glob", Client{User: "lead"}, Admin, "orders-eu", "", true},
		{"admin glob does not grant all", Client{User: "lead"}, Admin, "", "", false},
		{"admin glob elsewhere", Client{User: "lead"}, Admin, "jobs", "", false},
		{"unknown action", alice, Action("delete"), "x", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Allowed(tc.c, tc.action, tc.res, tc.grp); got != tc.want {
				t.Errorf("Allowed(%+v, %s, %q, %q) = %v, want %v", tc.c, tc.action, tc.res, tc.grp, got, tc.want)
			}
		})
	}
}

func TestACLDenyWithUnusablePlaceholderDenies(t *testing.T) {
	a := compile(t,
		deny("*", Publish, "private/%u/#"),
		allow("*", Publish, "#"),
	)
	if a.Allowed(Client{}, Publish, "private/x/y", "") {
		t.Error("an anonymous client passed a deny rule of %u")
	}
	if !a.Allowed(Client{User: "bob"}, Publish, "private/alice/y", "") {
		t.Error("bob denied outside his own level")
	}
	if a.Allowed(Client{User: "bob"}, Publish, "private/bob/y", "") {
		t.Error("bob allowed into his denied level")
	}
}

func TestACLFirstMatchWins(t *testing.T) {
	a := compile(t, allow("alice", Publish, "a/#"), deny("*", Publish, "a/secret"))
	if !a.Allowed(Client{User: "alice"}, Publish, "a/secret", "") {
		t.Error("the earlier allow lost")
	}
	if a.Allowed(Client{User: "bob"}, Publish, "a/secret", "") {
		t.Error("bob got alice's rule")
	}
}

func TestACLCompileErrors(t *testing.T) {
	rules := []Rule{
		allow("*", Publish, "ok/#"),
		{User: "", Action: Publish, Pattern: "a", Permission: Allow},
		{User: "*", Action: "pub", Pattern: "a", Permission: Allow},
		{User: "*", Action: Publish, Pattern: "a/#/b", Permission: "yes"},
		allow("*", Subscribe, "$queue/orders"),
		allow("*", Subscribe, "$share/g/a"),
		allow("*", Produce, "orders/x"),
		allow("*", Produce, "ord ers"),
		{User: "*", Action: Publish, Pattern: "a", Group: "g", Permission: Allow},
		{User: "*", Action: Consume, Pattern: "q", Group: "a/b", Permission: Allow},
		allow("*", Publish, "a/%x"),
		allow("*", Produce, "/$dlq"),
		allow("*", Publish, "a+/b"),
	}
	_, err := Compile(rules)
	want := map[int]string{
		1:  "user",
		2:  "action",
		3:  "permission",
		4:  "pattern",
		5:  "pattern",
		6:  "pattern",
		7:  "pattern",
		8:  "group",
		9:  "group",
		10: "pattern",
		11: "pattern",
		12: "pattern",
	}
	got := map[int][]string{}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		re, ok := errors.AsType[*RuleError](e)
		if !ok {
			t.Fatalf("%v is not a *RuleError", e)
		}
		got[re.Index] = append(got[re.Index], re.Field)
	}
	for i, field := range want {
		found := false
		for _, f := range got[i] {
			found = found || f == field
		}
		if !found {
			t.Errorf("rule %d: errors on %v, want one on %s", i, got[i], field)
		}
	}
	if len(got[0]) > 0 {
		t.Errorf("rule 0 is valid, got errors on %v", got[0])
	}
	if len(got[3]) != 2 {
		t.Errorf("rule 3: errors on %v, want permission and pattern", got[3])
	}
}

// refMatch is MQTT topic matching done the plain way, for comparison.
func refMatch(filter, topic string) bool {
	f, tp := strings.Split(filter, "/"), strings.Split(topic, "/")
	if strings.HasPrefix(topic, "$") && (f[0] == "+" || f[0] == "#") {
		return false
	}
	for i, l := range f {
		if l == "#" {
			return true
		}
		if i >= len(tp) || l != "+" && l != tp[i] {
			return false
		}
	}
	return len(f) == len(tp)
}

// filters returns every filter of up to n levels of the given words, +
// and # (last only).
func filters(words []string, n int) []string {
	var out []string
	var walk func(prefix string, depth int)
	walk = func(prefix string, depth int) {
		for _, w := range append(append([]string{}, words...), "+", "#") {
			f := w
			if depth > 0 {
				f = prefix + "/" + w
			}
			if f != "" {
				out = append(out, f)
			}
			if w != "#" && depth+1 < n {
				walk(f, depth+1)
			}
		}
	}
	walk("", 0)
	return out
}

func topics(words []string, n int) []string {
	var out []string
	var walk func(prefix string, depth int)
	walk = func(prefix string, depth int) {
		for _, w := range words {
			tp := w
			if depth > 0 {
				tp = prefix + "/" + w
			}
			if tp != "" {
				out = append(out, tp)
			}
			if depth+1 < n {
				walk(tp, depth+1)
			}
		}
	}
	walk("", 0)
	return out
}

// TestACLTopicMatchingExhaustive compares matching, cover and intersection
// with the plain definitions over every filter and topic of up to three
// and four levels of a few words.
func TestACLTopicMatchingExhaustive(t *testing.T) {
	words := []string{"a", "b", "$s", ""}
	fs := filters(words, 3)
	ts := topics(words, 4)
	w := who{}
	for _, pf := range fs {
		p, reason := compileTopic(pf)
		if reason != "" {
			t.Fatalf("%q: %s", pf, reason)
		}
		pub := compile(t, allow("*", Publish, pf)).by[0].anyone[0]
		for _, tp := range ts {
			if got, want := p.matchTopic(tp, w), refMatch(pf, tp); got != want {
				t.Fatalf("match(%q, %q) = %v, want %v", pf, tp, got, want)
			}
			if refMatch(pf, tp) && !pub.mayApply(tp, false) {
				t.Fatalf("%q: prefix %q passes over topic %q", pf, pub.prefix, tp)
			}
		}
		for _, f := range fs {
			covers, inter := true, false
			for _, tp := range ts {
				if refMatch(f, tp) {
					covers = covers && refMatch(pf, tp)
					inter = inter || refMatch(pf, tp)
				}
			}
			// Topics longer than four levels decide nothing more here:
			// # matches them all alike.
			if got := p.covers(f, w); got != covers {
				t.Fatalf("covers(%q, %q) = %v, want %v", pf, f, got, covers)
			}
			if got := p.intersects(f, w); got != inter {
				t.Fatalf("intersects(%q, %q) = %v, want %v", pf, f, got, inter)
			}
			// The prefix never passes over a rule that applies.
			for _, perm := range []string{Allow, Deny} {
				a := compile(t, Rule{User: "*", Action: Subscribe, Pattern: pf, Permission: perm})
				r := a.by[1].anyone[0]
				applies, _ := r.applies(Subscribe, f, "", w)
				if applies && !r.mayApply(f, wildStart(Subscribe, f)) {
					t.Fatalf("%s %q: prefix %q passes over filter %q", perm, pf, r.prefix, f)
				}
			}
		}
	}
}

func TestACLGlobMatchesPathMatch(t *testing.T) {
	for _, p := range []string{"*", "orders*", "*/$dlq", "o?d*s", "a*b*c", "*-%u-*", "", "é?", "*?"} {
		for _, name := range []string{"orders", "orders/$dlq", "ord", "oxdxs", "abc", "a-b-c", "é", "éé", "", "a/b"} {
			want, _ := path.Match(p, name)
			if got := globMatch(p, name); got != want {
				t.Errorf("globMatch(%q, %q) = %v, want %v", p, name, got, want)
			}
		}
	}
}

// FuzzACL checks, for any rule the compiler accepts, that checking never
// panics and that matching keeps its definitions: a topic matches as
// MQTT says; a filter a pattern covers matches no topic the pattern does
// not; a filter and a pattern that share a topic intersect; a glob
// matches as path.Match does.
func FuzzACL(f *testing.F) {
	f.Add("*", "publish", "a/+/#", "", "allow", "alice", "c1", "a/b/c", "a/#")
	f.Add("bob", "subscribe", "devices/%u/#", "", "deny", "bob", "c1", "devices/bob/x", "devices/+/x")
	f.Add("*", "consume", "q*", "g?", "allow", "", "c1", "q1", "g1")
	f.Add("*", "produce", "%c-*/$dlq", "", "allow", "", "x", "x-1/$dlq", "")
	f.Add("*", "admin", "*", "", "allow", "u", "", "", "")
	f.Add("*", "produce", "ord?rs*", "", "allow", "u", "", "orders-eu", "")
	f.Fuzz(func(t *testing.T, user, action, pattern, group, perm, cuser, client, resource, other string) {
		a, err := Compile([]Rule{{User: user, Action: Action(action), Pattern: pattern, Group: group, Permission: perm}})
		if err != nil {
			return
		}
		c := Client{User: cuser, ClientID: client}
		_ = a.Allowed(c, Action(action), resource, group)
		_ = a.Allowed(c, Action(action), resource, other)
		_ = a.Allowed(c, Subscribe, other, "")
		w := who{user: cuser, client: client}
		switch Action(action) {
		case Publish, Subscribe:
			p, _ := compileTopic(pattern)
			if len(p.parts) > 0 || strings.ContainsAny(resource, "+#") {
				return
			}
			if got, want := p.matchTopic(resource, w), refMatch(pattern, resource); got != want {
				t.Fatalf("match(%q, %q) = %v, want %v", pattern, resource, got, want)
			}
			if _, reason := compileTopic(other); reason != "" {
				return
			}
			if p.covers(other, w) && refMatch(other, resource) && !refMatch(pattern, resource) {
				t.Fatalf("%q covers %q but not its topic %q", pattern, other, resource)
			}
			if refMatch(other, resource) && refMatch(pattern, resource) && !p.intersects(other, w) {
				t.Fatalf("%q and %q share %q but do not intersect", pattern, other, resource)
			}
		default:
			if strings.Contains(pattern, "%") {
				return
			}
			want, _ := path.Match(pattern, resource)
			if got := globMatch(pattern, resource); got != want {
				t.Fatalf("globMatch(%q, %q) = %v, want %v", pattern, resource, got, want)
			}
			if Action(action) == Produce && perm == Allow && user == AnyUser {
				if got := a.Allowed(c, Produce, resource, ""); got != want {
					t.Fatalf("Allowed(produce %q) under %q = %v, want %v", resource, pattern, got, want)
				}
			}
		}
	})
}

// BenchmarkACLAllowed measures one check against an ACL of 100 rules
// whose matching rule comes last (the others apply to every user but name
// other topics and queues), and against one rule.
//
//	go test -run '^$' -bench BenchmarkACLAllowed ./auth/
func BenchmarkACLAllowed(b *testing.B) {
	build := func(n int) *ACL {
		var rules []Rule
		for i := 0; len(rules) < n-2; i++ {
			if i%2 == 0 {
				rules = append(rules, allow("*", Publish, "site/"+strconv.Itoa(i)+"/+/telemetry/#"))
			} else {
				rules = append(rules, allow("*", Produce, "tenant-"+strconv.Itoa(i)+"-*"))
			}
		}
		return compile(b, append(rules, allow("*", Publish, "devices/%u/#"), allow("*", Produce, "bench*"))...)
	}
	c := Client{User: "alice", ClientID: "sensor-1"}
	for _, n := range []int{2, 100} {
		a := build(n)
		b.Run("rules="+strconv.Itoa(n)+",action=publish", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if !a.Allowed(c, Publish, "devices/alice/temp", "") {
					b.Fatal("denied")
				}
			}
		})
		b.Run("rules="+strconv.Itoa(n)+",action=produce", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if !a.Allowed(c, Produce, "bench-orders", "") {
					b.Fatal("denied")
				}
			}
		})
	}
}
