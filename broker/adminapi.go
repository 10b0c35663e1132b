package broker

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/shardq/shardq/queue"
)

// The JSON documents of the admin API (/api/v1/, see admin.go). The shardq
// command decodes the same types.

// QueueList is the answer to GET /api/v1/queues. In a cluster it holds
// every node's figures (clusterapi.go).
type QueueList struct {
	Node   string      `json:"node"`
	Queues []QueueView `json:"queues"`
	// NodesMissing names the nodes whose figures are missing, each with
	// why ("node-3: down"); only in a cluster, only when there are some.
	NodesMissing []string `json:"nodes_missing,omitempty"`
}

// QueueView is a queue with its settings and figures. In a list, the
// per-partition details are left out.
type QueueView struct {
	Node string `json:"node,omitempty"`
	Name string `json:"name"`
	// Source says where the settings come from: "api" (set at run time),
	// "config" (declared in the config file) or "defaults" (auto-created).
	Source   string   `json:"source,omitempty"`
	Settings Settings `json:"settings"`
	Depth    uint64   `json:"depth"`
	// Partitions holds each partition; only in a single queue's view.
	Partitions []PartitionView `json:"partitions,omitempty"`
	Groups     []GroupView     `json:"groups"`
	Counts     CountsView      `json:"counts"`
	// Rates are over the node's last 5 s sample (summed over the nodes in
	// a cluster).
	Rates RatesView  `json:"rates"`
	DLQ   *QueueView `json:"dlq,omitempty"`
	// NodesMissing: as in QueueList, in a single queue's view.
	NodesMissing []string `json:"nodes_missing,omitempty"`
}

// PartitionView is one partition's offsets. In a cluster, Node is the
// node that serves it and gave its figures; a partition no node answering
// serves has no node and zero figures.
type PartitionView struct {
	Partition int    `json:"partition"`
	Node      string `json:"node,omitempty"`
	Shard     int    `json:"shard"`
	First     uint64 `json:"first"`
	Next      uint64 `json:"next"`
	Committed uint64 `json:"committed"`
	Depth     uint64 `json:"depth"`
}

// GroupView is a consumer group's figures over every partition and, in a
// single queue's view, per partition.
type GroupView struct {
	Name      string `json:"name"`
	Consumers int    `json:"consumers"`
	Lag       uint64 `json:"lag"`
	Leased    int    `json:"leased"`
	// Filter is the group's subject filter ("" for every subject);
	// Filtered counts the messages it left out since the node started.
	Filter   string `json:"filter,omitempty"`
	Filtered uint64 `json:"filtered,omitempty"`
	// OldestUnsettledAge is the age in seconds of the oldest message the
	// group has not settled; 0 when none.
	OldestUnsettledAge float64              `json:"oldest_unsettled_age_seconds"`
	Partitions         []GroupPartitionView `json:"partitions,omitempty"`
}

// GroupPartitionView is a group's position in one partition.
type GroupPartitionView struct {
	Partition          int     `json:"partition"`
	Floor              uint64  `json:"floor"`
	SettledAboveFloor  int     `json:"settled_above_floor"`
	Lag                uint64  `json:"lag"`
	Leased             int     `json:"leased"`
	OldestUnsettledAge float64 `json:"oldest_unsettled_age_seconds"`
}

// CountsView are a queue's running totals since the node started.
type CountsView struct {
	Enqueued     uint64 `json:"enqueued"`
	Delivered    uint64 `json:"delivered"`
	Redelivered  uint64 `json:"redelivered"`
	Acked        uint64 `json:"acked"`
	Nacked       uint64 `json:"nacked"`
	Released     uint64 `json:"released"`
	Rejected     uint64 `json:"rejected"`
	DeadLettered uint64 `json:"dead_lettered"`
	Expired      uint64 `json:"expired"`
	LeasesLost   uint64 `json:"leases_lost"`
	Deduplicated uint64 `json:"deduplicated"`
	Dropped      uint64 `json:"dropped"`
}

