package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/queue"
)

// The admin API, under /api/v1/ on the HTTP address. Every answer is JSON;
// an error is {"error": "..."} with its HTTP status. When http.admin_token
// is set, every call needs credentials (adminauth.go): the token as a
// bearer token, or a user's name and password (HTTP Basic) with an ACL
// rule granting admin on the queue. Each call checks all of its input
// before it changes anything.
//
//	GET    /api/v1/queues                            every queue: settings and figures
//	GET    /api/v1/queues/{q}                        one queue with its partitions and groups
//	PUT    /api/v1/queues/{q}                        create or change a queue (settings, persisted)
//	DELETE /api/v1/queues/{q}                        delete a queue with its groups and its DLQ
//	GET    /api/v1/queues/{q}/messages               peek: ?partition=P&from=OFFSET&limit=N; or find: ?key=K or ?id=P-O (search.go)
//	POST   /api/v1/queues/{q}/messages               publish a message (publish.go)
//	GET    /api/v1/queues/{q}/consumers              the clients consuming it (clients.go)
//	POST   /api/v1/queues/{q}/purge                  delete every message
//	DELETE /api/v1/queues/{q}/groups/{g}             delete a consumer group
//	POST   /api/v1/queues/{q}/dlq/replay             replay dead letters: {"ids": [...]} or all
//	GET    /api/v1/queues/{q}/dlq                    the dead-letter queue, and the same
//	GET    /api/v1/queues/{q}/dlq/messages           calls on it
//	POST   /api/v1/queues/{q}/dlq/purge
//	DELETE /api/v1/queues/{q}/dlq/groups/{g}
//	POST   /api/v1/queues/{q}/groups/{g}/seek        move a group: {"to": ..., "force": bool} (seek.go)
//	GET    /api/v1/clients                           connected clients: ?node=&user=&limit= (clients.go)
//	DELETE /api/v1/clients/{id}                      disconnect a client
//	GET    /api/v1/retained                          retained messages: ?prefix=&limit= (retained.go)
//	GET    /api/v1/cluster                           the nodes and each partition's owner (clusterapi.go)
//
// In a cluster, the reads of queues (the list, a queue, a peek) gather
// every node's figures (clusterapi.go), a declare goes to the cluster's
// catalog, and purge, group delete and replay act on every node's
// partitions (clusterchange.go); a queue delete removes the queue from
// the cluster, every node forgetting its copy (cluster.Node.DeleteQueue).

// Peek limits.
const (
	defaultPeek = 10
	maxPeek     = 1000
)

// maxBody bounds a request body.
const maxBody = 1 << 20

// adminAPI serves /api/v1/.
type adminAPI struct {
	b   *Broker
	log *slog.Logger
}

// apiRoute is a path of the admin API and its handler for each method.
type apiRoute struct {
	path    string
	methods map[string]http.HandlerFunc
}

// mount adds the admin API's routes to mux, each behind guard.
func (a *adminAPI) mount(mux *http.ServeMux) {
	for _, r := range a.routes() {
		var allow []string
		for method, h := range r.methods {
			mux.HandleFunc(method+" "+r.path, a.guard(h))
			allow = append(allow, method)
		}
		slices.Sort(allow)
		if !slices.Contains(allow, "GET") {
			// GET also matches HEAD; other methods get a 405 below.
			mux.HandleFunc("GET "+r.path, a.guard(a.notAllowed(allow)))
		}
		mux.HandleFunc(r.path, a.guard(a.notAllowed(allow)))
	}
	mux.HandleFunc("/api/v1/", a.guard(func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, r, http.StatusNotFound, fmt.Errorf("no such endpoint: %s %s", r.Method, r.URL.Path))
	}))
}

