package hooks

import (
	"encoding/binary"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// The packets shardq writes on its hot paths (deliveries and producer
// PUBACKs) are encoded here rather than by mochi's packet encoder, which
// consults a map for every property of every packet. The bytes are the
// same: the tests decode them with mochi's decoder.

// MQTT 5 property identifiers used by deliveries.
const (
	propIDPayloadFormat   = 0x01
	propIDMessageExpiry   = 0x02
	propIDContentType     = 0x03
	propIDResponseTopic   = 0x08
	propIDCorrelationData = 0x09
	propIDReasonString    = 0x1F
	propIDUser            = 0x26
)

// appendPuback appends a PUBACK. A success without properties is the
// two-byte short form, valid in both protocol versions.
func appendPuback(b []byte, v5 bool, id uint16, code byte, reason string) []byte {
	if !v5 || (code == 0 && reason == "") {
		return append(b, packets.Puback<<4, 2, byte(id>>8), byte(id))
	}
	var props []byte
	if reason != "" {
		props = appendString(append(props, propIDReasonString), reason)
	}
	rest := 3 + varintLen(len(props)) + len(props)
	b = append(b, packets.Puback<<4)
	b = appendVarint(b, rest)
	b = append(b, byte(id>>8), byte(id), code)
	b = appendVarint(b, len(props))
	return append(b, props...)
}

// publishHeader describes a delivery to encode.
type publishHeader struct {
	v5    bool
	qos   byte
	dup   bool
	id    uint16
	topic string
	props []byte // encoded MQTT 5 properties, without their length
}

// appendPublish appends a PUBLISH packet and returns its size.
func appendPublish(b []byte, h publishHeader, payload []byte) []byte {
	rest := 2 + len(h.topic) + len(payload)
	if h.qos > 0 {
		rest += 2
	}
	if h.v5 {
		rest += varintLen(len(h.props)) + len(h.props)
	}
	first := byte(packets.Publish<<4) | h.qos<<1
	if h.dup {
		first |= 1 << 3
	}
	b = append(b, first)
	b = appendVarint(b, rest)
	b = appendString(b, h.topic)
	if h.qos > 0 {
		b = append(b, byte(h.id>>8), byte(h.id))
	}
	if h.v5 {
		b = appendVarint(b, len(h.props))
		b = append(b, h.props...)
	}
	return append(b, payload...)
}

// appendDeliveryProps appends the MQTT 5 properties of a delivery: the
// producer's own, then shardq's user properties.
func appendDeliveryProps(b []byte, d queue.Delivery, subjectMoved bool, now time.Time) []byte {
	m := d.Message
	h := m.Headers
	if h.PayloadFormat > 0 {
		b = append(b, propIDPayloadFormat, h.PayloadFormat-1)
	}
	if !m.ExpiresAt.IsZero() {
		left := uint32(max(1, m.ExpiresAt.Sub(now)/time.Second))
		b = binary.BigEndian.AppendUint32(append(b, propIDMessageExpiry), left)
	}
	if h.ContentType != "" {
		b = appendString(append(b, propIDContentType), h.ContentType)
	}
	if h.ResponseTopic != "" {
		b = appendString(append(b, propIDResponseTopic), h.ResponseTopic)
	}
	if h.CorrelationData != nil {
		b = appendString(append(b, propIDCorrelationData), string(h.CorrelationData))
	}
	for _, u := range h.User {
		b = appendUser(b, u.Name, u.Value)
	}
	var num [41]byte
	id := appendUint(num[:0], uint64(d.Partition)) // the msg-id, without a string
	id = append(id, '-')
	id = appendUint(id, d.Message.Offset)
	b = appendUserBytes(b, "msg-id", id)
	b = appendUser(b, "key", m.Key)
	b = appendUserBytes(b, "partition", appendUint(num[:0], uint64(d.Partition)))
	b = appendUserBytes(b, "delivery-count", appendUint(num[:0], uint64(d.Count)))
	b = appendUserBytes(b, "enqueued-at", appendUint(num[:0], uint64(m.EnqueuedAt.UnixMilli())))
	if subjectMoved {
		b = appendUser(b, "subject", m.Subject)
	}
	if dl := m.DeadLetter; dl != nil {
		b = appendUser(b, "dlq-reason", dl.Reason)
		b = appendUser(b, "original-msg-id", dl.OriginalID)
		b = appendUser(b, "original-topic", dl.OriginalTopic)
		b = appendUserBytes(b, "original-delivery-count", appendUint(num[:0], uint64(dl.Deliveries)))
		if dl.Group != "" {
			b = appendUser(b, "original-group", dl.Group)
		}
	}
	return b
}

func appendUser(b []byte, k, v string) []byte {
	return appendString(appendString(append(b, propIDUser), k), v)
}

func appendUserBytes(b []byte, k string, v []byte) []byte {
	b = appendString(append(b, propIDUser), k)
	b = append(b, byte(len(v)>>8), byte(len(v)))
	return append(b, v...)
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

func appendUint(b []byte, v uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, tmp[i:]...)
}

func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func varintLen(n int) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	default:
		return 4
	}
}
