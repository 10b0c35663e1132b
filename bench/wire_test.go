package bench

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// TestBenchWireDecodesWhatPahoEncodes encodes PUBLISH packets with paho,
// every kind of property among them, and checks that the wire consumer
// finds the payload, DUP and delivery-count that went in.
func TestBenchWireDecodesWhatPahoEncodes(t *testing.T) {
	expiry, alias, sub := uint32(30), uint16(3), []int{7}
	format := byte(1)
	for _, tc := range []struct {
		name  string
		qos   byte
		dup   bool
		props *packets.Properties
		count int
	}{
		{"no properties", 1, false, nil, 0},
		{"a queue delivery", 1, true, &packets.Properties{User: []packets.User{
			{Key: "msg-id", Value: "3-1207"}, {Key: "key", Value: "k9"}, {Key: "partition", Value: "3"},
			{Key: "delivery-count", Value: "2"}, {Key: "enqueued-at", Value: "1700000000000"}}}, 2},
		{"every kind of property first", 1, false, &packets.Properties{
			PayloadFormat: &format, MessageExpiry: &expiry, TopicAlias: &alias, SubscriptionIdentifier: &sub[0],
			ContentType: "text/plain", ResponseTopic: "re/ply", CorrelationData: []byte{0, 1, 2},
			User: []packets.User{{Key: "a", Value: "b"}, {Key: "delivery-count", Value: "5"}}}, 5},
		{"QoS 0", 0, false, &packets.Properties{User: []packets.User{{Key: "delivery-count", Value: "1"}}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &packets.Publish{Topic: "$queue/q", QoS: tc.qos, Duplicate: tc.dup, PacketID: 77,
				Payload: []byte("payload bytes"), Properties: tc.props}
			var buf bytes.Buffer
			if _, err := pub.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			c := &wireConsumer{}
			typ, body, err := (&wireConsumer{r: newReader(buf.Bytes())}).read()
			if err != nil {
				t.Fatal(err)
			}
			var gotPayload []byte
			var gotDup bool
			gotCount := -1
			if err := c.publish(typ, body, func(p []byte, dup bool, n int) { gotPayload, gotDup, gotCount = p, dup, n }); err != nil {
				t.Fatal(err)
			}
			if string(gotPayload) != "payload bytes" || gotDup != tc.dup || gotCount != tc.count {
				t.Fatalf("payload %q dup %v count %d, want %q %v %d", gotPayload, gotDup, gotCount, "payload bytes", tc.dup, tc.count)
			}
			wantAck := []byte{}
			if tc.qos == 1 {
				wantAck = []byte{0x40, 2, 0, 77}
			}
			if !bytes.Equal(c.acks, wantAck) && !(len(c.acks) == 0 && len(wantAck) == 0) {
				t.Fatalf("queued PUBACKs %x, want %x", c.acks, wantAck)
			}
		})
	}
}

func newReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