// routes are the admin API's paths and handlers (docs/openapi.yaml).
func (a *adminAPI) routes() []apiRoute {
	return []apiRoute{
		{"/api/v1/queues", map[string]http.HandlerFunc{"GET": a.listQueues}},
		{"/api/v1/queues/{queue}", map[string]http.HandlerFunc{"GET": a.showQueue(false), "PUT": a.mutating(a.declare), "DELETE": a.mutating(a.deleteQueue)}},
		{"/api/v1/queues/{queue}/messages", map[string]http.HandlerFunc{"GET": a.messages(false), "POST": a.mutating(a.publish)}},
		{"/api/v1/queues/{queue}/history", map[string]http.HandlerFunc{"GET": a.showHistory}},
		{"/api/v1/queues/{queue}/consumers", map[string]http.HandlerFunc{"GET": a.queueConsumers}},
		{"/api/v1/queues/{queue}/purge", map[string]http.HandlerFunc{"POST": a.mutating(a.purge(false))}},
		{"/api/v1/queues/{queue}/groups/{group}", map[string]http.HandlerFunc{"DELETE": a.mutating(a.deleteGroup(false))}},
		{"/api/v1/queues/{queue}/groups/{group}/seek", map[string]http.HandlerFunc{"POST": a.mutating(a.seek)}},
		{"/api/v1/queues/{queue}/dlq", map[string]http.HandlerFunc{"GET": a.showQueue(true)}},
		{"/api/v1/queues/{queue}/dlq/messages", map[string]http.HandlerFunc{"GET": a.messages(true)}},
		{"/api/v1/queues/{queue}/dlq/purge", map[string]http.HandlerFunc{"POST": a.mutating(a.purge(true))}},
		{"/api/v1/queues/{queue}/dlq/groups/{group}", map[string]http.HandlerFunc{"DELETE": a.mutating(a.deleteGroup(true))}},
		{"/api/v1/queues/{queue}/dlq/replay", map[string]http.HandlerFunc{"POST": a.mutating(a.replay)}},
		{"/api/v1/clients", map[string]http.HandlerFunc{"GET": a.listClients}},
		{"/api/v1/retained", map[string]http.HandlerFunc{"GET": a.listRetained}},
		{"/api/v1/clients/{client}", map[string]http.HandlerFunc{"DELETE": a.mutating(a.disconnectClient)}},
		{"/api/v1/cluster", map[string]http.HandlerFunc{"GET": a.clusterStatus}},
		{"/api/v1/cluster/nodes/{node}/drain", map[string]http.HandlerFunc{"POST": a.mutating(a.clustered(a.drain(true)))}},
		{"/api/v1/cluster/nodes/{node}/undrain", map[string]http.HandlerFunc{"POST": a.mutating(a.clustered(a.drain(false)))}},
		{"/api/v1/cluster/placement", map[string]http.HandlerFunc{"GET": a.placement, "PUT": a.mutating(a.clustered(a.setPlacement))}},
	}
}

func (a *adminAPI) notAllowed(allow []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		a.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed here (allowed: %s)", r.Method, strings.Join(allow, ", ")))
	}
}

// mutating bounds the body of a call that changes something (guard has
// checked its credentials).
func (a *adminAPI) mutating(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		h(w, r)
	}
}

// resolve returns the queue the path names (its dead-letter queue with
// dlq), or writes the error.
func (a *adminAPI) resolve(w http.ResponseWriter, r *http.Request, dlq bool) *queue.Queue {
	name := r.PathValue("queue")
	if err := queue.CheckQueueName(name); err != nil {
		a.fail(w, r, http.StatusBadRequest, fmt.Errorf("%w: %v", queue.ErrInvalidName, err))
		return nil
	}
	q := a.b.manager.Queue(name)
	if q == nil {
		a.fail(w, r, http.StatusNotFound, fmt.Errorf("%w: %s", queue.ErrNoSuchQueue, name))
		return nil
	}
	if dlq {
		q = q.DLQ()
	}
	return q
}

func (a *adminAPI) listQueues(w http.ResponseWriter, r *http.Request) {
	sources := a.sources()
	list := QueueList{Node: a.b.cfg.NodeID, Queues: []QueueView{}}
	for _, q := range a.b.manager.Queues() {
		if q.IsDLQ() {
			continue
		}
		v := a.view(q, false)
		v.Node = ""
		v.Source = sources(q.Name())
		list.Queues = append(list.Queues, v)
	}
	slices.SortFunc(list.Queues, func(x, y QueueView) int { return strings.Compare(x.Name, y.Name) })
	if a.gathering(r) {
		a.gatherList(r, &list)
	}
	a.reply(w, http.StatusOK, list)
}

func declared(m map[string]queue.Options, name string) bool {
	_, ok := m[name]
	return ok
}

func (a *adminAPI) showQueue(dlq bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := a.resolve(w, r, dlq)
		if q == nil {
			return
		}
		v := a.view(q, true)
		if !dlq {
			v.Source = a.sources()(q.Name())
		}
		if a.gathering(r) {
			a.gatherQueue(r, &v, queue.ParentName(q.Name()))
		}
		a.reply(w, http.StatusOK, v)
	}
}

