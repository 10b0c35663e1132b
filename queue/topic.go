package queue

import (
	"fmt"
	"strings"
)

// Topic prefixes and verbs of SPEC section 1.
const (
	TopicPrefix  = "$queue/"
	SharePrefix  = "$share/"
	DefaultGroup = "default"
	dlqLevel     = "$dlq"
	dlqSuffix    = "/" + dlqLevel
)

// Settlement verbs published to $queue/{queue}/{verb}.
const (
	VerbAck     = "$ack"
	VerbNack    = "$nack"
	VerbReject  = "$reject"
	VerbExtend  = "$extend"
	VerbRelease = "$release"
)

// Topic is a parsed publish topic under $queue/.
type Topic struct {
	// Queue is the queue's name; for $queue/{q}/$dlq it is DLQName(q).
	Queue string
	// Subject is the part after the queue level, or empty.
	Subject string
	// Verb is one of the settlement verbs, or empty for an enqueue.
	Verb string
}

// IsQueueTopic reports whether a topic or filter addresses the queue layer
// (either $queue/... or $share/{group}/$queue/...).
func IsQueueTopic(s string) bool {
	if strings.HasPrefix(s, TopicPrefix) {
		return true
	}
	if !strings.HasPrefix(s, SharePrefix) {
		return false
	}
	rest := s[len(SharePrefix):]
	i := strings.IndexByte(rest, '/')
	return i >= 0 && strings.HasPrefix(rest[i+1:], TopicPrefix)
}

// ValidQueueName reports whether name is 1 to 128 characters of A-Z a-z 0-9 _ . -.
func ValidQueueName(name string) bool { return CheckQueueName(name) == nil }

// CheckQueueName says which rule of a queue name name breaks, or nil.
func CheckQueueName(name string) error {
	const rule = "a queue name is 1 to 128 characters of A-Z a-z 0-9 _ . -"
	switch {
	case len(name) == 0:
		return fmt.Errorf("the queue name is empty: %s", rule)
	case len(name) > 128:
		return fmt.Errorf("the queue name is %d bytes long: %s", len(name), rule)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("the queue name %q holds %q: %s", name, c, rule)
		}
	}
	return nil
}

// DLQName is the internal name of a queue's dead-letter queue.
func DLQName(queue string) string { return queue + dlqSuffix }

// IsDLQ reports whether name is a dead-letter queue's internal name.
func IsDLQ(name string) bool { return strings.HasSuffix(name, dlqSuffix) }

// ParentName returns the queue a dead-letter queue belongs to; any other
// name is returned unchanged.
func ParentName(name string) string { return strings.TrimSuffix(name, dlqSuffix) }

// TopicName is the MQTT topic of a queue (or dead-letter queue) and subject.
func TopicName(queue, subject string) string {
	if subject == "" {
		return TopicPrefix + queue
	}
	return TopicPrefix + queue + "/" + subject
}

// ParseTopic parses a publish topic. It accepts $queue/{q},
// $queue/{q}/{subject...}, $queue/{q}/$dlq, $queue/{q}/{verb} and
// $queue/{q}/$dlq/{verb} (settling a dead letter), where
// {q} is a valid queue name, no subject level starts with '$', and no level
// holds a wildcard. Anything else is ErrInvalidTopic.
func ParseTopic(topic string) (Topic, error) {
	if !strings.HasPrefix(topic, TopicPrefix) {
		return Topic{}, fmt.Errorf("%w: %q does not start with %s", ErrInvalidTopic, topic, TopicPrefix)
	}
	if strings.ContainsAny(topic, "+#\x00") {
		return Topic{}, fmt.Errorf("%w: %q holds a wildcard (+ or #) or a NUL: a publish names one topic", ErrInvalidTopic, topic)
	}
	rest := topic[len(TopicPrefix):]
	name, subject, hasSubject := strings.Cut(rest, "/")
	if err := CheckQueueName(name); err != nil {
		return Topic{}, fmt.Errorf("%w: %v", ErrInvalidTopic, err)
	}
	if !hasSubject {
		return Topic{Queue: name}, nil
	}
	switch subject {
	case dlqLevel:
		return Topic{Queue: DLQName(name)}, nil
	case dlqLevel + "/" + VerbAck, dlqLevel + "/" + VerbNack, dlqLevel + "/" + VerbReject, dlqLevel + "/" + VerbExtend, dlqLevel + "/" + VerbRelease:
		return Topic{Queue: DLQName(name), Verb: subject[len(dlqLevel)+1:]}, nil
	case VerbAck, VerbNack, VerbReject, VerbExtend, VerbRelease:
		return Topic{Queue: name, Verb: subject}, nil
	case "":
		return Topic{}, fmt.Errorf("%w: %q ends with /: write $queue/%s, or a subject after the /", ErrInvalidTopic, topic, name)
	}
	for _, level := range strings.Split(subject, "/") {
		if strings.HasPrefix(level, "$") {
			return Topic{}, fmt.Errorf("%w: the subject level %q starts with $, which only $dlq and the verbs ($ack, $nack, $reject, $extend, $release) may", ErrInvalidTopic, level)
		}
	}
	return Topic{Queue: name, Subject: subject}, nil
}

