package broker_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

func TestQueueProduceThenConsume(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	for i, p := range payloads(20, "m") {
		if rc := prod.publish("$queue/orders/eu", p, "key", "k"+strconv.Itoa(i%3), "trace", "x"); rc != 0 {
			t.Fatalf("publish %d: reason %#x, want 0x00", i, rc)
		}
	}
	// The group did not exist when the messages were published: it starts
	// at the oldest retained message.
	cons := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	if rc := cons.subscribe(1, nil, "$share/workers/$queue/orders/#"); rc[0] != 1 {
		t.Fatalf("SUBACK %#x, want 0x01", rc[0])
	}
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		p := cons.next(5 * time.Second)
		if i == 0 {
			cons.mu.Lock()
			order := slices.Clone(cons.seen)
			cons.mu.Unlock()
			if sa, pub := slices.Index(order, packets.SUBACK), slices.Index(order, packets.PUBLISH); sa < 0 || sa > pub {
				t.Fatalf("packets in order %v: a delivery came before the SUBACK", order)
			}
		}
		if p.Topic != "$queue/orders/eu" {
			t.Errorf("topic %q, want $queue/orders/eu", p.Topic)
		}
		if p.QoS != 1 || p.Duplicate {
			t.Errorf("qos %d dup %v, want a first QoS 1 delivery", p.QoS, p.Duplicate)
		}
		for _, k := range []string{"msg-id", "key", "partition", "delivery-count", "enqueued-at", "trace"} {
			if userProp(p, k) == "" {
				t.Errorf("delivery lacks user property %q", k)
			}
		}
		if dc := userProp(p, "delivery-count"); dc != "1" {
			t.Errorf("delivery-count %q, want 1", dc)
		}
		id := userProp(p, "msg-id")
		if seen[id] {
			t.Errorf("msg-id %s delivered twice", id)
		}
		seen[id] = true
		cons.puback(p, 0)
	}
	cons.none(200 * time.Millisecond)
}

func TestQueueSubjectMovesToPropertyWhenFilterHasNoWildcard(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	cons := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	cons.subscribe(1, nil, "$queue/telemetry")
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	prod.publish("$queue/telemetry/dev-7/temp", []byte("21.5"))
	p := cons.next(5 * time.Second)
	if p.Topic != "$queue/telemetry" || userProp(p, "subject") != "dev-7/temp" {
		t.Fatalf("got topic %q subject %q, want $queue/telemetry with subject dev-7/temp", p.Topic, userProp(p, "subject"))
	}
	if userProp(p, "key") != "dev-7/temp" {
		t.Errorf("key %q, want the subject", userProp(p, "key"))
	}
}

func TestQueueTwoGroupsEachGetEveryMessage(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	a := dialRaw(t, b.MQTTAddr(), "a", connectOpts{})
	a.subscribe(1, nil, "$share/billing/$queue/events")
	c := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	c.subscribe(1, nil, "$share/audit/$queue/events")
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	const n = 50
	for _, p := range payloads(n, "e") {
		prod.publish("$queue/events", p)
	}
	for _, cl := range []*rawClient{a, c} {
		got := map[string]bool{}
		for i := 0; i < n; i++ {
			p := cl.next(5 * time.Second)
			got[string(p.Payload)] = true
			cl.puback(p, 0)
		}
		if len(got) != n {
			t.Errorf("%s got %d distinct messages, want %d", cl.id, len(got), n)
		}
	}
}

func TestQueueReceiveMaximumBoundsUnsettled(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i, p := range payloads(30, "r") {
		prod.publish("$queue/jobs", p, "key", strconv.Itoa(i)) // distinct keys: no key waits for another
	}
	cons := dialRaw(t, b.MQTTAddr(), "slow", connectOpts{receiveMax: 5})
	cons.subscribe(1, nil, "$queue/jobs")
	var held []*packets.Publish
	for i := 0; i < 5; i++ {
		held = append(held, cons.next(5*time.Second))
	}
	cons.none(300 * time.Millisecond) // a sixth would exceed Receive Maximum
	total := 5
	for total < 30 {
		cons.puback(held[0], 0)
		held = held[1:]
		held = append(held, cons.next(5*time.Second))
		total++
		select {
		case p := <-cons.msgs:
			t.Fatalf("consumer holds more than 5: extra delivery %q", p.Payload)
		default:
		}
	}
}

