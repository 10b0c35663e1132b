package queue

import (
	"strconv"
	"time"
)

// Property is one user property of a message: a name and a value, both UTF-8.
type Property struct {
	Name  string
	Value string
}

// Headers are the producer's own message properties, carried unchanged to
// every consumer. They mirror MQTT 5 publish properties but the queue does
// not interpret them.
type Headers struct {
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	PayloadFormat   byte
	// ExpiryInterval is the producer's message expiry in seconds; 0 means none.
	ExpiryInterval uint32
	User           []Property
}

// Message is one stored message of a queue partition.
type Message struct {
	// Offset is the message's position in its partition, assigned at append.
	Offset uint64
	// Key decides the partition and, with ordering key, the order.
	Key string
	// Subject is the topic part after $queue/{queue}/, or empty.
	Subject string
	// EnqueuedAt is when the broker accepted the message.
	EnqueuedAt time.Time
	// NotBefore delays delivery until then; zero means at once.
	NotBefore time.Time
	// ExpiresAt ends delivery: a message not delivered by then is expired.
	ExpiresAt time.Time
	Headers   Headers
	Payload   []byte

	// DeadLetter is set on dead-letter queue messages.
	DeadLetter *DeadLetter

	// DedupID, when set, makes a publish with the same id within the
	// queue's dedup window a duplicate: acknowledged, stored once.
	DedupID string

	// Origin names the publish where it entered a cluster, so that a
	// publish routed again after its outcome was lost (a leader that
	// stepped down, a link that broke) is stored once. Zero outside a
	// cluster; not stored with the message.
	Origin Origin

	// ReplayFor, when set, makes the message the replay of a dead letter
	// of that group (Queue.ReplayDLQ): where the queue has the group, the
	// other groups have it settled at once. Not stored with the message.
	ReplayFor string
}

// Origin names one publish: the run of the node it entered the cluster
// through (a random number per process) and its number in that run.
type Origin struct{ Run, Seq uint64 }

// DeadLetter records why and from where a message was dead-lettered.
type DeadLetter struct {
	Reason        string // max-deliveries, rejected, expired, overflow
	OriginalID    string // msg-id in the source queue
	OriginalTopic string
	Deliveries    uint32 // deliveries to the group before it was dead-lettered
	Group         string // the group that dead-lettered it, empty for queue-wide reasons
}

// Dead-letter reasons.
const (
	ReasonMaxDeliveries = "max-deliveries"
	ReasonRejected      = "rejected"
	ReasonExpired       = "expired"
	ReasonOverflow      = "overflow"
)

// Size is the number of bytes the message counts against max_bytes.
func (m *Message) Size() int {
	n := len(m.Payload) + len(m.Key) + len(m.Subject) + len(m.Headers.ContentType) +
		len(m.Headers.ResponseTopic) + len(m.Headers.CorrelationData)
	for _, p := range m.Headers.User {
		n += len(p.Name) + len(p.Value)
	}
	return n
}

// MessageID formats the msg-id of SPEC 3: {partition}-{offset}.
func MessageID(partition int, offset uint64) string {
	return strconv.Itoa(partition) + "-" + strconv.FormatUint(offset, 10)
}

// ParseMessageID is the inverse of MessageID.
func ParseMessageID(id string) (partition int, offset uint64, err error) {
	for i := 0; i < len(id); i++ {
		if id[i] != '-' {
			continue
		}
		p, err1 := strconv.Atoi(id[:i])
		o, err2 := strconv.ParseUint(id[i+1:], 10, 64)
		if err1 != nil || err2 != nil || p < 0 || id[0] == '+' || (len(id) > i+1 && id[i+1] == '+') {
			break
		}
		return p, o, nil
	}
	return 0, 0, ErrUnknownMessage
}