// sources returns where each queue's settings come from.
func (a *adminAPI) sources() func(string) string {
	runtime, err := a.b.manager.DeclaredAtRuntime()
	if err != nil {
		a.log.Warn("reading queue metadata failed", "err", err)
	}
	return func(name string) string {
		switch {
		case runtime[name]:
			return "api"
		case declared(a.b.cfg.Queues.Declared, name):
			return "config"
		default:
			return "defaults"
		}
	}
}

// view returns the queue's figures; with detail, per partition too. The
// view of a queue includes its dead-letter queue's. In a cluster, the
// figures are those of the partitions this node serves.
func (a *adminAPI) view(q *queue.Queue, detail bool) QueueView {
	info := q.Info()
	a.ownFigures(q, &info)
	now := time.Now()
	c := info.Counts
	v := QueueView{
		Node: a.b.cfg.NodeID, Name: info.Name, Settings: settingsOf(info.Options), Depth: info.Depth(),
		Groups: []GroupView{},
		Counts: CountsView{Enqueued: c.Enqueued, Delivered: c.Delivered, Redelivered: c.Redelivered, Acked: c.Acked,
			Nacked: c.Nacked, Released: c.Released, Rejected: c.Rejected, DeadLettered: c.DeadLettered, Expired: c.Expired,
			LeasesLost: c.LeasesLost, Deduplicated: c.Deduplicated, Dropped: c.Dropped},
		Rates: a.b.history.rates(info.Name, now),
	}
	if a.b.node != nil {
		// What applies in the cluster, the defaults included.
		v.Settings.ReplicationFactor, v.Settings.AckPolicy = a.b.node.Replication(info.Name)
	}
	if detail {
		for _, p := range info.Partitions {
			pv := PartitionView{Partition: p.Partition, Shard: p.Shard,
				First: p.First, Next: p.Next, Committed: p.Committed, Depth: p.Depth()}
			if a.b.node != nil && a.served(q, p.Partition) {
				pv.Node = a.b.cfg.NodeID
			}
			v.Partitions = append(v.Partitions, pv)
		}
	}
	for _, g := range info.Groups {
		gv := GroupView{Name: g.Name, Consumers: g.Consumers, Lag: g.Lag(), Leased: g.Leased(), OldestUnsettledAge: ageOf(g.OldestUnsettled(), now),
			Filter: g.Filter, Filtered: g.Counts.Filtered}
		if detail {
			for _, p := range g.Partitions {
				gv.Partitions = append(gv.Partitions, GroupPartitionView{Partition: p.Partition, Floor: p.Floor,
					SettledAboveFloor: p.SettledAboveFloor, Lag: p.Lag, Leased: p.Leased, OldestUnsettledAge: ageOf(p.OldestUnsettled, now)})
			}
		}
		v.Groups = append(v.Groups, gv)
	}
	if d := q.DLQ(); d != nil {
		dv := a.view(d, detail)
		dv.Node = ""
		v.DLQ = &dv
	}
	return v
}

func ageOf(t, now time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(0, now.Sub(t).Seconds())
}

// declare creates or changes a queue: the body's settings over the
// queue's current ones (or, for a new queue, the config's for that name).
func (a *adminAPI) declare(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if err := queue.CheckQueueName(name); err != nil {
		a.fail(w, r, http.StatusBadRequest, fmt.Errorf("%w: %v", queue.ErrInvalidName, err))
		return
	}
	base, _ := a.b.cfg.QueueOptions(name)
	if q := a.b.manager.Queue(name); q != nil {
		base = q.Options()
	}
	s := settingsOf(base)
	if err := decodeBody(r, &s, false); err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	q, created, err := a.b.declare(r.Context(), name, s.Options())
	if err != nil {
		a.failErr(w, r, err)
		return
	}
	v := a.view(q, true)
	v.Source = "api"
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	a.reply(w, status, v)
}

