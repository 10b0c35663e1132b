package broker_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/queue"
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

// TestAdminSearchAfterGrowth: after a queue grew, a search by key finds
// the key's messages in the partition of each count it had, newest
// first, paging across them with next_before.
func TestAdminSearchAfterGrowth(t *testing.T) {
	b := startBroker(t, t.TempDir(), withToken)
	put := "/api/v1/queues/orders"
	get[broker.QueueView](t, b, "PUT", put, adminToken, `{"partitions": 1}`, http.StatusCreated)
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("k", i); queue.PartitionFor(k, 2) == 1 {
			key = k
		}
	}
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	pub := func(from, to int) {
		for i := from; i < to; i++ {
			if code := prod.publish("$queue/orders", []byte(fmt.Sprint(i)), "key", key); code != 0 {
				t.Fatalf("publish %d: %#x", i, code)
			}
			prod.publish("$queue/orders", []byte("other"), "key", "x")
		}
	}
	pub(0, 4)
	get[broker.QueueView](t, b, "PUT", put, adminToken, `{"partitions": 2}`, http.StatusOK)
	pub(4, 7)
	var got []string
	path := "/api/v1/queues/orders/messages?limit=2&key=" + key
	for before := ""; ; {
		s := search(t, b, path+before)
		var page []string
		for _, m := range s.Messages {
			page = append(page, fmt.Sprintf("%s@%d", m.Payload, m.Partition))
		}
		got = append(page, got...)
		if !s.Truncated {
			break
		}
		before = "&before=" + s.NextBefore
	}
	want := []string{"0@0", "1@0", "2@0", "3@0", "4@1", "5@1", "6@1"}
	if !slices.Equal(got, want) {
		t.Fatalf("the key's messages, paged by 2: %v, want %v", got, want)
	}
}
