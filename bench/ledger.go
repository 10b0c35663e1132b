package bench

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Delivery is what a consumer learned from one received message.
type Delivery struct {
	Producer uint32
	Seq      uint64
	Key      uint32
	// Redelivered: the broker says it delivered this message before (the
	// DUP flag, or a v5 user property delivery-count above 1).
	Redelivered bool
}

// Outcome classifies one Delivery.
type Outcome uint8

const (
	// OutcomeFirst: the first receipt of the message.
	OutcomeFirst Outcome = iota
	// OutcomeRedelivery: received before, and the broker flagged it as a
	// redelivery. Allowed by at-least-once delivery.
	OutcomeRedelivery
	// OutcomeDuplicate: received before, and not flagged: a true duplicate.
	OutcomeDuplicate
	// OutcomeForeign: not from a producer of this run.
	OutcomeForeign
)

// Tally is the accounting of a run.
type Tally struct {
	Sent         int64 `json:"sent"`         // publishes handed to the connection
	Acked        int64 `json:"acked"`        // of those, acknowledged with success (QoS 0: written)
	Rejected     int64 `json:"rejected"`     // acknowledged with a failure reason code
	Received     int64 `json:"received"`     // distinct messages received
	Missing      int64 `json:"missing"`      // acked, never received
	Duplicates   int64 `json:"duplicates"`   // receipts of an already received message without a redelivery flag
	Redeliveries int64 `json:"redeliveries"` // receipts of an already received message flagged as redelivered
	Reordered    int64 `json:"reordered"`    // first receipts older than a message of the same producer and key received before
	Foreign      int64 `json:"foreign"`      // messages not written by this run's producers
}

// Unacked is the number of publishes that got no acknowledgement at all.
func (t Tally) Unacked() int64 { return t.Sent - t.Acked - t.Rejected }

// Ledger is the correctness accounting of one run: what producers sent and
// the broker acknowledged, against what consumers received.
//
// Messages are identified by (producer, sequence); sequences of a producer
// are dense from 0, so the ledger keeps two bits per message. The per-key
// order check compares sequences of one producer and one key, which is the
// order the broker received them in (a producer writes its publishes to the
// connection in sequence order).
//
// All methods are safe for concurrent use. Acks and receipts may arrive in
// either order: a message received before its PUBACK is not missing.
type Ledger struct {
	books       []*book
	outstanding atomic.Int64 // acked and not yet received
	sent        atomic.Int64
	received    atomic.Int64
	foreign     atomic.Int64
	zero        chan struct{} // poked when outstanding drops to 0
}

// book is the ledger of one producer.
type book struct {
	mu sync.Mutex
	// Guarded by mu.
	acked, received bitset
	nAcked          int64
	rejected        int64
	duplicates      int64
	redeliveries    int64
	reordered       int64
	lastSeq         map[uint32]uint64 // key -> highest first-receipt sequence
}

// NewLedger returns a ledger for producers 0..producers-1.
func NewLedger(producers int) *Ledger {
	l := &Ledger{
		books: make([]*book, producers),
		zero:  make(chan struct{}, 1),
	}
	for i := range l.books {
		l.books[i] = &book{lastSeq: make(map[uint32]uint64)}
	}
	return l
}

func (l *Ledger) book(producer uint32) *book {
	if int(producer) >= len(l.books) {
		return nil
	}
	return l.books[producer]
}

// Sent counts a publish handed to the connection.
func (l *Ledger) Sent() {
	l.sent.Add(1)
}

// Acked records a success acknowledgement of a message. A repeated ack of
// the same message is ignored.
func (l *Ledger) Acked(producer uint32, seq uint64) {
	b := l.book(producer)
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.acked.set(seq) {
		return
	}
	b.nAcked++
	if !b.received.get(seq) {
		l.outstanding.Add(1)
	}
}

// Rejected records a failure acknowledgement: the broker refused the
// message, so it is not expected to be delivered.
func (l *Ledger) Rejected(producer uint32, seq uint64) {
	if b := l.book(producer); b != nil {
		b.mu.Lock()
		b.rejected++
		b.mu.Unlock()
	}
}

// Foreign counts a message that could not be attributed to a producer.
func (l *Ledger) Foreign() {
	l.foreign.Add(1)
}

// Receive records one receipt and classifies it.
func (l *Ledger) Receive(d Delivery) Outcome { return l.ReceiveFirst(d, nil) }

