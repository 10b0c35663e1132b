package hooks

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/shardq/shardq/queue"
)

// conn is shardq's state for one connected client: its producer window and
// PUBACK order, its subscriptions to queues, and the deliveries it holds.
// One writer goroutine per conn writes PUBACKs and deliveries, so that no
// committer or queue ever blocks on a client's socket.
type conn struct {
	h  *Hook
	cl *mqtt.Client
	v5 bool
	// ctx is the hook's, saying that the queues the client creates are
	// its user's (queue.WithOwner).
	ctx context.Context

	// credit is the MQTT 5 client's Receive Maximum, shared by all its
	// queue subscriptions; nil for MQTT 3.1.1.
	credit *queue.Credit
	// window bounds the producer's publishes not yet acknowledged
	// (backpressure); done is closed when the conn ends.
	window chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	closed bool
	// acks are the producer's QoS 1 publishes in arrival order; PUBACKs go
	// out in that order as their commits finish.
	acks []*ackSlot
	// out holds deliveries waiting for the writer.
	out  []delivery
	wake chan struct{}
	// leases maps the packet ID of each outstanding QoS 1 delivery.
	leases map[uint16]lease
	// explicit maps leases of explicit-settlement subscriptions by
	// queue, group and msg-id (see explicitKey).
	explicit map[string]queue.LeaseRef
	// subs are the client's queue subscriptions by filter.
	subs map[string]*subscription
	// unsubbed lists, by UNSUBSCRIBE packet ID, the positions of the queue
	// filters it removed (see OnPacketEncode).
	unsubbed map[uint16][]int
	// subRefusals say, by SUBSCRIBE packet ID, why a queue filter of it
	// was refused: its SUBACK's reason string (see OnPacketEncode).
	subRefusals map[uint16]string
	// pendingSubs are queue subscriptions whose deliveries wait for their
	// SUBACK to be written, by SUBSCRIBE packet ID.
	pendingSubs map[uint16][]*subscription
	// writing is true while the writer goroutine runs.
	writing bool
}

type ackSlot struct {
	read time.Time // when the publish was read (Options.OnPuback)
	id   uint16
	err  error
	done bool
}

// lease is a delivery awaiting its PUBACK.
type lease struct {
	ref      queue.LeaseRef
	explicit bool // the PUBACK only says received
}

type delivery struct {
	d   queue.Delivery
	sub *subscription
}

func newConn(h *Hook, cl *mqtt.Client) *conn {
	var credit *queue.Credit
	if cl.Properties.ProtocolVersion == 5 {
		rm := int(cl.Properties.Props.ReceiveMaximum)
		if rm == 0 {
			rm = 65535 // MQTT 5: absent means 65535
		}
		credit = queue.NewCredit(rm)
	}
	return &conn{
		ctx:         queue.WithOwner(h.ctx, string(cl.Properties.Username)),
		credit:      credit,
		h:           h,
		cl:          cl,
		v5:          cl.Properties.ProtocolVersion == 5,
		window:      make(chan struct{}, h.opts.ProducerWindow),
		done:        make(chan struct{}),
		wake:        make(chan struct{}, 1),
		leases:      map[uint16]lease{},
		explicit:    map[string]queue.LeaseRef{},
		unsubbed:    map[uint16][]int{},
		pendingSubs: map[uint16][]*subscription{},
		subs:        map[string]*subscription{},
	}
}

