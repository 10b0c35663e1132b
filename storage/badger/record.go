package badger

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/shardq/shardq/queue"
)

// recordVersion is the first byte of every message record.
const recordVersion byte = 1

// Record flags, the second byte.
const (
	flagDeadLetter  byte = 1 << 0 // the dead-letter fields follow the headers
	flagCorrelation byte = 1 << 1 // correlation data is present (possibly empty)
	knownFlags           = flagDeadLetter | flagCorrelation
)

// EncodeMessage returns the record of m. The offset is not part of it: it
// is in the key.
//
// Version 1 layout, strings and byte slices as a uvarint length then the
// bytes, times as zigzag varint Unix milliseconds with 0 for the zero time:
//
//	version(1) flags(1) key subject enqueuedAt notBefore expiresAt
//	contentType responseTopic [correlationData if flagCorrelation]
//	payloadFormat(1) expiryInterval(uvarint) userCount(uvarint) {name value}...
//	[reason originalID originalTopic deliveries(uvarint) group if flagDeadLetter]
//	payload
func EncodeMessage(m *queue.Message) []byte {
	return appendMessage(make([]byte, 0, recordSizeHint(m)), m)
}

// recordSizeHint is an upper bound of the length of m's record.
func recordSizeHint(m *queue.Message) int {
	const v = binary.MaxVarintLen64
	h := &m.Headers
	n := 2 + 3*v + // version, flags, times
		v + len(m.Key) + v + len(m.Subject) +
		v + len(h.ContentType) + v + len(h.ResponseTopic) + v + len(h.CorrelationData) +
		1 + v + v + // payload format, expiry, user count
		v + len(m.Payload)
	for _, p := range h.User {
		n += 2*v + len(p.Name) + len(p.Value)
	}
	if dl := m.DeadLetter; dl != nil {
		n += 5*v + len(dl.Reason) + len(dl.OriginalID) + len(dl.OriginalTopic) + len(dl.Group)
	}
	return n
}

// appendMessage appends m's record to dst.
func appendMessage(dst []byte, m *queue.Message) []byte {
	h := &m.Headers
	var flags byte
	if m.DeadLetter != nil {
		flags |= flagDeadLetter
	}
	if h.CorrelationData != nil {
		flags |= flagCorrelation
	}
	dst = append(dst, recordVersion, flags)
	dst = appendString(dst, m.Key)
	dst = appendString(dst, m.Subject)
	dst = binary.AppendVarint(dst, unixMillis(m.EnqueuedAt))
	dst = binary.AppendVarint(dst, ceilMillis(m.NotBefore))
	dst = binary.AppendVarint(dst, unixMillis(m.ExpiresAt))
	dst = appendString(dst, h.ContentType)
	dst = appendString(dst, h.ResponseTopic)
	if flags&flagCorrelation != 0 {
		dst = appendBytes(dst, h.CorrelationData)
	}
	dst = append(dst, h.PayloadFormat)
	dst = binary.AppendUvarint(dst, uint64(h.ExpiryInterval))
	dst = binary.AppendUvarint(dst, uint64(len(h.User)))
	for _, p := range h.User {
		dst = appendString(dst, p.Name)
		dst = appendString(dst, p.Value)
	}
	if dl := m.DeadLetter; dl != nil {
		dst = appendString(dst, dl.Reason)
		dst = appendString(dst, dl.OriginalID)
		dst = appendString(dst, dl.OriginalTopic)
		dst = binary.AppendUvarint(dst, uint64(dl.Deliveries))
		dst = appendString(dst, dl.Group)
	}
	return appendBytes(dst, m.Payload)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// unixMillis is t in Unix milliseconds, 0 for the zero time.
func unixMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// ceilMillis is unixMillis rounded up: a time a message may not be
// delivered before must not come back earlier than it was.
func ceilMillis(t time.Time) int64 {
	ms := unixMillis(t)
	if ms != 0 && time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

// fromMillis is the inverse of unixMillis, in UTC. The first millisecond
// of 1970 reads back as the zero time.
func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// DecodeMessage decodes a record made by EncodeMessage into a message at
// offset. It never panics; a record that is truncated, has trailing bytes,
// an unknown version or flags, or out-of-range numbers yields an error
// wrapping ErrCorruptRecord. The message does not share memory with b.
// Empty payloads and user property lists decode as nil.
func DecodeMessage(b []byte, offset uint64) (*queue.Message, error) {
	d := decoder{buf: b}
	if v := d.byte("version"); d.err == nil && v != recordVersion {
		return nil, d.corrupt(offset, fmt.Sprintf("unknown version %d", v))
	}
	flags := d.byte("flags")
	if d.err == nil && flags&^knownFlags != 0 {
		return nil, d.corrupt(offset, fmt.Sprintf("unknown flags %#x", flags))
	}
	m := &queue.Message{Offset: offset}
	h := &m.Headers
	m.Key = d.string("key")
	m.Subject = d.string("subject")
	m.EnqueuedAt = fromMillis(d.varint("enqueued-at"))
	m.NotBefore = fromMillis(d.varint("not-before"))
	m.ExpiresAt = fromMillis(d.varint("expires-at"))
	h.ContentType = d.string("content type")
	h.ResponseTopic = d.string("response topic")
	if flags&flagCorrelation != 0 {
		h.CorrelationData = d.bytes("correlation data")
		if h.CorrelationData == nil && d.err == nil {
			h.CorrelationData = []byte{}
		}
	}
	h.PayloadFormat = d.byte("payload format")
	h.ExpiryInterval = d.uint32("expiry interval")
	// Each property takes at least two bytes: bound the count before
	// allocating for it.
	if n := d.uvarint("user property count"); n > 0 && d.err == nil {
		if n > uint64(d.left()/2) {
			return nil, d.corrupt(offset, fmt.Sprintf("%d user properties in %d bytes", n, d.left()))
		}
		h.User = make([]queue.Property, n)
		for i := range h.User {
			h.User[i].Name = d.string("user property name")
			h.User[i].Value = d.string("user property value")
		}
	}
	if flags&flagDeadLetter != 0 {
		m.DeadLetter = &queue.DeadLetter{
			Reason:        d.string("dead-letter reason"),
			OriginalID:    d.string("dead-letter original id"),
			OriginalTopic: d.string("dead-letter original topic"),
			Deliveries:    d.uint32("dead-letter deliveries"),
			Group:         d.string("dead-letter group"),
		}
	}
	m.Payload = d.bytes("payload")
	if d.err == nil && d.left() > 0 {
		return nil, d.corrupt(offset, fmt.Sprintf("%d trailing bytes", d.left()))
	}
	if d.err != nil {
		return nil, d.corrupt(offset, d.err.Error())
	}
	return m, nil
}

// decoder reads a record front to back. After the first error every read
// returns a zero value and the error stays.
type decoder struct {
	buf []byte
	pos int
	err error
}

func (d *decoder) left() int { return len(d.buf) - d.pos }

func (d *decoder) fail(field, what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s %s at byte %d", what, field, d.pos)
	}
}

func (d *decoder) corrupt(offset uint64, why string) error {
	return fmt.Errorf("%w: offset %d: %s", ErrCorruptRecord, offset, why)
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if d.left() < 1 {
		d.fail(field, "truncated")
		return 0
	}
	b := d.buf[d.pos]
	d.pos++
	return b
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf[d.pos:])
	if n <= 0 {
		d.fail(field, "bad varint in")
		return 0
	}
	d.pos += n
	return v
}

