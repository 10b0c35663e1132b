package auth

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// Action is what an ACL rule is about.
type Action string

const (
	// Publish: publishing to a plain topic (not $queue/); the pattern is a
	// topic filter the topic must match.
	Publish Action = "publish"
	// Subscribe: subscribing to a plain topic filter ($share/{group}/
	// stripped); an allow rule's pattern must cover every topic the
	// filter matches, a deny rule applies when they have any in common.
	Subscribe Action = "subscribe"
	// Produce: enqueueing into a queue; the pattern is a glob of queue
	// names. The dead-letter queue of q is the queue q/$dlq.
	Produce Action = "produce"
	// Consume: consuming a queue, as a member of a group; the pattern is a
	// glob of queue names, the rule's group (optional) a glob of groups.
	Consume Action = "consume"
	// Admin: the admin API's calls on a queue; the pattern is a glob of
	// queue names. Calls on no single queue need the pattern "*".
	Admin Action = "admin"
)

var actions = []Action{Publish, Subscribe, Produce, Consume, Admin}

// Permissions of a rule.
const (
	Allow = "allow"
	Deny  = "deny"
)

// AnyUser is the user of a rule that applies to every client, anonymous
// ones included.
const AnyUser = "*"

// Rule is one entry of auth.acl, as the config file writes it.
type Rule struct {
	User       string `yaml:"user"`       // a username, or "*" for every client
	Action     Action `yaml:"action"`     // publish, subscribe, produce, consume or admin
	Pattern    string `yaml:"pattern"`    // a topic filter or a glob of queue names, with %u and %c
	Group      string `yaml:"group"`      // consume only: a glob of groups; empty for every group
	Permission string `yaml:"permission"` // allow or deny
}

// Client is who asks: the authenticated username ("" for an anonymous
// client) and the MQTT client ID ("" over HTTP).
type Client struct {
	User     string
	ClientID string
}

// ACL is a compiled list of rules. The first rule that applies to a
// request decides it; once the list holds any rule, a request no rule
// applies to is denied. An empty (or nil) ACL allows everything. An ACL is
// read-only and safe for concurrent use.
type ACL struct {
	n  int
	by [5]ruleIndex // by the position of the action in actions
}

// ruleIndex holds the rules of one action that apply to each user, in
// their order in the list.
type ruleIndex struct {
	anyone []*rule            // the rules of "*"
	users  map[string][]*rule // a named user's rules and the rules of "*"
}

type rule struct {
	allow bool
	topic *topicPattern // publish, subscribe
	name  *glob         // produce, consume, admin
	group *glob         // consume; nil for every group
	all   bool          // admin with the pattern "*"
	// prefix is text every resource the rule matches starts with: the
	// literal first level of a topic pattern (with the / after it when
	// more levels follow, none for a last #), or the literal start of a
	// glob. It rejects most rules at the first bytes.
	prefix string
}

// quickPrefix returns the prefix of a rule (see rule.prefix).
func (r *rule) quickPrefix() string {
	if r.topic != nil {
		l := r.topic.levels[0]
		if l.kind != levelLiteral || l.parts != nil {
			return ""
		}
		if len(r.topic.levels) > 1 && r.topic.levels[1].kind != levelHash {
			return l.text + "/"
		}
		return l.text
	}
	if r.name != nil && r.name.parts == nil {
		if i := strings.IndexAny(r.name.text, "*?"); i >= 0 {
			return r.name.text[:i]
		}
		return r.name.text
	}
	return ""
}

