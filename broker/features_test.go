package broker_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

func TestQueueExplicitSettlement(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.RetryBackoff = 100 * time.Millisecond
		c.Queues.Defaults.AckTimeout = time.Hour
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 3; i++ {
		prod.publish("$queue/exp", []byte("e"+strconv.Itoa(i)), "key", strconv.Itoa(i))
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	if rc := cons.subscribe(1, map[string]string{"ack": "explicit", "prefetch": "2"}, "$share/w/$queue/exp"); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	a, bb := cons.next(5*time.Second), cons.next(5*time.Second)
	cons.puback(a, 0) // only "received": the lease stays, and so does the credit
	cons.puback(bb, 0)
	cons.none(300 * time.Millisecond)

	other := dialRaw(t, b.MQTTAddr(), "intruder", connectOpts{})
	if rc := other.publish("$queue/exp/$ack", nil, "msg-id", userProp(a, "msg-id"), "group", "w"); rc != 0x80 {
		t.Fatalf("settlement by a client without the lease: %#x, want 0x80", rc)
	}
	if rc := cons.publish("$queue/exp/$ack", nil, "msg-id", "9-999", "group", "w"); rc != 0x80 {
		t.Fatalf("settlement of an unknown msg-id: %#x, want 0x80", rc)
	}
	if rc := cons.publish("$queue/exp/$extend", []byte(userProp(a, "msg-id")), "group", "w"); rc != 0 {
		t.Fatalf("$extend: %#x", rc)
	}
	// msg-id as the payload works too.
	if rc := cons.publish("$queue/exp/$ack", []byte(userProp(a, "msg-id")), "group", "w"); rc != 0 {
		t.Fatalf("$ack: %#x", rc)
	}
	third := cons.next(5 * time.Second) // credit came back with the $ack
	cons.puback(third, 0)
	if rc := cons.publish("$queue/exp/$nack", nil, "msg-id", userProp(bb, "msg-id"), "group", "w"); rc != 0 {
		t.Fatalf("$nack: %#x", rc)
	}
	again := cons.next(5 * time.Second)
	if userProp(again, "msg-id") != userProp(bb, "msg-id") || userProp(again, "delivery-count") != "2" {
		t.Fatalf("after $nack got %s count %s", userProp(again, "msg-id"), userProp(again, "delivery-count"))
	}
	dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
	dlq.subscribe(1, nil, "$queue/exp/$dlq")
	if rc := cons.publish("$queue/exp/$reject", nil, "msg-id", userProp(third, "msg-id"), "group", "w"); rc != 0 {
		t.Fatalf("$reject: %#x", rc)
	}
	if d := dlq.next(5 * time.Second); userProp(d, "dlq-reason") != "rejected" || userProp(d, "original-msg-id") != userProp(third, "msg-id") {
		t.Fatalf("dead letter %s from %s", userProp(d, "dlq-reason"), userProp(d, "original-msg-id"))
	}
	// Settling the same message twice: the second is refused.
	if rc := cons.publish("$queue/exp/$ack", nil, "msg-id", userProp(a, "msg-id"), "group", "w"); rc != 0x80 {
		t.Fatalf("second $ack: %#x, want 0x80", rc)
	}
}

// SPEC 12: $release gives a message back without counting toward
// max_deliveries: released ten times with max_deliveries 2, it is still
// delivered, each time with DUP and the next delivery-count, and nothing
// is dead-lettered; the queue counts the releases apart from nacks.
func TestQueueRelease(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.MaxDeliveries = 2
		c.Queues.Defaults.AckTimeout = time.Hour
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if rc := prod.publish("$queue/rel", []byte("job"), "key", "k"); rc != 0 {
		t.Fatalf("publish: %#x", rc)
	}
	dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
	dlq.subscribe(1, nil, "$queue/rel/$dlq")
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	if rc := cons.subscribe(1, map[string]string{"ack": "explicit"}, "$share/w/$queue/rel"); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	for n := 1; n <= 11; n++ {
		d := cons.next(5 * time.Second)
		if got := userProp(d, "delivery-count"); got != strconv.Itoa(n) || d.Duplicate != (n > 1) || string(d.Payload) != "job" {
			t.Fatalf("delivery %d: %q count %s, DUP %v", n, d.Payload, got, d.Duplicate)
		}
		cons.puback(d, 0)
		verb := "$release"
		if n == 11 {
			verb = "$ack"
		}
		if rc := cons.publish("$queue/rel/"+verb, nil, "msg-id", userProp(d, "msg-id"), "group", "w"); rc != 0 {
			t.Fatalf("%s of delivery %d: %#x", verb, n, rc)
		}
	}
	cons.none(300 * time.Millisecond)
	dlq.none(300 * time.Millisecond)
	q := b.Manager().Queue("rel")
	if q == nil {
		t.Fatal("queue rel is gone")
	}
	if c := q.Stats().Snapshot(); c.Released != 10 || c.Nacked != 0 || c.Acked != 1 || c.DeadLettered != 0 {
		t.Fatalf("counts %+v, want 10 released, 1 acked, none nacked or dead-lettered", c)
	}
}

func TestQueueStaticPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.Partitions = 4 })
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	want := map[int]int{}
	for i := 0; i < 40; i++ {
		key := "k" + strconv.Itoa(i)
		want[queue.PartitionFor(key, 4)]++
		prod.publish("$queue/static", []byte(key), "key", key)
	}
	mine := dialRaw(t, b.MQTTAddr(), "mine", connectOpts{})
	if rc := mine.subscribe(1, map[string]string{"partitions": "0,2"}, "$share/g/$queue/static"); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	rest := dialRaw(t, b.MQTTAddr(), "rest", connectOpts{})
	rest.subscribe(1, nil, "$share/g/$queue/static")
	for _, tc := range []struct {
		c     *rawClient
		parts map[string]bool
		n     int
	}{{mine, map[string]bool{"0": true, "2": true}, want[0] + want[2]}, {rest, map[string]bool{"1": true, "3": true}, want[1] + want[3]}} {
		for i := 0; i < tc.n; i++ {
			p := tc.c.next(5 * time.Second)
			if !tc.parts[userProp(p, "partition")] {
				t.Fatalf("%s got partition %s", tc.c.id, userProp(p, "partition"))
			}
			tc.c.puback(p, 0)
		}
		tc.c.none(200 * time.Millisecond)
	}
	bad := dialRaw(t, b.MQTTAddr(), "bad", connectOpts{})
	for _, list := range []string{"0", "7", "x", "1,1", ""} {
		if rc := bad.subscribe(1, map[string]string{"partitions": list}, "$share/g/$queue/static"); rc[0] != 0x8F {
			t.Errorf("partitions=%q: SUBACK %#x, want 0x8F", list, rc[0])
		}
	}
}