// Filter is a parsed subscription to a queue.
type Filter struct {
	// Queue is the queue's name; for a $dlq filter it is DLQName(q).
	Queue string
	// Group is the consumer group: the $share group, or DefaultGroup.
	Group string
	// Shared is true when the group came from a $share/ prefix.
	Shared bool
	// AllSubjects is true for $queue/{q}/#: deliveries keep their subject topic.
	AllSubjects bool
	// Subjects is a filter of subjects, the levels after the queue's
	// ($queue/{q}/eu/# takes eu/#): the group takes only the messages
	// whose subject matches it, and deliveries keep their subject topic.
	// "" for a filter with no subject levels, or #: every message.
	Subjects string
}

// ParseFilter parses a subscription filter: [$share/{group}/]$queue/{q}
// optionally followed by /# and/or preceded by /$dlq. A filter that names
// more than one queue (a wildcard in the queue level) or filters by subject
// is ErrInvalidFilter.
func ParseFilter(filter string) (Filter, error) {
	var f Filter
	if strings.HasPrefix(filter, SharePrefix) {
		rest := filter[len(SharePrefix):]
		group, tail, ok := strings.Cut(rest, "/")
		if !ok || group == "" || strings.ContainsAny(group, "+#\x00") {
			return Filter{}, ErrInvalidFilter
		}
		f.Group, f.Shared, filter = group, true, tail
	} else {
		f.Group = DefaultGroup
	}
	if !strings.HasPrefix(filter, TopicPrefix) {
		return Filter{}, ErrInvalidFilter
	}
	levels := strings.Split(filter[len(TopicPrefix):], "/")
	if err := CheckQueueName(levels[0]); err != nil {
		return Filter{}, fmt.Errorf("%w: %v", ErrInvalidFilter, err)
	}
	f.Queue = levels[0]
	levels = levels[1:]
	if len(levels) > 0 && levels[0] == dlqLevel {
		f.Queue = DLQName(f.Queue)
		levels = levels[1:]
	}
	switch {
	case len(levels) == 0:
	case len(levels) == 1 && levels[0] == "#":
		f.AllSubjects = true
	case IsDLQ(f.Queue):
		return Filter{}, fmt.Errorf("%w: a dead-letter queue takes no subject filter", ErrInvalidFilter)
	default:
		for i, l := range levels {
			switch {
			case l == "#" && i != len(levels)-1:
				return Filter{}, fmt.Errorf("%w: # must be the last level of a subject filter", ErrInvalidFilter)
			case l != "#" && l != "+" && strings.ContainsAny(l, "#+"):
				return Filter{}, fmt.Errorf("%w: the subject level %q mixes a wildcard with other characters", ErrInvalidFilter, l)
			case strings.HasPrefix(l, "$"):
				return Filter{}, fmt.Errorf("%w: the subject level %q starts with $", ErrInvalidFilter, l)
			}
		}
		f.Subjects = strings.Join(levels, "/")
	}
	return f, nil
}

// MatchSubject reports whether subject matches the subject filter
// (Filter.Subjects) as an MQTT topic matches a topic filter: + stands for
// one level, a last # for any number, none included. "" matches every
// subject.
func MatchSubject(filter, subject string) bool {
	if filter == "" || filter == "#" {
		return true
	}
	if subject == "" {
		return false // a message published to $queue/{q} itself
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		sl, srest, smore := strings.Cut(subject, "/")
		if fl != "+" && fl != sl {
			return false
		}
		switch {
		case !fmore && !smore:
			return true
		case !fmore:
			return false
		case !smore:
			// eu/# matches eu: what is left of the filter must be #.
			return frest == "#"
		}
		filter, subject = frest, srest
	}
}

// DeliveryTopic is the topic a message of subject is delivered on to a
// consumer with filter f: its own topic when f matches it (a filter of
// every subject, $queue/{q}/#, or of some), else the queue's.
func (f Filter) DeliveryTopic(subject string) (topic string, subjectMoved bool) {
	if subject == "" || f.AllSubjects || f.Subjects != "" {
		return TopicName(f.Queue, subject), false
	}
	return TopicName(f.Queue, ""), true
}

// filterMismatch says that group of queue takes the subjects filter and
// a subscription asked for want.
func filterMismatch(queue, group, filter, want string) error {
	name := func(f string) string {
		if f == "" {
			return "every subject"
		}
		return "subjects " + f
	}
	return fmt.Errorf("%w: group %s of queue %s takes %s; this subscription asks for %s: subscribe with the group's filter, or use another group",
		ErrFilterMismatch, group, queue, name(filter), name(want))
}
