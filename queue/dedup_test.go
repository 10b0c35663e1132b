package queue_test

import (
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// SPEC 2: a publish whose dedup-id was seen within the queue's dedup
// window (2m here) is acknowledged but stored once; after the window it is
// a new message.
func TestQueueDedup(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second msg
		gap           time.Duration // between the two publishes
		// together: the second is published while the first is still
		// being stored.
		together bool
		// consumed: the first is delivered, acked and deleted before the
		// second is published.
		consumed bool
		want     []string // the deliveries of both, in order
	}{
		{
			name:  "a duplicate within the window is stored once",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "x"},
			gap: 2*time.Minute - time.Millisecond, want: []string{"p1#1"},
		},
		{
			name:  "a duplicate at once is stored once",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "x"},
			want: []string{"p1#1"},
		},
		{
			name:  "a duplicate of a message being stored is stored once",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "x"},
			together: true, want: []string{"p1#1"},
		},
		{
			name:  "a duplicate with another key is a duplicate",
			first: msg{key: "a", payload: "p1", dedup: "x"}, second: msg{key: "b", payload: "p2", dedup: "x"},
			want: []string{"p1#1"},
		},
		{
			name:  "a duplicate of a message consumed and deleted is still a duplicate",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "x"},
			gap: time.Minute, consumed: true, want: []string{"p1#1"},
		},
		{
			name:  "the same dedup-id after the window is stored again",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "x"},
			gap: 2 * time.Minute, want: []string{"p1#1", "p2#1"},
		},
		{
			name:  "different dedup-ids are both stored",
			first: msg{key: "k", payload: "p1", dedup: "x"}, second: msg{key: "k", payload: "p2", dedup: "y"},
			want: []string{"p1#1", "p2#1"},
		},
		{
			name:  "messages without a dedup-id are both stored",
			first: msg{key: "k", payload: "p1"}, second: msg{key: "k", payload: "p1"},
			together: true, want: []string{"p1#1", "p1#1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *queue.Options) { o.AckTimeout = time.Hour })
			if tc.together {
				first, second := h.publishAsync("q", tc.first), h.publishAsync("q", tc.second)
				if err := h.await(first); err != nil {
					t.Fatalf("first publish: %v", err)
				}
				if err := h.await(second); err != nil {
					t.Fatalf("second publish: %v", err)
				}
			} else {
				h.mustPublish("q", tc.first)
				if tc.consumed {
					h.subscribe("q", "c", defaultSub)
					h.mustSettle(h.expect(tc.want[0])[0], acked)
					h.retain()
					if d := h.depth("q"); d != 0 {
						t.Fatalf("q holds %d messages after its only group acked them", d)
					}
				}
				h.tick(tc.gap)
				if err := h.publish("q", tc.second); err != nil {
					t.Fatalf("second publish: %v", err)
				}
			}
			stored := uint64(len(tc.want))
			if tc.consumed {
				stored = 0
			}
			if d := h.depth("q"); d != stored {
				t.Fatalf("q holds %d messages, want %d", d, stored)
			}
			if tc.consumed {
				h.expect()
				return
			}
			h.subscribe("q", "c", defaultSub)
			// Each delivery is acked to let the next of the key through.
			for _, w := range tc.want {
				h.mustSettle(h.expect(w)[0], acked)
			}
			h.expect()
		})
	}
}
