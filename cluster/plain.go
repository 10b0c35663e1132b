package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/shardq/shardq/cluster/clusterpb"
)

// Ordinary MQTT across nodes (SPEC section 7). Each node publishes, under
// its lease, the plain topic filters its clients subscribe to (its
// interest), and every node keeps the others' in its view. A publish on a
// plain topic goes, over one Route stream to each peer, to every node
// with a plain subscriber of the topic, and for each shared subscription
// with members somewhere to one node with members (this node when it has
// some, else the others in turn): each group gets each message once in
// the cluster. A retained publish goes to every node, which stores it.
// The node receiving a routed publish delivers it to its own subscribers
// only. Delivery across nodes is at most once: a message in flight on a
// link that breaks is lost.
//
// A client ID is held by one node at a time, recorded under its lease; a
// node where the client connects records itself and takes the session
// over from the node that held it (Takeover), which disconnects the
// client there and hands its subscriptions over.
//
// Keys, under the prefix P:
//
//	P interest/{node}/{filter}  "", under the node's lease: a filter (path-escaped)
//	                            a client of node subscribes to; $share/{group}/{filter}
//	                            for a shared subscription
//	P clients/{client ID}       {"node","user"}, under the node's lease: the node
//	                            holding the client's session, and the session's user

// PlainHandler is the broker's side of ordinary MQTT across nodes.
type PlainHandler interface {
	// Deliver publishes messages routed here by another node to this
	// node's subscribers, in order: to every plain subscriber unless
	// SharedOnly, and to one member of each shared subscription named in
	// Groups. It must not route them on.
	Deliver(msgs []PlainMessage)
	// TakeOver ends the session of clientID here, because the client
	// connected on node: its connection is closed and its session
	// dropped. It returns the session, encoded by the handler, and whether
	// there was one.
	TakeOver(clientID, node string) (session []byte, found bool)
	// Retained stores the retained messages of msgs as the cluster records
	// them (an empty payload clears its topic's), in order; with all,
	// msgs are every record, and the retained messages here of the other
	// topics are cleared (retained.go).
	Retained(msgs []PlainMessage, all bool)
	// Adopt holds the session of clientID, of user, recorded by a node
	// that left (sessions.go), as it was encoded by the handler there:
	// offline, with its subscriptions, until its client connects. It
	// reports whether it adopted it (false when the client ID is held
	// already, here or elsewhere).
	Adopt(clientID, user string, session []byte) bool
}

// PlainMessage is a publish on a plain topic.
type PlainMessage struct {
	Topic      string
	Payload    []byte
	QoS        byte
	Retain     bool
	Properties []byte // the MQTT 5 properties, encoded by the broker
	Origin     string // the publishing client's ID
	// SharedOnly and Groups are set on the messages delivered: the node
	// serves the shared subscriptions ($share/{group}/{filter}) in Groups
	// and, unless SharedOnly, every plain subscriber.
	SharedOnly bool
	Groups     []string
	// Retained names a retained publish (retained.go); zero for others,
	// and for one routed by a node that records none.
	Retained RetainedID
}

// ErrSessionOfOtherUser is returned by ClaimClient when the client ID
// holds a session of another user.
var ErrSessionOfOtherUser = errors.New("cluster: the client ID belongs to another user's session")

func (k keys) interest(node, filter string) string {
	return k.prefix + "interest/" + node + "/" + url.PathEscape(filter)
}

func (k keys) client(id string) string { return k.prefix + "clients/" + id }

// clientRecord is the value of a client's key.
type clientRecord struct {
	Node string `json:"node"`
	User string `json:"user"`
}

func clientValue(node, user string) string {
	v, _ := json.Marshal(clientRecord{Node: node, User: user})
	return string(v)
}

// splitShared returns the shared subscription of a $share/{group}/{filter}
// filter (the whole filter, as mochi keys it) and the filter it matches
// with; group is "" for a plain filter.
func splitShared(filter string) (group, match string) {
	first, rest, ok := strings.Cut(filter, "/")
	if ok && strings.EqualFold(first, "$share") {
		if _, f, ok := strings.Cut(rest, "/"); ok {
			return filter, f
		}
	}
	return "", filter
}