// ReceiveFirst is Receive that runs first, when d is the message's first
// delivery, before the delivery counts as received: whoever waits for
// every message then sees what first recorded (its end-to-end latency).
func (l *Ledger) ReceiveFirst(d Delivery, first func()) Outcome {
	b := l.book(d.Producer)
	if b == nil {
		l.foreign.Add(1)
		return OutcomeForeign
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.received.set(d.Seq) {
		if d.Redelivered {
			b.redeliveries++
			return OutcomeRedelivery
		}
		b.duplicates++
		return OutcomeDuplicate
	}
	if first != nil {
		first()
	}
	l.received.Add(1)
	if b.acked.get(d.Seq) && l.outstanding.Add(-1) == 0 {
		select {
		case l.zero <- struct{}{}:
		default:
		}
	}
	// Order is judged on first deliveries only: a redelivery may
	// legitimately follow later messages of its key.
	if !d.Redelivered {
		if last, ok := b.lastSeq[d.Key]; ok && d.Seq < last {
			b.reordered++
		} else {
			b.lastSeq[d.Key] = d.Seq
		}
	}
	return OutcomeFirst
}

// Outstanding is the number of acknowledged messages not received yet.
func (l *Ledger) Outstanding() int64 { return l.outstanding.Load() }

// SentCount is the number of publishes so far.
func (l *Ledger) SentCount() int64 { return l.sent.Load() }

// ReceivedCount is the number of distinct messages received so far.
func (l *Ledger) ReceivedCount() int64 { return l.received.Load() }

// Wait blocks until every acknowledged message has been received, or ctx
// ends (returning ctx.Err()). Call it once producers are done: before that,
// the outstanding count may touch zero while more acks are on the way.
func (l *Ledger) Wait(ctx context.Context) error {
	for {
		if l.outstanding.Load() <= 0 {
			return nil
		}
		select {
		case <-l.zero:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Tally sums the books.
func (l *Ledger) Tally() Tally {
	t := Tally{
		Sent:     l.sent.Load(),
		Received: l.received.Load(),
		Foreign:  l.foreign.Load(),
	}
	for _, b := range l.books {
		b.mu.Lock()
		t.Acked += b.nAcked
		t.Rejected += b.rejected
		t.Missing += b.acked.countAndNot(&b.received)
		t.Duplicates += b.duplicates
		t.Redeliveries += b.redeliveries
		t.Reordered += b.reordered
		b.mu.Unlock()
	}
	return t
}

// Missing lists up to limit acknowledged messages that were never
// received, lowest producer and sequence first.
func (l *Ledger) Missing(limit int) []MessageID {
	var ids []MessageID
	for p, b := range l.books {
		b.mu.Lock()
		b.acked.eachAndNot(&b.received, func(seq uint64) bool {
			if len(ids) >= limit {
				return false
			}
			ids = append(ids, MessageID{Producer: uint32(p), Seq: seq})
			return true
		})
		b.mu.Unlock()
		if len(ids) >= limit {
			break
		}
	}
	return ids
}

// bitset is a growable set of sequence numbers.
type bitset []uint64

// set adds i and reports whether it was already present.
func (b *bitset) set(i uint64) bool {
	w := i / 64
	if w >= uint64(len(*b)) {
		n := max(2*len(*b), int(w)+1)
		grown := make([]uint64, n)
		copy(grown, *b)
		*b = grown
	}
	mask := uint64(1) << (i % 64)
	was := (*b)[w]&mask != 0
	(*b)[w] |= mask
	return was
}

func (b bitset) get(i uint64) bool {
	w := i / 64
	return w < uint64(len(b)) && b[w]&(1<<(i%64)) != 0
}

// countAndNot counts the members of b that are not in o.
func (b bitset) countAndNot(o *bitset) int64 {
	var n int
	for w, x := range b {
		if w < len(*o) {
			x &^= (*o)[w]
		}
		n += bits.OnesCount64(x)
	}
	return int64(n)
}

// eachAndNot calls fn for the members of b not in o, in order, until fn
// returns false.
func (b bitset) eachAndNot(o *bitset, fn func(uint64) bool) {
	for w, x := range b {
		if w < len(*o) {
			x &^= (*o)[w]
		}
		for x != 0 {
			bit := bits.TrailingZeros64(x)
			if !fn(uint64(w)*64 + uint64(bit)) {
				return
			}
			x &= x - 1
		}
	}
}
