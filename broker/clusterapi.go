package broker

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/queue"
)

// The admin API in a cluster: GET /api/v1/cluster, and the reads of the
// queues gathered from every node. Each partition is counted by the node
// that serves it (its owner); the node asked adds the other members'
// figures to its own. A node that does not answer, or that owns partitions
// and is down, is named in nodes_missing; the figures lack its partitions.

// ClusterView is the answer to GET /api/v1/cluster. A single node answers
// too: itself, up, owning every partition (clustered false).
type ClusterView struct {
	Node      string `json:"node"`
	Clustered bool   `json:"clustered"`
	cluster.Status
}

// localHeader marks an admin read another node gathers: it is answered
// with this node's own figures.
const localHeader = "X-Shardq-Local"

func (a *adminAPI) clusterStatus(w http.ResponseWriter, r *http.Request) {
	v := ClusterView{Node: a.b.cfg.NodeID}
	if n := a.b.node; n != nil {
		v.Clustered = true
		v.Status = n.Status()
	} else {
		v.Status = a.singleNodeStatus()
	}
	a.reply(w, http.StatusOK, v)
}

// clustered refuses h on a single node: it changes the cluster's
// placement.
func (a *adminAPI) clustered(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.b.node == nil {
			a.fail(w, r, http.StatusConflict, fmt.Errorf("%s %s needs a cluster: this node runs alone (start it with --etcd to join one)", r.Method, r.URL.Path))
			return
		}
		h(w, r)
	}
}

// DrainView answers POST /api/v1/cluster/nodes/{node}/drain and
// /undrain.
type DrainView struct {
	Node    string `json:"node"`
	Drained bool   `json:"drained"`
}

func (a *adminAPI) drain(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		node := r.PathValue("node")
		if err := a.b.node.Drain(r.Context(), node, on); err != nil {
			a.failCluster(w, r, err)
			return
		}
		a.reply(w, http.StatusOK, DrainView{Node: node, Drained: on})
	}
}

// PlacementView is the cluster's placement: GET and PUT
// /api/v1/cluster/placement. The first rule whose queues pattern matches
// a queue's name gives the nodes its partitions live on; a queue no rule
// matches lives on any node.
type PlacementView struct {
	Rules []PlacementRuleView `json:"rules"`
}

// PlacementRuleView is one placement rule.
type PlacementRuleView struct {
	// Queues is a glob of queue names; or Tenants names the tenants whose
	// queues the rule places.
	Queues  string   `json:"queues,omitempty" yaml:"queues"`
	Tenants []string `json:"tenants,omitempty" yaml:"tenants"`
	Nodes   []string `json:"nodes" yaml:"nodes"`
}

func (a *adminAPI) placement(w http.ResponseWriter, r *http.Request) {
	v := PlacementView{Rules: []PlacementRuleView{}}
	if a.b.node != nil {
		for _, rule := range a.b.node.Placement() {
			v.Rules = append(v.Rules, PlacementRuleView{Queues: rule.Queues, Tenants: rule.Tenants, Nodes: rule.Nodes})
		}
	}
	a.reply(w, http.StatusOK, v)
}

func (a *adminAPI) setPlacement(w http.ResponseWriter, r *http.Request) {
	var v PlacementView
	if err := decodeBody(r, &v, false); err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	rules := make([]cluster.PlacementRule, 0, len(v.Rules))
	for i, rule := range v.Rules {
		rules = append(rules, cluster.PlacementRule{Name: fmt.Sprintf("rules[%d] (%s)", i, cluster.PlacementRule{Queues: rule.Queues, Tenants: rule.Tenants}.What()), Queues: rule.Queues, Tenants: rule.Tenants, Nodes: rule.Nodes})
	}
	if err := a.b.node.SetPlacement(r.Context(), rules); err != nil {
		a.failCluster(w, r, err)
		return
	}
	if v.Rules == nil {
		v.Rules = []PlacementRuleView{}
	}
	a.reply(w, http.StatusOK, v)
}

// failCluster answers a refused change of the cluster: bad input is 400,
// an unknown node 404, etcd out of reach 503.
func (a *adminAPI) failCluster(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, cluster.ErrBadPlacement):
		a.fail(w, r, http.StatusBadRequest, err)
	case errors.Is(err, cluster.ErrUnknownNodeID):
		a.fail(w, r, http.StatusNotFound, err)
	case errors.Is(err, queue.ErrNotOwned):
		a.fail(w, r, http.StatusServiceUnavailable, err)
	default:
		a.failErr(w, r, err)
	}
}

// singleNodeStatus is the cluster document of a single node.
func (a *adminAPI) singleNodeStatus() cluster.Status {
	id := a.b.cfg.NodeID
	st := cluster.Status{
		Nodes:      []cluster.NodeStatus{{ID: id, MQTT: a.b.addrs["mqtt"], HTTP: a.b.HTTPAddr(), State: cluster.StateUp}},
		Partitions: []cluster.PartitionStatus{},
	}
	qs := a.b.manager.Queues()
	slices.SortFunc(qs, func(x, y *queue.Queue) int { return strings.Compare(x.Name(), y.Name()) })
	for _, q := range qs {
		if q.IsDLQ() {
			continue
		}
		for p := range q.Partitions() {
			st.Partitions = append(st.Partitions, cluster.PartitionStatus{Queue: q.Name(), Partition: p,
				Owner: id, Epoch: 1, Replicas: []string{id}, Learners: []string{}, InSync: []string{id}})
			st.Nodes[0].Replicas++
			st.Nodes[0].Leads++
		}
	}
	return st
}