func TestQueueDisconnectReturnsMessagesAtOnce(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.AckTimeout = time.Hour })
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i, p := range payloads(3, "d") {
		prod.publish("$queue/work", p, "key", strconv.Itoa(i))
	}
	first := dialRaw(t, b.MQTTAddr(), "first", connectOpts{})
	first.subscribe(1, nil, "$queue/work")
	for i := 0; i < 3; i++ {
		first.next(5 * time.Second)
	}
	second := dialRaw(t, b.MQTTAddr(), "second", connectOpts{})
	second.subscribe(1, nil, "$queue/work")
	second.none(200 * time.Millisecond)
	first.close()
	for i := 0; i < 3; i++ {
		p := second.next(5 * time.Second) // at once, not after the hour-long lease
		if !p.Duplicate || userProp(p, "delivery-count") != "2" {
			t.Errorf("redelivery dup=%v delivery-count=%s, want DUP and 2", p.Duplicate, userProp(p, "delivery-count"))
		}
		second.puback(p, 0)
	}
}

func TestQueueSettlingByReasonCode(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.RetryBackoff = 200 * time.Millisecond
		c.Queues.Defaults.RetryBackoffMax = time.Second
		c.Queues.Defaults.MaxDeliveries = 3
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/pay")
	dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
	dlq.subscribe(1, nil, "$queue/pay/$dlq")

	t.Run("nack redelivers after the backoff", func(t *testing.T) {
		prod.publish("$queue/pay", []byte("nack-me"))
		p := cons.next(5 * time.Second)
		start := time.Now()
		cons.puback(p, 0x80)
		again := cons.next(5 * time.Second)
		if waited := time.Since(start); waited < 150*time.Millisecond {
			t.Errorf("redelivered after %s, want the 200ms backoff", waited)
		}
		if string(again.Payload) != "nack-me" || userProp(again, "delivery-count") != "2" || !again.Duplicate {
			t.Errorf("redelivery %q count %s dup %v", again.Payload, userProp(again, "delivery-count"), again.Duplicate)
		}
		cons.puback(again, 0x10) // 0x10 acks too
		cons.none(400 * time.Millisecond)
	})
	t.Run("reject goes straight to the dead-letter queue", func(t *testing.T) {
		prod.publish("$queue/pay", []byte("poison"))
		p := cons.next(5 * time.Second)
		cons.puback(p, 0x87)
		d := dlq.next(5 * time.Second)
		if d.Topic != "$queue/pay/$dlq" || string(d.Payload) != "poison" {
			t.Fatalf("dead letter %q on %q", d.Payload, d.Topic)
		}
		want := map[string]string{"dlq-reason": "rejected", "original-msg-id": userProp(p, "msg-id"),
			"original-topic": "$queue/pay", "original-delivery-count": "1", "delivery-count": "1"}
		for k, v := range want {
			if got := userProp(d, k); got != v {
				t.Errorf("dead letter %s = %q, want %q", k, got, v)
			}
		}
		dlq.puback(d, 0)
		cons.none(300 * time.Millisecond)
	})
	t.Run("max deliveries ends in the dead-letter queue", func(t *testing.T) {
		prod.publish("$queue/pay", []byte("flaky"))
		for i := 1; i <= 3; i++ {
			p := cons.next(5 * time.Second)
			if got := userProp(p, "delivery-count"); got != strconv.Itoa(i) {
				t.Fatalf("delivery-count %s, want %d", got, i)
			}
			cons.puback(p, 0x83)
		}
		d := dlq.next(5 * time.Second)
		if userProp(d, "dlq-reason") != "max-deliveries" || userProp(d, "original-delivery-count") != "3" {
			t.Errorf("dead letter reason %q count %q", userProp(d, "dlq-reason"), userProp(d, "original-delivery-count"))
		}
		dlq.puback(d, 0)
		cons.none(500 * time.Millisecond)
	})
}

func TestQueueLeaseExpiryAndLateAck(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.AckTimeout = 300 * time.Millisecond })
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	slow := dialRaw(t, b.MQTTAddr(), "slow", connectOpts{})
	slow.subscribe(1, nil, "$queue/tasks")
	prod.publish("$queue/tasks", []byte("t1"))
	old := slow.next(5 * time.Second)
	// The lease runs out; the message comes back to the group, here to the
	// same consumer (its only member).
	again := slow.next(5 * time.Second)
	if userProp(again, "msg-id") != userProp(old, "msg-id") || userProp(again, "delivery-count") != "2" {
		t.Fatalf("after expiry got %s count %s", userProp(again, "msg-id"), userProp(again, "delivery-count"))
	}
	// A late PUBACK of the first delivery settles nothing: the message is
	// leased again under the second delivery.
	other := dialRaw(t, b.MQTTAddr(), "other", connectOpts{})
	other.subscribe(1, nil, "$queue/tasks")
	slow.puback(old, 0)
	slow.close() // the second lease is released: the message must come back
	p := other.next(5 * time.Second)
	if userProp(p, "msg-id") != userProp(old, "msg-id") {
		t.Fatalf("got %s, want %s again: the late ack settled it", userProp(p, "msg-id"), userProp(old, "msg-id"))
	}
	other.puback(p, 0)
}