// signal wakes the writer, starting it if needed. Lock must be held.
func (c *conn) signalLocked() {
	if !c.writing {
		c.writing = true
		go c.write()
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// write is the writer goroutine: it sends the PUBACKs whose commits have
// finished (in order) and the pending deliveries, then waits for more.
// Everything ready at a wake-up is encoded into one buffer and written with
// one system call.
func (c *conn) write() {
	defer c.recoverWriter()
	var acks []ackOut
	var outs []delivery
	w := &wire{c: c}
	for range c.wake {
		c.mu.Lock()
		if c.closed {
			c.writing = false
			c.mu.Unlock()
			return
		}
		var stop error
		acks, stop = c.readyAcksLocked(acks[:0])
		outs = append(outs[:0], c.out...)
		clear(c.out)
		c.out = c.out[:0]
		c.mu.Unlock()

		for _, a := range acks {
			w.buf = appendPuback(w.buf, c.v5, a.id, a.code, w.reason(a.reason))
		}
		var qos0 []queue.LeaseRef
		now := time.Now()
		for i := range outs {
			if l, ok := c.prepare(w, outs[i], now); ok {
				qos0 = append(qos0, l)
			}
			outs[i] = delivery{}
		}
		if err := w.flush(); err != nil {
			c.h.log.Debug("write failed", "client", c.cl.ID, "err", err)
		} else if f := c.h.opts.OnPuback; f != nil && len(acks) > 0 {
			now := time.Now()
			for _, a := range acks {
				f(now.Sub(a.read))
			}
		}
		for range acks {
			<-c.window
		}
		for _, l := range qos0 {
			_ = c.h.m.Settle(l, queue.Ack)
		}
		if stop != nil {
			c.h.log.Warn("disconnecting MQTT 3.1.1 producer: publish not stored", "client", c.cl.ID, "err", stop)
			c.cl.Stop(stop)
		}
	}
}

// recoverWriter ends a panic of the writer: the client is stopped (its
// disconnect cleans the connection up), the panic logged with its stack
// and reported to Options.OnPanic; the node goes on. Deferred by write.
func (c *conn) recoverWriter() {
	v := recover()
	if v == nil {
		return
	}
	stack := debug.Stack()
	c.cl.Stop(fmt.Errorf("hooks: internal error writing to the client: %v", v))
	if f := c.h.opts.OnPanic; f != nil {
		f(c.cl, v, stack)
		return
	}
	c.h.log.Error("panic on a client's writer; client closed", "client", c.cl.ID, "panic", fmt.Sprint(v), "stack", string(stack))
}

// ackOut is a PUBACK ready to be written.
type ackOut struct {
	read   time.Time
	id     uint16
	code   byte
	reason string
}

// readyAcksLocked takes the PUBACKs that may be sent now: the finished
// prefix of the producer's publishes. A failure of a v3.1.1 publish, which
// has no negative PUBACK, stops there: the client is disconnected.
func (c *conn) readyAcksLocked(dst []ackOut) ([]ackOut, error) {
	n := 0
	var stop error
	for n < len(c.acks) && c.acks[n].done {
		s := c.acks[n]
		if s.err != nil && !c.v5 {
			stop = s.err
			break
		}
		a := ackOut{read: s.read, id: s.id, code: reasonFor(s.err).Code}
		if s.err != nil {
			a.reason = s.err.Error()
		}
		dst = append(dst, a)
		n++
	}
	clear(c.acks[:n])
	c.acks = c.acks[n:]
	return dst, stop
}

// finishAck records the outcome of a producer's publish.
func (c *conn) finishAck(s *ackSlot, err error) {
	c.mu.Lock()
	s.err, s.done = err, true
	if !c.closed && len(c.acks) > 0 && c.acks[0] == s {
		c.signalLocked()
	}
	c.mu.Unlock()
}

// close ends the conn: every consumer leaves its group, so the messages the
// client held go back to their groups at once.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	subs := c.subs
	c.subs = map[string]*subscription{}
	clear(c.leases)
	clear(c.explicit)
	c.out = nil
	c.signalLocked()
	c.mu.Unlock()
	for _, s := range subs {
		s.close()
	}
}

// wire collects the encoded packets of one wake-up and writes them with
// one system call, under the client's lock like mochi's own WritePacket.
type wire struct {
	c     *conn
	buf   []byte
	props []byte
}

// reason returns a reason string unless the client asked for none
// (MQTT 5 Request Problem Information 0).
func (w *wire) reason(s string) string {
	p := &w.c.cl.Properties.Props
	if p.RequestProblemInfoFlag && p.RequestProblemInfo == 0 {
		return ""
	}
	return s
}

func (w *wire) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	cl := w.c.cl
	defer func() { w.buf = w.buf[:0] }()
	if cl.Closed() || cl.Net.Conn == nil {
		return mqtt.ErrConnectionClosed
	}
	cl.Lock()
	defer cl.Unlock()
	_, err := cl.Net.Conn.Write(w.buf)
	return err
}