// TestQueuePartitionOrderingRebalances checks ordering partition: each
// partition's messages arrive in offset order even while a second consumer
// joins and takes half of the partitions.
func TestQueuePartitionOrderingRebalances(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.Partitions = 4
		c.Queues.Defaults.Ordering = queue.OrderPartition
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	const n = 200
	for i := 0; i < n; i++ {
		prod.publishAsync("$queue/po", []byte(fmt.Sprintf("%03d", i)), "key", "k"+strconv.Itoa(i%16))
	}
	a := dialRaw(t, b.MQTTAddr(), "a", connectOpts{})
	a.subscribe(1, map[string]string{"prefetch": "4"}, "$share/g/$queue/po")
	last := map[string]int{} // partition -> last offset delivered
	got := 0
	take := func(c *rawClient, p *packets.Publish, parts map[string]bool) {
		part := userProp(p, "partition")
		var off int
		fmt.Sscanf(userProp(p, "msg-id"), "%d-%d", new(int), &off)
		if prev, ok := last[part]; ok && off <= prev {
			t.Fatalf("partition %s: offset %d after %d", part, off, prev)
		}
		last[part] = off
		parts[part] = true
		c.puback(p, 0)
		got++
	}
	seenA, seenB := map[string]bool{}, map[string]bool{}
	for i := 0; i < 20; i++ {
		take(a, a.next(5*time.Second), seenA)
	}
	c2 := dialRaw(t, b.MQTTAddr(), "b", connectOpts{})
	c2.subscribe(1, map[string]string{"prefetch": "4"}, "$share/g/$queue/po")
	for got < n {
		select {
		case p := <-a.msgs:
			take(a, p, seenA)
		case p := <-c2.msgs:
			take(c2, p, seenB)
		case <-time.After(5 * time.Second):
			t.Fatalf("stuck at %d of %d", got, n)
		}
	}
	if len(seenB) != 2 {
		t.Fatalf("the second consumer got partitions %v, want 2 of the 4 (balanced)", seenB)
	}
	a.none(200 * time.Millisecond)
}

func TestQueueDedupSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := 0; i < 3; i++ { // the same dedup-id three times, pipelined
		if rc := prod.waitAck(prod.publishAsync("$queue/dd", []byte("order-1"), "dedup-id", "o-1")).ReasonCode; rc != 0 {
			t.Fatalf("duplicate publish: %#x, want 0x00 (acknowledged, stored once)", rc)
		}
	}
	prod.publish("$queue/dd", []byte("order-2"), "dedup-id", "o-2")
	if got := b.Manager().Queue("dd").Stats().Deduplicated.Load(); got != 2 {
		t.Fatalf("deduplicated = %d, want 2", got)
	}
	prod.close()
	b.stop(t)

	b2 := startBroker(t, dir, nil)
	prod2 := dialRaw(t, b2.MQTTAddr(), "p2", connectOpts{})
	prod2.publish("$queue/dd", []byte("order-1 again"), "dedup-id", "o-1") // within the window, after a restart
	prod2.publish("$queue/dd", []byte("order-3"), "dedup-id", "o-3")
	cons := dialRaw(t, b2.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/dd")
	got := map[string]bool{}
	for i := 0; i < 3; i++ {
		p := cons.next(5 * time.Second)
		got[string(p.Payload)] = true
		cons.puback(p, 0)
	}
	cons.none(300 * time.Millisecond)
	if !got["order-1"] || !got["order-2"] || !got["order-3"] {
		t.Fatalf("stored %v, want order-1, order-2 and order-3 once each", got)
	}
}

func TestQueueDelayedDeliverySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	start := time.Now()
	prod.publish("$queue/later", []byte("delayed"), "delay", "1500ms", "key", "a")
	prod.publish("$queue/later", []byte("at-once"), "key", "b")
	if rc := prod.publish("$queue/later", []byte("x"), "delay", "soon"); rc != 0x99 {
		t.Fatalf("invalid delay: %#x, want 0x99", rc)
	}
	if rc := prod.publish("$queue/later", []byte("x"), "deliver-at", "tomorrow"); rc != 0x99 {
		t.Fatalf("invalid deliver-at: %#x, want 0x99", rc)
	}
	prod.close()
	b.stop(t)

	b2 := startBroker(t, dir, nil)
	cons := dialRaw(t, b2.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/later")
	p := cons.next(5 * time.Second)
	if string(p.Payload) != "at-once" {
		t.Fatalf("first delivery %q: the delayed message must not hold back the other", p.Payload)
	}
	cons.puback(p, 0)
	p = cons.next(5 * time.Second)
	if string(p.Payload) != "delayed" || time.Since(start) < 1500*time.Millisecond {
		t.Fatalf("got %q after %s, want the delayed message after 1.5s", p.Payload, time.Since(start))
	}
	cons.puback(p, 0)
}