// interest indexes the filters of every node, by topic level.
type interest struct{ root *inode }

type inode struct {
	children map[string]*inode
	nodes    map[string]bool            // nodes with a plain filter ending here
	groups   map[string]map[string]bool // shared subscription -> nodes with members
}

func (x *inode) empty() bool {
	return len(x.children) == 0 && len(x.nodes) == 0 && len(x.groups) == 0
}

// apply records (present) or removes the interest key named
// {node}/{escaped filter}.
func (t *interest) apply(name string, present bool) {
	node, esc, ok := strings.Cut(name, "/")
	if !ok {
		return
	}
	filter, err := url.PathUnescape(esc)
	if err != nil || filter == "" {
		return
	}
	group, f := splitShared(filter)
	levels := strings.Split(f, "/")
	if t.root == nil {
		t.root = &inode{}
	}
	path := []*inode{t.root}
	x := t.root
	for _, l := range levels {
		c := x.children[l]
		if c == nil {
			if !present {
				return
			}
			if x.children == nil {
				x.children = map[string]*inode{}
			}
			c = &inode{}
			x.children[l] = c
		}
		x = c
		path = append(path, x)
	}
	switch {
	case present && group == "":
		if x.nodes == nil {
			x.nodes = map[string]bool{}
		}
		x.nodes[node] = true
	case present:
		if x.groups == nil {
			x.groups = map[string]map[string]bool{}
		}
		if x.groups[group] == nil {
			x.groups[group] = map[string]bool{}
		}
		x.groups[group][node] = true
	case group == "":
		delete(x.nodes, node)
	default:
		delete(x.groups[group], node)
		if len(x.groups[group]) == 0 {
			delete(x.groups, group)
		}
	}
	if present {
		return
	}
	for i := len(path) - 1; i > 0 && path[i].empty(); i-- {
		delete(path[i-1].children, levels[i-1])
	}
}

// matches are the nodes whose filters match a topic.
type matches struct {
	nodes  map[string]bool
	groups map[string]map[string]bool
}

func (m *matches) add(x *inode) {
	for id := range x.nodes {
		if m.nodes == nil {
			m.nodes = map[string]bool{}
		}
		m.nodes[id] = true
	}
	for g, ids := range x.groups {
		if m.groups == nil {
			m.groups = map[string]map[string]bool{}
		}
		if m.groups[g] == nil {
			m.groups[g] = map[string]bool{}
		}
		for id := range ids {
			m.groups[g][id] = true
		}
	}
}

// match gathers the nodes whose filters match topic. A topic starting
// with $ matches no filter starting with a wildcard.
func (t *interest) match(topic string, m *matches) {
	if t.root == nil || topic == "" {
		return
	}
	t.root.match(strings.Split(topic, "/"), 0, topic[0] == '$', m)
}

func (x *inode) match(levels []string, i int, dollar bool, m *matches) {
	wild := !dollar || i > 0
	if wild {
		if c := x.children["#"]; c != nil {
			m.add(c) // also matches the parent level: a/# matches a
		}
	}
	if i == len(levels) {
		m.add(x)
		return
	}
	if c := x.children[levels[i]]; c != nil {
		c.match(levels, i+1, dollar, m)
	}
	if wild {
		if c := x.children["+"]; c != nil {
			c.match(levels, i+1, dollar, m)
		}
	}
}

// plainState is a node's part of ordinary MQTT across nodes: its own
// interest and client IDs as written to etcd, and its senders to peers.
type plainState struct {
	n *Node

	mu      sync.Mutex
	started bool             // run is running
	want    map[string]bool  // this node's interest
	have    map[string]bool  // the interest keys written under lease
	lease   clientv3.LeaseID // the lease have and the claims were written under
	claims  map[string]*Claim
	reclaim bool // the claims need writing under the current lease
	routers map[string]*router
	next    map[string]uint64 // round robin over the nodes of a shared subscription
	wake    chan struct{}
}