func TestQueueKeyOrderUnderNacksTimeoutsAndDisconnects(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.AckTimeout = 300 * time.Millisecond
		c.Queues.Defaults.RetryBackoff = 20 * time.Millisecond
		c.Queues.Defaults.RetryBackoffMax = 40 * time.Millisecond
		c.Queues.Defaults.MaxDeliveries = 100
		c.Queues.Defaults.Partitions = 4
	})
	const keys, perKey = 6, 40
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	var acks []chan *packets.Puback
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			acks = append(acks, prod.publishAsync("$queue/ordered", []byte(fmt.Sprintf("%d:%d", k, i)), "key", "k"+strconv.Itoa(k)))
		}
	}
	for _, a := range acks {
		if rc := prod.waitAck(a).ReasonCode; rc != 0 {
			t.Fatalf("publish reason %#x", rc)
		}
	}
	next := make([]int, keys) // next sequence each key must get an ack for
	done := 0
	consumerN := 0
	var cons *rawClient
	connect := func() {
		consumerN++
		cons = dialRaw(t, b.MQTTAddr(), "c"+strconv.Itoa(consumerN), connectOpts{})
		cons.subscribe(1, nil, "$share/g/$queue/ordered")
	}
	connect()
	outstanding := map[int]bool{} // keys with a message out
	step := 0
	deadline := time.Now().Add(60 * time.Second)
	for done < keys*perKey {
		if time.Now().After(deadline) {
			t.Fatalf("stuck: %d of %d acked, next per key %v", done, keys*perKey, next)
		}
		p := cons.next(10 * time.Second)
		var k, i int
		fmt.Sscanf(string(p.Payload), "%d:%d", &k, &i)
		if i != next[k] {
			t.Fatalf("key %d: got sequence %d, want %d (order broken)", k, i, next[k])
		}
		if outstanding[k] && !p.Duplicate {
			t.Fatalf("key %d: two messages out at once", k)
		}
		step++
		switch {
		case step%11 == 0: // nack
			cons.puback(p, 0x80)
		case step%17 == 0: // let the lease run out
			outstanding[k] = true
		case step%23 == 0: // crash with messages held
			cons.close()
			clear(outstanding)
			connect()
		default:
			cons.puback(p, 0)
			delete(outstanding, k)
			next[k]++
			done++
		}
	}
}

func TestQueueRejectsInvalidTopicsAndFilters(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	c := dialRaw(t, b.MQTTAddr(), "v5", connectOpts{})
	for _, topic := range []string{"$queue/bad name", "$queue/" + strings.Repeat("q", 129), "$queue/q/$secret", "$queue/", "$queue/q/"} {
		if rc := c.publish(topic, []byte("x")); rc != 0x90 {
			t.Errorf("publish to %q: reason %#x, want 0x90", topic, rc)
		}
	}
	for _, f := range []string{"$queue/#", "$queue/+/x", "$share/g/$queue/+", "$queue/q/$sub", "$queue/q/#/x", "$queue/q/$dlq/eu", "$queue/bad name"} {
		if rc := c.subscribe(1, nil, f); rc[0] != 0x8F {
			t.Errorf("subscribe %q: SUBACK %#x, want 0x8F", f, rc[0])
		}
	}
	// A v3.1.1 producer has no negative PUBACK: it is disconnected, not acknowledged.
	lost := make(chan error, 1)
	v3 := dialV3(t, b.MQTTAddr(), "v3", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	tok := v3.Publish("$queue/bad name", 1, false, "x")
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("v3.1.1 producer not disconnected")
	}
	if tok.WaitTimeout(time.Second) && tok.Error() == nil {
		t.Fatal("v3.1.1 publish to an invalid queue completed as if acknowledged")
	}
	// Nothing was stored by any of it.
	for _, q := range b.Manager().Queues() {
		if q.Stats().Enqueued.Load() != 0 {
			t.Errorf("queue %s holds a message", q.Name())
		}
	}
}

