package history_test

import (
	"fmt"
	"time"

	"github.com/shardq/shardq/internal/history"
)

// record fills rec as a test harness would: producer p1 on node a
// publishes m1, m2 and m3 of key k one after the other; consumer c1 of
// group billing on node b receives m2 before m1 and never gets m3.
func record(rec *history.Recorder) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for i, id := range []string{"m1", "m2", "m3"} {
		rec.Publish(history.Publish{ID: id, Key: "k", Queue: "orders", Node: "a", Producer: "p1",
			Sent: ms(10 * i), Answered: ms(10*i + 4), Answer: history.Acked})
	}
	for i, id := range []string{"m2", "m1"} {
		rec.Deliver(history.Delivery{ID: id, Key: "k", Group: "billing", Consumer: "c1", Node: "b",
			At: ms(40 + 10*i), MsgID: fmt.Sprintf("3-%d", 7-i), DeliveryCount: 1})
		rec.Settle(history.Settlement{ID: id, Group: "billing", Consumer: "c1", At: ms(45 + 10*i), Outcome: history.Ack})
	}
}

func Example() {
	var rec history.Recorder
	record(&rec) // from the producers' and consumers' goroutines

	opts := history.DefaultOptions()
	opts.Groups = map[string][]string{"orders": {"billing"}}
	r := history.Check(rec.History(), opts)
	fmt.Println("ok:", r.OK(), "lost:", r.Summary.Lost, "reordered:", r.Summary.Reordered)
	for _, v := range r.Violations {
		fmt.Println(v)
	}
	// Output:
	// ok: false lost: 1 reordered: 1
	// lost m3: sent at 12:00:00.020 by p1 on a, acknowledged at 12:00:00.024, but never delivered to group billing nor dead-lettered
	// reorder m1: acknowledged to p1 on a at 12:00:00.004, before m2 was sent at 12:00:00.010, yet m2 was first delivered to group billing at 12:00:00.040 (c1 on b) and m1 only at 12:00:00.050 (c1 on b)
}

func ExampleReport_Markdown() {
	var rec history.Recorder
	record(&rec)
	opts := history.DefaultOptions()
	opts.Groups = map[string][]string{"orders": {"billing"}}
	fmt.Print(history.Check(rec.History(), opts).Markdown())
	// Output:
	// History check: **2 violations**
	//
	// | what | count |
	// | --- | --- |
	// | publish attempts | 3 (refused 0, outcome unknown 0) |
	// | acknowledged | 3 |
	// | delivered | 2 (2 deliveries, 0 redeliveries) |
	// | dead-lettered | 0 |
	// | lost | 1 |
	// | duplicates | 0 |
	// | explained duplicates | 0 |
	// | redelivered without DUP | 0 |
	// | order violations | 1 |
	// | lease overlaps | 0 |
	// | vanished dead letters | 0 |
	// | orphan dead letters | 0 |
	// | unexpected deliveries | 0 |
	//
	// Violations:
	//
	// | kind | message | key | group | what happened |
	// | --- | --- | --- | --- | --- |
	// | lost | m3 | k | billing | sent at 12:00:00.020 by p1 on a, acknowledged at 12:00:00.024, but never delivered to group billing nor dead-lettered |
	// | reorder | m1 | k | billing | acknowledged to p1 on a at 12:00:00.004, before m2 was sent at 12:00:00.010, yet m2 was first delivered to group billing at 12:00:00.040 (c1 on b) and m1 only at 12:00:00.050 (c1 on b) |
}