// plains holds the plainState of each node.
var plains sync.Map // *Node -> *plainState

func (n *Node) plain() *plainState {
	if v, ok := plains.Load(n); ok {
		return v.(*plainState)
	}
	p := &plainState{n: n, want: map[string]bool{}, have: map[string]bool{}, claims: map[string]*Claim{},
		routers: map[string]*router{}, next: map[string]uint64{}, wake: make(chan struct{}, 1)}
	v, _ := plains.LoadOrStore(n, p)
	return v.(*plainState)
}

func (p *plainState) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// plainRegistered writes this node's interest and client IDs again under
// the lease just taken (register calls it).
func (n *Node) plainRegistered() {
	p := n.plain()
	p.mu.Lock()
	start := !p.started
	p.started = true
	p.mu.Unlock()
	if start {
		go p.run()
	}
	p.poke()
}

// plainRetry is the pause before writing to etcd again after a failure.
const plainRetry = 500 * time.Millisecond

// run keeps this node's keys in etcd in line with its interest and
// claims until the node closes.
func (p *plainState) run() {
	defer plains.Delete(p.n)
	for {
		select {
		case <-p.n.ctx.Done():
			return
		case <-p.wake:
		}
		if err := p.sync(); err != nil {
			if p.n.ctx.Err() != nil {
				return
			}
			p.n.log.Warn("writing the node's topic filters and client IDs to etcd", "err", err)
			select {
			case <-p.n.ctx.Done():
				return
			case <-time.After(plainRetry):
			}
			p.poke()
		}
	}
}

// maxTxnOps stays below etcd's default limit of operations in a
// transaction (128).
const maxTxnOps = 64

func (p *plainState) sync() error {
	n := p.n
	n.mu.Lock()
	lease := n.session
	n.mu.Unlock()
	if lease == 0 {
		return nil // register pokes once it has a lease
	}
	p.mu.Lock()
	if lease != p.lease {
		// The keys written under the previous lease went with it.
		p.lease = lease
		p.have = map[string]bool{}
		p.reclaim = len(p.claims) > 0
	}
	type change struct {
		filter string
		put    bool
	}
	var changes []change
	for f := range p.want {
		if !p.have[f] {
			changes = append(changes, change{f, true})
		}
	}
	for f := range p.have {
		if !p.want[f] {
			changes = append(changes, change{f, false})
		}
	}
	var claims []*Claim
	if p.reclaim {
		p.reclaim = false
		for _, c := range p.claims {
			claims = append(claims, c)
		}
	}
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	defer cancel()
	for len(changes) > 0 {
		chunk := changes[:min(len(changes), maxTxnOps)]
		changes = changes[len(chunk):]
		ops := make([]clientv3.Op, len(chunk))
		for i, c := range chunk {
			key := n.keys.interest(n.opts.NodeID, c.filter)
			if c.put {
				ops[i] = clientv3.OpPut(key, "", clientv3.WithLease(lease))
			} else {
				ops[i] = clientv3.OpDelete(key)
			}
		}
		if _, err := n.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
			p.retryClaims(claims)
			return fmt.Errorf("cluster: writing topic filters: %w", err)
		}
		p.mu.Lock()
		if p.lease == lease {
			for _, c := range chunk {
				if c.put {
					p.have[c.filter] = true
				} else {
					delete(p.have, c.filter)
				}
			}
		}
		p.mu.Unlock()
	}
	for i, c := range claims {
		if err := p.rewrite(ctx, lease, c); err != nil {
			p.retryClaims(claims[i:])
			return err
		}
	}
	return nil
}

func (p *plainState) retryClaims(claims []*Claim) {
	if len(claims) == 0 {
		return
	}
	p.mu.Lock()
	p.reclaim = true
	p.mu.Unlock()
}

