package hooks

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// Subscription user properties (MQTT 5).
const (
	propGroup      = "group"
	propPrefetch   = "prefetch"
	propPartitions = "partitions"
	propStart      = "start"
	propShardBy    = "shard-by"
	propShardCount = "shard-count"
	propShards     = "shards"
)

// subscription is one queue subscription of a client: a consumer of a group.
type subscription struct {
	c      *conn
	raw    string
	filter queue.Filter
	qos    byte
	// prefetch: the unsettled messages it may hold (the smallest of the
	// queue's prefetch, the property and the v5 Receive Maximum);
	// partitions: those it claimed by name; explicit: ack=explicit.
	prefetch   int
	partitions []int
	explicit   bool
	consumer   queue.Subscription
	// held keeps deliveries until the SUBACK is written (see OnSubscribed);
	// started says it was. Both guarded by the conn's lock.
	held    []delivery
	started bool
}

// close leaves the group. The consumer is set under the conn's lock once
// the subscription is registered; a subscription closed before that is
// closed by subscribe itself.
func (s *subscription) close() {
	s.c.mu.Lock()
	cons := s.consumer
	s.c.mu.Unlock()
	if cons != nil {
		cons.Close()
	}
}

// OnSubscribe turns an invalid $queue/ filter, or a queue subscription
// with invalid user properties, into an empty filter, which mochi answers
// with 0x8F Topic Filter invalid (0x80 for MQTT 3.1.1), and caps a queue
// subscription's QoS at 1: a delivery is a lease settled by PUBACK.
func (h *Hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	filters := make(packets.Subscriptions, len(pk.Filters))
	copy(filters, pk.Filters)
	for i, sub := range filters {
		if !queue.IsQueueTopic(sub.Filter) {
			continue
		}
		f, err := queue.ParseFilter(sub.Filter)
		var qo queue.Options
		if err == nil {
			qo, err = h.m.Settings(h.connFor(cl).ctx, f.Queue)
		}
		if err == nil && sub.Qos == 0 && qo.QoS0 == queue.QoS0Refuse {
			err = fmt.Errorf("queue %s takes QoS 1 subscriptions only (qos0: refuse)", f.Queue)
		}
		if err == nil {
			var o subOptions
			if o, err = subscriptionOptions(f, sub, pk.Properties.User, qo.Partitions); err == nil {
				err = h.m.CheckSubscription(h.connFor(cl).ctx, o.filter, o.ConsumerOptions)
			}
			if err == nil && sub.Qos == 0 {
				h.warnQoS0(cl, f.Queue, o.filter.Group)
			}
		}
		if err != nil {
			h.log.Debug("queue subscription refused", "client", cl.ID, "filter", sub.Filter, "err", err)
			filters[i].Filter = ""
			h.refusedSub(cl, pk.PacketID, sub.Filter, err)
			continue
		}
		if sub.Qos > 1 {
			filters[i].Qos = 1
		}
	}
	pk.Filters = filters
	return pk
}

// subOptions are a queue subscription's settings from its user properties.
type subOptions struct {
	queue.ConsumerOptions
	filter queue.Filter
}

// subscriptionOptions reads the subscription user properties group,
// prefetch, ack and partitions.
func subscriptionOptions(f queue.Filter, sub packets.Subscription, props []packets.UserProperty, partitions int) (subOptions, error) {
	o := subOptions{filter: f}
	for _, u := range props {
		switch u.Key {
		case propGroup:
			if u.Val == "" {
				return o, fmt.Errorf("%w: empty group", errBadProperty)
			}
			if !f.Shared {
				o.filter.Group = u.Val
			}
		case propPrefetch:
			n, err := strconv.Atoi(u.Val)
			if err != nil || n < 1 || n > 65535 {
				return o, fmt.Errorf("%w: prefetch %q is not a number from 1 to 65535", errBadProperty, u.Val)
			}
			o.Prefetch = n
		case propAck:
			switch u.Val {
			case "puback":
			case "explicit":
				if sub.Qos == 0 {
					return o, errExplicitQoS
				}
				o.Explicit = true
			default:
				return o, fmt.Errorf("%w: ack %q is not puback or explicit", errBadProperty, u.Val)
			}
		case propStart:
			if err := queue.CheckStart(queue.Start(u.Val)); err != nil || u.Val == "" {
				return o, fmt.Errorf("%w: start %q is not earliest, latest or an RFC 3339 time (where a new group starts)", errBadProperty, u.Val)
			}
			o.Start = queue.Start(u.Val)
		case propPartitions:
			ps, err := parsePartitions(u.Val, partitions)
			if err != nil {
				return o, err
			}
			o.Partitions = ps
		}
	}
	sh, err := shardingOf(props)
	o.Sharding = sh
	return o, err
}