// Settings are a queue's settings, named as in the config file. A PUT of a
// queue sends the ones to change; the others keep their values.
type Settings struct {
	Partitions      int              `json:"partitions"`
	Ordering        queue.Ordering   `json:"ordering"`
	AckTimeout      Duration         `json:"ack_timeout"`
	MaxDeliveries   int              `json:"max_deliveries"`
	Prefetch        int              `json:"prefetch"`
	KeyInflight     int              `json:"key_inflight"`
	Start           queue.Start      `json:"start"`
	Durability      queue.Durability `json:"durability"`
	QoS0            queue.QoS0Policy `json:"qos0"`
	Retention       queue.Retention  `json:"retention"`
	MaxAge          Duration         `json:"max_age"`
	MaxMessages     int64            `json:"max_messages"`
	MaxBytes        int64            `json:"max_bytes"`
	Overflow        queue.Overflow   `json:"overflow"`
	RetryBackoff    Duration         `json:"retry_backoff"`
	RetryBackoffMax Duration         `json:"retry_backoff_max"`
	DedupWindow     Duration         `json:"dedup_window"`
	// ReplicationFactor and AckPolicy apply in a cluster; a factor of 0
	// (and an empty policy) take the cluster's defaults, shown as such by
	// a node in a cluster.
	ReplicationFactor int             `json:"replication_factor"`
	AckPolicy         queue.AckPolicy `json:"ack_policy"`
}

func settingsOf(o queue.Options) Settings {
	// The defaults by name, as the config file writes them.
	o.Start = cmp.Or(o.Start, queue.StartEarliest)
	o.Retention = cmp.Or(o.Retention, queue.RetentionAcked)
	return Settings{
		Partitions: o.Partitions, Ordering: o.Ordering, AckTimeout: Duration(o.AckTimeout),
		MaxDeliveries: o.MaxDeliveries, Prefetch: o.Prefetch, KeyInflight: o.KeyInflight, Start: o.Start, Durability: o.Durability, QoS0: o.QoS0,
		Retention: o.Retention, MaxAge: Duration(o.MaxAge), MaxMessages: o.MaxMessages, MaxBytes: o.MaxBytes, Overflow: o.Overflow,
		RetryBackoff: Duration(o.RetryBackoff), RetryBackoffMax: Duration(o.RetryBackoffMax), DedupWindow: Duration(o.DedupWindow),
		ReplicationFactor: o.ReplicationFactor, AckPolicy: o.AckPolicy,
	}
}

// Options returns the settings as queue options.
func (s Settings) Options() queue.Options {
	return queue.Options{
		Partitions: s.Partitions, Ordering: s.Ordering, AckTimeout: time.Duration(s.AckTimeout),
		MaxDeliveries: s.MaxDeliveries, Prefetch: s.Prefetch, KeyInflight: s.KeyInflight, Start: s.Start, Durability: s.Durability, QoS0: s.QoS0,
		Retention: s.Retention, MaxAge: time.Duration(s.MaxAge), MaxMessages: s.MaxMessages, MaxBytes: s.MaxBytes, Overflow: s.Overflow,
		RetryBackoff: time.Duration(s.RetryBackoff), RetryBackoffMax: time.Duration(s.RetryBackoffMax), DedupWindow: time.Duration(s.DedupWindow),
		ReplicationFactor: s.ReplicationFactor, AckPolicy: s.AckPolicy,
	}
}

// Duration is a time.Duration written in JSON as a Go duration string ("30s").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"30s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"30s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

// MessageList is the answer to GET .../messages: messages as they are
// stored, nothing delivered or settled.
type MessageList struct {
	Node     string        `json:"node"`
	Queue    string        `json:"queue"`
	Messages []MessageView `json:"messages"`
	// NodesMissing: as in QueueList.
	NodesMissing []string `json:"nodes_missing,omitempty"`
}

// MessageView is one stored message.
type MessageView struct {
	ID              string          `json:"msg_id"`
	Partition       int             `json:"partition"`
	Offset          uint64          `json:"offset"`
	Topic           string          `json:"topic"`
	Key             string          `json:"key"`
	EnqueuedAt      time.Time       `json:"enqueued_at"`
	NotBefore       *time.Time      `json:"not_before,omitempty"`
	ExpiresAt       *time.Time      `json:"expires_at,omitempty"`
	ContentType     string          `json:"content_type,omitempty"`
	ResponseTopic   string          `json:"response_topic,omitempty"`
	CorrelationData []byte          `json:"correlation_data,omitempty"`
	UserProperties  []Property      `json:"user_properties,omitempty"`
	Payload         []byte          `json:"payload"`
	DeadLetter      *DeadLetterView `json:"dead_letter,omitempty"`
}