// deleteQueue deletes a queue with its groups and its dead-letter queue
// (queue.Manager.DeleteQueue): durable before it answers.
func (a *adminAPI) deleteQueue(w http.ResponseWriter, r *http.Request) {
	q := a.resolve(w, r, false)
	if q == nil {
		return
	}
	if err := decodeBody(r, nil, true); err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if a.b.node != nil {
		a.deleteClusterQueue(w, r, q)
		return
	}
	depth, dlqDepth := q.Info().Depth(), q.DLQ().Info().Depth()
	if err := a.b.manager.DeleteQueue(r.Context(), q.Name()); err != nil {
		a.failErr(w, r, err)
		return
	}
	a.log.Info("queue deleted over the admin API", "queue", q.Name(), "messages", depth, "dead_letters", dlqDepth)
	a.reply(w, http.StatusOK, QueueDeleted{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: depth, DeadLetters: dlqDepth})
}

// deleteClusterQueue deletes q from the cluster: the figures it answers
// are those every node gave just before (the partitions of a node down
// are not counted), and it names the nodes that had yet to forget the
// queue when it answered (those down forget it as they start).
func (a *adminAPI) deleteClusterQueue(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	v := a.view(q, false)
	a.gatherQueue(r, &v, q.Name())
	var dlqDepth uint64
	if v.DLQ != nil {
		dlqDepth = v.DLQ.Depth
	}
	done, err := a.b.node.DeleteQueue(r.Context(), q.Name())
	if err != nil {
		a.failErr(w, r, err)
		return
	}
	a.log.Info("queue deleted from the cluster over the admin API", "queue", q.Name(), "messages", v.Depth, "dead_letters", dlqDepth, "pending", done.Pending)
	a.reply(w, http.StatusOK, QueueDeleted{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: v.Depth, DeadLetters: dlqDepth, Pending: done.Pending, NodesMissing: v.NodesMissing})
}

func (a *adminAPI) peek(dlq bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := a.resolve(w, r, dlq)
		if q == nil {
			return
		}
		parts := q.Info().Partitions
		qv := r.URL.Query()
		limit, err := intParam(qv.Get("limit"), "limit", defaultPeek, 1, maxPeek)
		if err != nil {
			a.fail(w, r, http.StatusBadRequest, err)
			return
		}
		var from uint64
		if s := qv.Get("from"); s != "" {
			if qv.Get("partition") == "" {
				a.fail(w, r, http.StatusBadRequest, errors.New("from needs partition"))
				return
			}
			if from, err = strconv.ParseUint(s, 10, 64); err != nil {
				a.fail(w, r, http.StatusBadRequest, fmt.Errorf("from: want an offset, got %q", s))
				return
			}
		}
		which := make([]int, len(parts))
		for i := range which {
			which[i] = i
		}
		if s := qv.Get("partition"); s != "" {
			p, err := intParam(s, "partition", 0, 0, len(parts)-1)
			if err != nil {
				a.fail(w, r, http.StatusBadRequest, err)
				return
			}
			which = []int{p}
		}
		list := MessageList{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: []MessageView{}}
		for _, p := range which {
			n := limit - len(list.Messages)
			if n == 0 {
				break
			}
			if !a.served(q, p) {
				continue // in a cluster, another node's
			}
			msgs, err := q.Peek(r.Context(), p, from, n)
			if err != nil {
				a.failErr(w, r, err)
				return
			}
			for _, m := range msgs {
				list.Messages = append(list.Messages, messageView(q.Name(), p, m))
			}
		}
		if a.gathering(r) {
			a.gatherPeek(r, &list, q.Name(), limit)
		}
		a.reply(w, http.StatusOK, list)
	}
}

func messageView(queueName string, partition int, m *queue.Message) MessageView {
	v := MessageView{
		ID: queue.MessageID(partition, m.Offset), Partition: partition, Offset: m.Offset,
		Topic: queue.TopicName(queueName, m.Subject), Key: m.Key, EnqueuedAt: m.EnqueuedAt,
		ContentType: m.Headers.ContentType, ResponseTopic: m.Headers.ResponseTopic,
		CorrelationData: m.Headers.CorrelationData, Payload: m.Payload,
	}
	if v.Payload == nil {
		v.Payload = []byte{}
	}
	if !m.NotBefore.IsZero() {
		t := m.NotBefore
		v.NotBefore = &t
	}
	if !m.ExpiresAt.IsZero() {
		t := m.ExpiresAt
		v.ExpiresAt = &t
	}
	for _, u := range m.Headers.User {
		v.UserProperties = append(v.UserProperties, Property{Name: u.Name, Value: u.Value})
	}
	if dl := m.DeadLetter; dl != nil {
		v.DeadLetter = &DeadLetterView{Reason: dl.Reason, OriginalID: dl.OriginalID, OriginalTopic: dl.OriginalTopic,
			Deliveries: dl.Deliveries, Group: dl.Group}
	}
	return v
}

