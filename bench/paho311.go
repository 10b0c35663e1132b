package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// The consumers' MQTT clients (Config.ConsumerClient).
const (
	ClientLean    = "lean"
	ClientPaho311 = "paho311"
)

// paho311Consumer is a consumer on paho.mqtt.golang at MQTT 3.1.1, the way
// an application typically uses it: messages handled in order on the
// client's router goroutine, each acknowledged as its handler finishes.
// MQTT 3.1.1 has no Receive Maximum, so the broker alone decides how many
// deliveries are unsettled.
type paho311Consumer struct {
	client mqtt.Client
	lost   atomic.Pointer[error]
}

// dialPaho311 connects with a clean session and subscribes to filter;
// record sees every delivery before its PUBACK is sent.
func dialPaho311(ctx context.Context, cfg *Config, addr, clientID, filter string, record func(payload []byte, dup bool, deliveryCount int)) (*paho311Consumer, error) {
	c := &paho311Consumer{}
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(clientID).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(cfg.ConnectTimeout).
		SetKeepAlive(time.Minute).
		SetOrderMatters(true).
		// paho.mqtt.golang files a subscription to $queue/q (or
		// $share/g/$queue/q) under the route "q", which the delivered
		// topic $queue/q never matches; the default handler sees them.
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			record(m.Payload(), m.Duplicate(), 0)
		}).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			if err == nil {
				err = errors.New("connection lost")
			}
			c.lost.CompareAndSwap(nil, &err)
		})
	c.client = mqtt.NewClient(opts)
	if err := wait(ctx, c.client.Connect()); err != nil {
		return nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	tok := c.client.Subscribe(filter, cfg.QoS, nil)
	if err := wait(ctx, tok); err != nil {
		c.client.Disconnect(0)
		return nil, fmt.Errorf("subscribe %s: %w", filter, err)
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		for _, code := range st.Result() {
			if code >= 0x80 {
				c.client.Disconnect(0)
				return nil, fmt.Errorf("%w: %s: reason 0x%02x", ErrSubscribeRefused, filter, code)
			}
		}
	}
	return c, nil
}

// wait waits for tok to complete or ctx to end.
func wait(ctx context.Context, tok mqtt.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}
