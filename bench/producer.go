package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// producer is one publishing connection.
//
// It writes its publishes to the connection in sequence order, so the
// broker receives a producer's messages in sequence order and the per-key
// order check is exact. Up to Window publishes are in flight: the send loop
// hands each publish to paho without waiting (PublishMethod_AsyncSend) and
// learns of its PUBACK through ackSession, which releases the window slot.
type producer struct {
	id     uint32
	cfg    *Config
	topic  string
	client *paho.Client
	sess   *ackSession
	ledger *Ledger
	meter  *meter

	window     chan struct{} // a slot is taken by sending, released by receiving
	lastReject atomic.Uint32 // last failure reason code, for the report
	err        atomic.Pointer[error]
}

// dialProducer connects producer id to the broker.
func dialProducer(ctx context.Context, cfg *Config, id uint32, run, topic string, l *Ledger, m *meter) (*producer, error) {
	p := &producer{
		id:     id,
		cfg:    cfg,
		topic:  topic,
		ledger: l,
		meter:  m,
		window: make(chan struct{}, cfg.Window),
	}
	p.sess = newAckSession(p.settled)
	clientID := fmt.Sprintf("bench-%s-p%d", run, id)
	client, err := connect(ctx, cfg, cfg.producerAddr(int(id)), paho.ClientConfig{
		ClientID:           clientID,
		Session:            p.sess,
		OnClientError:      p.fail,
		OnServerDisconnect: func(d *paho.Disconnect) { p.fail(fmt.Errorf("server sent DISCONNECT 0x%02x", d.ReasonCode)) },
	}, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 60})
	if err != nil {
		_ = p.sess.Close()
		return nil, fmt.Errorf("producer %d: %w", id, err)
	}
	p.client = client
	return p, nil
}

// connect dials the broker and sends CONNECT, bounded by ConnectTimeout.
func connect(ctx context.Context, cfg *Config, addr string, cc paho.ClientConfig, cp *paho.Connect) (*paho.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err // names the address already
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		cc.Conn = bufferedConn{TCPConn: tc, r: bufio.NewReaderSize(conn, 64<<10)}
	} else {
		cc.Conn = conn
	}
	c := paho.NewClient(cc)
	if _, err := c.Connect(ctx, cp); err != nil { // closes conn on failure
		return nil, fmt.Errorf("mqtt connect to %s: %w", addr, err)
	}
	return c, nil
}

// bufferedConn reads through a buffer: paho reads a packet's fixed header,
// length and body with separate reads, so an unbuffered socket costs the
// load generator several system calls per delivery, CPU it takes from the
// broker it measures on the same machine. It embeds the *net.TCPConn
// itself, not a net.Conn: paho writes a packet as net.Buffers, which only
// a TCP connection writes in one system call; through any other type they
// are written one by one, and two goroutines' packets interleave.
type bufferedConn struct {
	*net.TCPConn
	r *bufio.Reader
}

func (c bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// fail records the first connection error; the client is shutting down.
func (p *producer) fail(err error) {
	p.err.CompareAndSwap(nil, &err)
}

// lost is the error to return once the client is done.
func (p *producer) lost() error {
	if e := p.err.Load(); e != nil {
		return fmt.Errorf("producer %d: %w: %w", p.id, ErrConnectionLost, *e)
	}
	return fmt.Errorf("producer %d: %w", p.id, ErrConnectionLost)
}

// produce publishes count messages (0: unbounded) until stop ends. It
// returns nil when stop ends or count is reached, and an error when ctx ends
// or the connection is lost.
func (p *producer) produce(ctx, stop context.Context, count uint64) error {
	var (
		interval time.Duration
		start    = time.Now()
		timer    *time.Timer
	)
	if p.cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(p.cfg.Producers) / p.cfg.Rate)
		timer = time.NewTimer(0)
		defer timer.Stop()
	}
	for seq := uint64(0); count == 0 || seq < count; seq++ {
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(seq) * interval)); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-stop.Done():
					return ctx.Err()
				case <-p.client.Done():
					return p.lost()
				}
			}
		}
		select {
		case p.window <- struct{}{}:
		case <-stop.Done():
			return ctx.Err()
		case <-p.client.Done():
			return p.lost()
		}
		if stop.Err() != nil { // the slot and the deadline were both ready
			<-p.window
			return ctx.Err()
		}

		key := keyIndex(p.id, seq, p.cfg.Producers, p.cfg.Keys)
		payload := make([]byte, p.cfg.Size)
		h := header{Producer: p.id, Seq: seq, SentAt: time.Now().UnixNano(), Key: key}
		h.put(payload)
		pub := &paho.Publish{
			QoS:        p.cfg.QoS,
			Topic:      p.topic,
			Payload:    payload,
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: keyName(key)}}},
		}

		_, err := p.client.PublishWithOptions(ctx, pub, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		if err != nil {
			<-p.window
			if p.err.Load() != nil {
				return p.lost()
			}
			return fmt.Errorf("producer %d: publish #%d: %w", p.id, seq, err)
		}
		p.ledger.Sent()
		if p.cfg.QoS == 0 { // nothing comes back: written is as acknowledged as it gets
			p.ledger.Acked(p.id, seq)
			p.meter.written(time.Now().UnixNano())
			<-p.window
		}
	}
	return nil
}