// shardingOf reads the subscription properties shard-by, shard-count and
// shards: nil when none is given.
func shardingOf(props []packets.UserProperty) (*queue.Sharding, error) {
	var s *queue.Sharding
	count, shards := "", ""
	for _, u := range props {
		switch u.Key {
		case propShardBy, propShardCount, propShards:
		default:
			continue
		}
		if s == nil {
			s = &queue.Sharding{}
		}
		switch u.Key {
		case propShardBy:
			for _, name := range strings.Split(u.Val, ",") {
				s.By = append(s.By, strings.TrimSpace(name))
			}
		case propShardCount:
			count = u.Val
		case propShards:
			shards = u.Val
		}
	}
	if s == nil {
		return nil, nil
	}
	if count == "" || shards == "" {
		return nil, fmt.Errorf("%w: sharding needs shard-count and shards (shards=0,2 shard-count=4), got shard-count %q and shards %q", errBadProperty, count, shards)
	}
	n, err := strconv.Atoi(count)
	if err != nil {
		return nil, fmt.Errorf("%w: shard-count %q is not a number", errBadProperty, count)
	}
	s.Count = n
	seen := map[int]bool{}
	for _, f := range strings.Split(shards, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || seen[id] {
			return nil, fmt.Errorf("%w: shards %q: each must be a distinct number below shard-count", errBadProperty, shards)
		}
		seen[id] = true
		s.Shards = append(s.Shards, id)
	}
	return s, s.Check()
}

// parsePartitions reads a list like "0,1,5" of distinct partitions below n.
func parsePartitions(s string, n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p < 0 || p >= n || seen[p] {
			return nil, fmt.Errorf("%w: partitions %q: each must be a distinct number from 0 to %d", errBadProperty, s, n-1)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}

// OnSubscribed joins the consumer groups of the accepted queue filters at
// once (a partitions claim holds from the SUBACK on), but their deliveries
// are held until the SUBACK is written (OnPacketSent): some clients drop a
// message for a subscription they have not seen acknowledged.
func (h *Hook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	var started []*subscription
	for i, sub := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code && queue.IsQueueTopic(sub.Filter) {
			h.saveProps(cl.ID, sub.Filter, pk.Properties.User)
			h.unindex(cl, sub.Filter)
			if s := h.subscribe(cl, sub, pk.Properties.User, false); s != nil {
				started = append(started, s)
			}
		}
	}
	if len(started) == 0 {
		return
	}
	c := h.connFor(cl)
	c.mu.Lock()
	c.pendingSubs[pk.PacketID] = started
	c.mu.Unlock()
}

// OnPacketSent releases the deliveries of a SUBSCRIBE once its SUBACK is out.
func (h *Hook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, b []byte) {
	if pk.FixedHeader.Type != packets.Suback {
		return
	}
	c := h.lookup(cl)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	subs := c.pendingSubs[pk.PacketID]
	delete(c.pendingSubs, pk.PacketID)
	for _, s := range subs {
		s.startLocked()
	}
}

// startLocked lets the subscription's deliveries go out. The conn's lock
// must be held.
func (s *subscription) startLocked() {
	s.started = true
	if s.c.closed || len(s.held) == 0 {
		s.held = nil
		return
	}
	s.c.out = append(s.c.out, s.held...)
	s.held = nil
	s.c.signalLocked()
}

