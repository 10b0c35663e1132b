package broker

import (
	"net/http"
	"sync"
	"time"

	"github.com/shardq/shardq/queue"
)

// historyEvery is how often the node samples each queue's figures, and
// historyKeep how long it keeps them: in memory only, gone with a restart.
const (
	historyEvery = 5 * time.Second
	historyKeep  = time.Hour
)

// sample is one queue's figures at At. A queue whose counters did not move
// keeps one sample whose Until says when they were last seen the same, so
// an idle queue costs one sample, not 720.
type sample struct {
	At, Until                                time.Time
	Depth                                    uint64
	Enqueued, Delivered, Acked, DeadLettered uint64
}

func (s sample) sameCounters(o sample) bool {
	return s.Enqueued == o.Enqueued && s.Delivered == o.Delivered && s.Acked == o.Acked && s.DeadLettered == o.DeadLettered
}

// history holds the node's samples of its queues (of the partitions it
// serves, in a cluster), by queue.
type history struct {
	mu     sync.Mutex
	queues map[string][]sample
}

// record samples every queue at now; the samples of queues that are gone
// are dropped.
func (h *history) record(now time.Time, queues []*queue.Queue, depth func(*queue.Queue) uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.queues == nil {
		h.queues = map[string][]sample{}
	}
	seen := make(map[string]bool, len(queues))
	for _, q := range queues {
		name := q.Name()
		seen[name] = true
		st := q.Stats()
		s := sample{At: now, Until: now, Enqueued: st.Enqueued.Load(), Delivered: st.Delivered.Load(),
			Acked: st.Acked.Load(), DeadLettered: st.DeadLettered.Load()}
		ss := h.queues[name]
		if n := len(ss); n > 0 && ss[n-1].sameCounters(s) {
			// Idle: retention may still shrink its depth, read once a
			// minute rather than at every sample.
			if last := &ss[n-1]; now.Sub(last.At) < time.Minute || depth(q) == last.Depth {
				last.Until = now
				continue
			}
		}
		s.Depth = depth(q)
		ss = append(ss, s)
		drop := 0
		for drop < len(ss)-1 && now.Sub(ss[drop].Until) > historyKeep {
			drop++
		}
		if drop > 0 {
			ss = append(ss[:0:0], ss[drop:]...) // let the old array go
		}
		h.queues[name] = ss
	}
	for name := range h.queues {
		if !seen[name] {
			delete(h.queues, name)
		}
	}
}

// samples returns the queue's samples, oldest first.
func (h *history) samples(name string) []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.queues[name]...)
}

// rates returns the queue's enqueue and ack rates, per second, over the
// last interval sampled: 0 when the last samples are older than two
// intervals (the sampler is not running).
func (h *history) rates(name string, now time.Time) RatesView {
	ss := h.samples(name)
	n := len(ss)
	if n == 0 || now.Sub(ss[n-1].Until) > 2*historyEvery {
		return RatesView{}
	}
	if n == 1 || ss[n-1].Until.After(ss[n-1].At) {
		return RatesView{} // its counters have not moved since the last change
	}
	return ratesBetween(ss[n-2], ss[n-1])
}

// ratesBetween is the rate of the counters from a (as last seen) to b.
func ratesBetween(a, b sample) RatesView {
	secs := b.At.Sub(a.Until).Seconds()
	if secs <= 0 {
		return RatesView{}
	}
	return RatesView{Enqueued: float64(b.Enqueued-a.Enqueued) / secs, Acked: float64(b.Acked-a.Acked) / secs}
}

// RatesView is a queue's throughput over the node's last sample interval
// (5 s), in messages per second.
type RatesView struct {
	Enqueued float64 `json:"enqueued_per_second"`
	Acked    float64 `json:"acked_per_second"`
}

// History is GET /api/v1/queues/{q}/history: the samples this node took
// of the queue (of the partitions it serves, in a cluster) over the last
// hour, every 5 s; a run of samples with the same counters is one sample
// from at to until.
type History struct {
	Node     string          `json:"node"`
	Queue    string          `json:"queue"`
	Interval float64         `json:"interval_seconds"`
	Samples  []HistorySample `json:"samples"`
}

// HistorySample is one sample of History, with the rates since the one
// before.
type HistorySample struct {
	At           time.Time `json:"at"`
	Until        time.Time `json:"until"`
	Depth        uint64    `json:"depth"`
	Enqueued     uint64    `json:"enqueued"`
	Delivered    uint64    `json:"delivered"`
	Acked        uint64    `json:"acked"`
	DeadLettered uint64    `json:"dead_lettered"`
	RatesView
}

// showHistory serves GET /api/v1/queues/{q}/history.
func (a *adminAPI) showHistory(w http.ResponseWriter, r *http.Request) {
	q := a.resolve(w, r, false)
	if q == nil {
		return
	}
	ss := a.b.history.samples(q.Name())
	out := History{Node: a.b.cfg.NodeID, Queue: q.Name(), Interval: historyEvery.Seconds(), Samples: make([]HistorySample, 0, len(ss))}
	for i, s := range ss {
		hs := HistorySample{At: s.At.UTC(), Until: s.Until.UTC(), Depth: s.Depth, Enqueued: s.Enqueued, Delivered: s.Delivered,
			Acked: s.Acked, DeadLettered: s.DeadLettered}
		if i > 0 {
			hs.RatesView = ratesBetween(ss[i-1], s)
		}
		out.Samples = append(out.Samples, hs)
	}
	a.reply(w, http.StatusOK, out)
}

// sampleHistory samples the node's queues every historyEvery until
// Shutdown.
func (b *Broker) sampleHistory() {
	b.every(historyEvery, func(now time.Time) {
		b.history.record(now, b.manager.Queues(), func(q *queue.Queue) uint64 { return q.Info().Depth() })
	})
}
