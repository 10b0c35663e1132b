package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// wireConsumer is the consumers' MQTT 5 client for QoS 0 and 1: it speaks
// just what a subscriber needs (CONNECT, SUBSCRIBE, PUBLISH in, batched
// PUBACKs out, DISCONNECT) and decodes a delivery without copying its
// properties. The load generator runs on the machine it measures: paho
// reads every string property into a buffer of its own (512 bytes or
// more), which cost it more CPU per delivery with the properties a durable
// queue sends than the broker spent, for whatever broker it measured. The
// producers stay on paho.
type wireConsumer struct {
	conn net.Conn
	r    *bufio.Reader

	mu   sync.Mutex
	acks []byte // encoded PUBACKs not yet written
	wake chan struct{}

	done    chan struct{}
	errOnce sync.Once
	err     error
}

// errWire is a packet the consumer could not make sense of.
var errWire = errors.New("malformed packet from the broker")

// dialWire connects and subscribes to filter at qos (0 or 1) with a
// Receive Maximum when rm is not 0. onPublish runs on the reading
// goroutine for every delivery; the PUBACK of a QoS 1 delivery is queued
// once it returns and written within ackInterval.
func dialWire(ctx context.Context, addr, clientID, filter string, qos byte, rm uint16, ackInterval time.Duration,
	onPublish func(payload []byte, dup bool, deliveryCount int)) (*wireConsumer, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	c := &wireConsumer{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), wake: make(chan struct{}, 1), done: make(chan struct{})}
	if err := c.handshake(clientID, filter, qos, rm); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	go c.readLoop(onPublish)
	go c.ackLoop(ackInterval)
	return c, nil
}

// handshake sends CONNECT and SUBSCRIBE and checks their answers.
func (c *wireConsumer) handshake(clientID, filter string, qos byte, rm uint16) error {
	var props []byte
	if rm > 0 {
		props = append(props, 0x21, byte(rm>>8), byte(rm)) // Receive Maximum
	}
	var vh []byte
	vh = appendWireString(vh, "MQTT")
	vh = append(vh, 5, 0x02, 0, 0) // v5, clean start, keep alive 0 (off)
	vh = appendVarint(vh, len(props))
	vh = append(vh, props...)
	vh = appendWireString(vh, clientID)
	if err := c.send(0x10, vh); err != nil {
		return err
	}
	typ, body, err := c.read()
	if err != nil {
		return err
	}
	if typ>>4 != 2 || len(body) < 2 || body[1] != 0 {
		return fmt.Errorf("%w: CONNACK %x", ErrConnectionLost, body)
	}
	sub := []byte{0, 1, 0} // packet ID 1, no properties
	sub = appendWireString(sub, filter)
	sub = append(sub, qos)
	if err := c.send(0x82, sub); err != nil {
		return err
	}
	if typ, body, err = c.read(); err != nil {
		return err
	}
	if typ>>4 != 9 || len(body) < 4 {
		return fmt.Errorf("%w: SUBACK expected, got packet type %d", errWire, typ)
	}
	pl, n, err := readVarint(body[2:])
	if err != nil || 2+n+pl >= len(body) {
		return fmt.Errorf("%w: SUBACK %x", errWire, body)
	}
	if code := body[2+n+pl]; code >= 0x80 {
		return fmt.Errorf("%w: %s: reason 0x%02x", ErrSubscribeRefused, filter, code)
	}
	return nil
}

func (c *wireConsumer) send(first byte, body []byte) error {
	pkt := append(appendVarint([]byte{first}, len(body)), body...)
	_, err := c.conn.Write(pkt)
	return err
}