func (a *adminAPI) purge(dlq bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := a.resolve(w, r, dlq)
		if q == nil {
			return
		}
		if err := decodeBody(r, nil, true); err != nil {
			a.fail(w, r, http.StatusBadRequest, err)
			return
		}
		res, err := q.Purge(r.Context())
		if err != nil {
			a.failErr(w, r, err)
			return
		}
		out := PurgeResult{Node: a.b.cfg.NodeID, Queue: q.Name(), Purged: res.Messages, Partitions: res.Partitions}
		if a.gathering(r) {
			others, refused, failed := spread[PurgeResult](a, r, nil, false)
			for _, o := range others {
				out.Purged += o.Purged
				out.Partitions = append(out.Partitions, o.Partitions...)
			}
			slices.Sort(out.Partitions)
			if missing := unreached(allPartitions(len(q.Info().Partitions)), out.Partitions); missing != nil {
				err := a.unreachedError(q, missing, refused, failed)
				a.logFailure(r, http.StatusServiceUnavailable, err)
				a.reply(w, http.StatusServiceUnavailable, Error{Error: err.Error() + "; the partitions listed in purge were purged: purge again once every partition has an owner", Purge: &out})
				return
			}
		}
		a.reply(w, http.StatusOK, out)
	}
}

func (a *adminAPI) deleteGroup(dlq bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := a.resolve(w, r, dlq)
		if q == nil {
			return
		}
		g := r.PathValue("group")
		if a.checking(r) {
			// Another node asks before it deletes.
			err := q.CheckDeleteGroup(g)
			if err != nil && !errors.Is(err, queue.ErrNoSuchGroup) {
				a.failErr(w, r, err)
				return
			}
			a.reply(w, http.StatusOK, groupCheck{Partitions: a.servedOf(q), Found: err == nil})
			return
		}
		if !a.gathering(r) {
			parts, err := q.DeleteGroup(r.Context(), g)
			switch {
			case errors.Is(err, queue.ErrNoSuchGroup) && r.Header.Get(localHeader) != "":
				// Spread by another node: this one has nothing of the group.
				a.reply(w, http.StatusOK, GroupDeleted{Node: a.b.cfg.NodeID, Queue: q.Name(), Group: g, Partitions: a.servedOf(q)})
			case err != nil:
				a.failErr(w, r, err)
			default:
				a.reply(w, http.StatusOK, GroupDeleted{Node: a.b.cfg.NodeID, Queue: q.Name(), Group: g, Partitions: parts})
			}
			return
		}
		a.deleteGroupEverywhere(w, r, q, g)
	}
}

// groupCheckWait bounds how long a group delete waits for every partition
// of its queue to be served (a leadership moving), asking every
// groupCheckRetry; as long as a publish waits for its partition.
const (
	groupCheckWait  = 5 * time.Second
	groupCheckRetry = 200 * time.Millisecond
)

// groupCheck is a node's answer to the check before a group delete: the
// partitions it serves, and whether it has the group.
type groupCheck struct {
	Partitions []int `json:"partitions"`
	Found      bool  `json:"found"`
}

