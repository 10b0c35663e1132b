package bench

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"
)

// step is one event fed to a ledger in a test.
type step struct {
	ack      bool // an ack; otherwise a receipt
	reject   bool
	producer uint32
	seq      uint64
	key      uint32
	redeliv  bool
}

func ack(p uint32, seq uint64) step              { return step{ack: true, producer: p, seq: seq} }
func recv(p uint32, seq uint64, key uint32) step { return step{producer: p, seq: seq, key: key} }
func redeliver(p uint32, seq uint64, key uint32) step {
	return step{producer: p, seq: seq, key: key, redeliv: true}
}

func acks(p uint32, n int) []step {
	var s []step
	for i := range n {
		s = append(s, ack(p, uint64(i)))
	}
	return s
}

func recvs(p uint32, key uint32, seqs ...uint64) []step {
	var s []step
	for _, seq := range seqs {
		s = append(s, recv(p, seq, key))
	}
	return s
}

func feed(l *Ledger, steps []step) []Outcome {
	var out []Outcome
	for _, s := range steps {
		switch {
		case s.reject:
			l.Sent()
			l.Rejected(s.producer, s.seq)
		case s.ack:
			l.Sent()
			l.Acked(s.producer, s.seq)
		default:
			out = append(out, l.Receive(Delivery{Producer: s.producer, Seq: s.seq, Key: s.key, Redelivered: s.redeliv}))
		}
	}
	return out
}

func join(parts ...[]step) []step {
	var s []step
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

func TestLedgerTally(t *testing.T) {
	cases := []struct {
		name    string
		steps   []step
		want    Tally
		missing []MessageID
	}{
		{
			name:  "in order",
			steps: join(acks(0, 5), recvs(0, 0, 0, 1, 2, 3, 4)),
			want:  Tally{Sent: 5, Acked: 5, Received: 5},
		},
		{
			name:    "missing",
			steps:   join(acks(0, 5), recvs(0, 0, 0, 1, 3)),
			want:    Tally{Sent: 5, Acked: 5, Received: 3, Missing: 2},
			missing: []MessageID{{0, 2}, {0, 4}},
		},
		{
			name:  "received before acked is not missing",
			steps: join(recvs(0, 0, 0, 1), acks(0, 2)),
			want:  Tally{Sent: 2, Acked: 2, Received: 2},
		},
		{
			name:  "unacked and not received is not missing",
			steps: join(acks(0, 2), recvs(0, 0, 0, 1, 2)),
			want:  Tally{Sent: 2, Acked: 2, Received: 3},
		},
		{
			name:  "rejected is not missing",
			steps: join(acks(0, 1), []step{{reject: true, seq: 1}}, recvs(0, 0, 0)),
			want:  Tally{Sent: 2, Acked: 1, Rejected: 1, Received: 1},
		},
		{
			name:  "true duplicate",
			steps: join(acks(0, 3), recvs(0, 0, 0, 1, 1, 2)),
			want:  Tally{Sent: 3, Acked: 3, Received: 3, Duplicates: 1},
		},
		{
			name:  "flagged redelivery",
			steps: join(acks(0, 3), recvs(0, 0, 0, 1), []step{redeliver(0, 1, 0)}, recvs(0, 0, 2)),
			want:  Tally{Sent: 3, Acked: 3, Received: 3, Redeliveries: 1},
		},
		{
			name:  "swap within a key",
			steps: join(acks(0, 5), recvs(0, 0, 0, 1, 3, 2, 4)),
			want:  Tally{Sent: 5, Acked: 5, Received: 5, Reordered: 1},
		},
		{
			name: "order is per key",
			steps: join(acks(0, 4),
				[]step{recv(0, 1, 1), recv(0, 3, 1), recv(0, 0, 0), recv(0, 2, 0)}),
			want: Tally{Sent: 4, Acked: 4, Received: 4},
		},
		{
			name: "order is per producer",
			steps: join(acks(0, 2), acks(1, 2),
				[]step{recv(1, 0, 0), recv(1, 1, 0), recv(0, 0, 0), recv(0, 1, 0)}),
			want: Tally{Sent: 4, Acked: 4, Received: 4},
		},
		{
			name:  "late first delivery flagged as redelivery is not a reorder",
			steps: join(acks(0, 3), recvs(0, 0, 0, 2), []step{redeliver(0, 1, 0)}),
			want:  Tally{Sent: 3, Acked: 3, Received: 3},
		},
		{
			name:  "duplicates are not judged for order",
			steps: join(acks(0, 3), recvs(0, 0, 0, 1, 2, 0)),
			want:  Tally{Sent: 3, Acked: 3, Received: 3, Duplicates: 1},
		},
		{
			name:  "foreign producer",
			steps: join(acks(0, 1), recvs(0, 0, 0), recvs(7, 0, 0)),
			want:  Tally{Sent: 1, Acked: 1, Received: 1, Foreign: 1},
		},
		{
			name:    "repeated ack counts once",
			steps:   join(acks(0, 2), acks(0, 2), recvs(0, 0, 0)),
			want:    Tally{Sent: 4, Acked: 2, Received: 1, Missing: 1},
			missing: []MessageID{{0, 1}},
		},
		{
			name:    "sparse high sequences",
			steps:   []step{ack(1, 1000), ack(1, 64), recv(1, 64, 3)},
			want:    Tally{Sent: 2, Acked: 2, Received: 1, Missing: 1},
			missing: []MessageID{{1, 1000}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(2)
			feed(l, tc.steps)
			if got := l.Tally(); got != tc.want {
				t.Fatalf("tally\n got %+v\nwant %+v", got, tc.want)
			}
			if got := l.Outstanding(); got != tc.want.Missing {
				t.Fatalf("outstanding = %d, want %d", got, tc.want.Missing)
			}
			if got := l.Missing(10); !reflect.DeepEqual(got, tc.missing) {
				t.Fatalf("missing = %v, want %v", got, tc.missing)
			}
		})
	}
}

func TestLedgerOutcomes(t *testing.T) {
	l := NewLedger(1)
	got := feed(l, []step{recv(0, 0, 0), recv(0, 0, 0), redeliver(0, 0, 0), recv(3, 0, 0)})
	want := []Outcome{OutcomeFirst, OutcomeDuplicate, OutcomeRedelivery, OutcomeForeign}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outcomes = %v, want %v", got, want)
	}
}