func TestQueueRetentionLimits(t *testing.T) {
	t.Run("reject keeps the producer connected", func(t *testing.T) {
		b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.MaxMessages = 3 })
		prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
		for i := 0; i < 3; i++ {
			if rc := prod.publish("$queue/full", []byte{byte('a' + i)}); rc != 0 {
				t.Fatalf("publish %d: %#x", i, rc)
			}
		}
		if rc := prod.publish("$queue/full", []byte("d")); rc != 0x97 {
			t.Fatalf("publish to a full queue: %#x, want 0x97", rc)
		}
		cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
		cons.subscribe(1, nil, "$queue/full")
		for i := 0; i < 3; i++ {
			cons.puback(cons.next(5*time.Second), 0)
		}
		// Once consumed and deleted, the queue takes publishes again, on the same connection.
		waitFor(t, func() bool { return prod.publish("$queue/full", []byte("e")) == 0 })
	})
	t.Run("drop-oldest dead-letters the oldest", func(t *testing.T) {
		b := startBroker(t, t.TempDir(), func(c *config.Config) {
			c.Queues.Defaults.MaxMessages = 5
			c.Queues.Defaults.Overflow = queue.OverflowDropOldest
			c.Queues.Defaults.Partitions = 1
		})
		prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
		for i := 0; i < 8; i++ {
			if rc := prod.publish("$queue/ring", []byte(strconv.Itoa(i))); rc != 0 {
				t.Fatalf("publish %d: %#x", i, rc)
			}
		}
		dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
		dlq.subscribe(1, nil, "$queue/ring/$dlq")
		for i := 0; i < 3; i++ {
			d := dlq.next(5 * time.Second)
			if string(d.Payload) != strconv.Itoa(i) || userProp(d, "dlq-reason") != "overflow" {
				t.Fatalf("dead letter %q reason %q, want %d overflow", d.Payload, userProp(d, "dlq-reason"), i)
			}
			dlq.puback(d, 0)
		}
		waitDepth(t, b, "ring", 5) // the eviction is done, not only its dead letters
		cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
		cons.subscribe(1, nil, "$queue/ring")
		for i := 3; i < 8; i++ {
			if p := cons.next(5 * time.Second); string(p.Payload) != strconv.Itoa(i) {
				t.Fatalf("got %q, want %d", p.Payload, i)
			} else {
				cons.puback(p, 0)
			}
		}
		cons.none(200 * time.Millisecond)
	})
	t.Run("max_age and message expiry dead-letter as expired", func(t *testing.T) {
		b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.MaxAge = 300 * time.Millisecond })
		prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
		prod.publish("$queue/old", []byte("stale"))
		dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
		dlq.subscribe(1, nil, "$queue/old/$dlq")
		d := dlq.next(5 * time.Second)
		if string(d.Payload) != "stale" || userProp(d, "dlq-reason") != "expired" {
			t.Fatalf("dead letter %q reason %q", d.Payload, userProp(d, "dlq-reason"))
		}
		dlq.puback(d, 0)
		// The dead letter can be delivered a moment before the eviction
		// takes the original out of its queue: a group created in that
		// moment would start at it. Wait for the queue to be empty.
		waitDepth(t, b, "old", 0)
		cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
		cons.subscribe(1, nil, "$queue/old")
		cons.none(300 * time.Millisecond)
	})
	t.Run("a message past its MQTT 5 expiry is not delivered", func(t *testing.T) {
		b := startBroker(t, t.TempDir(), nil)
		prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
		if rc := prod.publishExpiring("$queue/fresh", []byte("short-lived"), 1); rc != 0 {
			t.Fatalf("publish: %#x", rc)
		}
		prod.publish("$queue/fresh", []byte("durable"), "key", "other")
		time.Sleep(1100 * time.Millisecond) // let the one-second expiry pass before anyone consumes
		cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
		cons.subscribe(1, nil, "$queue/fresh")
		if p := cons.next(5 * time.Second); string(p.Payload) != "durable" {
			t.Fatalf("delivered %q, want only the unexpired message", p.Payload)
		}
		dlq := dialRaw(t, b.MQTTAddr(), "d", connectOpts{})
		dlq.subscribe(1, nil, "$queue/fresh/$dlq")
		if d := dlq.next(5 * time.Second); string(d.Payload) != "short-lived" || userProp(d, "dlq-reason") != "expired" {
			t.Fatalf("dead letter %q reason %q", d.Payload, userProp(d, "dlq-reason"))
		}
	})
}

func TestQueueWillIsEnqueuedAndReachesNoPlainSubscriber(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	plain := dialRaw(t, b.MQTTAddr(), "plain", connectOpts{})
	plain.subscribe(1, nil, "$share/g/#")
	consumer := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	consumer.subscribe(1, nil, "$queue/status")

	device := dialRaw(t, b.MQTTAddr(), "device-9", connectOpts{will: "$queue/status", willMsg: "device-9 offline"})
	device.close() // the connection drops without DISCONNECT: the broker sends the will

	p := consumer.next(5 * time.Second)
	if string(p.Payload) != "device-9 offline" || userProp(p, "msg-id") == "" || userProp(p, "key") != "device-9" {
		t.Fatalf("will delivered as %q msg-id %q key %q, want a queue delivery keyed by the client", p.Payload, userProp(p, "msg-id"), userProp(p, "key"))
	}
	consumer.puback(p, 0)
	plain.none(300 * time.Millisecond)
	// Not retained either: a new plain subscriber to the topic gets nothing.
	late := dialRaw(t, b.MQTTAddr(), "late", connectOpts{})
	late.subscribe(1, nil, "$share/h/#")
	late.none(200 * time.Millisecond)
}

