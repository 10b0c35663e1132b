package queue

import (
	"errors"
	"strings"
	"testing"
)

func TestQueueParseTopic(t *testing.T) {
	cases := []struct {
		topic string
		want  Topic
		ok    bool
	}{
		{"$queue/orders", Topic{Queue: "orders"}, true},
		{"$queue/orders/eu/de", Topic{Queue: "orders", Subject: "eu/de"}, true},
		{"$queue/orders/$dlq", Topic{Queue: "orders/$dlq"}, true},
		{"$queue/orders/$ack", Topic{Queue: "orders", Verb: VerbAck}, true},
		{"$queue/orders/$dlq/$nack", Topic{Queue: "orders/$dlq", Verb: VerbNack}, true},
		{"$queue/orders/$release", Topic{Queue: "orders", Verb: VerbRelease}, true},
		{"$queue/orders/$dlq/$other", Topic{}, false},
		{"$queue/a.b-c_D9", Topic{Queue: "a.b-c_D9"}, true},
		{"$queue/" + strings.Repeat("q", 128), Topic{Queue: strings.Repeat("q", 128)}, true},
		{"$queue/" + strings.Repeat("q", 129), Topic{}, false},
		{"$queue/", Topic{}, false},
		{"$queue/orders/", Topic{}, false},
		{"$queue/bad name", Topic{}, false},
		{"$queue/orders/$other", Topic{}, false},
		{"$queue/orders/a/$b", Topic{}, false},
		{"$queue/+", Topic{}, false},
		{"orders", Topic{}, false},
	}
	for _, c := range cases {
		t.Run(c.topic, func(t *testing.T) {
			got, err := ParseTopic(c.topic)
			if (err == nil) != c.ok || got != c.want {
				t.Fatalf("ParseTopic(%q) = %+v, %v; want %+v ok=%v", c.topic, got, err, c.want, c.ok)
			}
		})
	}
}

func TestQueueParseFilter(t *testing.T) {
	cases := []struct {
		filter string
		want   Filter
		ok     bool
	}{
		{"$queue/jobs", Filter{Queue: "jobs", Group: DefaultGroup}, true},
		{"$queue/jobs/#", Filter{Queue: "jobs", Group: DefaultGroup, AllSubjects: true}, true},
		{"$share/w/$queue/jobs", Filter{Queue: "jobs", Group: "w", Shared: true}, true},
		{"$share/w/$queue/jobs/$dlq", Filter{Queue: "jobs/$dlq", Group: "w", Shared: true}, true},
		{"$queue/#", Filter{}, false},
		{"$queue/+/x", Filter{}, false},
		{"$queue/jobs/sub", Filter{Queue: "jobs", Group: DefaultGroup, Subjects: "sub"}, true},
		{"$share/w/$queue/jobs/eu/#", Filter{Queue: "jobs", Group: "w", Shared: true, Subjects: "eu/#"}, true},
		{"$queue/jobs/+/temp", Filter{Queue: "jobs", Group: DefaultGroup, Subjects: "+/temp"}, true},
		{"$queue/jobs/#/x", Filter{}, false},
		{"$queue/jobs/eu+", Filter{}, false},
		{"$queue/jobs/$x", Filter{}, false},
		{"$queue/jobs/$dlq/eu", Filter{}, false},
		{"$share//$queue/jobs", Filter{}, false},
		{"$share/g/plain", Filter{}, false},
	}
	for _, c := range cases {
		t.Run(c.filter, func(t *testing.T) {
			got, err := ParseFilter(c.filter)
			if (err == nil) != c.ok || got != c.want {
				t.Fatalf("ParseFilter(%q) = %+v, %v; want %+v ok=%v", c.filter, got, err, c.want, c.ok)
			}
		})
	}
}

