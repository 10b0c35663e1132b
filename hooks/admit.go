package hooks

import (
	"errors"
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// Admission: what the broker decides about a publish or a subscription
// before the queues see it. Its errors take their reason codes from the
// table in codes.go.
var (
	// ErrNotAuthorized: the client may not produce into the queue
	// (0x87 Not authorized; an MQTT 3.1.1 producer is disconnected).
	ErrNotAuthorized = errors.New("hooks: not authorized")
	// ErrQuotaExceeded: a limit of the node refuses the request, such as
	// a queue auto-created past limits.max_queues (0x97 Quota exceeded).
	ErrQuotaExceeded = errors.New("hooks: quota exceeded")
	// ErrDelayTooLong: a delay or deliver-at past the queue's max_delay
	// (0x99 Payload format invalid, as any invalid property).
	ErrDelayTooLong = fmt.Errorf("%w: delay past the queue's max_delay", errBadProperty)
)

// Admit decides whether the client cl may enqueue into the named queue
// (a dead-letter queue is named {queue}/$dlq): nil admits, an error
// refuses the publish with its reason code. It runs on the client's read
// goroutine for every $queue/ publish but settlements, before the message
// is built.
type Admit func(cl *mqtt.Client, queueName string) error

// QueueSubscription returns the queue and the consumer group a queue
// subscription filter joins: the $share group, else the subscription's
// user property group, else the default group.
func QueueSubscription(filter string, props []packets.UserProperty) (queueName, group string, err error) {
	f, err := queue.ParseFilter(filter)
	if err != nil {
		return "", "", err
	}
	if !f.Shared {
		for _, u := range props {
			if u.Key == propGroup && u.Val != "" {
				f.Group = u.Val
			}
		}
	}
	return f.Queue, f.Group, nil
}