// rewrite writes a claim under the node's new lease. A client ID another
// node holds meanwhile ends the session here.
func (p *plainState) rewrite(ctx context.Context, lease clientv3.LeaseID, c *Claim) error {
	n := p.n
	p.mu.Lock()
	rev, held := c.rev, p.claims[c.id] == c
	p.mu.Unlock()
	if !held {
		return nil
	}
	key := n.keys.client(c.id)
	val := clientValue(n.opts.NodeID, c.user)
	resp, err := n.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(lease))},
			[]clientv3.Op{clientv3.OpGet(key)})).
		Commit()
	if err != nil {
		return fmt.Errorf("cluster: recording client %q: %w", c.id, err)
	}
	inner := resp.Responses[0].GetResponseTxn()
	if resp.Succeeded || (inner != nil && inner.Succeeded) {
		p.mu.Lock()
		c.rev = resp.Header.Revision
		p.mu.Unlock()
		return nil
	}
	var holder clientRecord
	if inner != nil && len(inner.Responses) > 0 {
		if kvs := inner.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &holder)
		}
	}
	if holder.Node == n.opts.NodeID && rev == 0 {
		// Taken provisionally (etcd out of reach) over a record of this
		// node's own, from before: written again over that one.
		if kvs := inner.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			p.mu.Lock()
			c.rev = kvs[0].ModRevision
			p.mu.Unlock()
			return p.rewrite(ctx, lease, c)
		}
	}
	p.mu.Lock()
	if p.claims[c.id] == c {
		delete(p.claims, c.id)
	}
	p.mu.Unlock()
	if holder.Node != n.opts.NodeID && n.opts.Plain != nil {
		n.log.Info("client taken by another node while this node's lease was lost", "client", c.id, "node", holder.Node)
		n.opts.Plain.TakeOver(c.id, holder.Node)
	}
	return nil
}

// Interest adds (subscribed) or removes a topic filter clients here
// subscribe to ($share/{group}/{filter} for a shared subscription). The
// node publishes its interest, so that publishes on other nodes reach it.
func (n *Node) Interest(filter string, subscribed bool) {
	p := n.plain()
	p.mu.Lock()
	if subscribed {
		p.want[filter] = true
	} else {
		delete(p.want, filter)
	}
	p.mu.Unlock()
	p.poke()
}

// SetInterest replaces the node's interest with filters.
func (n *Node) SetInterest(filters []string) {
	p := n.plain()
	want := make(map[string]bool, len(filters))
	for _, f := range filters {
		want[f] = true
	}
	p.mu.Lock()
	p.want = want
	p.mu.Unlock()
	p.poke()
}

// RoutePlain sends a publish made here on a plain topic to the other
// nodes: to each node with a plain subscriber of the topic, to one node
// with members of each shared subscription not served here (local names
// those this node served), and, when retained, to every node (recorded
// in etcd unless Retain recorded it already: m.Retained). It does not
// wait. A node's filters go with its lease, so a node is a target for as
// long as it holds it (a node leaving still serves its clients).
func (n *Node) RoutePlain(m PlainMessage, local []string) {
	var (
		mt      matches
		members []string
	)
	self := n.opts.NodeID
	n.mu.Lock()
	n.view.plain.match(m.Topic, &mt)
	if m.Retain {
		for id := range n.view.nodes {
			members = append(members, id)
		}
	}
	n.mu.Unlock()

	type target struct {
		sharedOnly bool
		groups     []string
	}
	targets := map[string]*target{}
	for id := range mt.nodes {
		if id != self {
			targets[id] = &target{}
		}
	}
	p := n.plain()
	for g, ids := range mt.groups {
		if slices.Contains(local, g) {
			continue
		}
		candidates := make([]string, 0, len(ids))
		for id := range ids {
			if id != self {
				candidates = append(candidates, id)
			}
		}
		if len(candidates) == 0 {
			continue
		}
		slices.Sort(candidates)
		p.mu.Lock()
		i := p.next[g]
		p.next[g] = i + 1
		p.mu.Unlock()
		id := candidates[i%uint64(len(candidates))]
		t := targets[id]
		if t == nil {
			t = &target{sharedOnly: true}
			targets[id] = t
		}
		t.groups = append(t.groups, g)
	}
	for _, id := range members {
		if id != self && targets[id] == nil {
			targets[id] = &target{sharedOnly: true}
		}
	}
	id := m.Retained
	if m.Retain && id == (RetainedID{}) {
		id = n.Retain(m, 0) // not recorded before (a will)
	}
	for node, t := range targets {
		p.router(node).push(&pb.RoutedPublish{Topic: m.Topic, Payload: m.Payload, Qos: uint32(m.QoS), Retain: m.Retain,
			SharedOnly: t.sharedOnly, Groups: t.groups, Properties: m.Properties, Origin: m.Origin,
			RetainedRun: id.Run, RetainedSeq: id.Seq})
	}
}

