package hooks

import (
	"slices"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// QueueConsumer is one queue subscription of a connected client, as the
// admin API shows it.
type QueueConsumer struct {
	Filter string
	Queue  string
	Group  string
	QoS    byte
	// Prefetch is how many unsettled messages it may hold; Leased how
	// many it holds now.
	Prefetch int
	Leased   int
	// Partitions are those it claimed by name; empty: any the group
	// gives it.
	Partitions []int
	Explicit   bool
}

// Since returns when cl's session was established here, or the zero time.
func (h *Hook) Since(cl *mqtt.Client) time.Time {
	if v, ok := h.since.Load(cl); ok {
		return v.(time.Time)
	}
	return time.Time{}
}

// Consumers returns cl's queue subscriptions, by filter.
func (h *Hook) Consumers(cl *mqtt.Client) []QueueConsumer {
	c := h.lookup(cl)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]QueueConsumer, 0, len(c.subs))
	for _, s := range c.subs {
		qc := QueueConsumer{Filter: s.raw, Queue: s.filter.Queue, Group: s.filter.Group, QoS: s.qos,
			Prefetch: s.prefetch, Partitions: slices.Clone(s.partitions), Explicit: s.explicit}
		if s.explicit {
			// Leased until settled on $ack, $nack or $reject.
			for _, ref := range c.explicit {
				if ref.Partition.Queue == s.filter.Queue && ref.Group == s.filter.Group {
					qc.Leased++
				}
			}
		} else {
			for _, l := range c.leases {
				if l.ref.Partition.Queue == s.filter.Queue && l.ref.Group == s.filter.Group {
					qc.Leased++
				}
			}
		}
		out = append(out, qc)
	}
	slices.SortFunc(out, func(a, b QueueConsumer) int { return strings.Compare(a.Filter, b.Filter) })
	return out
}