// peerAdmin returns what answers the admin reads other nodes gather and
// the changes they spread: the request goes through this node's admin
// API, with its admin token, and is answered with its own figures, or
// acts on the partitions this node serves. Only reads under /api/v1/, and
// the changes of clusterchange.go.
func (b *Broker) peerAdmin() func(ctx context.Context, method, path string, body []byte) (int, []byte) {
	var (
		once sync.Once
		mux  *http.ServeMux
	)
	refuse := func(status int, format string, args ...any) (int, []byte) {
		doc, _ := json.Marshal(Error{Error: fmt.Sprintf(format, args...)})
		return status, doc
	}
	return func(ctx context.Context, method, path string, body []byte) (int, []byte) {
		if !strings.HasPrefix(path, "/api/v1/") {
			return refuse(http.StatusNotFound, "no such endpoint: %s", path)
		}
		if method != http.MethodGet && !spreadable(method, path) {
			return refuse(http.StatusMethodNotAllowed, "%s %s is not spread to other nodes", method, path)
		}
		once.Do(func() {
			mux = http.NewServeMux()
			(&adminAPI{b: b, log: b.log.With("component", "admin")}).mount(mux)
		})
		req, err := http.NewRequestWithContext(ctx, method, "http://shardq"+path, bytes.NewReader(body))
		if err != nil {
			return refuse(http.StatusBadRequest, "bad path %q: %v", path, err)
		}
		req.Header.Set(localHeader, "1")
		if token := b.policy.Load().token; token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
}

// gathering reports whether a read is answered for the whole cluster.
func (a *adminAPI) gathering(r *http.Request) bool {
	return a.b.node != nil && r.Header.Get(localHeader) == ""
}

// served reports whether this node serves partition p of q: always on a
// single node.
func (a *adminAPI) served(q *queue.Queue, p int) bool {
	if a.b.node == nil {
		return true
	}
	_, ok := a.b.manager.Owned(queue.PartitionID{Queue: q.Name(), Partition: p})
	return ok
}

// ownFigures blanks the partitions of info this node does not serve: a
// cluster node has a copy of every queue, but only the owner's figures of
// a partition are current.
func (a *adminAPI) ownFigures(q *queue.Queue, info *queue.Info) {
	if a.b.node == nil {
		return
	}
	for i, p := range info.Partitions {
		if a.served(q, p.Partition) {
			continue
		}
		info.Partitions[i] = queue.PartitionInfo{Partition: p.Partition, Shard: p.Shard}
		for _, g := range info.Groups {
			for j, gp := range g.Partitions {
				if gp.Partition == p.Partition {
					g.Partitions[j] = queue.GroupPartitionInfo{Partition: gp.Partition}
				}
			}
		}
	}
}

// gather sends r's read to the other members and decodes each answer
// 200 into a T. Answers 404 (a queue not there yet) are left out; the
// nodes that failed, and those down that own partitions of queueName
// (every queue when ""), are returned as missing.
func gather[T any](a *adminAPI, r *http.Request, queueName string) (answers []T, missing []string) {
	for _, pa := range a.b.node.Gather(r.Context(), http.MethodGet, r.URL.RequestURI()) {
		switch {
		case pa.Err != nil:
			missing = append(missing, pa.Node+": "+pa.Err.Error())
		case pa.Status == http.StatusOK:
			var v T
			if err := json.Unmarshal(pa.Body, &v); err != nil {
				missing = append(missing, fmt.Sprintf("%s: bad answer: %v", pa.Node, err))
				continue
			}
			answers = append(answers, v)
		case pa.Status == http.StatusNotFound:
		default:
			var e Error
			_ = json.Unmarshal(pa.Body, &e)
			missing = append(missing, fmt.Sprintf("%s: HTTP %d: %s", pa.Node, pa.Status, e.Error))
		}
	}
	return answers, append(missing, a.downOwners(queueName)...)
}

// downOwners names the other nodes that own partitions of queueName
// (every queue when "") and are not members: their partitions are not
// served, and not counted.
func (a *adminAPI) downOwners(queueName string) []string {
	st := a.b.node.Status()
	up := map[string]bool{}
	for _, n := range st.Nodes {
		up[n.ID] = n.State != cluster.StateDown
	}
	var out []string
	seen := map[string]bool{a.b.cfg.NodeID: true}
	for _, p := range st.Partitions {
		if p.Owner == "" || seen[p.Owner] || up[p.Owner] || (queueName != "" && p.Queue != queueName) {
			continue
		}
		seen[p.Owner] = true
		out = append(out, p.Owner+": down")
	}
	slices.Sort(out)
	return out
}

// gatherList adds the other nodes' queues to list.
func (a *adminAPI) gatherList(r *http.Request, list *QueueList) {
	answers, missing := gather[QueueList](a, r, "")
	list.NodesMissing = missing
	at := map[string]int{}
	for i, q := range list.Queues {
		at[q.Name] = i
	}
	for _, o := range answers {
		for _, q := range o.Queues {
			if i, ok := at[q.Name]; ok {
				mergeQueue(&list.Queues[i], q)
				continue
			}
			at[q.Name] = len(list.Queues)
			list.Queues = append(list.Queues, q)
		}
	}
	slices.SortFunc(list.Queues, func(x, y QueueView) int { return strings.Compare(x.Name, y.Name) })
}

// gatherQueue adds the other nodes' figures of the queue to v.
func (a *adminAPI) gatherQueue(r *http.Request, v *QueueView, name string) {
	answers, missing := gather[QueueView](a, r, name)
	v.NodesMissing = missing
	for _, o := range answers {
		mergeQueue(v, o)
	}
}

// mergeQueue adds o, another node's view of the same queue, to v: depth,
// lag, leases and totals add up (each node counts only the partitions it
// serves), the oldest unsettled age is the largest, consumers the most
// any node counts (a consumer is known to every node: on its own, and on
// each other through its stream). Partitions and groups' partitions are
// taken from the node that serves them.
func mergeQueue(v *QueueView, o QueueView) {
	v.Depth += o.Depth
	addCounts(&v.Counts, o.Counts)
	v.Rates.Enqueued += o.Rates.Enqueued
	v.Rates.Acked += o.Rates.Acked
	served := map[int]bool{}
	for _, p := range o.Partitions {
		if p.Node == "" {
			continue
		}
		served[p.Partition] = true
		if i := slices.IndexFunc(v.Partitions, func(x PartitionView) bool { return x.Partition == p.Partition }); i >= 0 {
			if v.Partitions[i].Node == "" {
				v.Partitions[i] = p
			}
		} else {
			v.Partitions = append(v.Partitions, p)
		}
	}
	slices.SortFunc(v.Partitions, func(x, y PartitionView) int { return cmp.Compare(x.Partition, y.Partition) })
	for _, g := range o.Groups {
		i := slices.IndexFunc(v.Groups, func(x GroupView) bool { return x.Name == g.Name })
		if i < 0 {
			v.Groups = append(v.Groups, g)
			continue
		}
		mg := &v.Groups[i]
		mg.Consumers = max(mg.Consumers, g.Consumers)
		mg.Lag += g.Lag
		mg.Leased += g.Leased
		mg.Filter = cmp.Or(mg.Filter, g.Filter)
		mg.Filtered += g.Filtered
		mg.OldestUnsettledAge = max(mg.OldestUnsettledAge, g.OldestUnsettledAge)
		for _, gp := range g.Partitions {
			if !served[gp.Partition] {
				continue
			}
			if j := slices.IndexFunc(mg.Partitions, func(x GroupPartitionView) bool { return x.Partition == gp.Partition }); j >= 0 {
				mg.Partitions[j] = gp
			} else {
				mg.Partitions = append(mg.Partitions, gp)
			}
		}
		slices.SortFunc(mg.Partitions, func(x, y GroupPartitionView) int { return cmp.Compare(x.Partition, y.Partition) })
	}
	slices.SortFunc(v.Groups, func(x, y GroupView) int { return strings.Compare(x.Name, y.Name) })
	if o.DLQ != nil {
		if v.DLQ == nil {
			d := *o.DLQ
			v.DLQ = &d
		} else {
			mergeQueue(v.DLQ, *o.DLQ)
		}
	}
}

func addCounts(c *CountsView, o CountsView) {
	c.Enqueued += o.Enqueued
	c.Delivered += o.Delivered
	c.Redelivered += o.Redelivered
	c.Acked += o.Acked
	c.Nacked += o.Nacked
	c.Released += o.Released
	c.Rejected += o.Rejected
	c.DeadLettered += o.DeadLettered
	c.Expired += o.Expired
	c.LeasesLost += o.LeasesLost
	c.Deduplicated += o.Deduplicated
	c.Dropped += o.Dropped
}

// gatherPeek adds the other nodes' messages to list: each node peeks the
// partitions it serves, so the oldest of each partition in turn, up to
// limit, are the first limit of all of them in partition and offset order.
func (a *adminAPI) gatherPeek(r *http.Request, list *MessageList, name string, limit int) {
	answers, missing := gather[MessageList](a, r, queue.ParentName(name))
	list.NodesMissing = missing
	for _, o := range answers {
		list.Messages = append(list.Messages, o.Messages...)
	}
	slices.SortStableFunc(list.Messages, func(x, y MessageView) int {
		return cmp.Or(cmp.Compare(x.Partition, y.Partition), cmp.Compare(x.Offset, y.Offset))
	})
	if len(list.Messages) > limit {
		list.Messages = list.Messages[:limit]
	}
}
