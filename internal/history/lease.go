package history

import (
	"fmt"
	"time"
)

// ending is what ended a lease.
type ending uint8

const (
	stillHeld ending = iota // nothing recorded ended it
	settled                 // its consumer settled it: lease.settlement says how
	disconnected
	expired    // the lease timeout passed, counted from the delivery or its last Extend
	superseded // the broker delivered it to the same consumer again
)

// lease is the time a consumer held one delivery, as the history shows it.
type lease struct {
	d *Delivery
	// end is when it ended; zero while held at the end of the history
	// with no lease timeout to end it.
	end    time.Time
	ending ending
	// settlement is the settlement that ended it, with ending settled.
	settlement *Settlement
}

// failed reports whether the lease ended without an ack in a way that
// counts toward max_deliveries, for certain by end (the end of the
// history, which a lease timeout must have passed by slack).
func (l *lease) failed(end time.Time, slack time.Duration) bool {
	switch l.ending {
	case settled:
		return l.settlement.Outcome == Nack || l.settlement.Outcome == Disconnected
	case disconnected, superseded:
		return true
	case expired:
		return !l.end.Add(slack).After(end)
	}
	return false
}

// units splits a message's deliveries in one stream into the deliveries
// of each stored copy, by msg-id. When some deliveries carry no msg-id the
// copies cannot be told apart: a message stored once is one unit, one
// stored more often from the queue none (nil).
func units(m *message, s stream, ds []*Delivery) [][]*Delivery {
	var ids []string
	by := map[string][]*Delivery{}
	for _, d := range ds {
		if d.MsgID == "" {
			if !s.dlq && m.copies > 1 {
				return nil
			}
			return [][]*Delivery{ds}
		}
		ids = appendNew(ids, d.MsgID)
		by[d.MsgID] = append(by[d.MsgID], d)
	}
	out := make([][]*Delivery, 0, len(ids))
	for _, id := range ids {
		out = append(out, by[id])
	}
	return out
}

// leases works out the lease of each delivery of one unit, in stream s.
// A lease ends at the first of: its consumer's settlement (other than
// Extend) at or after the delivery, its consumer's disconnect, the lease
// timeout, and the next delivery of the unit to the same consumer (the
// broker only delivers it again once the lease is over).
func (c *checker) leases(s stream, ds []*Delivery) []lease {
	out := make([]lease, len(ds))
	for i, d := range ds {
		l := lease{d: d}
		end := func(t time.Time, e ending, st *Settlement) {
			if !t.IsZero() && (l.end.IsZero() || t.Before(l.end)) {
				l.end, l.ending, l.settlement = t, e, st
			}
		}
		var again time.Time
		for _, e := range ds[i+1:] {
			if e.Consumer == d.Consumer {
				again = e.At
				break
			}
		}
		var deadline time.Time
		if c.opts.LeaseTimeout > 0 {
			deadline = d.At.Add(c.opts.LeaseTimeout)
		}
		for _, st := range c.settles[settleKey{s, d.ID, d.Consumer}] {
			if st.At.Before(d.At) || st.MsgID != "" && d.MsgID != "" && st.MsgID != d.MsgID {
				continue
			}
			if !again.IsZero() && !st.At.Before(again) || !deadline.IsZero() && st.At.After(deadline) {
				break
			}
			if st.Outcome == Extend {
				if !deadline.IsZero() {
					deadline = st.At.Add(c.opts.LeaseTimeout)
				}
				continue
			}
			end(st.At, settled, st)
			break
		}
		for _, dc := range c.disconnects[d.Consumer] {
			if !dc.At.Before(d.At) {
				end(dc.At, disconnected, nil)
				break
			}
		}
		end(deadline, expired, nil)
		end(again, superseded, nil)
		out[i] = l
	}
	return out
}

// checkLeases reports two consumers of one group holding leases on the
// same stored message at once, by more than Options.Slack. Deliveries to
// the same consumer may overlap: a reconnecting session is resent what it
// held.
func (c *checker) checkLeases() {
	for _, id := range c.ids {
		m := c.msgs[id]
		for _, s := range m.sortedStreams() {
			for _, u := range units(m, s, m.streams[s]) {
				ls := c.leases(s, u)
				for i := range ls {
					for j := i + 1; j < len(ls); j++ {
						c.overlap(m, &ls[i], &ls[j])
					}
				}
			}
		}
	}
}

