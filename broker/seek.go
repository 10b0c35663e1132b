package broker

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/shardq/shardq/queue"
)

// seek serves POST /api/v1/queues/{q}/groups/{g}/seek: it moves the group
// to a point of the queue (queue.Queue.Seek). In a cluster every node is
// asked first whether the group exists and has consumers connected, and
// whether between them they serve every partition; only then does each
// move it on the partitions it serves. A partition no node served by then
// is named in a 503, with what was done.
func (a *adminAPI) seek(w http.ResponseWriter, r *http.Request) {
	q := a.resolve(w, r, false)
	if q == nil {
		return
	}
	g := r.PathValue("group")
	var req SeekRequest
	if err := decodeBody(r, &req, false); err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if len(req.To) == 0 {
		a.fail(w, r, http.StatusBadRequest, errors.New(`"to" is missing: give "earliest", "latest", an RFC 3339 time or {"partition": P, "offset": O}`))
		return
	}
	to, err := queue.ParseSeekJSON(req.To)
	if err != nil {
		a.failErr(w, r, err)
		return
	}
	if a.checking(r) {
		n, found := q.GroupConsumers(g)
		a.reply(w, http.StatusOK, seekCheck{Partitions: a.servedOf(q), Found: found, Consumers: n})
		return
	}
	out := SeekResult{Node: a.b.cfg.NodeID, Queue: q.Name(), Group: g, To: to.String()}
	if !a.gathering(r) {
		// A single node, or one node of a cluster asked by another after
		// the check: a group it has not read with yet is made there.
		parts, err := q.Seek(r.Context(), g, to, req.Force, r.Header.Get(localHeader) != "")
		if err != nil {
			a.failErr(w, r, err)
			return
		}
		out.Partitions = parts
		a.reply(w, http.StatusOK, out)
		return
	}
	if !a.seekCheck(w, r, q, g, to, req) {
		return
	}
	parts, err := q.Seek(r.Context(), g, to, req.Force, true)
	if err != nil {
		a.failErr(w, r, err)
		return
	}
	out.Partitions = parts
	others, refused, failed := spread[SeekResult](a, r, req, false)
	for _, o := range others {
		out.Partitions = append(out.Partitions, o.Partitions...)
	}
	slices.SortFunc(out.Partitions, func(x, y queue.SoughtPartition) int { return x.Partition - y.Partition })
	need := allPartitions(len(q.Info().Partitions))
	if to.OnePartition {
		need = []int{to.Partition}
	}
	done := make([]int, len(out.Partitions))
	for i, p := range out.Partitions {
		done[i] = p.Partition
	}
	if missing := unreached(need, done); missing != nil {
		err := a.unreachedError(q, missing, refused, failed)
		a.logFailure(r, http.StatusServiceUnavailable, err)
		a.reply(w, http.StatusServiceUnavailable, Error{Error: err.Error() + "; the partitions listed in seek were moved: seek again once every partition has an owner", Seek: &out})
		return
	}
	a.reply(w, http.StatusOK, out)
}

// seekCheck asks every node whether group g of q may be moved: it exists
// somewhere, has no consumer connected (unless force), and the nodes
// serve every partition between them, waiting for a partition whose
// leadership moves as a group delete does. It answers the refusal itself
// and reports whether to go on.
func (a *adminAPI) seekCheck(w http.ResponseWriter, r *http.Request, q *queue.Queue, g string, to queue.SeekTo, req SeekRequest) bool {
	need := allPartitions(len(q.Info().Partitions))
	if to.OnePartition {
		need = []int{to.Partition}
	}
	deadline := time.Now().Add(groupCheckWait)
	for {
		n, found := q.GroupConsumers(g)
		check := seekCheck{Partitions: a.servedOf(q), Found: found, Consumers: n}
		checks, refused, failed := spread[seekCheck](a, r, req, true)
		for _, rf := range refused {
			if rf.status == http.StatusNotFound {
				continue // the queue is not there yet: it serves none of it
			}
			a.fail(w, r, rf.status, fmt.Errorf("node %s: %s", rf.node, rf.err))
			return false
		}
		for _, o := range checks {
			check.Found = check.Found || o.Found
			check.Consumers += o.Consumers
			check.Partitions = append(check.Partitions, o.Partitions...)
		}
		missing := unreached(need, check.Partitions)
		if missing == nil {
			switch {
			case !check.Found:
				a.failErr(w, r, fmt.Errorf("%w: %q in queue %s", queue.ErrNoSuchGroup, g, q.Name()))
				return false
			case check.Consumers > 0 && !req.Force:
				a.failErr(w, r, fmt.Errorf("%w: group %s of queue %s has consumers connected; force takes their leases back", queue.ErrGroupActive, g, q.Name()))
				return false
			}
			return true
		}
		if time.Now().After(deadline) || r.Context().Err() != nil {
			err := a.unreachedError(q, missing, refused, failed)
			a.fail(w, r, http.StatusServiceUnavailable, fmt.Errorf("%w; the group was not moved", err))
			return false
		}
		select {
		case <-r.Context().Done():
		case <-time.After(groupCheckRetry):
		}
	}
}
