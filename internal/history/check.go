package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Options says what the test expects of the broker.
type Options struct {
	// Usually set.

	// Groups lists, per queue, the groups that must receive every
	// acknowledged message of the queue. Only these are checked for lost
	// messages; a queue not listed is not.
	Groups map[string][]string
	// LeaseTimeout is the queues' ack_timeout: an unsettled delivery's
	// lease ends this long after it was received, or after its last
	// Extend. Zero: leases end only by settlement or disconnect.
	LeaseTimeout time.Duration
	// MaxDeliveries is the queues' max_deliveries: a message whose
	// deliveries to a group ended this many times without an ack must be
	// dead-lettered. Zero: only rejected messages must be.
	MaxDeliveries int
	// DLQConsumed says the test consumed the dead-letter queues to the
	// end, after the queues' own consumers stopped, and recorded those
	// deliveries. Only then is a message that had to be dead-lettered and
	// never came out of a dead-letter queue reported as vanished.
	DLQConsumed bool

	// Fine tuning.

	// Slack is how much later a client may see what the broker did: a
	// consumer receives a delivery after its lease was granted and sees a
	// dropped connection after the broker dropped it, and a lease
	// timeout counted from the receipt ends a little after the broker's.
	// Two leases that overlap by no more than Slack are not reported,
	// and a lease timeout must have passed by Slack before the end of the
	// history to count as a failed delivery. Negative counts as zero.
	Slack time.Duration
	// Unordered lists the queues with ordering none, which promise no
	// order; the order check skips them.
	Unordered []string
}

// DefaultOptions returns shardq's queue defaults (ack_timeout 30 s,
// max_deliveries 5) and a Slack of 100 ms. Groups must still be set for
// the lost check.
func DefaultOptions() Options {
	return Options{
		LeaseTimeout:  30 * time.Second,
		MaxDeliveries: 5,
		Slack:         100 * time.Millisecond,
	}
}

// stream is where a group reads a message: its queue or its queue's
// dead-letter queue.
type stream struct {
	group string
	dlq   bool
}

// message is everything the history says of one message ID.
type message struct {
	id string
	// pubs are its publish attempts by Sent; acked, unknown and refused
	// split them by what the producer was told.
	pubs, acked, unknown, refused []*Publish
	// streams are its deliveries by where they came from, each by At.
	streams map[stream][]*Delivery
	// msgIDs are the distinct msg-ids it was stored at: those of its
	// deliveries from the queue and the original-msg-id of its dead
	// letters; checkDuplicates orders them by first delivery.
	msgIDs []string
	// copies is how many times it was stored, as far as the deliveries
	// tell (set by checkDuplicates).
	copies int
}

// queue and key come from the first acknowledged attempt, else the first
// attempt; the key, else from the first delivery.
func (m *message) queue() string {
	if p := m.first(); p != nil {
		return p.Queue
	}
	return ""
}

func (m *message) key() string {
	if p := m.first(); p != nil {
		return p.Key
	}
	for _, s := range m.sortedStreams() {
		return m.streams[s][0].Key
	}
	return ""
}

func (m *message) first() *Publish {
	if len(m.acked) > 0 {
		return m.acked[0]
	}
	if len(m.pubs) > 0 {
		return m.pubs[0]
	}
	return nil
}

// mayBeStored reports whether a publish attempt could have stored it.
func (m *message) mayBeStored() bool { return len(m.acked)+len(m.unknown) > 0 }

func (m *message) deadLettered() bool {
	for s := range m.streams {
		if s.dlq {
			return true
		}
	}
	return false
}