// Compile checks and compiles rules. Every invalid field is reported, as a
// *RuleError, joined with errors.Join.
func Compile(rules []Rule) (*ACL, error) {
	a := &ACL{n: len(rules)}
	var errs []error
	fail := func(i int, field, format string, args ...any) {
		errs = append(errs, &RuleError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	type compiled struct {
		r      *rule
		user   string
		action int
	}
	var out []compiled
	for i, r := range rules {
		c := &rule{}
		bad := len(errs)
		switch r.Permission {
		case Allow:
			c.allow = true
		case Deny:
		default:
			fail(i, "permission", "must be allow or deny, got %q", r.Permission)
		}
		if r.User != AnyUser {
			if err := ValidUsername(r.User); err != nil {
				fail(i, "user", "must be a username or \"*\" for every client: %s", strings.TrimPrefix(err.Error(), "auth: "))
			}
		}
		ai := -1
		for j, x := range actions {
			if r.Action == x {
				ai = j
			}
		}
		if ai < 0 {
			fail(i, "action", "must be publish, subscribe, produce, consume or admin, got %q", r.Action)
		}
		if r.Group != "" && r.Action != Consume {
			fail(i, "group", "only consume rules name a group")
		}
		switch r.Action {
		case Publish, Subscribe:
			p, reason := compileTopic(r.Pattern)
			switch {
			case reason != "":
				fail(i, "pattern", "%s, got %q", reason, r.Pattern)
			case r.Pattern == "$queue" || strings.HasPrefix(r.Pattern, "$queue/"):
				fail(i, "pattern", "$queue/ topics are queues: use produce and consume rules with queue names, got %q", r.Pattern)
			case strings.HasPrefix(r.Pattern, "$share/"):
				fail(i, "pattern", "write the topic filter without $share/{group}/ (a shared subscription is checked by its filter), got %q", r.Pattern)
			}
			c.topic = p
		case Produce, Consume, Admin:
			g, reason := compileGlob(r.Pattern, queueRune, "a queue name cannot hold (A-Z a-z 0-9 _ . - and * ?, with /$dlq for a dead-letter queue)")
			if reason == "" {
				reason = checkQueueGlob(g)
			}
			if reason != "" {
				fail(i, "pattern", "%s, got %q", reason, r.Pattern)
			}
			c.name = g
			c.all = r.Action == Admin && r.Pattern == "*"
			if r.Group != "" {
				gg, reason := compileGlob(r.Group, groupRune, "a group cannot hold")
				if reason != "" {
					fail(i, "group", "%s, got %q", reason, r.Group)
				}
				c.group = gg
			}
		}
		if len(errs) == bad {
			c.prefix = c.quickPrefix()
			out = append(out, compiled{c, r.User, ai})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, c := range out {
		idx := &a.by[c.action]
		if c.user == AnyUser {
			idx.anyone = append(idx.anyone, c.r)
			for u := range idx.users {
				idx.users[u] = append(idx.users[u], c.r)
			}
			continue
		}
		if idx.users == nil {
			idx.users = map[string][]*rule{}
		}
		if _, ok := idx.users[c.user]; !ok {
			idx.users[c.user] = append([]*rule(nil), idx.anyone...)
		}
		idx.users[c.user] = append(idx.users[c.user], c.r)
	}
	return a, nil
}

// queueRune reports whether r may be in a queue name glob: the characters
// of queue names, and / and $ for the /$dlq suffix (checked after).
func queueRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' || r == '/' || r == '$'
}

// groupRune reports whether r may be in a group glob: anything $share
// accepts in a group.
func groupRune(r rune) bool {
	return r != '/' && r != '+' && r != '#' && !unicode.IsControl(r)
}

// checkQueueGlob returns why a queue glob is not one: / and $ only in a
// final /$dlq.
func checkQueueGlob(g *glob) string {
	text := g.text
	if g.parts != nil {
		// Placeholders are checked by their values; look at the literals.
		var b strings.Builder
		for _, p := range g.parts {
			if p.ph == 0 {
				b.WriteString(p.text)
			} else {
				b.WriteByte('x')
			}
		}
		text = b.String()
	}
	base := strings.TrimSuffix(text, "/$dlq")
	if strings.ContainsAny(base, "/$") {
		return "/ and $ may only end a pattern as /$dlq (a queue's dead-letter queue)"
	}
	if base == "" {
		return "names no queue before /$dlq"
	}
	return ""
}

// Empty reports whether a holds no rule: everything is allowed.
func (a *ACL) Empty() bool { return a == nil || a.n == 0 }

// Len returns the number of rules.
func (a *ACL) Len() int {
	if a == nil {
		return 0
	}
	return a.n
}

// Allowed reports whether c may take action on resource: the topic of a
// publish, the filter of a subscription, the queue of a produce, consume
// or admin call ("" for an admin call on no single queue). group is the
// consumer group of a consume.
func (a *ACL) Allowed(c Client, action Action, resource, group string) bool {
	if a.Empty() {
		return true
	}
	ai := -1
	for j, x := range actions {
		if action == x {
			ai = j
			break
		}
	}
	if ai < 0 {
		return false
	}
	idx := &a.by[ai]
	rules := idx.anyone
	if c.User != "" {
		if r, ok := idx.users[c.User]; ok {
			rules = r
		}
	}
	if action == Subscribe {
		resource = stripShare(resource)
	}
	w := who{user: c.User, client: c.ClientID}
	wild := wildStart(action, resource)
	for _, r := range rules {
		if !r.mayApply(resource, wild) {
			continue
		}
		if applies, ok := r.applies(action, resource, group, w); applies || !ok && !r.allow {
			// A deny rule whose placeholders have no usable value
			// applies: it must never open more than it would with one.
			return r.allow && ok
		}
	}
	return false
}

// wildStart reports whether a subscription's filter starts with a
// wildcard: it may then meet any deny rule.
func wildStart(action Action, filter string) bool {
	return action == Subscribe && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#"))
}

// mayApply is false when the rule cannot apply to resource: its prefix
// says so. wild is wildStart's answer for the request.
func (r *rule) mayApply(resource string, wild bool) bool {
	return r.prefix == "" || strings.HasPrefix(resource, r.prefix) || wild && !r.allow
}

// applies reports whether the rule matches the request; ok is false when
// a placeholder's value cannot be used.
func (r *rule) applies(action Action, resource, group string, w who) (applies, ok bool) {
	switch action {
	case Publish, Subscribe:
		if !usable(r.topic.parts, w, topicValue) {
			return false, false
		}
		switch {
		case action == Publish:
			return r.topic.matchTopic(resource, w), true
		case r.allow:
			return r.topic.covers(resource, w), true
		default:
			return r.topic.intersects(resource, w), true
		}
	case Admin:
		if resource == "" {
			return r.all, true
		}
		return r.name.match(resource, w)
	default:
		m, ok := r.name.match(resource, w)
		if !m || !ok || r.group == nil {
			return m, ok
		}
		return r.group.match(group, w)
	}
}

// stripShare returns the filter of a shared subscription $share/{g}/{f}.
func stripShare(filter string) string {
	rest, ok := strings.CutPrefix(filter, "$share/")
	if !ok {
		return filter
	}
	if _, f, ok := strings.Cut(rest, "/"); ok {
		return f
	}
	return filter
}