// Limits of the routing to one peer.
const (
	maxRouteQueue      = 1 << 16 // publishes waiting; more are dropped
	maxRouteBatch      = 256     // publishes in one stream message
	maxRouteBatchBytes = 4 << 20
)

// router sends the publishes routed to one peer, in order, on one Route
// stream.
type router struct {
	n    *Node
	node string

	mu       sync.Mutex
	queue    []*pb.RoutedPublish
	dropping bool
	wake     chan struct{}
}

func (p *plainState) router(node string) *router {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.routers[node]
	if r == nil {
		r = &router{n: p.n, node: node, wake: make(chan struct{}, 1)}
		p.routers[node] = r
		go r.run()
	}
	return r
}

func (r *router) push(rp *pb.RoutedPublish) {
	r.mu.Lock()
	if len(r.queue) >= maxRouteQueue {
		if !r.dropping {
			r.n.log.Warn("publishes to a node dropped: its link is behind", "node", r.node, "waiting", len(r.queue))
		}
		r.dropping = true
		r.mu.Unlock()
		return
	}
	r.dropping = false
	r.queue = append(r.queue, rp)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// take returns the next batch to send.
func (r *router) take() []*pb.RoutedPublish {
	r.mu.Lock()
	defer r.mu.Unlock()
	size, i := 0, 0
	for i < len(r.queue) && i < maxRouteBatch {
		size += len(r.queue[i].Payload) + len(r.queue[i].Topic) + len(r.queue[i].Properties)
		i++
		if size >= maxRouteBatchBytes {
			break
		}
	}
	batch := r.queue[:i:i]
	r.queue = r.queue[i:]
	if len(r.queue) == 0 {
		r.queue = nil
	}
	return batch
}

func (r *router) run() {
	var (
		stream  pb.Node_RouteClient
		cancel  context.CancelFunc
		failing bool
	)
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()
	fail := func(err error) {
		if !failing {
			r.n.log.Warn("routing publishes to a node", "node", r.node, "err", err)
		}
		failing = true
		if cancel != nil {
			cancel()
		}
		stream, cancel = nil, nil
	}
	for {
		select {
		case <-r.n.ctx.Done():
			return
		case <-r.wake:
		}
		for {
			batch := r.take()
			if len(batch) == 0 {
				break
			}
			if stream == nil {
				p, err := r.n.peer(r.node)
				if err != nil {
					fail(err)
					continue // the batch is dropped
				}
				ctx, c := context.WithCancel(r.n.ctx)
				if stream, err = p.client.Route(ctx); err != nil {
					c()
					fail(err)
					continue
				}
				cancel = c
			}
			if err := stream.Send(&pb.RouteBatch{Publishes: batch}); err != nil {
				if errors.Is(err, io.EOF) {
					// The stream ended: its error comes with the answer.
					_, err = stream.CloseAndRecv()
				}
				fail(err)
				continue
			}
			if failing {
				r.n.log.Info("routing publishes to a node again", "node", r.node)
				failing = false
			}
		}
	}
}

// Route delivers the publishes another node routes here to the local
// subscribers, in order.
func (s *server) Route(stream pb.Node_RouteServer) error {
	h := s.n.opts.Plain
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&pb.RouteResponse{})
		}
		if err != nil {
			return err
		}
		if h == nil || len(b.Publishes) == 0 {
			continue
		}
		msgs := make([]PlainMessage, len(b.Publishes))
		for i, rp := range b.Publishes {
			msgs[i] = PlainMessage{Topic: rp.Topic, Payload: rp.Payload, QoS: byte(rp.Qos), Retain: rp.Retain,
				Properties: rp.Properties, Origin: rp.Origin, SharedOnly: rp.SharedOnly, Groups: rp.Groups,
				Retained: RetainedID{rp.RetainedRun, rp.RetainedSeq}}
		}
		h.Deliver(msgs)
	}
}

