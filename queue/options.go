package queue

import (
	"fmt"
	"time"
)

// Ordering says how a queue orders deliveries within a consumer group.
type Ordering string

const (
	// OrderKey delivers the messages of one key in publish order, one at a
	// time per group; different keys are delivered in parallel.
	OrderKey Ordering = "key"
	// OrderPartition gives each partition to one consumer of a group at a time.
	OrderPartition Ordering = "partition"
	// OrderNone delivers in any order.
	OrderNone Ordering = "none"
)

// Durability says when a publish counts as stored.
type Durability string

const (
	// DurabilityFsync acknowledges a publish after the batch holding it is fsynced.
	DurabilityFsync Durability = "fsync"
	// DurabilityAsync acknowledges after the write reaches the storage engine;
	// the engine is fsynced every sync interval.
	DurabilityAsync Durability = "async"
)

// Start says where a new consumer group starts.
type Start string

const (
	// StartEarliest: at the oldest retained message.
	StartEarliest Start = "earliest"
	// StartLatest: after the newest message, so only what is published
	// from then on.
	StartLatest Start = "latest"
)

// CheckStart reports whether s is a start ("" is the default): earliest,
// latest or an RFC 3339 time (a new group then starts at the first
// message enqueued at or after it).
func CheckStart(s Start) error {
	if _, err := s.time(); err != nil {
		return fmt.Errorf("%w: start must be earliest, latest or an RFC 3339 time (2026-11-27T08:00:00Z), got %q", ErrBadSeek, s)
	}
	return nil
}

// time returns the time s names, zero for earliest and latest.
func (s Start) time() (time.Time, error) {
	if s == "" || s == StartEarliest || s == StartLatest {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, string(s))
}

// Retention says how long a queue keeps a message.
type Retention string

const (
	// RetentionAcked: until every group settled it.
	RetentionAcked Retention = "acked"
	// RetentionTime: for max_age (within max_messages and max_bytes),
	// settled or not: a group made later, or moved back (Seek), reads
	// it again.
	RetentionTime Retention = "time"
)

// Overflow says what a full queue does with a new publish.
type Overflow string

const (
	// OverflowReject refuses new publishes while the queue is full.
	OverflowReject Overflow = "reject"
	// OverflowDropOldest moves the oldest messages to the dead-letter queue.
	OverflowDropOldest Overflow = "drop-oldest"
)

// AckPolicy says when a publish to a replicated queue is acknowledged.
type AckPolicy string

const (
	// AckQuorum acknowledges once a majority of the partition's replicas
	// have the message on disk.
	AckQuorum AckPolicy = "quorum"
	// AckLeader acknowledges once the partition's owner has it on disk; a
	// failover may lose the newest acknowledged messages.
	AckLeader AckPolicy = "leader"
)

// MaxReplicationFactor bounds replication_factor.
const MaxReplicationFactor = 5

// Options are the settings of one queue.
type Options struct {
	// Usually set.
	Partitions    int           `yaml:"partitions" json:"partitions"`
	Ordering      Ordering      `yaml:"ordering" json:"ordering"`
	AckTimeout    time.Duration `yaml:"ack_timeout" json:"ack_timeout"`
	MaxDeliveries int           `yaml:"max_deliveries" json:"max_deliveries"`
	Prefetch      int           `yaml:"prefetch" json:"prefetch"`
	// KeyInflight is, with ordering key, how many messages of one key may
	// be unsettled at once in a group, all with one consumer (0 is 1).
	KeyInflight int        `yaml:"key_inflight" json:"key_inflight"`
	Durability  Durability `yaml:"durability" json:"durability"`
	// Start is where a new group starts: StartEarliest ("" too),
	// StartLatest or an RFC 3339 time. A subscription may say otherwise
	// (ConsumerOptions).
	Start Start `yaml:"start" json:"start"`
	// QoS0 says whether a consumer may subscribe at QoS 0 ("" is allow).
	QoS0 QoS0Policy `yaml:"qos0" json:"qos0"`

	// Retention: RetentionAcked ("" too), a message stays until every
	// group settled it (or max_age, max_messages, max_bytes end it), or
	// RetentionTime, it stays for max_age within max_messages and
	// max_bytes whether groups settled it or not, as in a stream.
	Retention   Retention     `yaml:"retention" json:"retention"`
	MaxAge      time.Duration `yaml:"max_age" json:"max_age"`
	MaxMessages int64         `yaml:"max_messages" json:"max_messages"`
	MaxBytes    int64         `yaml:"max_bytes" json:"max_bytes"`
	Overflow    Overflow      `yaml:"overflow" json:"overflow"`

	// Fine tuning.
	RetryBackoff    time.Duration `yaml:"retry_backoff" json:"retry_backoff"`
	RetryBackoffMax time.Duration `yaml:"retry_backoff_max" json:"retry_backoff_max"`
	DedupWindow     time.Duration `yaml:"dedup_window" json:"dedup_window"`

	// Replication (a cluster). ReplicationFactor is how many nodes keep
	// each partition (1 to 5; 0 means the default: 1 on a single node, 3
	// in a cluster); AckPolicy when a publish is acknowledged ("" means
	// quorum).
	ReplicationFactor int       `yaml:"replication_factor" json:"replication_factor"`
	AckPolicy         AckPolicy `yaml:"ack_policy" json:"ack_policy"`
}

