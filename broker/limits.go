package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
)

// limitedQueues is the queue service the MQTT hook sees: the node's
// manager with the limits of the config in front of it. A queue past
// limits.max_queues is not auto-created (hooks.ErrQuotaExceeded, 0x97), a
// delay past the queue's max_delay is refused (hooks.ErrDelayTooLong,
// 0x99), and refusals of full queues are counted.
type limitedQueues struct {
	*queue.Manager
	// svc serves the queues: the manager on a single node, the cluster
	// node in a cluster.
	svc queue.Service
	cfg *config.Config
	sec *securityMetrics
	// admit refuses publishes below storage.min_free_bytes (disk.go),
	// before a queue is auto-created for them; nil: always admitted.
	admit func(queue string) error
	// tenants, when the config has any, limits what each tenant's
	// clients create; nil: no tenant limits.
	tenants *tenants
	// create serialises the auto-creation of queues while a limit holds,
	// so that concurrent publishes to new names cannot pass it together.
	create sync.Mutex
}

var _ queue.Service = (*limitedQueues)(nil)

// parentQueue returns the queue a name belongs to: q for q and q/$dlq.
func parentQueue(name string) string {
	return strings.TrimSuffix(name, "/$dlq")
}

// Publish checks the limits, then publishes.
func (l *limitedQueues) Publish(ctx context.Context, name string, msg *queue.Message, done func(error)) {
	if l.admit != nil {
		if err := l.admit(name); err != nil {
			l.sec.limit(limitDiskFull)
			done(err)
			return
		}
	}
	// Refusals that need no queue come before the queue is auto-created:
	// a refused first publish creates no queue.
	if max := l.cfg.Storage.MaxPayload; max > 0 && len(msg.Payload) > max {
		done(queue.TooLarge(len(msg.Payload), max))
		return
	}
	if !msg.NotBefore.IsZero() {
		if err := l.checkDelay(name, msg.NotBefore); err != nil {
			done(err)
			return
		}
	}
	if err := l.ensure(ctx, name); err != nil {
		done(err)
		return
	}
	l.svc.Publish(ctx, name, msg, func(err error) {
		switch {
		case err == nil:
		case errors.Is(err, queue.ErrQueueFull):
			l.sec.limit(limitQueueFull)
		case errors.Is(err, queue.ErrStorageFull):
			l.sec.limit(limitDiskFull)
		}
		done(err)
	})
}

// Create checks the queue limit, then creates the queue.
func (l *limitedQueues) Create(ctx context.Context, name string) error {
	if err := l.ensure(ctx, name); err != nil {
		return err
	}
	return l.svc.Create(ctx, name)
}

// Settings refuses a queue a limit would not let be created, and
// creates nothing.
func (l *limitedQueues) Settings(ctx context.Context, name string) (queue.Options, error) {
	if l.wouldExceed(name) {
		l.sec.limit(limitMaxQueues)
		return queue.Options{}, fmt.Errorf("%w: limits.max_queues (%d) reached; queue %q not created", hooks.ErrQuotaExceeded, l.cfg.Limits.MaxQueues, parentQueue(name))
	}
	if l.tenants != nil && l.creates(name) {
		if err := l.tenants.create(ctx, parentQueue(name)); err != nil {
			return queue.Options{}, err
		}
	}
	return l.svc.Settings(ctx, name)
}

// creates reports whether a publish or subscription to name would
// auto-create a queue.
func (l *limitedQueues) creates(name string) bool {
	parent := parentQueue(name)
	_, declared := l.cfg.Queues.Declared[parent]
	return l.cfg.Queues.AutoCreate && !declared && queue.ValidQueueName(parent) && l.Manager.Queue(parent) == nil
}

// Subscribe checks the queue limit, then subscribes.
func (l *limitedQueues) Subscribe(ctx context.Context, f queue.Filter, r queue.Receiver, o queue.ConsumerOptions) (queue.Subscription, error) {
	if err := l.ensure(ctx, f.Queue); err != nil {
		return nil, err
	}
	return l.svc.Subscribe(ctx, f, r, o)
}

// wouldCreate reports whether a publish or subscription to name would
// auto-create a queue past limits.max_queues.
func (l *limitedQueues) wouldExceed(name string) bool {
	max := l.cfg.Limits.MaxQueues
	if max <= 0 || !l.cfg.Queues.AutoCreate {
		return false
	}
	parent := parentQueue(name)
	return queue.ValidQueueName(parent) && l.Manager.Queue(parent) == nil && l.count() >= max
}

// ensure creates the queue of name, if it is to be auto-created and the
// limit allows it; the manager decides everything else.
func (l *limitedQueues) ensure(ctx context.Context, name string) error {
	max := l.cfg.Limits.MaxQueues
	if max <= 0 && l.tenants == nil || !l.creates(name) {
		return nil
	}
	parent := parentQueue(name)
	l.create.Lock()
	defer l.create.Unlock()
	if l.Manager.Queue(parent) != nil {
		return nil
	}
	if n := l.count(); max > 0 && n >= max {
		l.sec.limit(limitMaxQueues)
		return fmt.Errorf("%w: limits.max_queues (%d) reached; queue %q not created", hooks.ErrQuotaExceeded, max, parent)
	}
	if l.tenants != nil {
		if err := l.tenants.create(ctx, parent); err != nil {
			return err
		}
	}
	return l.svc.Create(ctx, parent)
}

// The calls below go to the service as they are.

func (l *limitedQueues) CheckSubscription(ctx context.Context, f queue.Filter, o queue.ConsumerOptions) error {
	return l.svc.CheckSubscription(ctx, f, o)
}

func (l *limitedQueues) Settle(r queue.LeaseRef, o queue.Outcome) error { return l.svc.Settle(r, o) }

func (l *limitedQueues) Received(r queue.LeaseRef) { l.svc.Received(r) }

func (l *limitedQueues) Extend(r queue.LeaseRef) error { return l.svc.Extend(r) }

// count returns the number of queues, dead-letter queues not counted.
func (l *limitedQueues) count() int {
	n := 0
	for _, q := range l.Manager.Queues() {
		if !q.IsDLQ() {
			n++
		}
	}
	return n
}

// checkDelay refuses a delivery time past the queue's max_delay: the one
// configured, else the queue's max_age.
func (l *limitedQueues) checkDelay(name string, notBefore time.Time) error {
	parent := parentQueue(name)
	max := l.cfg.QueueMaxDelay(parent)
	if max == 0 {
		if q := l.Manager.Queue(parent); q != nil {
			max = q.Options().MaxAge
		} else {
			o, _ := l.cfg.QueueOptions(parent)
			max = o.MaxAge
		}
	}
	if max <= 0 {
		return nil
	}
	if d := time.Until(notBefore); d > max {
		l.sec.limit(limitMaxDelay)
		return fmt.Errorf("%w: delivery in %s, the queue's max_delay is %s", hooks.ErrDelayTooLong, d.Round(time.Second), max)
	}
	return nil
}