func TestQueueResumedSessionKeepsSubscriptionSettings(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Queues.Defaults.AckTimeout = time.Hour })
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	c1 := dialRaw(t, b.MQTTAddr(), "worker", connectOpts{keepClean: true, expiry: 3600})
	if rc := c1.subscribe(1, map[string]string{"ack": "explicit", "group": "jobs"}, "$queue/tasks"); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	c1.close()
	c2 := dialRaw(t, b.MQTTAddr(), "worker", connectOpts{keepClean: true, expiry: 3600}) // session resumed
	prod.publish("$queue/tasks", []byte("t1"))
	p := c2.next(5 * time.Second)
	c2.puback(p, 0) // explicit mode survives: the PUBACK does not settle
	if rc := c2.publish("$queue/tasks/$ack", []byte(userProp(p, "msg-id")), "group", "jobs"); rc != 0 {
		t.Fatalf("$ack in the resumed session's group: %#x, want 0x00", rc)
	}
	// Unsubscribing a queue filter is answered with success.
	id := c2.id16()
	ch := make(chan *packets.Unsuback, 1)
	c2.mu.Lock()
	c2.unsubs[id] = ch
	c2.mu.Unlock()
	c2.write(&packets.Unsubscribe{PacketID: id, Topics: []string{"$queue/tasks"}, Properties: &packets.Properties{}})
	select {
	case u := <-ch:
		if len(u.Reasons) != 1 || u.Reasons[0] != 0 {
			t.Fatalf("UNSUBACK %v, want [0x00]", u.Reasons)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no UNSUBACK")
	}
	prod.publish("$queue/tasks", []byte("t2"))
	c2.none(300 * time.Millisecond)
}

func TestQueueMaxBytes(t *testing.T) {
	dir := t.TempDir()
	limit := func(c *config.Config) {
		c.Queues.Defaults.MaxBytes = 1000
		c.Queues.Defaults.Partitions = 2
	}
	b := startBroker(t, dir, limit)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	payload := make([]byte, 300)
	stored := 0
	for i := 0; i < 5; i++ {
		switch rc := prod.publish("$queue/bytes", payload, "key", strconv.Itoa(i)); rc {
		case 0:
			stored++
		case 0x97:
		default:
			t.Fatalf("publish %d: %#x", i, rc)
		}
	}
	if stored != 3 {
		t.Fatalf("stored %d messages of 300+ bytes under max_bytes 1000, want 3 (then 0x97)", stored)
	}
	prod.close()
	b.stop(t)

	// The count survives a restart: still full.
	b2 := startBroker(t, dir, limit)
	prod2 := dialRaw(t, b2.MQTTAddr(), "p2", connectOpts{})
	if rc := prod2.publish("$queue/bytes", payload, "key", "x"); rc != 0x97 {
		t.Fatalf("publish after restart: %#x, want 0x97", rc)
	}
	cons := dialRaw(t, b2.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/bytes")
	for i := 0; i < 3; i++ {
		cons.puback(cons.next(5*time.Second), 0)
	}
	waitFor(t, func() bool { return prod2.publish("$queue/bytes", payload, "key", "y") == 0 })

	// With drop-oldest, max_bytes evicts the oldest to the dead-letter queue instead.
	b3 := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.MaxBytes = 1000
		c.Queues.Defaults.Partitions = 1
		c.Queues.Defaults.Overflow = queue.OverflowDropOldest
	})
	prod3 := dialRaw(t, b3.MQTTAddr(), "p3", connectOpts{})
	for i := 0; i < 5; i++ {
		if rc := prod3.publish("$queue/bytes", append([]byte(strconv.Itoa(i)), payload...)); rc != 0 {
			t.Fatalf("publish %d with drop-oldest: %#x", i, rc)
		}
	}
	dlq := dialRaw(t, b3.MQTTAddr(), "d", connectOpts{})
	dlq.subscribe(1, nil, "$queue/bytes/$dlq")
	for i := 0; i < 2; i++ {
		d := dlq.next(5 * time.Second)
		if d.Payload[0] != byte('0'+i) || userProp(d, "dlq-reason") != "overflow" {
			t.Fatalf("dead letter %q reason %q, want message %d overflow", d.Payload[:1], userProp(d, "dlq-reason"), i)
		}
		dlq.puback(d, 0)
	}
	dlq.none(300 * time.Millisecond)
}

// TestQueueDefaultShardsFollowTheDataDirectory: with storage.shards unset,
// a new data directory gets one shard and an existing one keeps the count
// it was made with, so upgrading a node never trips over the default.
func TestQueueDefaultShardsFollowTheDataDirectory(t *testing.T) {
	fresh := t.TempDir()
	b := startBroker(t, fresh, nil)
	b.stop(t)
	if n, err := badger.ShardCount(fresh); err != nil || n != 1 {
		t.Fatalf("a new data directory got %d shards (%v), want 1", n, err)
	}

	old := t.TempDir()
	b = startBroker(t, old, func(c *config.Config) { c.Storage.Shards = 3 })
	c := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if code := c.publish("$queue/kept", []byte("before")); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	c.close()
	b.stop(t)
	b = startBroker(t, old, nil)
	if n, err := badger.ShardCount(old); err != nil || n != 3 {
		t.Fatalf("the data directory has %d shards (%v) after a start with the default, want 3", n, err)
	}
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/kept")
	if m := cons.next(5 * time.Second); m == nil || string(m.Payload) != "before" {
		t.Fatalf("after the restart with the default: %v, want the message published before", m)
	}
}

