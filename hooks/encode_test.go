package hooks

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// decode reads one packet with mochi's decoder.
func decode(t *testing.T, b []byte, version byte) packets.Packet {
	t.Helper()
	var fh packets.FixedHeader
	if err := fh.Decode(b[0]); err != nil {
		t.Fatal(err)
	}
	n, i := 0, 1
	for mul := 1; ; mul *= 128 {
		n += int(b[i]&127) * mul
		i++
		if b[i-1] < 128 {
			break
		}
	}
	fh.Remaining = n
	if len(b)-i != n {
		t.Fatalf("remaining length %d, have %d bytes", n, len(b)-i)
	}
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: version}
	var err error
	switch fh.Type {
	case packets.Publish:
		err = pk.PublishDecode(b[i:])
	case packets.Puback:
		err = pk.PubackDecode(b[i:])
	}
	if err != nil {
		t.Fatalf("mochi cannot decode %x: %v", b, err)
	}
	return pk
}

func TestHooksPublishEncodingDecodesWithMochi(t *testing.T) {
	m := &queue.Message{Offset: 42, Key: "dev-1", Subject: "a/b", EnqueuedAt: time.UnixMilli(1700000000123),
		ExpiresAt: time.Now().Add(time.Hour), Payload: bytes.Repeat([]byte("x"), 300),
		Headers: queue.Headers{ContentType: "application/json", ResponseTopic: "reply/1", CorrelationData: []byte{1, 2},
			PayloadFormat: 2, User: []queue.Property{{Name: "trace", Value: "t1"}, {Name: "trace", Value: "t2"}}},
		DeadLetter: &queue.DeadLetter{Reason: "rejected", OriginalID: "3-7", OriginalTopic: "$queue/q", Deliveries: 2}}
	d := queue.Delivery{Queue: "q", Partition: 3, Message: m, Count: 2}
	for _, v5 := range []bool{true, false} {
		h := publishHeader{v5: v5, qos: 1, dup: true, id: 77, topic: "$queue/q/a/b"}
		version := byte(4)
		if v5 {
			h.props = appendDeliveryProps(nil, d, true, time.Now())
			version = 5
		}
		pk := decode(t, appendPublish(nil, h, m.Payload), version)
		if pk.TopicName != h.topic || pk.PacketID != 77 || !pk.FixedHeader.Dup || pk.FixedHeader.Qos != 1 || !bytes.Equal(pk.Payload, m.Payload) {
			t.Fatalf("v5=%v decoded %+v", v5, pk.FixedHeader)
		}
		if !v5 {
			continue
		}
		p := pk.Properties
		if p.ContentType != "application/json" || p.ResponseTopic != "reply/1" || !bytes.Equal(p.CorrelationData, []byte{1, 2}) ||
			!p.PayloadFormatFlag || p.PayloadFormat != 1 || p.MessageExpiryInterval < 3590 {
			t.Fatalf("properties %+v", p)
		}
		want := map[string]string{"msg-id": "3-42", "key": "dev-1", "partition": "3", "delivery-count": "2",
			"enqueued-at": "1700000000123", "subject": "a/b", "dlq-reason": "rejected", "original-msg-id": "3-7",
			"original-topic": "$queue/q", "original-delivery-count": "2"}
		got := map[string]string{}
		for _, u := range p.User {
			got[u.Key] = u.Val
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("user property %s = %q, want %q", k, got[k], v)
			}
		}
		if p.User[0].Val != "t1" || p.User[1].Val != "t2" {
			t.Errorf("producer properties lost their order: %+v", p.User[:2])
		}
	}
}

func TestHooksPubackEncodingDecodesWithMochi(t *testing.T) {
	pk := decode(t, appendPuback(nil, true, 9, 0x97, "queue: queue full"), 5)
	if pk.PacketID != 9 || pk.ReasonCode != 0x97 || pk.Properties.ReasonString != "queue: queue full" {
		t.Fatalf("decoded %+v", pk)
	}
	pk = decode(t, appendPuback(nil, true, 10, 0, ""), 5)
	if pk.PacketID != 10 || pk.ReasonCode != 0 {
		t.Fatalf("decoded %+v", pk)
	}
}

// FuzzHooksPublishEncoding checks that any delivery shardq encodes is a
// packet mochi's decoder reads back with the same topic, id and payload.
func FuzzHooksPublishEncoding(f *testing.F) {
	f.Add("$queue/q", "k", "trace", "v", []byte("payload"), uint16(1), true)
	f.Add("$queue/q/s", "", "", "", []byte{}, uint16(65535), false)
	f.Fuzz(func(t *testing.T, topic, key, pk, pv string, payload []byte, id uint16, v5 bool) {
		for _, s := range []string{topic, key, pk, pv} {
			if len(s) > 1000 || !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				return // never produced: MQTT strings are valid UTF-8 without U+0000
			}
		}
		if topic == "" || id == 0 {
			return
		}
		m := &queue.Message{Key: key, Payload: payload, EnqueuedAt: time.UnixMilli(1),
			Headers: queue.Headers{User: []queue.Property{{Name: pk, Value: pv}}}}
		h := publishHeader{v5: v5, qos: 1, id: id, topic: topic}
		version := byte(4)
		if v5 {
			h.props = appendDeliveryProps(nil, queue.Delivery{Message: m, Count: 1}, false, time.Now())
			version = 5
		}
		out := decode(t, appendPublish(nil, h, payload), version)
		if out.TopicName != topic || out.PacketID != id || !bytes.Equal(out.Payload, payload) {
			t.Fatalf("round trip changed the packet: %q %d", out.TopicName, out.PacketID)
		}
	})
}