// flush waits until every publish in flight is acknowledged. It returns nil
// when ctx ends first (the unacknowledged messages show in the tally) and
// an error only when the connection is lost.
func (p *producer) flush(ctx context.Context) error {
	for range cap(p.window) {
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			return nil
		case <-p.client.Done():
			return p.lost()
		}
	}
	return nil
}

// settled is called once per QoS 1 or 2 publish with its acknowledgement
// reason code, from the client's reading goroutine.
func (p *producer) settled(h header, reason byte) {
	now := time.Now().UnixNano()
	if reason < 0x80 {
		p.ledger.Acked(h.Producer, h.Seq)
		p.meter.acked(h.SentAt, now)
	} else {
		p.ledger.Rejected(h.Producer, h.Seq)
		p.lastReject.Store(uint32(reason))
	}
	<-p.window
}

// close disconnects and releases the session.
func (p *producer) close() {
	_ = p.client.Disconnect(&paho.Disconnect{ReasonCode: 0})
	_ = p.sess.Close()
}

// ackSession is paho's in-memory session state with a tap on
// acknowledgements: it remembers which message each packet id carries and
// reports the PUBACK (or PUBCOMP, or failed PUBREC) of each to onSettled.
//
// It exists because paho's Publish either blocks until the PUBACK, which
// would let concurrent publishes reach the wire out of sequence order, or
// (AsyncSend) returns without any way to learn the outcome.
type ackSession struct {
	*state.State
	onSettled func(h header, reason byte)

	mu      sync.Mutex
	pending map[uint16]header // guarded by mu
}

var _ session.SessionManager = (*ackSession)(nil)

func newAckSession(onSettled func(header, byte)) *ackSession {
	return &ackSession{
		State:     state.NewInMemory(),
		onSettled: onSettled,
		pending:   make(map[uint16]header),
	}
}

// AddToSession records the header of an outgoing PUBLISH under the packet
// id the session assigned. It runs before the packet is written, so the
// acknowledgement cannot overtake it.
func (s *ackSession) AddToSession(ctx context.Context, pkt session.Packet, resp chan<- packets.ControlPacket) error {
	if err := s.State.AddToSession(ctx, pkt, resp); err != nil {
		return err
	}
	if pub, ok := pkt.(*packets.Publish); ok {
		if h, err := parseHeader(pub.Payload); err == nil {
			s.mu.Lock()
			s.pending[pub.PacketID] = h
			s.mu.Unlock()
		}
	}
	return nil
}

// PacketReceived reports the end of a publish transaction. The pending
// entry is taken before the session frees the packet id, which a new
// publish may reuse at once.
func (s *ackSession) PacketReceived(cp *packets.ControlPacket, pubs chan<- *packets.Publish) error {
	var (
		id     uint16
		reason byte
		done   bool
	)
	switch p := cp.Content.(type) {
	case *packets.Puback:
		id, reason, done = p.PacketID, p.ReasonCode, true
	case *packets.Pubcomp:
		id, reason, done = p.PacketID, p.ReasonCode, true
	case *packets.Pubrec:
		id, reason, done = p.PacketID, p.ReasonCode, p.ReasonCode >= 0x80
	}
	var (
		h  header
		ok bool
	)
	if done {
		s.mu.Lock()
		h, ok = s.pending[id]
		delete(s.pending, id)
		s.mu.Unlock()
	}
	err := s.State.PacketReceived(cp, pubs)
	if ok {
		s.onSettled(h, reason)
	}
	return err
}