func (d *decoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf[d.pos:])
	if n <= 0 {
		d.fail(field, "bad varint in")
		return 0
	}
	d.pos += n
	return v
}

func (d *decoder) uint32(field string) uint32 {
	v := d.uvarint(field)
	if v > math.MaxUint32 {
		d.fail(field, "out of range")
		return 0
	}
	return uint32(v)
}

// raw returns the next length-prefixed field without copying it.
func (d *decoder) raw(field string) []byte {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(d.left()) {
		d.fail(field, "truncated")
		return nil
	}
	b := d.buf[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b
}

func (d *decoder) string(field string) string { return string(d.raw(field)) }

// bytes returns a copy of the next length-prefixed field, nil when empty.
func (d *decoder) bytes(field string) []byte {
	b := d.raw(field)
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// metaRecord is the stored form of queue.QueueMeta. Metadata is written
// rarely, so JSON, which is easy to read with a debugger, is good enough.
type metaRecord struct {
	Version    int            `json:"v"`
	Name       string         `json:"name"`
	Partitions int            `json:"partitions"`
	Declared   *queue.Options `json:"declared,omitempty"`
	Owner      string         `json:"owner,omitempty"`
	Growths    []queue.Growth `json:"growths,omitempty"`
}

const metaVersion = 1

// EncodeQueueMeta returns the record of a queue's metadata.
func EncodeQueueMeta(q queue.QueueMeta) ([]byte, error) {
	b, err := json.Marshal(metaRecord{Version: metaVersion, Name: q.Name, Partitions: q.Partitions, Declared: q.Declared, Owner: q.Owner, Growths: q.Growths})
	if err != nil {
		return nil, fmt.Errorf("storage: encoding queue meta %q: %w", q.Name, err)
	}
	return b, nil
}

// DecodeQueueMeta decodes a record made by EncodeQueueMeta.
func DecodeQueueMeta(b []byte) (queue.QueueMeta, error) {
	var r metaRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return queue.QueueMeta{}, fmt.Errorf("%w: queue meta: %v", ErrCorruptRecord, err)
	}
	if r.Version != metaVersion {
		return queue.QueueMeta{}, fmt.Errorf("%w: queue meta %q: unknown version %d", ErrCorruptRecord, r.Name, r.Version)
	}
	return queue.QueueMeta{Name: r.Name, Partitions: r.Partitions, Declared: r.Declared, Owner: r.Owner, Growths: r.Growths}, nil
}