// sortedStreams lists the streams that delivered it, queues first, by
// group.
func (m *message) sortedStreams() []stream {
	return slices.SortedFunc(maps.Keys(m.streams), func(a, b stream) int {
		if a.dlq != b.dlq {
			if b.dlq {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.group, b.group)
	})
}

// settleKey finds a consumer's settlements of one message in one stream.
type settleKey struct {
	stream
	id, consumer string
}

type checker struct {
	opts Options
	msgs map[string]*message
	ids  []string // msgs' keys, sorted
	// settles are by At; disconnects by client, by At.
	settles     map[settleKey][]*Settlement
	disconnects map[string][]*Disconnect
	// end is the latest time in the history.
	end time.Time
	r   Report
}

// Check judges a history against what shardq promises (SPEC sections 2 to
// 5 and the dead-letter queue) and returns every violation found. It does
// not change h; it may run while a Recorder goes on recording, on a
// History taken from it.
func Check(h History, opts Options) Report {
	c := newChecker(h, opts)
	c.checkUnexpected()
	c.checkDuplicates()
	c.checkLost()
	c.checkOrder()
	c.checkLeases()
	c.checkDeadLetters()
	return c.report()
}

func newChecker(h History, opts Options) *checker {
	opts.Slack = max(opts.Slack, 0)
	opts.LeaseTimeout = max(opts.LeaseTimeout, 0)
	c := &checker{
		opts:        opts,
		msgs:        map[string]*message{},
		settles:     map[settleKey][]*Settlement{},
		disconnects: map[string][]*Disconnect{},
	}
	for i := range h.Publishes {
		p := &h.Publishes[i]
		m := c.message(p.ID)
		m.pubs = append(m.pubs, p)
		c.see(p.Sent)
		c.see(p.Answered)
	}
	for i := range h.Deliveries {
		d := &h.Deliveries[i]
		m := c.message(d.ID)
		s := stream{d.Group, d.DLQ}
		m.streams[s] = append(m.streams[s], d)
		c.see(d.At)
	}
	for i := range h.Settlements {
		s := &h.Settlements[i]
		k := settleKey{stream{s.Group, s.DLQ}, s.ID, s.Consumer}
		c.settles[k] = append(c.settles[k], s)
		c.see(s.At)
	}
	for i := range h.Disconnects {
		d := &h.Disconnects[i]
		c.disconnects[d.Client] = append(c.disconnects[d.Client], d)
		c.see(d.At)
	}

	c.ids = slices.Sorted(maps.Keys(c.msgs))
	for _, id := range c.ids {
		m := c.msgs[id]
		slices.SortStableFunc(m.pubs, func(a, b *Publish) int { return a.Sent.Compare(b.Sent) })
		for _, p := range m.pubs {
			switch {
			case p.Answer == Acked:
				m.acked = append(m.acked, p)
			case p.Unknown():
				m.unknown = append(m.unknown, p)
			default:
				m.refused = append(m.refused, p)
			}
		}
		for _, s := range m.sortedStreams() {
			ds := m.streams[s]
			slices.SortStableFunc(ds, func(a, b *Delivery) int { return a.At.Compare(b.At) })
			for _, d := range ds {
				switch {
				case !s.dlq && d.MsgID != "":
					m.msgIDs = appendNew(m.msgIDs, d.MsgID)
				case s.dlq && d.OriginalMsgID != "":
					m.msgIDs = appendNew(m.msgIDs, d.OriginalMsgID)
				}
			}
		}
	}
	for _, ss := range c.settles {
		slices.SortStableFunc(ss, func(a, b *Settlement) int { return a.At.Compare(b.At) })
	}
	for _, ds := range c.disconnects {
		slices.SortStableFunc(ds, func(a, b *Disconnect) int { return a.At.Compare(b.At) })
	}
	c.summarize()
	return c
}

func (c *checker) message(id string) *message {
	m := c.msgs[id]
	if m == nil {
		m = &message{id: id, streams: map[stream][]*Delivery{}}
		c.msgs[id] = m
	}
	return m
}

func (c *checker) see(t time.Time) {
	if t.After(c.end) {
		c.end = t
	}
}

// summarize counts what happened, before any check.
func (c *checker) summarize() {
	s := &c.r.Summary
	for _, id := range c.ids {
		m := c.msgs[id]
		s.Publishes += len(m.pubs)
		s.Refused += len(m.refused)
		s.Unknown += len(m.unknown)
		if len(m.acked) > 0 {
			s.Acknowledged++
		}
		delivered := false
		for st, ds := range m.streams {
			if st.dlq {
				continue
			}
			delivered = true
			s.Deliveries += len(ds)
			s.Redeliveries += len(ds) - 1
		}
		if delivered {
			s.Delivered++
		}
		if m.deadLettered() {
			s.DeadLettered++
		}
	}
}

// checkUnexpected reports deliveries of messages that no publish could
// have stored: never published, or refused with a definite reason code.
func (c *checker) checkUnexpected() {
	for _, id := range c.ids {
		m := c.msgs[id]
		if m.mayBeStored() {
			continue
		}
		for _, s := range m.sortedStreams() {
			d := m.streams[s][0]
			f := Finding{Kind: Unexpected, ID: id, Key: d.Key, Queue: m.queue(), Group: d.Group}
			what := "delivered"
			if s.dlq {
				f.Kind, what = Orphan, "dead letter delivered"
			}
			if len(m.refused) == 0 {
				f.Text = fmt.Sprintf("%s to group %s at %s (%s) but never published", what, d.Group, clock(d.At), on(d.Consumer, d.Node))
				f.add(d.At, d.Node, d.Consumer)
			} else {
				p := m.refused[len(m.refused)-1]
				f.Text = fmt.Sprintf("%s to group %s at %s (%s) but its publish was refused with 0x%02x at %s (%s)",
					what, d.Group, clock(d.At), on(d.Consumer, d.Node), p.Code, clock(p.Answered), on(p.Producer, p.Node))
				f.add(d.At, d.Node, d.Consumer)
				f.add(p.Answered, p.Node, p.Producer)
			}
			c.violation(f)
			if s.dlq {
				// One orphan finding per message is enough.
				break
			}
		}
	}
}

// checkDuplicates finds messages stored more than once and redeliveries
// without DUP, and sets every message's copies.
//
// Within a group a delivery without DUP is a redelivery without DUP when
// the broker itself counts it as one (delivery-count above 1) or when its
// msg-id was delivered to the group before; otherwise it is the first
// delivery of a stored copy. A message was stored as many times as it had
// distinct msg-ids, or first deliveries in one group, whichever is more.
// Copies beyond one are explained when the producer may have stored them:
// by acknowledged retries, or by attempts answered 0x83 or not at all.
func (c *checker) checkDuplicates() {
	for _, id := range c.ids {
		m := c.msgs[id]
		copies := len(m.msgIDs)
		var copyFirsts []*Delivery // first deliveries of the copies, in the group that shows most
		byMsgID := map[string]*Delivery{}
		for _, s := range m.sortedStreams() {
			for _, d := range m.streams[s] {
				id := d.MsgID
				if s.dlq {
					id = d.OriginalMsgID
				}
				if first := byMsgID[id]; id != "" && (first == nil || d.At.Before(first.At)) {
					byMsgID[id] = d
				}
			}
			if s.dlq {
				continue
			}
			var firsts []*Delivery
			seen := map[string]*Delivery{}
			for _, d := range m.streams[s] {
				prev := seen[d.MsgID]
				switch {
				case d.DUP:
				case d.DeliveryCount > 1:
					c.withoutDUP(m, d, fmt.Sprintf("delivery-count %d", d.DeliveryCount), nil)
				case d.MsgID != "" && prev != nil:
					c.withoutDUP(m, d, "msg-id "+d.MsgID, prev)
				default:
					firsts = append(firsts, d)
				}
				if d.MsgID != "" && prev == nil {
					seen[d.MsgID] = d
				}
			}
			if len(firsts) > len(copyFirsts) {
				copyFirsts = firsts
			}
		}
		slices.SortStableFunc(m.msgIDs, func(a, b string) int { return byMsgID[a].At.Compare(byMsgID[b].At) })
		m.copies = max(copies, len(copyFirsts), 1)
		if m.copies < 2 || !m.mayBeStored() {
			continue
		}
		if len(copyFirsts) < len(m.msgIDs) {
			copyFirsts = nil
			for _, id := range m.msgIDs {
				copyFirsts = append(copyFirsts, byMsgID[id])
			}
		}
		c.duplicate(m, copyFirsts)
	}
}

func (c *checker) withoutDUP(m *message, d *Delivery, why string, prev *Delivery) {
	f := Finding{Kind: WithoutDUP, ID: m.id, Key: d.Key, Queue: m.queue(), Group: d.Group}
	f.add(d.At, d.Node, d.Consumer)
	if prev != nil {
		f.add(prev.At, prev.Node, prev.Consumer)
		f.Text = fmt.Sprintf("delivered again to group %s at %s (%s) without DUP: %s was first delivered at %s (%s)",
			d.Group, clock(d.At), on(d.Consumer, d.Node), why, clock(prev.At), on(prev.Consumer, prev.Node))
	} else {
		f.Text = fmt.Sprintf("delivered again to group %s at %s (%s) without DUP: %s", d.Group, clock(d.At), on(d.Consumer, d.Node), why)
	}
	c.violation(f)
}

// duplicate reports a message stored m.copies times, as explained or not.
func (c *checker) duplicate(m *message, firsts []*Delivery) {
	f := Finding{Kind: Duplicate, ID: m.id, Key: m.key(), Queue: m.queue()}
	how := "stored " + times(m.copies)
	if len(m.msgIDs) > 1 {
		how += " (msg-ids " + join(m.msgIDs) + ")"
	}
	if len(firsts) > 1 && sameGroup(firsts) {
		d := firsts[0]
		f.Group = d.Group
		how += fmt.Sprintf(": first delivered to group %s", d.Group)
		for i, d := range firsts {
			if i > 0 {
				how += ","
			}
			how += fmt.Sprintf(" at %s (%s)", clock(d.At), on(d.Consumer, d.Node))
			f.add(d.At, d.Node, d.Consumer)
		}
	} else {
		how += ": first delivered"
		for i, d := range firsts {
			if i > 0 {
				how += ","
			}
			where := "group " + d.Group
			if d.DLQ {
				where = "the dead-letter queue"
			}
			how += fmt.Sprintf(" to %s at %s (%s)", where, clock(d.At), on(d.Consumer, d.Node))
			f.add(d.At, d.Node, d.Consumer)
		}
	}
	acked := len(m.acked)
	switch {
	case m.copies <= acked:
		p := m.acked[len(m.acked)-1]
		f.Cause = CausePublishedAgain
		f.Text = fmt.Sprintf("%s; explained: acknowledged %s, the last time to %s at %s", how, times(acked), on(p.Producer, p.Node), clock(p.Answered))
		f.add(p.Answered, p.Node, p.Producer)
		c.explained(f)
	case m.copies <= acked+len(m.unknown):
		p := m.unknown[0]
		if p.Answer == NoAnswer {
			f.Cause = CauseNoAnswer
			f.Text = fmt.Sprintf("%s; explained: the publish sent at %s (%s) got no answer", how, clock(p.Sent), on(p.Producer, p.Node))
			f.add(p.Sent, p.Node, p.Producer)
		} else {
			f.Cause = CauseUnknown
			f.Text = fmt.Sprintf("%s; explained: the publish sent at %s (%s) was answered 0x83 at %s", how, clock(p.Sent), on(p.Producer, p.Node), clock(p.Answered))
			f.add(p.Answered, p.Node, p.Producer)
		}
		c.explained(f)
	default:
		f.Text = fmt.Sprintf("%s, but its producer was acknowledged %s and never told 0x83 nor left without an answer", how, times(acked))
		if p := m.first(); p != nil {
			f.add(p.Answered, p.Node, p.Producer)
		}
		c.violation(f)
	}
}

// checkLost reports acknowledged messages that a group listed in
// Options.Groups never received and that no dead-letter queue delivered.
func (c *checker) checkLost() {
	for _, id := range c.ids {
		m := c.msgs[id]
		if len(m.acked) == 0 || m.deadLettered() {
			continue
		}
		p := m.acked[0]
		lost := false
		for _, g := range c.opts.Groups[p.Queue] {
			if len(m.streams[stream{group: g}]) > 0 {
				continue
			}
			lost = true
			f := Finding{Kind: Lost, ID: id, Key: p.Key, Queue: p.Queue, Group: g}
			f.add(p.Sent, p.Node, p.Producer)
			f.add(p.Answered, "", "")
			f.Text = fmt.Sprintf("sent at %s by %s, acknowledged at %s, but never delivered to group %s nor dead-lettered",
				clock(p.Sent), on(p.Producer, p.Node), clock(p.Answered), g)
			c.violation(f)
		}
		if lost {
			c.r.Summary.Lost++
		}
	}
}

// chain is the acknowledged messages of one key from one producer.
type chain struct {
	producer, queue, key string
}

// ordered is a message of a chain with the instants that order it.
type ordered struct {
	m *message
	// sent is its first attempt that may have stored it; answered the
	// first acknowledgement.
	sent, answered *Publish
	first          *Delivery // in the group checked
}

// checkOrder reports, per group, the messages of one key and one producer
// whose first deliveries came in another order than their publishes: m1
// acknowledged before m2 was sent must be first delivered before m2.
// Redeliveries are not judged; a message a group never received is the
// lost check's.
func (c *checker) checkOrder() {
	chains := map[chain][]*message{}
	for _, id := range c.ids {
		m := c.msgs[id]
		if len(m.acked) == 0 || slices.Contains(c.opts.Unordered, m.acked[0].Queue) {
			continue
		}
		p := m.acked[0]
		k := chain{p.Producer, p.Queue, p.Key}
		chains[k] = append(chains[k], m)
	}
	for _, k := range slices.SortedFunc(maps.Keys(chains), func(a, b chain) int {
		return cmp.Or(cmp.Compare(a.queue, b.queue), cmp.Compare(a.key, b.key), cmp.Compare(a.producer, b.producer))
	}) {
		ms := chains[k]
		if len(ms) < 2 {
			continue
		}
		groups := map[string]bool{}
		for _, m := range ms {
			for s := range m.streams {
				if !s.dlq {
					groups[s.group] = true
				}
			}
		}
		for _, g := range slices.Sorted(maps.Keys(groups)) {
			c.checkChain(k, g, ms)
		}
	}
}

// checkChain checks one chain in group g. Taking the messages in the
// order they were sent, each must be first delivered after every message
// acknowledged before it was sent; the one of those delivered last is
// the one reported.
func (c *checker) checkChain(k chain, g string, ms []*message) {
	var items []*ordered
	for _, m := range ms {
		ds := m.streams[stream{group: g}]
		if len(ds) == 0 {
			continue
		}
		o := &ordered{m: m, sent: m.acked[0], answered: m.acked[0], first: ds[0]}
		for _, p := range m.acked {
			if p.Answered.Before(o.answered.Answered) {
				o.answered = p
			}
		}
		for _, p := range append(slices.Clone(m.acked), m.unknown...) {
			if p.Sent.Before(o.sent.Sent) {
				o.sent = p
			}
		}
		items = append(items, o)
	}
	bySent := slices.Clone(items)
	slices.SortStableFunc(bySent, func(a, b *ordered) int { return a.sent.Sent.Compare(b.sent.Sent) })
	byAnswer := items
	slices.SortStableFunc(byAnswer, func(a, b *ordered) int { return a.answered.Answered.Compare(b.answered.Answered) })
	var latest *ordered // delivered last of those acknowledged so far
	next := 0
	for _, b := range bySent {
		for ; next < len(byAnswer) && !byAnswer[next].answered.Answered.After(b.sent.Sent); next++ {
			if a := byAnswer[next]; latest == nil || a.first.At.After(latest.first.At) {
				latest = a
			}
		}
		if latest == nil || latest == b || !b.first.At.Before(latest.first.At) {
			continue
		}
		a := latest
		f := Finding{Kind: Reorder, ID: a.m.id, Other: b.m.id, Key: k.key, Queue: k.queue, Group: g}
		f.add(a.answered.Answered, a.answered.Node, k.producer)
		f.add(b.sent.Sent, b.sent.Node, "")
		f.add(b.first.At, b.first.Node, b.first.Consumer)
		f.add(a.first.At, a.first.Node, a.first.Consumer)
		f.Text = fmt.Sprintf("acknowledged to %s at %s, before %s was sent at %s, yet %s was first delivered to group %s at %s (%s) and %s only at %s (%s)",
			on(k.producer, a.answered.Node), clock(a.answered.Answered), b.m.id, clock(b.sent.Sent),
			b.m.id, g, clock(b.first.At), on(b.first.Consumer, b.first.Node),
			a.m.id, clock(a.first.At), on(a.first.Consumer, a.first.Node))
		c.violation(f)
	}
}

func (c *checker) violation(f Finding) { c.r.Violations = append(c.r.Violations, f) }

func (c *checker) explained(f Finding) { c.r.Explained = append(c.r.Explained, f) }

// sameGroup reports whether ds all came from one group of the queue.
func sameGroup(ds []*Delivery) bool {
	for _, d := range ds {
		if d.DLQ || d.Group != ds[0].Group {
			return false
		}
	}
	return true
}

func appendNew(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