// A subject filter matches subjects as an MQTT topic filter matches topics;
// a message without a subject matches only the filters of every subject.
func TestQueueMatchSubject(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"", "", true}, {"", "eu/de", true}, {"#", "", true}, {"#", "eu", true},
		{"eu/#", "eu", true}, {"eu/#", "eu/de", true}, {"eu/#", "eu/de/x", true}, {"eu/#", "us/de", false}, {"eu/#", "", false},
		{"eu", "eu", true}, {"eu", "eu/de", false}, {"eu/de", "eu", false},
		{"+", "eu", true}, {"+", "eu/de", false}, {"+", "", false},
		{"+/temp", "a/temp", true}, {"+/temp", "a/hum", false}, {"+/temp", "temp", false},
		{"a/+/c", "a/b/c", true}, {"a/+/c", "a//c", true}, {"a/+/#", "a/b", true},
	} {
		if got := MatchSubject(c.filter, c.subject); got != c.want {
			t.Errorf("MatchSubject(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}

// FuzzParseTopic checks that a topic that parses names a valid queue, never
// holds a wildcard, has no subject level starting with '$', and maps back
// to the topic it came from.
func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"$queue/q", "$queue/q/a/b", "$queue/q/$dlq", "$queue/q/$ack", "$queue/", "$queue/q//x", "$queue/+/#", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		tp, err := ParseTopic(topic)
		if err != nil {
			return
		}
		name := strings.TrimSuffix(tp.Queue, dlqSuffix)
		if !ValidQueueName(name) {
			t.Fatalf("%q parsed to invalid queue %q", topic, tp.Queue)
		}
		if strings.ContainsAny(topic, "+#") {
			t.Fatalf("%q holds a wildcard but parsed", topic)
		}
		for _, level := range strings.Split(tp.Subject, "/") {
			if strings.HasPrefix(level, "$") {
				t.Fatalf("%q: subject level %q starts with $", topic, level)
			}
		}
		if tp.Verb == "" && TopicName(tp.Queue, tp.Subject) != topic {
			t.Fatalf("%q does not round-trip: %q", topic, TopicName(tp.Queue, tp.Subject))
		}
	})
}

// FuzzParseFilter checks that a filter that parses names exactly one valid queue.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"$queue/q", "$queue/q/#", "$share/g/$queue/q", "$queue/#", "$share/g/$queue/q/$dlq/#"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, filter string) {
		fl, err := ParseFilter(filter)
		if err != nil {
			return
		}
		if !ValidQueueName(strings.TrimSuffix(fl.Queue, dlqSuffix)) || fl.Group == "" {
			t.Fatalf("%q parsed to %+v", filter, fl)
		}
	})
}

func TestQueueMessageIDRoundTrip(t *testing.T) {
	p, o, err := ParseMessageID(MessageID(7, 12345))
	if err != nil || p != 7 || o != 12345 {
		t.Fatalf("got %d %d %v", p, o, err)
	}
	for _, bad := range []string{"", "7", "-1", "a-1", "1-b", "1-", "-1-2", "+1-2", "1-+2"} {
		if _, _, err := ParseMessageID(bad); err == nil {
			t.Errorf("ParseMessageID(%q) succeeded", bad)
		}
	}
}

// A bad queue name is refused with the rule it breaks.
func TestQueueNameErrorsNameTheRule(t *testing.T) {
	for topic, want := range map[string]string{
		"$queue/":                            "the queue name is empty",
		"$queue/" + strings.Repeat("x", 129): "129 bytes long",
		"$queue/orders:eu":                   `holds ':'`,
		"$queue/ordérs":                      `holds 'é'`,
	} {
		_, err := ParseTopic(topic)
		if !errors.Is(err, ErrInvalidTopic) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "A-Z a-z 0-9 _ . -") {
			t.Errorf("ParseTopic(%.40q): %v; want ErrInvalidTopic saying %q and the rule", topic, err, want)
		}
	}
}

// Any other bad queue topic is refused saying what is wrong with it.
func TestQueueTopicErrorsSayWhy(t *testing.T) {
	for topic, want := range map[string]string{
		"$queue/orders/+":    "wildcard",
		"$queue/orders/#":    "wildcard",
		"$queue/orders/":     "ends with /",
		"$queue/orders/$foo": `"$foo" starts with $`,
		"orders":             "does not start with $queue/",
	} {
		_, err := ParseTopic(topic)
		if !errors.Is(err, ErrInvalidTopic) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseTopic(%q): %v; want ErrInvalidTopic saying %q", topic, err, want)
		}
	}
}