// Claim is this node's hold on a client ID (ClaimClient).
type Claim struct {
	id, user string
	rev      int64 // the key's mod revision as this node wrote it; under plainState.mu
}

// ClaimClient records that clientID, of user, connects here, and takes
// its session over from the node that held it: found reports whether
// there was a session, which comes encoded by that node's PlainHandler.
// A client ID whose session is another user's is ErrSessionOfOtherUser,
// and nothing changes. When the node holding it cannot be reached, the
// client starts anew here.
func (n *Node) ClaimClient(ctx context.Context, clientID, user string) (c *Claim, session []byte, found bool, err error) {
	if n.etcd == nil {
		return nil, nil, false, errors.New("cluster: not a member of the cluster")
	}
	n.mu.Lock()
	lease := n.session
	n.mu.Unlock()
	if lease == 0 || !n.etcdOK() {
		return n.claimProvisionally(clientID, user), nil, false, nil
	}
	key := n.keys.client(clientID)
	val := clientValue(n.opts.NodeID, user)
	var prev clientRecord
	for attempt := 0; ; attempt++ {
		gctx, cancel := context.WithTimeout(ctx, etcdClaimWait)
		get, err := n.etcd.Get(gctx, key)
		cancel()
		if err != nil && ctx.Err() == nil {
			return n.claimProvisionally(clientID, user), nil, false, nil
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("cluster: reading client %q: %w", clientID, err)
		}
		prev = clientRecord{}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(get.Kvs) > 0 {
			_ = json.Unmarshal(get.Kvs[0].Value, &prev)
			if prev.User != user {
				return nil, nil, false, ErrSessionOfOtherUser
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", get.Kvs[0].ModRevision)
		}
		resp, err := n.etcd.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
		if err != nil {
			return nil, nil, false, fmt.Errorf("cluster: recording client %q: %w", clientID, err)
		}
		if resp.Succeeded {
			c = &Claim{id: clientID, user: user, rev: resp.Header.Revision}
			break
		}
		if attempt >= 4 {
			return nil, nil, false, fmt.Errorf("cluster: recording client %q: it keeps changing", clientID)
		}
	}
	p := n.plain()
	p.mu.Lock()
	p.claims[clientID] = c
	p.mu.Unlock()
	if prev.Node == "" || prev.Node == n.opts.NodeID {
		return c, nil, false, nil
	}
	session, found, err = n.takeOver(ctx, prev.Node, clientID)
	if err != nil {
		n.log.Warn("taking a client's session over from another node; it starts anew here", "client", clientID, "node", prev.Node, "err", err)
		return c, nil, false, nil
	}
	return c, session, found, nil
}

// etcdClaimWait bounds how long a connecting client waits for etcd to
// read its client ID's record before it is taken provisionally.
const etcdClaimWait = time.Second

// claimProvisionally takes clientID here without etcd, which cannot be
// reached: a client connects while etcd is down as it does while etcd
// is up, but a session it had on another node is not taken over, and
// the client ID is recorded once etcd answers again. Should another node
// have taken it meanwhile, the session here ends then (TakeOver).
func (n *Node) claimProvisionally(clientID, user string) *Claim {
	c := &Claim{id: clientID, user: user}
	p := n.plain()
	p.mu.Lock()
	p.claims[clientID] = c
	p.reclaim = true
	p.mu.Unlock()
	p.poke()
	n.log.Info("client connected while etcd is out of reach: its client ID is recorded once etcd answers", "client", clientID)
	return c
}

func (n *Node) takeOver(ctx context.Context, node, clientID string) ([]byte, bool, error) {
	p, err := n.peer(node)
	if err != nil {
		return nil, false, err
	}
	resp, err := p.client.Takeover(ctx, &pb.TakeoverRequest{ClientId: clientID, Node: n.opts.NodeID})
	if err != nil {
		return nil, false, err
	}
	return resp.Session, resp.Found, nil
}

// ClaimRestored records a session restored from storage here unless its
// client ID is recorded already: holder then names the node holding it
// ("" when it is this node, and c is nil).
func (n *Node) ClaimRestored(ctx context.Context, clientID, user string) (c *Claim, holder string, err error) {
	n.mu.Lock()
	lease := n.session
	n.mu.Unlock()
	if lease == 0 || n.etcd == nil {
		return nil, "", errors.New("cluster: not a member of the cluster")
	}
	key := n.keys.client(clientID)
	resp, err := n.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, clientValue(n.opts.NodeID, user), clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return nil, "", fmt.Errorf("cluster: recording client %q: %w", clientID, err)
	}
	if !resp.Succeeded {
		var rec clientRecord
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &rec)
		}
		if rec.Node == n.opts.NodeID {
			return nil, "", nil
		}
		return nil, rec.Node, nil
	}
	c = &Claim{id: clientID, user: user, rev: resp.Header.Revision}
	p := n.plain()
	p.mu.Lock()
	p.claims[clientID] = c
	p.mu.Unlock()
	return c, "", nil
}

