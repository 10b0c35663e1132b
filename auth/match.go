package auth

import (
	"strings"
	"unicode/utf8"
)

// Patterns of ACL rules: MQTT topic filters for publish and subscribe,
// globs of queue names (and groups) for produce, consume and admin. Both
// may hold the placeholders %u (the username) and %c (the client ID); %%
// is a literal %. Matching never allocates unless a glob holds a
// placeholder.

// who is the client a rule is checked for.
type who struct {
	user, client string
}

// value returns the text a placeholder stands for.
func (w who) value(ph byte) string {
	if ph == 'u' {
		return w.user
	}
	return w.client
}

// topicValue reports whether v may stand for a placeholder in a topic: a
// value that is empty, holds a wildcard or a level separator, or starts
// with $ would let a client reach past its own level.
func topicValue(v string) bool {
	return v != "" && !strings.ContainsAny(v, "+#/\x00") && v[0] != '$'
}

// globValue reports whether v may stand for a placeholder in a glob.
func globValue(v string) bool {
	return v != "" && !strings.ContainsAny(v, "*?/\x00")
}

// part is a piece of a pattern: literal text, or a placeholder ('u', 'c').
type part struct {
	text string
	ph   byte
}

// parsePlaceholders splits s into literal text and placeholders. It
// returns the parts (nil when s holds no placeholder), s with %% read as %,
// and why s is invalid, or "".
func parsePlaceholders(s string) (parts []part, literal string, reason string) {
	if !strings.Contains(s, "%") {
		return nil, s, ""
	}
	var b strings.Builder
	hasPh := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 == len(s) {
			return nil, "", "a % must be followed by u (username), c (client ID) or % (a literal %)"
		}
		i++
		switch s[i] {
		case '%':
			b.WriteByte('%')
		case 'u', 'c':
			if b.Len() > 0 {
				parts = append(parts, part{text: b.String()})
				b.Reset()
			}
			parts = append(parts, part{ph: s[i]})
			hasPh = true
		default:
			return nil, "", "%" + string(s[i]) + " is not a placeholder: use %u (username), %c (client ID) or %% (a literal %)"
		}
	}
	if !hasPh {
		return nil, b.String(), ""
	}
	if b.Len() > 0 {
		parts = append(parts, part{text: b.String()})
	}
	return parts, "", ""
}

// usable reports whether every placeholder of parts has a value that may
// stand in a pattern (ok says which kind).
func usable(parts []part, w who, ok func(string) bool) bool {
	for _, p := range parts {
		if p.ph != 0 && !ok(w.value(p.ph)) {
			return false
		}
	}
	return true
}

// Topic filters.

type levelKind byte

const (
	levelLiteral levelKind = iota
	levelPlus
	levelHash
)

// level is one level of a topic pattern.
type level struct {
	kind  levelKind
	text  string // a literal level without placeholders
	parts []part // a literal level with placeholders
}

// matches reports whether the literal level l is s for the client w.
func (l *level) matches(s string, w who) bool {
	if l.parts == nil {
		return s == l.text
	}
	for _, p := range l.parts {
		t := p.text
		if p.ph != 0 {
			t = w.value(p.ph)
		}
		if !strings.HasPrefix(s, t) {
			return false
		}
		s = s[len(t):]
	}
	return s == ""
}

// dollar reports whether the literal level l starts with $. A value of a
// placeholder never does (see topicValue).
func (l *level) dollar() bool {
	if l.parts == nil {
		return strings.HasPrefix(l.text, "$")
	}
	return l.parts[0].ph == 0 && strings.HasPrefix(l.parts[0].text, "$")
}

// topicPattern is a compiled topic filter.
type topicPattern struct {
	levels []level
	parts  []part // every placeholder, to check their values once
}

// compileTopic compiles an MQTT topic filter; it returns why s is not one,
// or "".
func compileTopic(s string) (*topicPattern, string) {
	if s == "" {
		return nil, "must not be empty"
	}
	if strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return nil, "must be UTF-8 without NUL characters"
	}
	p := &topicPattern{}
	raw := strings.Split(s, "/")
	for i, r := range raw {
		switch {
		case r == "#":
			if i != len(raw)-1 {
				return nil, "# must be the last level"
			}
			p.levels = append(p.levels, level{kind: levelHash})
		case r == "+":
			p.levels = append(p.levels, level{kind: levelPlus})
		case strings.ContainsAny(r, "+#"):
			return nil, "+ and # must stand alone in their level"
		default:
			parts, lit, reason := parsePlaceholders(r)
			if reason != "" {
				return nil, reason
			}
			p.levels = append(p.levels, level{text: lit, parts: parts})
			for _, pt := range parts {
				if pt.ph != 0 {
					p.parts = append(p.parts, pt)
				}
			}
		}
	}
	return p, ""
}

// levelIter walks the levels of a topic or filter without allocating.
type levelIter struct {
	s    string
	done bool
}

func (it *levelIter) next() (string, bool) {
	if it.done {
		return "", false
	}
	i := strings.IndexByte(it.s, '/')
	if i < 0 {
		it.done = true
		return it.s, true
	}
	l := it.s[:i]
	it.s = it.s[i+1:]
	return l, true
}

func wild(s string) bool { return s == "+" || s == "#" }