// Property is a user property.
type Property struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// DeadLetterView says why and from where a message was dead-lettered.
type DeadLetterView struct {
	Reason        string `json:"reason"`
	OriginalID    string `json:"original_msg_id"`
	OriginalTopic string `json:"original_topic"`
	Deliveries    uint32 `json:"original_delivery_count"`
	Group         string `json:"group,omitempty"`
}

// PurgeResult is the answer to a purge.
type PurgeResult struct {
	Node   string `json:"node"`
	Queue  string `json:"queue"`
	Purged uint64 `json:"purged"`
	// Partitions are the partitions purged (in a cluster, of every node).
	Partitions []int `json:"partitions"`
}

// QueueDeleted is the answer to a queue deletion: the messages and dead
// letters the queue held when it was deleted.
type QueueDeleted struct {
	Node        string `json:"node"`
	Queue       string `json:"queue"`
	Messages    uint64 `json:"messages"`
	DeadLetters uint64 `json:"dead_letters"`
	// Pending names, in a cluster, the nodes that had not yet forgotten
	// the queue: those down forget it as they start.
	Pending []string `json:"pending,omitempty"`
	// NodesMissing names the nodes whose figures are not counted.
	NodesMissing []string `json:"nodes_missing,omitempty"`
}

// GroupDeleted is the answer to a group deletion.
type GroupDeleted struct {
	Node  string `json:"node"`
	Queue string `json:"queue"`
	Group string `json:"group"`
	// Partitions are the partitions the group was removed from (in a
	// cluster, of every node).
	Partitions []int `json:"partitions"`
}

// ReplayRequest is the body of POST .../dlq/replay. Without IDs every dead
// letter is replayed; IDs, when present, must not be empty.
type ReplayRequest struct {
	IDs *[]string `json:"ids,omitempty"`
}

// ReplayResult is the answer to a replay, and part of the error document
// of one that failed part way.
type ReplayResult struct {
	Node     string           `json:"node"`
	Queue    string           `json:"queue"`
	Replayed int              `json:"replayed"`
	Messages []ReplayedLetter `json:"messages"`
	// Partitions are the dead-letter partitions replayed from (in a
	// cluster, of every node).
	Partitions []int `json:"partitions"`
}

// ReplayedLetter names a dead letter replayed: its msg-id in the
// dead-letter queue and the msg-id of its copy in the queue.
type ReplayedLetter struct {
	DLQID string `json:"dlq_msg_id"`
	ID    string `json:"msg_id"`
}

// Error is the document of every error answer.
type Error struct {
	Error string `json:"error"`
	// Replay holds what a failed replay did before it failed.
	Replay *ReplayResult `json:"replay,omitempty"`
	// Purge holds what a purge that did not reach every partition did.
	Purge *PurgeResult `json:"purge,omitempty"`
	// Seek holds what a seek that did not reach every partition did.
	Seek *SeekResult `json:"seek,omitempty"`
}

// SeekRequest is the body of a group seek: To is "earliest", "latest",
// an RFC 3339 time, or {"partition": P, "offset": O}; Force takes the
// leases of the group's consumers back rather than refusing.
type SeekRequest struct {
	To    json.RawMessage `json:"to"`
	Force bool            `json:"force,omitempty"`
}

// SeekResult is the answer to a group seek: where the group was and is on
// each partition moved (in a cluster, of every node).
type SeekResult struct {
	Node       string                  `json:"node"`
	Queue      string                  `json:"queue"`
	Group      string                  `json:"group"`
	To         string                  `json:"to"`
	Partitions []queue.SoughtPartition `json:"partitions"`
}

// seekCheck is a node's answer to the check before a seek: the
// partitions it serves, whether it has the group, and how many of its
// consumers are connected there.
type seekCheck struct {
	Partitions []int `json:"partitions"`
	Found      bool  `json:"found"`
	Consumers  int   `json:"consumers"`
}