// overlap reports a and b if they overlap; a was delivered first.
func (c *checker) overlap(m *message, a, b *lease) {
	if a.d.Consumer == b.d.Consumer {
		return
	}
	until := a.end
	if until.IsZero() || !b.end.IsZero() && b.end.Before(until) {
		until = b.end
	}
	if !until.IsZero() && !until.After(b.d.At.Add(c.opts.Slack)) {
		return
	}
	by := "to the end of the history"
	if !until.IsZero() {
		by = "by " + until.Sub(b.d.At).Round(time.Millisecond).String()
	}
	f := Finding{Kind: LeaseOverlap, ID: m.id, Key: a.d.Key, Queue: m.queue(), Group: a.d.Group}
	f.add(a.d.At, a.d.Node, a.d.Consumer)
	f.add(a.end, "", "")
	f.add(b.d.At, b.d.Node, b.d.Consumer)
	f.add(b.end, "", "")
	where := "group " + a.d.Group
	if a.d.DLQ {
		where = "the dead-letter queue's group " + a.d.Group
	}
	f.Text = fmt.Sprintf("leased in %s to %s from %s %s and to %s from %s %s: overlapping %s",
		where, on(a.d.Consumer, a.d.Node), clock(a.d.At), c.until(a),
		on(b.d.Consumer, b.d.Node), clock(b.d.At), c.until(b), by)
	c.violation(f)
}

// until describes the end of l.
func (c *checker) until(l *lease) string {
	switch l.ending {
	case settled:
		return fmt.Sprintf("until its %s at %s", l.settlement.Outcome, clock(l.end))
	case disconnected:
		return "until it disconnected at " + clock(l.end)
	case expired:
		return fmt.Sprintf("until its lease timeout at %s", clock(l.end))
	case superseded:
		return "until it was delivered to it again at " + clock(l.end)
	}
	return "and still held at the end"
}

// checkDeadLetters reports, when Options.DLQConsumed, messages that a
// group rejected or failed MaxDeliveries times without ever acking them
// and that no dead-letter queue delivered. Orphan dead letters (no
// original) are checkUnexpected's.
func (c *checker) checkDeadLetters() {
	if !c.opts.DLQConsumed {
		return
	}
	for _, id := range c.ids {
		m := c.msgs[id]
		if m.deadLettered() {
			continue
		}
		for _, s := range m.sortedStreams() {
			if s.dlq {
				continue
			}
			for _, u := range units(m, s, m.streams[s]) {
				if c.vanished(m, s, u) {
					break
				}
			}
		}
	}
}

// vanished reports one unit of m in s if it had to be dead-lettered.
func (c *checker) vanished(m *message, s stream, u []*Delivery) bool {
	failures := 0
	var last *lease
	var reject *Settlement
	for _, l := range c.leases(s, u) {
		if l.ending == settled && l.settlement.Outcome == Reject && reject == nil {
			reject = l.settlement
		}
		if l.failed(c.end, c.opts.Slack) {
			failures++
			last = &l
		}
	}
	// Any ack settles it, even one sent after its lease was over: the
	// broker may have taken it, and then owes no dead letter.
	for _, d := range u {
		for _, st := range c.settles[settleKey{s, d.ID, d.Consumer}] {
			if st.Outcome == Ack && (st.MsgID == "" || d.MsgID == "" || st.MsgID == d.MsgID) {
				return false
			}
		}
	}
	f := Finding{Kind: Vanished, ID: m.id, Key: u[0].Key, Queue: m.queue(), Group: s.group}
	switch {
	case reject != nil:
		f.add(reject.At, "", reject.Consumer)
		f.Text = fmt.Sprintf("rejected in group %s by %s at %s, but never delivered from the dead-letter queue",
			s.group, reject.Consumer, clock(reject.At))
	case c.opts.MaxDeliveries > 0 && failures >= c.opts.MaxDeliveries:
		f.add(last.d.At, last.d.Node, last.d.Consumer)
		f.add(last.end, "", "")
		f.Text = fmt.Sprintf("%d deliveries to group %s ended without an ack, the last to %s at %s %s, but it was never delivered from the dead-letter queue",
			failures, s.group, on(last.d.Consumer, last.d.Node), clock(last.d.At), c.until(last))
	default:
		return false
	}
	c.violation(f)
	return true
}