// matchTopic reports whether the topic (no wildcards) matches p. As in
// MQTT, a wildcard in the first level does not match a topic starting
// with $, and "a/#" matches "a".
func (p *topicPattern) matchTopic(topic string, w who) bool {
	dollar := strings.HasPrefix(topic, "$")
	it := levelIter{s: topic}
	for i := range p.levels {
		l := &p.levels[i]
		if l.kind == levelHash {
			return !(i == 0 && dollar)
		}
		s, ok := it.next()
		if !ok {
			return false
		}
		if l.kind == levelPlus {
			if i == 0 && dollar {
				return false
			}
		} else if !l.matches(s, w) {
			return false
		}
	}
	_, more := it.next()
	return !more
}

// covers reports whether every topic the filter f matches also matches p.
func (p *topicPattern) covers(f string, w who) bool {
	it := levelIter{s: f}
	firstEmpty := false
	for i := range p.levels {
		l := &p.levels[i]
		s, ok := it.next()
		if i == 0 {
			firstEmpty = s == ""
		}
		if l.kind == levelHash {
			// The filter's topics from here on, none when it ended.
			return !(i == 0 && ok && !wild(s) && strings.HasPrefix(s, "$"))
		}
		switch {
		case !ok:
			// Shorter topics: p needs this level.
			return false
		case s == "#":
			// # also matches its parent level, which p needs, unless
			// that parent is no topic ("#" and "/#" at the start): then
			// it is +/#, which only +/# covers.
			if i == 0 || i == 1 && firstEmpty {
				return l.kind == levelPlus && i+1 < len(p.levels) && p.levels[i+1].kind == levelHash
			}
			return false
		case s == "+":
			if l.kind != levelPlus {
				return false
			}
		case l.kind == levelPlus:
			if i == 0 && strings.HasPrefix(s, "$") {
				return false
			}
		case !l.matches(s, w):
			return false
		}
	}
	_, more := it.next()
	return !more
}

// intersects reports whether some topic matches both p and the filter f.
func (p *topicPattern) intersects(f string, w who) bool {
	it := levelIter{s: f}
	// A shared topic of one level is the empty topic, which is none, when
	// either first level is empty.
	first := p.levels[0]
	firstEmpty := first.kind == levelLiteral && first.parts == nil && first.text == ""
	for i := range p.levels {
		l := &p.levels[i]
		s, ok := it.next()
		if i == 0 && s == "" {
			firstEmpty = true
		}
		if l.kind == levelHash {
			if !ok {
				return !(i == 1 && firstEmpty)
			}
			return !(i == 0 && !wild(s) && strings.HasPrefix(s, "$"))
		}
		if !ok {
			return false
		}
		switch {
		case s == "#":
			return !(i == 0 && l.kind == levelLiteral && l.dollar())
		case s == "+":
			if i == 0 && l.kind == levelLiteral && l.dollar() {
				return false
			}
		case l.kind == levelPlus:
			if i == 0 && strings.HasPrefix(s, "$") {
				return false
			}
		case !l.matches(s, w):
			return false
		}
	}
	// The filter goes on: only a last "#" matches no more levels.
	s, more := it.next()
	if !more {
		return true
	}
	_, after := it.next()
	return s == "#" && !after && !(len(p.levels) == 1 && firstEmpty)
}

// Globs of names: * matches any run of characters but /, ? one character
// but /. A queue's dead-letter queue is named {queue}/$dlq, so that * never
// reaches one.

// glob is a compiled glob.
type glob struct {
	text  string // without placeholders (%% read as %)
	parts []part // with placeholders; nil without
}

// compileGlob compiles a glob whose literal characters allowed accepts.
func compileGlob(s string, allowed func(rune) bool, what string) (*glob, string) {
	if s == "" {
		return nil, "must not be empty"
	}
	if !utf8.ValidString(s) {
		return nil, "must be UTF-8"
	}
	for _, r := range strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(s, "%%", ""), "%u", ""), "%c", "") {
		if r != '*' && r != '?' && r != '%' && !allowed(r) {
			return nil, "holds " + quoteRune(r) + ", which " + what
		}
	}
	parts, lit, reason := parsePlaceholders(s)
	if reason != "" {
		return nil, reason
	}
	return &glob{text: lit, parts: parts}, ""
}

func quoteRune(r rune) string {
	if r == '\'' {
		return `"'"`
	}
	return "'" + string(r) + "'"
}

// match reports whether name matches g for the client w; ok is false when
// a placeholder's value cannot be used (empty, or holding * ? or /).
func (g *glob) match(name string, w who) (matched, ok bool) {
	if g.parts == nil {
		return globMatch(g.text, name), true
	}
	if !usable(g.parts, w, globValue) {
		return false, false
	}
	var b strings.Builder
	for _, p := range g.parts {
		if p.ph != 0 {
			b.WriteString(w.value(p.ph))
		} else {
			b.WriteString(p.text)
		}
	}
	return globMatch(b.String(), name), true
}

// globMatch reports whether name matches the glob p (no placeholders):
// path.Match for patterns of * and ? only, in time O(len(p)*len(name)).
func globMatch(p, name string) bool {
	px, nx := 0, 0
	starPx, starNx := -1, 0 // the last * and where its run ends in name
	for px < len(p) || nx < len(name) {
		if px < len(p) {
			switch c := p[px]; c {
			case '*':
				starPx, starNx = px, nx
				px++
				continue
			case '?':
				if nx < len(name) {
					r, size := utf8.DecodeRuneInString(name[nx:])
					if r != '/' {
						px++
						nx += size
						continue
					}
				}
			default:
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		// Let the last * take one more character, if it may.
		if starPx < 0 || starNx >= len(name) {
			return false
		}
		r, size := utf8.DecodeRuneInString(name[starNx:])
		if r == '/' {
			return false
		}
		starNx += size
		px, nx = starPx+1, starNx
	}
	return true
}