// DefaultOptions returns the settings of SPEC section 8.
func DefaultOptions() Options {
	return Options{
		Partitions:      8,
		Ordering:        OrderKey,
		AckTimeout:      30 * time.Second,
		MaxDeliveries:   5,
		Prefetch:        1024,
		KeyInflight:     1,
		Durability:      DurabilityFsync,
		QoS0:            QoS0Allow,
		MaxAge:          168 * time.Hour,
		Overflow:        OverflowReject,
		RetryBackoff:    time.Second,
		RetryBackoffMax: 5 * time.Minute,
		DedupWindow:     2 * time.Minute,
	}
}

// QoS0Policy says what a queue does with a QoS 0 subscription, whose
// deliveries settle as they are sent (at most once: a consumer that fails
// loses what it was sent).
type QoS0Policy string

const (
	// QoS0Allow takes it, and logs a warning once per group.
	QoS0Allow QoS0Policy = "allow"
	// QoS0Refuse refuses it (SUBACK 0x8F): the queue's consumers must
	// subscribe at QoS 1 and settle each message.
	QoS0Refuse QoS0Policy = "refuse"
)

// MaxPartitions bounds a queue's partition count.
const MaxPartitions = 4096

// Validate reports the first invalid field, named as in the config file.
func (o Options) Validate() error {
	switch {
	case o.Partitions < 1 || o.Partitions > MaxPartitions:
		return &FieldError{"partitions", fmt.Sprintf("must be between 1 and %d, got %d", MaxPartitions, o.Partitions)}
	case o.Ordering != OrderKey && o.Ordering != OrderPartition && o.Ordering != OrderNone:
		return &FieldError{"ordering", fmt.Sprintf("must be key, partition or none, got %q", o.Ordering)}
	case o.AckTimeout < 100*time.Millisecond:
		return &FieldError{"ack_timeout", fmt.Sprintf("must be at least 100ms, got %s", o.AckTimeout)}
	case o.MaxDeliveries < 1:
		return &FieldError{"max_deliveries", fmt.Sprintf("must be at least 1, got %d", o.MaxDeliveries)}
	case o.Prefetch < 1 || o.Prefetch > 65535:
		return &FieldError{"prefetch", fmt.Sprintf("must be between 1 and 65535, got %d", o.Prefetch)}
	case o.KeyInflight < 0 || o.KeyInflight > 65535:
		return &FieldError{"key_inflight", fmt.Sprintf("must be between 1 and 65535, got %d", o.KeyInflight)}
	case CheckStart(o.Start) != nil:
		return &FieldError{"start", fmt.Sprintf("must be earliest, latest or an RFC 3339 time, got %q", o.Start)}
	case o.Retention != "" && o.Retention != RetentionAcked && o.Retention != RetentionTime:
		return &FieldError{"retention", fmt.Sprintf("must be acked or time, got %q", o.Retention)}
	case o.Retention == RetentionTime && o.MaxAge == 0 && o.MaxMessages == 0 && o.MaxBytes == 0:
		return &FieldError{"retention", "time keeps messages for max_age: set max_age (or max_messages or max_bytes), or the queue grows without bound"}
	case o.Durability != DurabilityFsync && o.Durability != DurabilityAsync:
		return &FieldError{"durability", fmt.Sprintf("must be fsync or async, got %q", o.Durability)}
	case o.QoS0 != "" && o.QoS0 != QoS0Allow && o.QoS0 != QoS0Refuse:
		return &FieldError{"qos0", fmt.Sprintf("must be allow or refuse, got %q", o.QoS0)}
	case o.MaxAge < 0:
		return &FieldError{"max_age", "must not be negative"}
	case o.MaxMessages < 0:
		return &FieldError{"max_messages", "must not be negative"}
	case o.MaxBytes < 0:
		return &FieldError{"max_bytes", "must not be negative"}
	case o.Overflow != OverflowReject && o.Overflow != OverflowDropOldest:
		return &FieldError{"overflow", fmt.Sprintf("must be reject or drop-oldest, got %q", o.Overflow)}
	case o.RetryBackoff <= 0:
		return &FieldError{"retry_backoff", fmt.Sprintf("must be positive, got %s", o.RetryBackoff)}
	case o.RetryBackoffMax < o.RetryBackoff:
		return &FieldError{"retry_backoff_max", fmt.Sprintf("must be at least retry_backoff (%s), got %s", o.RetryBackoff, o.RetryBackoffMax)}
	case o.DedupWindow < 0:
		return &FieldError{"dedup_window", "must not be negative"}
	case o.ReplicationFactor < 0 || o.ReplicationFactor > MaxReplicationFactor:
		return &FieldError{"replication_factor", fmt.Sprintf("must be between 1 and %d, got %d", MaxReplicationFactor, o.ReplicationFactor)}
	case o.AckPolicy != "" && o.AckPolicy != AckQuorum && o.AckPolicy != AckLeader:
		return &FieldError{"ack_policy", fmt.Sprintf("must be quorum or leader, got %q", o.AckPolicy)}
	}
	return nil
}

// keyInflight is KeyInflight, 1 when unset.
func (o Options) keyInflight() int { return max(1, o.KeyInflight) }

// FieldError names the setting that is wrong and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }
