package badger

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

func sampleMessage() *queue.Message {
	return &queue.Message{
		Offset:     42,
		Key:        "order-42",
		Subject:    "eu/created",
		EnqueuedAt: time.UnixMilli(1_736_000_000_123).UTC(),
		NotBefore:  time.UnixMilli(1_736_000_060_000).UTC(),
		ExpiresAt:  time.UnixMilli(-1_000).UTC(),
		Headers: queue.Headers{
			ContentType:     "application/json",
			ResponseTopic:   "replies/7",
			CorrelationData: []byte{0, 1, 0xff},
			PayloadFormat:   1,
			ExpiryInterval:  3600,
			User:            []queue.Property{{Name: "a", Value: "1"}, {Name: "a", Value: "2"}, {}},
		},
		Payload: []byte("{\"id\":42}"),
		DeadLetter: &queue.DeadLetter{
			Reason: queue.ReasonRejected, OriginalID: "3-41", OriginalTopic: "$queue/orders", Deliveries: 5, Group: "g",
		},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	cases := map[string]*queue.Message{
		"all fields": sampleMessage(),
		"zero":       {Offset: 7},
		"empty correlation data": {
			Headers: queue.Headers{CorrelationData: []byte{}},
			Payload: bytes.Repeat([]byte{0xab}, 70_000),
		},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeMessage(EncodeMessage(m), m.Offset)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("decoded\n  %+v\nwant\n  %+v", got, m)
			}
			if len(EncodeMessage(m)) > recordSizeHint(m) {
				t.Fatalf("record of %d bytes exceeds its size hint %d", len(EncodeMessage(m)), recordSizeHint(m))
			}
		})
	}
}

func TestRecordTimesToTheMillisecond(t *testing.T) {
	in := time.Date(2025, 6, 1, 12, 0, 0, 123_999_999, time.FixedZone("x", 3600))
	got, err := DecodeMessage(EncodeMessage(&queue.Message{EnqueuedAt: in}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := in.Truncate(time.Millisecond); !got.EnqueuedAt.Equal(want) {
		t.Fatalf("EnqueuedAt = %v, want %v", got.EnqueuedAt, want)
	}
}

func TestRecordCorrupt(t *testing.T) {
	good := EncodeMessage(sampleMessage())
	// Every strict prefix is truncated somewhere.
	for n := range len(good) {
		if _, err := DecodeMessage(good[:n], 1); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("%d of %d bytes: err = %v, want ErrCorruptRecord", n, len(good), err)
		}
	}
	cases := map[string][]byte{
		"trailing byte":  append(bytes.Clone(good), 0),
		"version 2":      append([]byte{2}, good[1:]...),
		"unknown flag":   append([]byte{recordVersion, 0x80}, good[2:]...),
		"huge length":    {recordVersion, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"varint overrun": {recordVersion, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
		"user count":     {recordVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03, 0},
		"expiry > u32":   {recordVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0},
	}
	for name, b := range cases {
		_, err := DecodeMessage(b, 9)
		if !errors.Is(err, ErrCorruptRecord) || !strings.HasPrefix(err.Error(), "storage: corrupt record: offset 9: ") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestRecordQueueMeta(t *testing.T) {
	o := queue.DefaultOptions()
	o.Partitions = 12
	for _, m := range []queue.QueueMeta{{Name: "a/$dlq", Partitions: 1}, {Name: "b", Partitions: 12, Declared: &o, Owner: "alice"}} {
		b, err := EncodeQueueMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeQueueMeta(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("DecodeQueueMeta = %+v, %v; want %+v", got, err, m)
		}
	}
	for _, bad := range []string{"", "{", `{"v":2,"name":"x"}`} {
		if _, err := DecodeQueueMeta([]byte(bad)); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("DecodeQueueMeta(%q) = %v", bad, err)
		}
	}
}

// FuzzDecodeRecord: DecodeMessage never panics, and a record it accepts
// survives re-encoding: decode(encode(decode(b))) equals decode(b), and
// re-encoding is stable.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeMessage(sampleMessage()))
	f.Add(EncodeMessage(&queue.Message{}))
	f.Add(EncodeMessage(&queue.Message{Headers: queue.Headers{CorrelationData: []byte{}}}))
	f.Add([]byte{})
	f.Add([]byte{recordVersion})
	f.Add([]byte{recordVersion, knownFlags, 1, 'k', 0, 2, 4, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b, 5)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("error does not wrap ErrCorruptRecord: %v", err)
			}
			return
		}
		again := EncodeMessage(m)
		m2, err := DecodeMessage(again, 5)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("decode(encode(m)) = %+v, want %+v", m2, m)
		}
		if !bytes.Equal(EncodeMessage(m2), again) {
			t.Fatal("re-encoding is not stable")
		}
	})
}

// FuzzRecordRoundTrip: for any message, DecodeMessage(EncodeMessage(m))
// equals m with its times truncated to the millisecond in UTC (the first
// millisecond of 1970 reading as the zero time), and empty payloads and
// property lists as nil.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(uint64(42), "key", "sub/ject", int64(1_736_000_000_123), int64(0), int64(-5), uint32(999_999),
		"text/plain", "re/ply", []byte{0, 1}, true, byte(1), uint32(60), "a=1\x1fa=2\x1f=", true, "rejected", uint32(3), []byte("payload"))
	f.Add(uint64(0), "", "", int64(0), int64(0), int64(0), uint32(0),
		"", "", []byte(nil), false, byte(0), uint32(0), "", false, "", uint32(0), []byte(nil))
	f.Fuzz(func(t *testing.T, off uint64, key, subject string, enq, nb, exp int64, subMs uint32,
		ctype, resp string, corr []byte, hasCorr bool, pf byte, expiry uint32, user string,
		dead bool, reason string, deliveries uint32, payload []byte) {
		// A time in milliseconds plus less than a millisecond.
		ms := func(v int64) time.Time {
			return time.UnixMilli(v).Add(time.Duration(subMs%1_000_000) * time.Nanosecond)
		}
		m := &queue.Message{
			Offset: off, Key: key, Subject: subject,
			EnqueuedAt: ms(enq), NotBefore: ms(nb), ExpiresAt: ms(exp),
			Headers: queue.Headers{ContentType: ctype, ResponseTopic: resp, PayloadFormat: pf, ExpiryInterval: expiry},
			Payload: payload,
		}
		if nb == 0 {
			m.NotBefore = time.Time{}
		}
		if hasCorr {
			m.Headers.CorrelationData = append([]byte{}, corr...)
		}
		if user != "" {
			for _, kv := range strings.Split(user, "\x1f") {
				name, value, _ := strings.Cut(kv, "=")
				m.Headers.User = append(m.Headers.User, queue.Property{Name: name, Value: value})
			}
		}
		if dead {
			m.DeadLetter = &queue.DeadLetter{Reason: reason, OriginalID: key, OriginalTopic: subject, Deliveries: deliveries, Group: ctype}
		}

		got, err := DecodeMessage(EncodeMessage(m), off)
		if err != nil {
			t.Fatal(err)
		}
		want := *m
		for _, tm := range []*time.Time{&want.EnqueuedAt, &want.NotBefore, &want.ExpiresAt} {
			if tm.IsZero() || tm.UnixMilli() == 0 {
				*tm = time.Time{}
			} else {
				*tm = time.UnixMilli(tm.UnixMilli()).UTC()
			}
		}
		if len(want.Payload) == 0 {
			want.Payload = nil
		}
		if !reflect.DeepEqual(got, &want) {
			t.Fatalf("decode(encode(m)) =\n  %+v\nwant\n  %+v", got, &want)
		}
	})
}