// waitDepth waits until the queue holds n messages.
func waitDepth(t *testing.T, b *testBroker, name string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var depth uint64
		for _, p := range b.Manager().Queue(name).Info().Partitions {
			depth += p.Depth()
		}
		if depth == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s holds %d messages, want %d", name, depth, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRefusedSubscribeCreatesNoQueue: a subscription refused for its
// partitions, to a queue no one created yet, leaves no queue behind, and
// the same subscription done right creates it (issue: a typo became a
// queue).
func TestRefusedSubscribeCreatesNoQueue(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	c := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	if rc := c.subscribe(1, map[string]string{"partitions": "99"}, "$share/g/$queue/typo"); rc[0] != 0x8F {
		t.Fatalf("partitions=99: SUBACK %#x, want 0x8F", rc[0])
	}
	if q := b.Manager().Queue("typo"); q != nil {
		t.Fatalf("the refused subscription created queue %s", q.Name())
	}
	if rc := c.subscribe(1, map[string]string{"partitions": "0"}, "$share/g/$queue/typo"); rc[0] != 1 {
		t.Fatalf("partitions=0: SUBACK %#x, want 1", rc[0])
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Manager().Queue("typo") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the accepted subscription did not create the queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQoS0Consumers: a queue with qos0: refuse answers a QoS 0
// subscription SUBACK 0x8F and takes a QoS 1 one; on a queue that allows
// them (the default), the first QoS 0 consumer of a group is warned of in
// the log, once.
func TestQoS0Consumers(t *testing.T) {
	var logged syncBuffer
	b := startBrokerLogging(t, t.TempDir(), func(c *config.Config) {
		o := c.Queues.Defaults
		o.QoS0 = queue.QoS0Refuse
		c.Queues.Declared["strict"] = o
	}, slog.New(slog.NewTextHandler(&logged, nil)))
	c := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	if rc := c.subscribe(0, nil, "$share/g/$queue/strict"); rc[0] != 0x8F {
		t.Errorf("QoS 0 subscription to a qos0: refuse queue: SUBACK %#x, want 0x8F", rc[0])
	}
	if rc := c.subscribe(1, nil, "$share/g/$queue/strict"); rc[0] != 1 {
		t.Errorf("QoS 1 subscription to it: SUBACK %#x, want 1", rc[0])
	}
	for range 2 {
		if rc := c.subscribe(0, nil, "$share/telemetry/$queue/loose"); rc[0] != 0 {
			t.Errorf("QoS 0 subscription to a queue that allows it: SUBACK %#x, want 0", rc[0])
		}
	}
	if n := strings.Count(logged.String(), "consumed at QoS 0"); n != 1 || !strings.Contains(logged.String(), "group=telemetry") {
		t.Errorf("warnings of group telemetry consumed at QoS 0: %d, want 1:\n%s", n, logged.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SPEC 12, start: a subscription with user property start=latest makes a
// new group that sees only what is published after it; a start that is
// neither earliest nor latest is refused.
func TestSubscriptionStartLatest(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	p := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for _, m := range []string{"old1", "old2"} {
		if rc := p.publish("$queue/feed", []byte(m), "key", m); rc != 0 {
			t.Fatalf("publish %s: 0x%02x", m, rc)
		}
	}
	c := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	if rc := c.subscribe(1, map[string]string{"start": "sideways"}, "$share/new/$queue/feed"); rc[0] != 0x8F {
		t.Fatalf("start=sideways: SUBACK %#x, want 0x8F", rc[0])
	}
	if rc := c.subscribe(1, map[string]string{"start": "latest"}, "$share/new/$queue/feed"); rc[0] != 1 {
		t.Fatalf("start=latest: SUBACK %#x, want 1", rc[0])
	}
	if rc := p.publish("$queue/feed", []byte("new"), "key", "new"); rc != 0 {
		t.Fatalf("publish: 0x%02x", rc)
	}
	if m := c.next(5 * time.Second); m == nil || string(m.Payload) != "new" {
		t.Fatalf("the group starting at latest got %v first, want new", m)
	}
	c.none(200 * time.Millisecond)
}