// read returns the next packet's type and body.
func (c *wireConsumer) read() (byte, []byte, error) {
	first, err := c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, mult := 0, 1
	for i := 0; ; i++ {
		b, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n += int(b&0x7f) * mult
		if b&0x80 == 0 {
			break
		}
		if mult *= 128; i == 3 {
			return 0, nil, fmt.Errorf("%w: remaining length", errWire)
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return first, body, nil
}

// readLoop decodes deliveries until the connection ends.
func (c *wireConsumer) readLoop(onPublish func([]byte, bool, int)) {
	for {
		first, body, err := c.read()
		if err != nil {
			c.fail(err)
			return
		}
		switch first >> 4 {
		case 3: // PUBLISH
			if err := c.publish(first, body, onPublish); err != nil {
				c.fail(err)
				return
			}
		case 14: // DISCONNECT
			code := byte(0)
			if len(body) > 0 {
				code = body[0]
			}
			c.fail(fmt.Errorf("server sent DISCONNECT 0x%02x", code))
			return
		}
	}
}

// publish decodes one PUBLISH: its payload, DUP and the user property
// delivery-count, found without copying any property.
func (c *wireConsumer) publish(first byte, b []byte, onPublish func([]byte, bool, int)) error {
	qos := first >> 1 & 3
	if len(b) < 2 {
		return errWire
	}
	tl := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+tl {
		return errWire
	}
	b = b[2+tl:]
	var id uint16
	if qos > 0 {
		if len(b) < 2 {
			return errWire
		}
		id, b = binary.BigEndian.Uint16(b), b[2:]
	}
	pl, n, err := readVarint(b)
	if err != nil || len(b) < n+pl {
		return errWire
	}
	count, err := deliveryCountOf(b[n : n+pl])
	if err != nil {
		return err
	}
	onPublish(b[n+pl:], first&0x08 != 0, count)
	if qos == 1 {
		c.mu.Lock()
		c.acks = append(c.acks, 0x40, 2, byte(id>>8), byte(id)) // PUBACK, success
		c.mu.Unlock()
	}
	return nil
}

// deliveryCountOf returns the user property delivery-count of publish
// properties p, 0 when absent.
func deliveryCountOf(p []byte) (int, error) {
	for len(p) > 0 {
		id := p[0]
		p = p[1:]
		var skip int
		switch id {
		case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2a: // byte
			skip = 1
		case 0x13, 0x21, 0x22, 0x23: // two-byte integer
			skip = 2
		case 0x02, 0x11, 0x18, 0x27: // four-byte integer
			skip = 4
		case 0x0b: // variable byte integer
			_, n, err := readVarint(p)
			if err != nil {
				return 0, err
			}
			skip = n
		case 0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1a, 0x1c, 0x1f: // string or binary
			if len(p) < 2 {
				return 0, errWire
			}
			skip = 2 + int(binary.BigEndian.Uint16(p))
		case 0x26: // user property: a string pair
			k, rest, ok := cutWireString(p)
			v, rest2, ok2 := cutWireString(rest)
			if !ok || !ok2 {
				return 0, errWire
			}
			if string(k) == "delivery-count" {
				n, _ := strconv.Atoi(string(v))
				return n, nil
			}
			p = rest2
			continue
		default:
			return 0, fmt.Errorf("%w: property 0x%02x", errWire, id)
		}
		if len(p) < skip {
			return 0, errWire
		}
		p = p[skip:]
	}
	return 0, nil
}

// ackLoop writes the queued PUBACKs every interval, all in one write.
func (c *wireConsumer) ackLoop(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var out []byte
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.mu.Lock()
		out, c.acks = c.acks, out[:0]
		c.mu.Unlock()
		if len(out) == 0 {
			continue
		}
		if _, err := c.conn.Write(out); err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *wireConsumer) fail(err error) {
	c.errOnce.Do(func() {
		c.err = err
		close(c.done)
	})
}

// close sends DISCONNECT and closes the connection.
func (c *wireConsumer) close() {
	_ = c.send(0xe0, []byte{0})
	c.fail(io.EOF)
	_ = c.conn.Close()
}

func appendWireString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

func cutWireString(p []byte) (s, rest []byte, ok bool) {
	if len(p) < 2 {
		return nil, nil, false
	}
	n := int(binary.BigEndian.Uint16(p))
	if len(p) < 2+n {
		return nil, nil, false
	}
	return p[2 : 2+n], p[2+n:], true
}

func appendVarint(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		if n /= 128; n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// readVarint reads a variable byte integer and returns it and its length.
func readVarint(b []byte) (int, int, error) {
	v, mult := 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		v += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
		mult *= 128
	}
	return 0, 0, errWire
}