// Holds reports whether the node still holds the client ID of c: another
// node may have taken it since.
func (n *Node) Holds(c *Claim) bool {
	if c == nil {
		return false
	}
	p := n.plain()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims[c.id] == c
}

// ReleaseClient removes the record of c, the session having ended here,
// unless the client ID was recorded again since. It does not wait.
func (n *Node) ReleaseClient(c *Claim) {
	if c == nil || n.etcd == nil {
		return
	}
	p := n.plain()
	p.mu.Lock()
	if p.claims[c.id] == c {
		delete(p.claims, c.id)
	}
	rev := c.rev
	p.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		defer cancel()
		key := n.keys.client(c.id)
		if _, err := n.etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit(); err != nil && n.ctx.Err() == nil {
			n.log.Debug("removing a client's record", "client", c.id, "err", err)
		}
	}()
}

// Takeover ends the session of a client ID here: it connected on the
// calling node.
func (s *server) Takeover(ctx context.Context, req *pb.TakeoverRequest) (*pb.TakeoverResponse, error) {
	p := s.n.plain()
	p.mu.Lock()
	delete(p.claims, req.ClientId)
	p.mu.Unlock()
	h := s.n.opts.Plain
	if h == nil {
		return &pb.TakeoverResponse{}, nil
	}
	session, found := h.TakeOver(req.ClientId, req.Node)
	return &pb.TakeoverResponse{Found: found, Session: session}, nil
}

// PlainTargets returns where a publish on topic made here could go, as
// this node sees the cluster now: the other nodes with plain subscribers
// of it, the other nodes with members of each shared subscription
// matching it, and the other members (where a retained message goes).
func (n *Node) PlainTargets(topic string) (plain []string, shared map[string][]string, members []string) {
	var mt matches
	n.mu.Lock()
	n.view.plain.match(topic, &mt)
	for id := range n.view.nodes {
		if id != n.opts.NodeID {
			members = append(members, id)
		}
	}
	n.mu.Unlock()
	slices.Sort(members)
	for id := range mt.nodes {
		if id != n.opts.NodeID {
			plain = append(plain, id)
		}
	}
	slices.Sort(plain)
	shared = map[string][]string{}
	for g, ids := range mt.groups {
		for id := range ids {
			if id != n.opts.NodeID {
				shared[g] = append(shared[g], id)
			}
		}
		slices.Sort(shared[g])
	}
	return plain, shared, members
}