// OnUnsubscribed leaves the groups of the removed queue filters.
func (h *Hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	c := h.lookup(cl)
	if c == nil {
		return
	}
	for i, sub := range pk.Filters {
		c.mu.Lock()
		s := c.subs[sub.Filter]
		delete(c.subs, sub.Filter)
		if s != nil {
			c.unsubbed[pk.PacketID] = append(c.unsubbed[pk.PacketID], i)
		}
		c.mu.Unlock()
		if s != nil {
			h.saveProps(cl.ID, sub.Filter, nil)
			s.close()
		}
	}
}

// subscribe registers a queue subscription; its deliveries go out at once
// when start is set, else once it is started. It returns the subscription,
// or nil when it could not be made.
func (h *Hook) subscribe(cl *mqtt.Client, sub packets.Subscription, props []packets.UserProperty, start bool) *subscription {
	f, err := queue.ParseFilter(sub.Filter)
	if err != nil {
		return nil
	}
	c := h.connFor(cl)
	qo, err := h.m.Settings(c.ctx, f.Queue)
	if err != nil {
		h.log.Warn("queue subscription failed", "client", cl.ID, "filter", sub.Filter, "err", err)
		return nil
	}
	o, err := subscriptionOptions(f, sub, props, qo.Partitions)
	if err != nil {
		return nil
	}
	if rm := int(cl.Properties.Props.ReceiveMaximum); cl.Properties.ProtocolVersion == 5 && rm > 0 && (o.Prefetch == 0 || rm < o.Prefetch) {
		o.Prefetch = rm
	}
	o.Credit = c.credit
	prefetch := qo.Prefetch
	if o.Prefetch > 0 && o.Prefetch < prefetch {
		prefetch = o.Prefetch
	}
	s := &subscription{c: c, raw: sub.Filter, filter: o.filter, qos: min(sub.Qos, 1), started: start,
		prefetch: prefetch, partitions: o.Partitions, explicit: o.Explicit}
	c.mu.Lock()
	old := c.subs[sub.Filter]
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil
	}
	if old != nil {
		old.close()
	}
	c.mu.Lock()
	c.subs[sub.Filter] = s
	c.mu.Unlock()
	cons, err := h.m.Subscribe(c.ctx, o.filter, s, o.ConsumerOptions)
	if err != nil {
		h.log.Warn("queue subscription failed", "client", cl.ID, "filter", sub.Filter, "err", err)
		return nil
	}
	c.mu.Lock()
	s.consumer = cons
	if c.closed || c.subs[sub.Filter] != s {
		c.mu.Unlock()
		cons.Close()
		return nil
	}
	c.mu.Unlock()
	return s
}

// Deliver implements queue.Receiver: the delivery is queued for the conn's
// writer. It runs with the queue's lock held and never blocks.
func (s *subscription) Deliver(d queue.Delivery) {
	c := s.c
	c.mu.Lock()
	switch {
	case c.closed:
	case !s.started:
		s.held = append(s.held, delivery{d: d, sub: s})
	default:
		c.out = append(c.out, delivery{d: d, sub: s})
		c.signalLocked()
	}
	c.mu.Unlock()
}