func TestLedgerMissingLimit(t *testing.T) {
	l := NewLedger(2)
	feed(l, join(acks(0, 100), acks(1, 100)))
	if got := l.Missing(3); !reflect.DeepEqual(got, []MessageID{{0, 0}, {0, 1}, {0, 2}}) {
		t.Fatalf("Missing(3) = %v", got)
	}
	if got := len(l.Missing(150)); got != 150 {
		t.Fatalf("len(Missing(150)) = %d", got)
	}
}

func TestLedgerWait(t *testing.T) {
	t.Run("returns once everything acked arrived", func(t *testing.T) {
		l := NewLedger(4)
		for p := range 4 {
			feed(l, acks(uint32(p), 500))
		}
		var wg sync.WaitGroup
		for p := range 4 {
			wg.Go(func() {
				for seq := range 500 {
					l.Receive(Delivery{Producer: uint32(p), Seq: uint64(seq), Key: uint32(seq % 7)})
				}
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Wait(ctx); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		wg.Wait()
		if got := l.Tally(); got.Missing != 0 || got.Received != 2000 || got.Reordered != 0 {
			t.Fatalf("tally %+v", got)
		}
	})
	t.Run("ends with ctx while a message is missing", func(t *testing.T) {
		l := NewLedger(1)
		feed(l, join(acks(0, 2), recvs(0, 0, 0)))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if err := l.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want deadline exceeded", err)
		}
	})
	t.Run("nothing acked returns at once", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := NewLedger(1).Wait(ctx); err != nil {
			t.Fatalf("Wait = %v", err)
		}
	})
}

func TestPayloadHeader(t *testing.T) {
	b := make([]byte, 64)
	want := header{Producer: 7, Seq: 1 << 40, SentAt: time.Now().UnixNano(), Key: 63}
	want.put(b)
	got, err := parseHeader(b)
	if err != nil || got != want {
		t.Fatalf("parseHeader = %+v, %v; want %+v", got, err, want)
	}
	if _, err := parseHeader(b[:HeaderSize-1]); !errors.Is(err, ErrShortPayload) {
		t.Fatalf("short payload: err = %v, want ErrShortPayload", err)
	}
}

func TestKeyIndex(t *testing.T) {
	// With keys a multiple of producers, each key has one producer.
	owner := map[uint32]uint32{}
	for p := range uint32(4) {
		for seq := range uint64(100) {
			k := keyIndex(p, seq, 4, 16)
			if o, ok := owner[k]; ok && o != p {
				t.Fatalf("key %d used by producers %d and %d", k, o, p)
			}
			owner[k] = p
		}
	}
	if len(owner) != 16 {
		t.Fatalf("%d keys used, want 16", len(owner))
	}
}
