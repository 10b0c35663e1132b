package bench_test

import (
	"fmt"
	"time"

	"github.com/shardq/shardq/bench"
)

func ExampleLedger() {
	l := bench.NewLedger(1)
	for seq := range uint64(5) {
		l.Sent()
		l.Acked(0, seq)
	}
	// The broker delivers 0, 2, 1 (swapped), 2 again, and loses 3 and 4.
	for _, seq := range []uint64{0, 2, 1, 2} {
		l.Receive(bench.Delivery{Producer: 0, Seq: seq, Key: 0})
	}
	t := l.Tally()
	fmt.Printf("received %d, missing %d %v, duplicates %d, reordered %d\n",
		t.Received, t.Missing, l.Missing(10), t.Duplicates, t.Reordered)
	// Output: received 3, missing 2 [p0#3 p0#4], duplicates 1, reordered 1
}

func ExampleHistogram() {
	h := bench.NewHistogram()
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * 10 * time.Microsecond)
	}
	s := h.Summary()
	fmt.Println(s.Count, s.P50, s.P99, s.Max)
	// Output: 1000 5.023ms 9.919ms 10ms
}
