package broker

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"

	"github.com/shardq/shardq/queue"
)

// Finding messages: GET /api/v1/queues/{q}/messages (and .../dlq/messages)
// with ?id=P-O or ?key=K, on the route of the peek. A msg-id names its
// partition, and a key's messages all live in the partition its hash
// picks (queue.PartitionFor, as a publish does; a dead letter keeps its
// key, so the same holds in the dead-letter queue): either way only one
// partition is read. By key, that partition is read from its newest
// message back, since the newest are what an operator usually looks for,
// until limit messages with the key are found, the oldest message is
// reached or searchBudget messages were read. The answer says whether
// older messages were left unread and, as a msg-id, where an older search
// goes on from (?before=): a position in the key's history rather than an
// offset, so that it keeps its meaning were that history to span
// partitions.
//
// A queue whose partitions grew (queue.Growth) has a key's messages from
// before each growth in the partition the count then gave it, below that
// partition's cut: a search by key reads those segments (queue.KeySegments)
// newest first, and next_before may name any of their partitions. A
// dead-letter queue grows with its queue but keeps no cuts: a key's dead
// letters are read, whole, in each partition one of its counts gave it.
//
// In a cluster the node asked reads the partition if it serves it, and
// otherwise asks every other member (the gather of a peek): each answers
// only for a partition it serves, 404 otherwise. No node answering is a
// 503 naming the partition's owner.

// Search limits: matches per answer, and messages read per answer.
const (
	defaultSearch = 100
	maxSearch     = 10000
	searchBudget  = 100_000
	// searchPage is how many messages one read takes, newest first.
	searchPage = 1000
)

// MessageSearch is the answer to GET .../messages?key= or ?id=: the
// messages found, in offset order.
type MessageSearch struct {
	// Node is the node that read the partition.
	Node  string `json:"node"`
	Queue string `json:"queue"`
	// Key is the key searched for; ID the msg-id looked up.
	Key *string `json:"key,omitempty"`
	ID  string  `json:"msg_id,omitempty"`
	// Partition is the partition the key or msg-id maps to.
	Partition int           `json:"partition"`
	Messages  []MessageView `json:"messages"`
	// Scanned counts the messages read.
	Scanned int `json:"scanned"`
	// Truncated is true when the search stopped before the partition's
	// oldest message (limit matches found, or searchBudget messages
	// read); NextBefore is then the msg-id an older search goes on
	// below (?before=).
	Truncated  bool   `json:"truncated"`
	NextBefore string `json:"next_before,omitempty"`
	// NodesMissing: as in QueueList.
	NodesMissing []string `json:"nodes_missing,omitempty"`
}

// messages serves GET .../messages: a search with ?key= or ?id=, else a
// peek.
func (a *adminAPI) messages(dlq bool) http.HandlerFunc {
	peek := a.peek(dlq)
	return func(w http.ResponseWriter, r *http.Request) {
		qv := r.URL.Query()
		if !qv.Has("key") && !qv.Has("id") {
			if qv.Has("before") {
				a.fail(w, r, http.StatusBadRequest, errors.New("before goes with key: a peek reads forward with partition and from"))
				return
			}
			peek(w, r)
			return
		}
		a.search(w, r, dlq)
	}
}

// search finds the message of ?id= or the messages of ?key=.
func (a *adminAPI) search(w http.ResponseWriter, r *http.Request, dlq bool) {
	q := a.resolve(w, r, dlq)
	if q == nil {
		return
	}
	qv := r.URL.Query()
	switch {
	case qv.Has("key") && qv.Has("id"):
		a.fail(w, r, http.StatusBadRequest, errors.New("give key or id, not both"))
		return
	case qv.Has("partition") || qv.Has("from"):
		a.fail(w, r, http.StatusBadRequest, errors.New("partition and from are for a peek: key and id find their partition themselves"))
		return
	case qv.Has("id") && (qv.Has("limit") || qv.Has("before")):
		a.fail(w, r, http.StatusBadRequest, errors.New("limit and before go with key: an id names one message"))
		return
	}
	partitions := q.Partitions()
	out := MessageSearch{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: []MessageView{}}
	var (
		offset uint64
		limit  int
		segs   []queue.KeySegment
	)
	if qv.Has("id") {
		out.ID = qv.Get("id")
		p, o, err := queue.ParseMessageID(out.ID)
		if err != nil {
			a.fail(w, r, http.StatusBadRequest, fmt.Errorf("id: want a msg-id PARTITION-OFFSET, such as 3-17; got %q", out.ID))
			return
		}
		if p >= partitions {
			a.fail(w, r, http.StatusNotFound, fmt.Errorf("%w: %s: %s has %d partitions", queue.ErrUnknownMessage, out.ID, q.Name(), partitions))
			return
		}
		out.Partition, offset = p, o
	} else {
		key := qv.Get("key")
		out.Key = &key
		segs = keySegments(q, a.b.manager.Queue(queue.ParentName(q.Name())), key)
		out.Partition = segs[0].Partition
		var err error
		if limit, err = intParam(qv.Get("limit"), "limit", defaultSearch, 1, maxSearch); err != nil {
			a.fail(w, r, http.StatusBadRequest, err)
			return
		}
		if s := qv.Get("before"); s != "" {
			p, o, err := queue.ParseMessageID(s)
			i := slices.IndexFunc(segs, func(sg queue.KeySegment) bool { return sg.Partition == p && o > sg.From && o <= sg.To })
			if err != nil || i < 0 {
				a.fail(w, r, http.StatusBadRequest, fmt.Errorf("before: want the next_before of the last answer, a msg-id of the key's partition %d, got %q", out.Partition, s))
				return
			}
			segs = segs[i:]
			segs[0].To = o
		}
	}

	if !a.served(q, out.Partition) {
		if !a.gathering(r) {
			// Another node asks: the node serving the partition answers.
			a.fail(w, r, http.StatusNotFound, fmt.Errorf("%w: %s/%d is not served by %s", queue.ErrNotOwned, q.Name(), out.Partition, a.b.cfg.NodeID))
			return
		}
		a.searchElsewhere(w, r, q, out)
		return
	}
	var err error
	if out.ID != "" {
		err = findID(r, q, &out, offset)
	} else {
		err = findKey(r, q, &out, limit, segs)
	}
	if err != nil {
		a.failErr(w, r, err)
		return
	}
	// Another node asking gets a 200 with no message: its 404 would say
	// that this node does not serve the partition.
	asked := a.b.node != nil && r.Header.Get(localHeader) != ""
	if out.ID != "" && len(out.Messages) == 0 && !asked {
		a.failErr(w, r, noSuchID(out))
		return
	}
	a.reply(w, http.StatusOK, out)
}