func TestQueueOversizedPayloadRefused(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Storage.MaxPayload = 1024
		c.Queues.Defaults.MaxAge = 24 * time.Hour
	})
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if rc := c.publish("$queue/big", make([]byte, 2048)); rc != 0x95 {
		t.Fatalf("oversized publish: reason %#x, want 0x95", rc)
	}
	// A refused first publish creates no queue: a typo, or a payload
	// too large, leaves nothing behind.
	if q := b.Manager().Queue("big"); q != nil {
		t.Fatal("the refused first publish created queue big")
	}
	far := time.Now().Add(30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	if rc := c.publish("$queue/later", []byte("x"), "deliver-at", far); rc != 0x99 {
		t.Fatalf("publish past max_delay: reason %#x, want 0x99", rc)
	}
	if q := b.Manager().Queue("later"); q != nil {
		t.Fatal("the refused first publish created queue later")
	}
	if rc := c.publish("$queue/big", make([]byte, 1024)); rc != 0 {
		t.Fatalf("publish at the limit: reason %#x, want 0x00", rc)
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/big")
	if p := cons.next(5 * time.Second); len(p.Payload) != 1024 {
		t.Fatalf("delivered %d bytes", len(p.Payload))
	}
	cons.none(200 * time.Millisecond)
}

func TestQueueMessagesNeverReachPlainSubscribers(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	all := dialRaw(t, b.MQTTAddr(), "all", connectOpts{})
	all.subscribe(1, nil, "#")
	shared := dialRaw(t, b.MQTTAddr(), "shared", connectOpts{})
	shared.subscribe(1, nil, "$share/g/#")
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/secret", []byte("q"))
	prod.publish("plain/topic", []byte("plain"))
	for _, c := range []*rawClient{all, shared} {
		p := c.next(5 * time.Second)
		if p.Topic != "plain/topic" {
			t.Errorf("%s got %q on %q, want only the plain message", c.id, p.Payload, p.Topic)
		}
		c.none(200 * time.Millisecond)
	}
}

func TestQueueRestartKeepsMessagesAndGroupState(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i, p := range payloads(10, "s") {
		prod.publish("$queue/keep", p, "key", strconv.Itoa(i))
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/keep")
	acked := map[string]bool{}
	for i := 0; i < 10; i++ {
		p := cons.next(5 * time.Second)
		if i < 4 {
			cons.puback(p, 0)
			acked[string(p.Payload)] = true
		}
	}
	// Settlements are persisted asynchronously; wait until they are.
	waitFor(t, func() bool { return b.Manager().Queue("keep").Stats().Acked.Load() == 4 })
	cons.close()
	prod.close()
	b.stop(t)

	b2 := startBroker(t, dir, nil)
	cons2 := dialRaw(t, b2.MQTTAddr(), "c2", connectOpts{})
	cons2.subscribe(1, nil, "$queue/keep")
	got := map[string]bool{}
	for i := 0; i < 6; i++ {
		p := cons2.next(5 * time.Second)
		if acked[string(p.Payload)] {
			t.Errorf("acked message %q delivered again after a clean restart", p.Payload)
		}
		got[string(p.Payload)] = true
		cons2.puback(p, 0)
	}
	cons2.none(300 * time.Millisecond)
	if len(got) != 6 {
		t.Fatalf("got %d distinct unacked messages back, want 6", len(got))
	}
	_ = queue.DefaultGroup
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMQTTConnectAndSubscribePolicy covers the two MQTT settings of the
// default config that the Eclipse Paho interoperability suite checks.
func TestMQTTConnectAndSubscribePolicy(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	long := dialRaw(t, b.MQTTAddr(), "long", connectOpts{keepAlive: 120})
	if p := long.connack.Properties; p == nil || p.ServerKeepAlive == nil || *p.ServerKeepAlive != 60 {
		t.Fatalf("CONNACK properties %+v: want Server Keep Alive 60 for a requested 120", long.connack.Properties)
	}
	short := dialRaw(t, b.MQTTAddr(), "short", connectOpts{keepAlive: 20})
	if p := short.connack.Properties; p != nil && p.ServerKeepAlive != nil {
		t.Fatalf("Server Keep Alive %d sent for a keep-alive within the cap", *p.ServerKeepAlive)
	}
	if rc := short.subscribe(2, nil, "test/nosubscribe", "test/ok"); rc[0] != 0x80 || rc[1] != 2 {
		t.Fatalf("SUBACK %v, want [0x80 0x02]", rc)
	}
}

// TestQueueReceiveMaximumIsPerConnection checks that Receive Maximum bounds
// the deliveries of all a client's queue subscriptions together.
func TestQueueReceiveMaximumIsPerConnection(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 10; i++ {
		prod.publish("$queue/left", []byte("l"+strconv.Itoa(i)), "key", strconv.Itoa(i))
		prod.publish("$queue/right", []byte("r"+strconv.Itoa(i)), "key", strconv.Itoa(i))
	}
	cons := dialRaw(t, b.MQTTAddr(), "both", connectOpts{receiveMax: 4})
	cons.subscribe(1, nil, "$queue/left", "$queue/right")
	var held []*packets.Publish
	for i := 0; i < 4; i++ {
		held = append(held, cons.next(5*time.Second))
	}
	cons.none(300 * time.Millisecond) // a fifth would exceed Receive Maximum 4
	for got := 4; got < 20; got++ {
		cons.puback(held[0], 0)
		held = append(held[1:], cons.next(5*time.Second))
		select {
		case p := <-cons.msgs:
			t.Fatalf("more than 4 unacknowledged deliveries: extra %q", p.Payload)
		default:
		}
	}
}
