package history

import (
	"slices"
	"strconv"
	"sync"
	"time"
)

// Answer is what a producer was told about one publish.
type Answer uint8

const (
	// NoAnswer: no PUBACK came; the connection was lost or the producer
	// stopped waiting. The message may or may not be stored. It is the
	// zero value, so a publish recorded without an answer is never
	// expected.
	NoAnswer Answer = iota
	// Acked: PUBACK with reason code 0x00. The message is stored.
	Acked
	// Refused: PUBACK with the failure reason code in Publish.Code. The
	// message is not stored, except with CodeUnknown, which says the
	// outcome is unknown.
	Refused
)

func (a Answer) String() string {
	switch a {
	case NoAnswer:
		return "no answer"
	case Acked:
		return "acked"
	case Refused:
		return "refused"
	}
	return "answer(" + strconv.Itoa(int(a)) + ")"
}

// CodeUnknown is the PUBACK reason code shardq answers when it cannot tell
// whether a publish was stored (0x83 Implementation specific error: a
// storage or cluster failure). A producer told 0x83 may find its message
// stored, and a retry without a dedup-id may store it twice.
const CodeUnknown byte = 0x83

// Publish is one publish attempt as its producer saw it. A retry of the
// same message (same ID) is another Publish.
type Publish struct {
	// ID identifies the message: the unique id the producer put in the
	// payload. It must be unique across every queue of the history.
	ID string
	// Key is the message's partition key as the broker computes it (the
	// user property key, else the subject, else the producer's client ID).
	Key   string
	Queue string
	// Node is the node the producer was connected to.
	Node string
	// Producer is the producer's client ID.
	Producer string
	// Sent is when the PUBLISH was handed to the connection.
	Sent time.Time
	// Answered is when the PUBACK arrived; zero with NoAnswer.
	Answered time.Time
	Answer   Answer
	// Code is the PUBACK reason code: 0x00 with Acked, the failure code
	// (0x83, 0x97, 0x87...) with Refused.
	Code byte
}

// Unknown reports whether the producer cannot tell whether the message
// was stored: no answer, or CodeUnknown.
func (p Publish) Unknown() bool {
	return p.Answer == NoAnswer || p.Answer == Refused && p.Code == CodeUnknown
}

// Delivery is one PUBLISH a consumer received from a queue or from its
// dead-letter queue.
type Delivery struct {
	// ID is the message's id, read from the payload.
	ID  string
	Key string
	// Group is the consumer group of the subscription that received it.
	Group string
	// Consumer is the consumer's client ID; Node the node it was
	// connected to.
	Consumer string
	Node     string
	// At is when the consumer received it.
	At time.Time
	// DUP is the MQTT DUP flag.
	DUP bool
	// MsgID and DeliveryCount are the broker's user properties msg-id and
	// delivery-count; "" and 0 when the delivery did not carry them (a
	// v3.1.1 consumer).
	MsgID         string
	DeliveryCount int
	// DLQ says the delivery came from the queue's dead-letter queue
	// ($queue/{queue}/$dlq). MsgID and DeliveryCount are then the
	// dead-letter queue's, and OriginalMsgID is its original-msg-id user
	// property.
	DLQ           bool
	OriginalMsgID string
}

// Outcome is how a consumer settled, or stopped holding, a delivery.
type Outcome uint8

const (
	// Ack: PUBACK 0x00 (or $ack): done for the group. The zero value.
	Ack Outcome = iota
	// Nack: PUBACK 0x80/0x83 (or $nack): to be redelivered; counts
	// toward max_deliveries.
	Nack
	// Reject: PUBACK 0x87/0x99 (or $reject): straight to the
	// dead-letter queue.
	Reject
	// Release: $release: given back without counting toward
	// max_deliveries.
	Release
	// Extend: $extend: the lease runs for another lease timeout from
	// the settlement's time. It does not end the lease.
	Extend
	// Disconnected: the consumer lost its connection holding the
	// delivery unsettled. A Disconnect event says the same of every
	// delivery the consumer held.
	Disconnected
)

func (o Outcome) String() string {
	switch o {
	case Ack:
		return "ack"
	case Nack:
		return "nack"
	case Reject:
		return "reject"
	case Release:
		return "release"
	case Extend:
		return "extend"
	case Disconnected:
		return "disconnect"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Settlement is what a consumer did with a delivery it held.
type Settlement struct {
	ID       string
	Group    string
	Consumer string
	// MsgID is the msg-id of the delivery settled, when known; it tells
	// apart two stored copies of one message held by one consumer.
	MsgID string
	// DLQ says the delivery settled came from the dead-letter queue.
	DLQ     bool
	At      time.Time
	Outcome Outcome
}

// Disconnect is a consumer's connection ending: every lease it held ends.
type Disconnect struct {
	Client string
	Node   string
	// At is when the client saw its connection end (or closed it).
	At time.Time
}

// History is everything a test recorded. The order of each slice does
// not matter: Check orders events by their times.
type History struct {
	Publishes   []Publish
	Deliveries  []Delivery
	Settlements []Settlement
	Disconnects []Disconnect
}

// Recorder collects a History from many goroutines. The zero value is
// ready to use; every method is safe for concurrent use and only appends
// under one mutex, so recording costs little beside the MQTT clients it
// observes.
type Recorder struct {
	mu sync.Mutex
	// Guarded by mu.
	h History
}

// Publish records a publish attempt once its outcome is known: when the
// PUBACK arrived, or when the producer gave up on it (NoAnswer).
func (r *Recorder) Publish(p Publish) { record(r, &r.h.Publishes, p) }

// Deliver records a delivery as the consumer received it.
func (r *Recorder) Deliver(d Delivery) { record(r, &r.h.Deliveries, d) }

// Settle records a settlement as the consumer sent it.
func (r *Recorder) Settle(s Settlement) { record(r, &r.h.Settlements, s) }

// Disconnect records a consumer's connection ending.
func (r *Recorder) Disconnect(d Disconnect) { record(r, &r.h.Disconnects, d) }

// record appends e to events, one of r.h's slices, under r.mu.
func record[E any](r *Recorder, events *[]E, e E) {
	r.mu.Lock()
	*events = append(*events, e)
	r.mu.Unlock()
}

// History returns a copy of what was recorded so far; recording may go on.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History{
		Publishes:   slices.Clone(r.h.Publishes),
		Deliveries:  slices.Clone(r.h.Deliveries),
		Settlements: slices.Clone(r.h.Settlements),
		Disconnects: slices.Clone(r.h.Disconnects),
	}
}
