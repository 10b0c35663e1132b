package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// consumer is one subscribing connection. It records every delivery in the
// ledger and settles it with a manual PUBACK after recording, so a broker
// that waits for the PUBACK before delivering the next message of a key
// (shardq's key ordering) sees the ledger updated first.
type consumer struct {
	id     int
	client *paho.Client  // QoS 2
	wire   *wireConsumer // QoS 0 and 1
	paho3  *paho311Consumer
	ledger *Ledger
	meter  *meter
	err    atomic.Pointer[error]
}

// dialConsumer connects consumer id and subscribes it to filter: through
// the lean wire client at QoS 0 and 1 (see wireConsumer), through paho at
// QoS 2.
func dialConsumer(ctx context.Context, cfg *Config, id int, run, filter string, l *Ledger, m *meter) (*consumer, error) {
	c := &consumer{id: id, ledger: l, meter: m}
	clientID := fmt.Sprintf("bench-%s-c%d", run, id)
	if cfg.ConsumerClient == ClientPaho311 {
		p, err := dialPaho311(ctx, cfg, cfg.consumerAddr(id), clientID, filter, c.record)
		if err != nil {
			return nil, fmt.Errorf("consumer %d: %w", id, err)
		}
		c.paho3 = p
		return c, nil
	}
	if cfg.QoS < 2 {
		dctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		defer cancel()
		w, err := dialWire(dctx, cfg.consumerAddr(id), clientID, filter, cfg.QoS, cfg.ReceiveMaximum, cfg.AckInterval, c.record)
		if err != nil {
			return nil, fmt.Errorf("consumer %d: %w", id, err)
		}
		c.wire = w
		return c, nil
	}
	cp := &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 60}
	if cfg.ReceiveMaximum > 0 {
		rm := cfg.ReceiveMaximum
		cp.Properties = &paho.ConnectProperties{ReceiveMaximum: &rm}
	}
	client, err := connect(ctx, cfg, cfg.consumerAddr(id), paho.ClientConfig{
		ClientID:                   clientID,
		EnableManualAcknowledgment: true,
		SendAcksInterval:           cfg.AckInterval,
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){c.onPublish},
		OnClientError:              c.fail,
		OnServerDisconnect:         func(d *paho.Disconnect) { c.fail(fmt.Errorf("server sent DISCONNECT 0x%02x", d.ReasonCode)) },
	}, cp)
	if err != nil {
		return nil, fmt.Errorf("consumer %d: %w", id, err)
	}
	c.client = client

	sctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	suback, err := client.Subscribe(sctx, &paho.Subscribe{
		Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: cfg.QoS}},
	})
	if err == nil && len(suback.Reasons) > 0 && suback.Reasons[0] >= 0x80 {
		err = fmt.Errorf("%w: %s: reason 0x%02x", ErrSubscribeRefused, filter, suback.Reasons[0])
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("consumer %d: subscribe %s: %w", id, filter, err)
	}
	return c, nil
}

// record enters one delivery in the ledger, before it is acknowledged.
func (c *consumer) record(payload []byte, dup bool, deliveryCount int) {
	now := time.Now().UnixNano()
	h, err := parseHeader(payload)
	if err != nil {
		c.ledger.Foreign()
		return
	}
	d := Delivery{Producer: h.Producer, Seq: h.Seq, Key: h.Key, Redelivered: dup || deliveryCount > 1}
	c.ledger.ReceiveFirst(d, func() { c.meter.delivered(h.SentAt, now) })
}

// onPublish handles one delivery, on the paho client's delivery goroutine.
func (c *consumer) onPublish(pr paho.PublishReceived) (bool, error) {
	pub := pr.Packet
	c.record(pub.Payload, pub.Duplicate(), deliveryCount(pub))
	if pub.QoS > 0 {
		if err := pr.Client.Ack(pub); err != nil {
			return true, fmt.Errorf("consumer %d: ack: %w", c.id, err)
		}
	}
	return true, nil
}

// deliveryCount is shardq's v5 user property delivery-count, or 0.
func deliveryCount(p *paho.Publish) int {
	if p.Properties == nil {
		return 0
	}
	n, err := strconv.Atoi(p.Properties.User.Get("delivery-count"))
	if err != nil {
		return 0
	}
	return n
}

func (c *consumer) fail(err error) {
	c.err.CompareAndSwap(nil, &err)
}

// lostErr is the connection error, or nil while the connection is up.
func (c *consumer) lostErr() error {
	if c.paho3 != nil {
		if err := c.paho3.lost.Load(); err != nil {
			return fmt.Errorf("consumer %d: %w: %w", c.id, ErrConnectionLost, *err)
		}
		return nil
	}
	if c.wire != nil {
		select {
		case <-c.wire.done:
			return fmt.Errorf("consumer %d: %w: %w", c.id, ErrConnectionLost, c.wire.err)
		default:
			return nil
		}
	}
	select {
	case <-c.client.Done():
	default:
		return nil
	}
	if e := c.err.Load(); e != nil {
		return fmt.Errorf("consumer %d: %w: %w", c.id, ErrConnectionLost, *e)
	}
	return fmt.Errorf("consumer %d: %w", c.id, ErrConnectionLost)
}

func (c *consumer) close() {
	if c.paho3 != nil {
		c.paho3.client.Disconnect(250)
		return
	}
	if c.wire != nil {
		c.wire.close()
		return
	}
	_ = c.client.Disconnect(&paho.Disconnect{ReasonCode: 0})
}
