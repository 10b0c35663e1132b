package bench

import (
	"encoding/binary"
	"fmt"
	"strconv"
)

// HeaderSize is the number of payload bytes that identify a message: the
// smallest allowed --size.
//
// Layout, big endian:
//
//	[0:4)   producer id      uint32
//	[4:12)  sequence         uint64 (per producer, from 0)
//	[12:20) send time        int64  (Unix nanoseconds)
//	[20:24) key index        uint32
//
// The rest of the payload, up to the configured size, is zero.
const HeaderSize = 24

// header is the identity a producer writes at the start of every payload.
type header struct {
	Producer uint32
	Seq      uint64
	SentAt   int64 // Unix nanoseconds
	Key      uint32
}

// put writes h into the first HeaderSize bytes of b.
func (h header) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:4], h.Producer)
	binary.BigEndian.PutUint64(b[4:12], h.Seq)
	binary.BigEndian.PutUint64(b[12:20], uint64(h.SentAt))
	binary.BigEndian.PutUint32(b[20:24], h.Key)
}

// parseHeader reads the header of a payload written by a producer.
func parseHeader(b []byte) (header, error) {
	if len(b) < HeaderSize {
		return header{}, fmt.Errorf("%w: %d bytes", ErrShortPayload, len(b))
	}
	return header{
		Producer: binary.BigEndian.Uint32(b[0:4]),
		Seq:      binary.BigEndian.Uint64(b[4:12]),
		SentAt:   int64(binary.BigEndian.Uint64(b[12:20])),
		Key:      binary.BigEndian.Uint32(b[20:24]),
	}, nil
}

// keyIndex is the key of message seq of a producer: producers deal the keys
// round robin, producer i taking keys i, i+P, i+2P, ... (mod keys). When keys
// is a multiple of producers, every key belongs to exactly one producer.
func keyIndex(producer uint32, seq uint64, producers, keys int) uint32 {
	return uint32((uint64(producer) + seq*uint64(producers)) % uint64(keys))
}

// keyName is the v5 user property `key` sent with key index k.
func keyName(k uint32) string {
	return "k" + strconv.FormatUint(uint64(k), 10)
}

// MessageID names one message of a run: a producer and its sequence.
type MessageID struct {
	Producer uint32 `json:"producer"`
	Seq      uint64 `json:"seq"`
}

// String formats the id as "p{producer}#{seq}".
func (id MessageID) String() string {
	return "p" + strconv.FormatUint(uint64(id.Producer), 10) + "#" + strconv.FormatUint(id.Seq, 10)
}
