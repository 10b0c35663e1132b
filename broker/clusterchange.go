package broker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/shardq/shardq/queue"
)

// The admin changes in a cluster: purge, group delete and dead-letter
// replay act on every partition of the queue, wherever it is served. The
// node asked acts on the partitions it serves and sends the same change
// to every other member (cluster.Node.Spread), which acts on its own; the
// writes go through each partition's replicated log, so its followers
// agree and a new leader does not bring back what was purged. The answer
// adds up what every node did. A partition no node acted on (its owner
// down or not answering, a leadership moving) fails the call with 503
// naming it and saying what was done; purge and replay are safe to
// repeat. A group delete asks every node first (checkParam) and deletes
// nothing unless every partition's node agrees.

// checkParam marks a change another node spreads as a check: the node
// answers what it would do, and changes nothing.
const checkParam = "check"

// peerRefusal is a member's answer other than 200.
type peerRefusal struct {
	node   string
	status int
	err    string
}

// spread sends r's change, with the body given, to every other member,
// checkOnly marking it a check, and decodes each answer 200 into a T.
// The members that answered otherwise are refused; those that did not
// answer are named in failed ("node: why").
func spread[T any](a *adminAPI, r *http.Request, body any, checkOnly bool) (answers []T, refused []peerRefusal, failed []string) {
	var data []byte
	if body != nil {
		data, _ = json.Marshal(body)
	}
	path := r.URL.EscapedPath()
	if checkOnly {
		path += "?" + url.Values{checkParam: {"1"}}.Encode()
	}
	for _, pa := range a.b.node.Spread(r.Context(), r.Method, path, data) {
		if pa.Err != nil {
			failed = append(failed, pa.Node+": "+pa.Err.Error())
			continue
		}
		if pa.Status != http.StatusOK {
			var e Error
			_ = json.Unmarshal(pa.Body, &e)
			refused = append(refused, peerRefusal{node: pa.Node, status: pa.Status, err: e.Error})
			continue
		}
		var v T
		if err := json.Unmarshal(pa.Body, &v); err != nil {
			failed = append(failed, fmt.Sprintf("%s: bad answer: %v", pa.Node, err))
			continue
		}
		answers = append(answers, v)
	}
	return answers, refused, failed
}

// spreadable reports whether method and path name a change nodes spread
// to each other: a purge, a group delete, a replay or a client's
// disconnect (clients.go).
func spreadable(method, path string) bool {
	path, _, _ = strings.Cut(path, "?")
	if id, ok := strings.CutPrefix(path, "/api/v1/clients/"); ok {
		return method == http.MethodDelete && id != "" && !strings.Contains(id, "/")
	}
	rest, ok := strings.CutPrefix(path, "/api/v1/queues/")
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	switch {
	case method == http.MethodPost && (len(parts) == 2 && parts[1] == "purge" || len(parts) == 3 && parts[1] == "dlq" && parts[2] == "purge"),
		method == http.MethodPost && len(parts) == 3 && parts[1] == "dlq" && parts[2] == "replay":
		return true
	case method == http.MethodDelete && (len(parts) == 3 && parts[1] == "groups" || len(parts) == 4 && parts[1] == "dlq" && parts[2] == "groups"),
		method == http.MethodPost && len(parts) == 4 && parts[1] == "groups" && parts[3] == "seek":
		return true
	}
	return false
}

// checking reports whether r is a check another node spreads.
func (a *adminAPI) checking(r *http.Request) bool {
	return r.Header.Get(localHeader) != "" && r.URL.Query().Get(checkParam) != ""
}

// unreached returns the partitions of q (from need) that are not in done,
// or nil.
func unreached(need, done []int) []int {
	var out []int
	for _, p := range need {
		if !slices.Contains(done, p) {
			out = append(out, p)
		}
	}
	return out
}

// allPartitions returns 0..n-1.
func allPartitions(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// unreachedError says which partitions of q no node acted on, who owns
// them, and why the other nodes did not answer.
func (a *adminAPI) unreachedError(q *queue.Queue, parts []int, refused []peerRefusal, failed []string) error {
	owners := map[int]string{}
	for _, p := range a.b.node.Status().Partitions {
		if p.Queue == queue.ParentName(q.Name()) && p.Owner != "" {
			owners[p.Partition] = p.Owner
		}
	}
	names := make([]string, len(parts))
	for i, p := range parts {
		owner := owners[p]
		if owner == "" {
			owner = "none"
		}
		names[i] = fmt.Sprintf("%s/%d (owner %s)", q.Name(), p, owner)
	}
	why := slices.Clone(failed)
	for _, rf := range refused {
		why = append(why, fmt.Sprintf("%s: HTTP %d: %s", rf.node, rf.status, rf.err))
	}
	because := ""
	if len(why) > 0 {
		because = " (" + strings.Join(why, "; ") + ")"
	}
	return fmt.Errorf("%w: partitions %s were not reached%s", queue.ErrNotOwned, strings.Join(names, ", "), because)
}