// findID reads the message at offset of out.Partition into out.
func findID(r *http.Request, q *queue.Queue, out *MessageSearch, offset uint64) error {
	msgs, err := q.Peek(r.Context(), out.Partition, offset, 1)
	if err != nil {
		return err
	}
	if len(msgs) == 1 && msgs[0].Offset == offset {
		out.Messages = append(out.Messages, messageView(q.Name(), out.Partition, msgs[0]))
	}
	out.Scanned = len(msgs)
	return nil
}

// findKey reads the key's segments, each from its end back, keeping the
// newest limit messages whose key is *out.Key.
func findKey(r *http.Request, q *queue.Queue, out *MessageSearch, limit int, segs []queue.KeySegment) error {
	parts := q.Info().Partitions
	type hit struct {
		p int
		m *queue.Message
	}
	var found []hit
	for _, sg := range segs {
		part := parts[sg.Partition]
		first, hi := max(part.First, sg.From), min(sg.To, part.Committed)
		for hi > first && len(found) < limit && out.Scanned < searchBudget {
			n := min(uint64(searchPage), hi-first, uint64(searchBudget-out.Scanned))
			from := hi - n
			msgs, err := q.Peek(r.Context(), sg.Partition, from, int(n))
			if err != nil {
				return err
			}
			// Newest first, so that the limit keeps the newest.
			for i := len(msgs) - 1; i >= 0; i-- {
				m := msgs[i]
				if m.Offset >= hi {
					continue // past a gap in the offsets: read already
				}
				out.Scanned++
				if m.Key != *out.Key {
					continue
				}
				found = append(found, hit{sg.Partition, m})
				if len(found) == limit {
					from = m.Offset // what is below it is left unread
					break
				}
			}
			hi = from
		}
		if hi > first {
			out.Truncated = true
			out.NextBefore = queue.MessageID(sg.Partition, hi)
			break
		}
	}
	slices.Reverse(found)
	for _, h := range found {
		out.Messages = append(out.Messages, messageView(q.Name(), h.p, h.m))
	}
	return nil
}

// keySegments returns where the messages of key are in q, newest first
// (queue.KeySegments); for a dead-letter queue, of queue parent, the
// whole of each partition one of parent's counts gave the key.
func keySegments(q, parent *queue.Queue, key string) []queue.KeySegment {
	if !queue.IsDLQ(q.Name()) {
		return queue.KeySegments(key, q.Partitions(), q.Growths())
	}
	var out []queue.KeySegment
	counts := []int{q.Partitions()}
	if parent != nil {
		for _, gr := range slices.Backward(parent.Growths()) {
			counts = append(counts, gr.From)
		}
	}
	for _, n := range counts {
		if p := queue.PartitionFor(key, n); !slices.ContainsFunc(out, func(sg queue.KeySegment) bool { return sg.Partition == p }) {
			out = append(out, queue.KeySegment{Partition: p, To: math.MaxUint64})
		}
	}
	return out
}

// searchElsewhere answers out's search with the answer of the node that
// serves its partition.
func (a *adminAPI) searchElsewhere(w http.ResponseWriter, r *http.Request, q *queue.Queue, out MessageSearch) {
	answers, missing := gather[MessageSearch](a, r, queue.ParentName(q.Name()))
	if len(answers) == 0 {
		a.fail(w, r, http.StatusServiceUnavailable, a.unreachedError(q, []int{out.Partition}, nil, missing))
		return
	}
	// Two nodes answer only while the partition's leadership moves:
	// either read it.
	got := answers[0]
	got.NodesMissing = missing
	if got.ID != "" && len(got.Messages) == 0 {
		a.failErr(w, r, noSuchID(got))
		return
	}
	a.reply(w, http.StatusOK, got)
}

// noSuchID is the error of a msg-id out found no message for.
func noSuchID(out MessageSearch) error {
	return fmt.Errorf("%w: no message %s in %s: partition %d does not hold it (never stored, or deleted by retention or a purge)",
		queue.ErrUnknownMessage, out.ID, out.Queue, out.Partition)
}