// deleteGroupEverywhere deletes group g of q on every node, once every
// node has said it may: none has consumers of it connected, and between
// them they serve every partition.
func (a *adminAPI) deleteGroupEverywhere(w http.ResponseWriter, r *http.Request, q *queue.Queue, g string) {
	// A partition whose leadership is moving has no node serving it for
	// a moment: the check is asked again until every partition is
	// served, for as long as a publish waits for one (MoveWait).
	all := allPartitions(len(q.Info().Partitions))
	deadline := time.Now().Add(groupCheckWait)
	var check groupCheck
	for {
		check = groupCheck{Partitions: a.servedOf(q)}
		err := q.CheckDeleteGroup(g)
		if err != nil && !errors.Is(err, queue.ErrNoSuchGroup) {
			a.failErr(w, r, err)
			return
		}
		check.Found = err == nil
		checks, refused, failed := spread[groupCheck](a, r, nil, true)
		for _, rf := range refused {
			if rf.status == http.StatusNotFound {
				continue // the queue is not there yet: it serves none of it
			}
			a.fail(w, r, rf.status, fmt.Errorf("node %s: %s", rf.node, rf.err))
			return
		}
		for _, o := range checks {
			check.Found = check.Found || o.Found
			check.Partitions = append(check.Partitions, o.Partitions...)
		}
		missing := unreached(all, check.Partitions)
		if missing == nil {
			break
		}
		if time.Now().After(deadline) || r.Context().Err() != nil {
			err := a.unreachedError(q, missing, refused, failed)
			a.fail(w, r, http.StatusServiceUnavailable, fmt.Errorf("%w; nothing was deleted", err))
			return
		}
		select {
		case <-r.Context().Done():
		case <-time.After(groupCheckRetry):
		}
	}
	if !check.Found {
		a.failErr(w, r, fmt.Errorf("%w: %q in queue %s", queue.ErrNoSuchGroup, g, q.Name()))
		return
	}
	out := GroupDeleted{Node: a.b.cfg.NodeID, Queue: q.Name(), Group: g, Partitions: a.servedOf(q)}
	parts, err := q.DeleteGroup(r.Context(), g)
	switch {
	case errors.Is(err, queue.ErrNoSuchGroup):
	case err != nil:
		a.failErr(w, r, err)
		return
	default:
		out.Partitions = parts
	}
	others, refused, failed := spread[GroupDeleted](a, r, nil, false)
	for _, o := range others {
		out.Partitions = append(out.Partitions, o.Partitions...)
	}
	slices.Sort(out.Partitions)
	if missing := unreached(all, out.Partitions); missing != nil {
		err := a.unreachedError(q, missing, refused, failed)
		a.fail(w, r, http.StatusServiceUnavailable, fmt.Errorf("%w; the group was deleted from the other partitions: delete it again once every partition has an owner", err))
		return
	}
	a.reply(w, http.StatusOK, out)
}

// servedOf returns the partitions of q this node serves.
func (a *adminAPI) servedOf(q *queue.Queue) []int {
	out := []int{}
	for p := range len(q.Info().Partitions) {
		if a.served(q, p) {
			out = append(out, p)
		}
	}
	return out
}

func (a *adminAPI) replay(w http.ResponseWriter, r *http.Request) {
	q := a.resolve(w, r, false)
	if q == nil {
		return
	}
	var req ReplayRequest
	if err := decodeBody(r, &req, true); err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	var ids []string
	if req.IDs != nil {
		if ids = *req.IDs; len(ids) == 0 {
			a.fail(w, r, http.StatusBadRequest, errors.New("ids is empty; leave it out to replay every dead letter"))
			return
		}
	}
	if a.checking(r) {
		served, err := q.CheckReplay(ids)
		if err != nil {
			a.failErr(w, r, err)
			return
		}
		a.reply(w, http.StatusOK, ReplayResult{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: []ReplayedLetter{}, Partitions: served})
		return
	}
	need := allPartitions(len(q.DLQ().Info().Partitions))
	if a.gathering(r) && ids != nil {
		// Every id is checked, by the node serving its partition, before
		// any is replayed.
		served, err := q.CheckReplay(ids)
		if err != nil {
			a.failErr(w, r, err)
			return
		}
		others, refused, failed := spread[ReplayResult](a, r, req, true)
		for _, rf := range refused {
			a.fail(w, r, rf.status, fmt.Errorf("node %s: %s", rf.node, rf.err))
			return
		}
		for _, o := range others {
			served = append(served, o.Partitions...)
		}
		need = need[:0]
		for _, id := range ids {
			p, _, _ := queue.ParseMessageID(id)
			if !slices.Contains(need, p) {
				need = append(need, p)
			}
		}
		if missing := unreached(need, served); missing != nil {
			err := a.unreachedError(q.DLQ(), missing, refused, failed)
			a.fail(w, r, http.StatusServiceUnavailable, fmt.Errorf("%w; nothing was replayed", err))
			return
		}
	}
	// A replay copies dead letters into the queue: refused, like a
	// publish, below storage.min_free_bytes.
	if err := a.b.disk.admit(q.Name()); err != nil {
		a.failErr(w, r, err)
		return
	}
	done, err := q.ReplayDLQ(r.Context(), ids)
	res := ReplayResult{Node: a.b.cfg.NodeID, Queue: q.Name(), Messages: []ReplayedLetter{}, Partitions: done.Partitions}
	for _, d := range done.Letters {
		res.Messages = append(res.Messages, ReplayedLetter{DLQID: d.DLQID, ID: d.ID})
	}
	if err == nil && a.gathering(r) {
		others, refused, failed := spread[ReplayResult](a, r, req, false)
		for _, o := range others {
			res.Messages = append(res.Messages, o.Messages...)
			res.Partitions = append(res.Partitions, o.Partitions...)
		}
		slices.Sort(res.Partitions)
		if missing := unreached(need, res.Partitions); missing != nil {
			err = fmt.Errorf("%w; the dead letters listed in replay were replayed: replay again once every partition has an owner", a.unreachedError(q.DLQ(), missing, refused, failed))
		} else if len(refused) > 0 {
			err = fmt.Errorf("node %s: HTTP %d: %s", refused[0].node, refused[0].status, refused[0].err)
		}
	}
	res.Replayed = len(res.Messages)
	if err != nil {
		status := statusOf(err)
		a.logFailure(r, status, err)
		doc := Error{Error: err.Error()}
		if len(res.Messages) > 0 {
			doc.Replay = &res
		}
		a.reply(w, status, doc)
		return
	}
	a.reply(w, http.StatusOK, res)
}

