package broker_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
)

// TestAdminGrowPartitions (SPEC 7, partition count): PUT with more
// partitions grows a queue online, under a producer: every publish is
// acknowledged 0x00, and a consumer gets each key's messages in publish
// order, one at a time, across the change; the queue page shows the new
// count, and fewer partitions are refused.
func TestAdminGrowPartitions(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	put := "/api/v1/queues/orders"
	get[broker.QueueView](t, b, "PUT", put, adminToken, `{"partitions": 2}`, http.StatusCreated)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	const keys, per = 12, 40
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range per {
			for k := range keys {
				if code := prod.publish("$queue/orders", []byte(fmt.Sprintf("%d/%d", k, i)), "key", fmt.Sprint("k", k)); code != 0 {
					t.Errorf("publish %d of key %d: %#x", i, k, code)
					return
				}
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // some published under 2 partitions, the rest under 6
	v := get[broker.QueueView](t, b, "PUT", put, adminToken, `{"partitions": 6}`, http.StatusOK)
	if v.Settings.Partitions != 6 || len(v.Partitions) != 6 {
		t.Fatalf("after growing: %d partitions in the settings, %d shown", v.Settings.Partitions, len(v.Partitions))
	}
	<-done
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/g/$queue/orders")
	next := map[int]int{}
	for range keys * per {
		p := cons.next(10 * time.Second)
		var k, i int
		fmt.Sscanf(string(p.Payload), "%d/%d", &k, &i)
		if i != next[k] {
			t.Fatalf("key %d: %d delivered when %d was next", k, i, next[k])
		}
		next[k]++
		cons.puback(p, 0)
	}
	refused(t, b, "PUT", put, adminToken, `{"partitions": 4}`, http.StatusConflict, "can grow, not shrink")
	if v := get[broker.QueueView](t, b, "GET", put, adminToken, "", http.StatusOK); len(v.Partitions) != 6 {
		t.Fatalf("the queue shows %d partitions after a refused shrink, not 6", len(v.Partitions))
	}
}