// prepare encodes one delivery into w. QoS 1 deliveries are leases: the
// packet ID is recorded so the PUBACK can settle it. A QoS 0 delivery's
// lease is returned: it is settled once written. A delivery larger than the
// client's Maximum Packet Size can never reach it and is rejected (to the
// dead-letter queue). One whose lease ended before it is written is given
// back unsent.
//
// The IDs come from mochi's counter (so mochi's own deliveries to the same
// client skip past them) but are not put in mochi's inflight table: mochi
// scans and sorts that table after every packet the client sends while it
// is not empty, and its NextImmediate takes the table's read lock twice,
// which deadlocks against a concurrent writer. See docs/DESIGN.md.
func (c *conn) prepare(w *wire, dl delivery, now time.Time) (qos0 queue.LeaseRef, settle bool) {
	d, s := dl.d, dl.sub
	if !d.Lease.Live(now) {
		// Its lease ended before it could be written (the partition moved,
		// or it came late from another node): the message may be out again
		// already, to another consumer, and this copy would reach the
		// client without DUP. Given back, unsent.
		_ = c.h.m.Settle(d.Lease, queue.Unsent)
		return queue.LeaseRef{}, false
	}
	m := d.Message
	topic, moved := s.filter.DeliveryTopic(m.Subject)
	h := publishHeader{v5: c.v5, qos: s.qos, dup: d.Count > 1, topic: topic}
	if c.v5 {
		var now time.Time
		if !m.ExpiresAt.IsZero() {
			now = time.Now()
		}
		w.props = appendDeliveryProps(w.props[:0], d, moved, now)
		h.props = w.props
	}
	if s.qos > 0 {
		id, ok := c.reservePacketID()
		if !ok {
			c.h.log.Warn("no free packet ID; delivery returned", "client", c.cl.ID, "queue", d.Queue)
			_ = c.h.m.Settle(d.Lease, queue.Nack)
			return queue.LeaseRef{}, false
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return queue.LeaseRef{}, false
		}
		h.id = id
		c.leases[id] = lease{ref: d.Lease, explicit: d.Explicit}
		if d.Explicit {
			c.explicit[explicitKey(d.Queue, s.filter.Group, d.ID())] = d.Lease
		}
		c.mu.Unlock()
	}
	before := len(w.buf)
	w.buf = appendPublish(w.buf, h, m.Payload)
	if max := c.cl.Properties.Props.MaximumPacketSize; max > 0 && len(w.buf)-before > int(max) {
		w.buf = w.buf[:before]
		c.h.log.Warn("delivery larger than the client accepts; rejected", "client", c.cl.ID, "queue", d.Queue,
			"msg_id", d.ID(), "max_packet_size", c.cl.Properties.Props.MaximumPacketSize)
		if s.qos > 0 {
			c.mu.Lock()
			delete(c.leases, h.id)
			c.mu.Unlock()
		}
		_ = c.h.m.Settle(d.Lease, queue.Reject)
		return queue.LeaseRef{}, false
	}
	return d.Lease, s.qos == 0
}

// reservePacketID picks a packet ID free both in mochi's table and in the
// conn's leases (a client's own publish can clear mochi's entry). mochi's
// NextPacketID takes the client's lock, which mochi holds while it writes
// to the socket: it is called without the conn's lock, so that a client
// that does not read never holds up a queue delivering to it.
func (c *conn) reservePacketID() (uint16, bool) {
	for i := 0; i < 65536; i++ {
		id, err := c.cl.NextPacketID()
		if err != nil {
			return 0, false
		}
		c.mu.Lock()
		_, used := c.leases[uint16(id)]
		c.mu.Unlock()
		if !used {
			return uint16(id), true
		}
	}
	return 0, false
}

// warnQoS0 logs, once per queue and group, that a consumer subscribed at
// QoS 0: its deliveries settle as they are sent, so a consumer that fails
// loses what it was sent, and mosquitto_sub's default QoS is 0.
func (h *Hook) warnQoS0(cl *mqtt.Client, q, group string) {
	if _, seen := h.qos0Warned.LoadOrStore(q+"\x00"+group, true); seen {
		return
	}
	h.log.Warn("a queue group is consumed at QoS 0: its deliveries settle as they are sent, and a consumer that fails loses them; subscribe at QoS 1 (mosquitto_sub -q 1), or set the queue's qos0: refuse",
		"queue", q, "group", group, "client", cl.ID)
}

// refusedSub keeps why the subscription to filter of SUBSCRIBE id was
// refused, for its SUBACK's reason string (OnPacketEncode): the first
// refusal of the packet.
func (h *Hook) refusedSub(cl *mqtt.Client, id uint16, filter string, err error) {
	if cl.Properties.ProtocolVersion < 5 {
		return // no reason string in MQTT 3.1.1
	}
	c := h.connFor(cl)
	c.mu.Lock()
	if c.subRefusals == nil {
		c.subRefusals = map[uint16]string{}
	}
	if _, ok := c.subRefusals[id]; !ok {
		c.subRefusals[id] = filter + ": " + strings.TrimPrefix(err.Error(), "queue: ")
	}
	c.mu.Unlock()
}