// decodeBody decodes the JSON body into v, refusing unknown fields. With
// optional, an empty body is fine (v keeps its values); v nil takes no
// body but an empty JSON object.
func decodeBody(r *http.Request, v any, optional bool) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if optional {
			return nil
		}
		return errors.New("want a JSON object in the body")
	}
	if v == nil {
		v = &struct{}{}
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return unknownField(v, strings.Trim(name, `"`))
		}
		return fmt.Errorf("bad JSON body: %w", err)
	}
	if dec.More() {
		return errors.New("bad JSON body: more than one JSON value")
	}
	return nil
}

// intParam parses a query parameter; empty gives def.
func intParam(s, name string, def, lo, hi int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: want a number from %d to %d, got %q", name, lo, hi, s)
	}
	return n, nil
}

// statusOf maps a domain error to its HTTP status.
func statusOf(err error) int {
	var fe *queue.FieldError
	switch {
	case errors.Is(err, queue.ErrNoSuchQueue), errors.Is(err, queue.ErrNoSuchGroup), errors.Is(err, queue.ErrUnknownMessage):
		return http.StatusNotFound
	case errors.Is(err, queue.ErrBadMessageID), errors.Is(err, queue.ErrInvalidName), errors.Is(err, queue.ErrInvalidGroup),
		errors.Is(err, queue.ErrBadPartitions), errors.Is(err, queue.ErrBadSeek), errors.As(err, &fe):
		return http.StatusBadRequest
	case errors.Is(err, queue.ErrPartitionsChanged), errors.Is(err, queue.ErrGrowInCluster), errors.Is(err, queue.ErrGroupActive), errors.Is(err, cluster.ErrReplicationChange):
		return http.StatusConflict
	case errors.Is(err, queue.ErrQueueFull), errors.Is(err, queue.ErrStorageFull), errors.Is(err, queue.ErrClosed), errors.Is(err, queue.ErrNotOwned),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (a *adminAPI) failErr(w http.ResponseWriter, r *http.Request, err error) {
	a.fail(w, r, statusOf(err), err)
}

func (a *adminAPI) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	a.logFailure(r, status, err)
	a.reply(w, status, Error{Error: err.Error()})
}

// logFailure logs server-side failures; a client's bad request is not the
// server's error.
func (a *adminAPI) logFailure(r *http.Request, status int, err error) {
	if status >= 500 {
		a.log.Error("admin call failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
		return
	}
	a.log.Debug("admin call refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
}

func (a *adminAPI) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		a.log.Debug("writing an admin answer failed", "err", err)
	}
}

// unknownField says which fields v takes, and the one name most likely
// meant.
func unknownField(v any, name string) error {
	var known []string
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct {
		for i := range t.NumField() {
			tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if tag != "" && tag != "-" {
				known = append(known, tag)
			}
		}
	}
	if len(known) == 0 {
		return fmt.Errorf("unknown field %q: this call takes no fields", name)
	}
	best, bestDist := "", 3 // a guess only within two edits
	for _, k := range known {
		if d := editDistance(name, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return fmt.Errorf("unknown field %q: did you mean %q? (fields: %s)", name, best, strings.Join(known, ", "))
	}
	return fmt.Errorf("unknown field %q (fields: %s)", name, strings.Join(known, ", "))
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
