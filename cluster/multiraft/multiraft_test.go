package multiraft_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shardq/shardq/cluster/multiraft"
	"github.com/shardq/shardq/internal/raftstore"
	"github.com/shardq/shardq/storage/raftlog"
)

// The groups here replicate a toy state machine, a map from entry index
// to the string proposed, over hosts joined by an in-memory network that
// can cut links. Ticks are 5 ms and elections 10 ticks, so that a test
// of elections runs in a fraction of a second.

const (
	tick      = 5 * time.Millisecond
	election  = 10 * tick
	waitLimit = 10 * time.Second
)

// net is an in-memory network between hosts: messages are delivered in
// order per link, on a goroutine per destination, unless the link is cut.
type net struct {
	mu    sync.Mutex
	hosts map[string]*node
	cut   map[[2]string]bool
}

type envelope struct {
	from, group string
	m           *rpb.Message
}

func newNet() *net { return &net{hosts: map[string]*node{}, cut: map[[2]string]bool{}} }

// isolate cuts a from every other node, or heals its links.
func (n *net) isolate(a string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !cut {
		for l := range n.cut {
			if l[0] == a || l[1] == a {
				delete(n.cut, l)
			}
		}
		return
	}
	for b := range n.hosts {
		if b != a {
			n.cut[[2]string{a, b}], n.cut[[2]string{b, a}] = true, true
		}
	}
}

// transport is one host's side of the network.
type transport struct {
	net  *net
	from string
}

func (t transport) Send(to, group string, m *rpb.Message) bool {
	t.net.mu.Lock()
	dst := t.net.hosts[to]
	cut := t.net.cut[[2]string{t.from, to}]
	t.net.mu.Unlock()
	if dst == nil || cut {
		return true // lost on the way, as on a network
	}
	select {
	case dst.in <- envelope{t.from, group, proto.Clone(m).(*rpb.Message)}:
	default: // the receiver is far behind: dropped
	}
	return true
}

// node is one host of a test, with its state machines by group.
type node struct {
	id     string
	dir    string
	h      *multiraft.Host
	store  *raftlog.Store
	disk   *heldStore
	in     chan envelope
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	sms map[string]*toy
}

// cluster is the hosts of a test.
type cluster struct {
	t   *testing.T
	net *net
	// keep and keepBytes are the LogKeep and LogKeepBytes of every host.
	keep      uint64
	keepBytes int
	nodes     map[string]*node
	// disks hold each state machine's values by raft log directory and
	// group: what a host finds again when it starts on the same one.
	disks map[string]*toy
	// ids are each group's raft ids by node as its leader last applied
	// them (change), which a node opening the group is given, as the
	// cluster gives the ids of its records.
	ids map[string]map[string]uint64
}

func newCluster(t *testing.T, keep uint64, ids ...string) *cluster {
	return newClusterBytes(t, keep, 0, ids...)
}

// newClusterBytes is newCluster with hosts that keep keepBytes of applied
// entries (0: the default).
func newClusterBytes(t *testing.T, keep uint64, keepBytes int, ids ...string) *cluster {
	c := &cluster{t: t, net: newNet(), keep: keep, keepBytes: keepBytes, nodes: map[string]*node{}, disks: map[string]*toy{}, ids: map[string]map[string]uint64{}}
	for _, id := range ids {
		c.start(id, t.TempDir())
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
	})
	return c
}

// start runs host id on its raft log in dir.
func (c *cluster) start(id, dir string) *node {
	c.t.Helper()
	store, err := raftlog.Open(raftlog.Options{Dir: dir, Salvage: true})
	if err != nil {
		c.t.Fatal(err)
	}
	n := &node{id: id, dir: dir, store: store, in: make(chan envelope, 1<<14), sms: map[string]*toy{}, done: make(chan struct{})}
	n.disk = &heldStore{Store: raftstore.Store{S: store}}
	n.disk.cond = sync.NewCond(&n.disk.mu)
	n.h = multiraft.New(multiraft.Options{NodeID: id, Store: n.disk, Transport: transport{c.net, id},
		Tick: tick, ElectionTicks: 10, LogKeep: c.keep, LogKeepBytes: c.keepBytes, SyncEvery: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		defer close(n.done)
		n.h.Run(ctx)
	}()
	go func() {
		for {
			select {
			case e := <-n.in:
				_ = n.h.Step(ctx, e.group, e.m)
			case <-ctx.Done():
				return
			}
		}
	}()
	c.net.mu.Lock()
	c.net.hosts[id] = n
	c.net.mu.Unlock()
	c.nodes[id] = n
	return n
}

// heldStore is a node's raft log whose writes can be held, as a slow
// disk holds them: a Save waits while held.
type heldStore struct {
	raftstore.Store
	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
	saving int // Saves of entries waiting while held
	broken bool
}

var errDiskBroken = errors.New("input/output error")

// breakDisk makes every later Save fail, as a disk that died does.
func (s *heldStore) breakDisk() {
	s.mu.Lock()
	s.broken = true
	s.mu.Unlock()
}

func (s *heldStore) Save(ws []multiraft.Write, sync bool) error {
	entries := slices.ContainsFunc(ws, func(w multiraft.Write) bool { return len(w.Entries) > 0 })
	s.mu.Lock()
	for s.held {
		if entries {
			s.saving++
		}
		s.cond.Wait()
		if entries {
			s.saving--
		}
	}
	broken := s.broken
	s.mu.Unlock()
	if broken {
		return errDiskBroken
	}
	return s.Store.Save(ws, sync)
}

// hold holds the node's raft log writes, or lets them go.
func (s *heldStore) hold(on bool) {
	s.mu.Lock()
	s.held = on
	s.mu.Unlock()
	s.cond.Broadcast()
}

// waiting reports whether a write of entries waits on the hold.
func (s *heldStore) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saving > 0
}

// stop ends the host, as a crash after its last write would.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.disk.hold(false)
	n.cancel()
	<-n.done
	_ = n.store.Close()
	n.cancel = nil
}

func (c *cluster) kill(id string) {
	c.net.mu.Lock()
	delete(c.net.hosts, id)
	c.net.mu.Unlock()
	c.nodes[id].stop()
}

// open opens group on every node named, over replicas.
func (c *cluster) open(group string, replicas []string, on ...string) {
	c.t.Helper()
	for _, id := range on {
		n := c.nodes[id]
		sm := c.disks[n.dir+"/"+group]
		if sm == nil {
			sm = &toy{c: c, group: group, values: map[uint64]string{}}
			c.disks[n.dir+"/"+group] = sm
		}
		sm.mu.Lock()
		sm.node, sm.pending, sm.waiting = id, nil, nil
		sm.mu.Unlock()
		n.mu.Lock()
		n.sms[group] = sm
		n.mu.Unlock()
		if _, err := n.h.Open(group, replicas, c.ids[group], sm); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *cluster) sm(id, group string) *toy {
	n := c.nodes[id]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sms[group]
}

// leader waits until one of the nodes named leads group and returns it.
func (c *cluster) leader(group string, among ...string) string {
	c.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		for _, id := range among {
			n := c.nodes[id]
			if n == nil || n.cancel == nil {
				continue // stopped
			}
			if g := n.h.Group(group); g != nil && g.IsLeader() && g.CaughtUp() {
				return id
			}
		}
		time.Sleep(tick)
	}
	c.t.Fatalf("no leader of %s among %v within %s", group, among, waitLimit)
	return ""
}

// propose proposes values on the leader of group among the nodes named,
// and waits until each is applied there; one refused by a replica that
// no longer leads goes to the new leader.
func (c *cluster) propose(among []string, group string, values ...string) {
	c.t.Helper()
	for _, v := range values {
		for tries := 0; ; tries++ {
			id := c.leader(group, among...)
			done := c.sm(id, group).offer(v)
			var err error
			select {
			case err = <-done:
			case <-time.After(waitLimit):
				c.t.Fatalf("%q not applied on %s within %s", v, id, waitLimit)
			}
			if err == nil {
				break
			}
			if !errors.Is(err, multiraft.ErrNotLeader) || tries > 10 {
				c.t.Fatalf("proposing %q on %s: %v", v, id, err)
			}
		}
	}
}

// converge waits until every node named applied the same values as the
// first, and at least want of them; it returns them in index order.
func (c *cluster) converge(group string, want int, ids ...string) []string {
	c.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		first := c.sm(ids[0], group).list()
		same := len(first) >= want
		for _, id := range ids[1:] {
			same = same && slices.Equal(first, c.sm(id, group).list())
		}
		if same {
			return first
		}
		if time.Now().After(deadline) {
			for _, id := range ids {
				c.t.Logf("%s: %v", id, c.sm(id, group).list())
			}
			c.t.Fatalf("replicas of %s did not converge on %d values within %s", group, want, waitLimit)
		}
		time.Sleep(tick)
	}
}

// toy is the state machine: the values of the entries applied, by index.
type toy struct {
	c     *cluster
	node  string
	group string

	mu        sync.Mutex
	g         *multiraft.Group
	values    map[uint64]string
	stored    uint64
	pending   []pendingValue
	waiting   map[string]chan error
	leader    bool
	removed   bool
	failed    error // the raft log's write error, when told
	installed []uint64
}

type pendingValue struct {
	v    string
	done chan error
	// term is the leadership term the value is proposed in; 0 for the
	// one this replica leads in.
	term uint64
}

func (s *toy) Bind(g *multiraft.Group) {
	s.mu.Lock()
	s.g = g
	s.mu.Unlock()
}

func (s *toy) Apply(ents []*rpb.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range ents {
		if e.GetType() == rpb.EntryType_EntryNormal && len(e.GetData()) > 0 {
			v := string(e.GetData())
			s.values[e.GetIndex()] = v
			if ch := s.waiting[v]; ch != nil {
				ch <- nil
				delete(s.waiting, v)
			}
		}
		s.stored = max(s.stored, e.GetIndex())
	}
}

// offer gives v to the state machine to propose, and wakes its group: the
// channel tells how it went.
func (s *toy) offer(v string) chan error {
	done := make(chan error, 1)
	s.mu.Lock()
	s.pending = append(s.pending, pendingValue{v: v, done: done})
	g := s.g
	s.mu.Unlock()
	g.Wake()
	return done
}

func (s *toy) Stored() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stored
}

func (s *toy) Propose() {
	s.mu.Lock()
	ps := s.pending
	s.pending = nil
	g := s.g
	s.mu.Unlock()
	for _, p := range ps {
		term := p.term
		if term == 0 {
			term = g.LeaderTerm()
		}
		if err := g.Propose(term, []byte(p.v)); err != nil {
			p.done <- err
			continue
		}
		s.mu.Lock()
		if s.waiting == nil {
			s.waiting = map[string]chan error{}
		}
		s.waiting[p.v] = p.done
		s.mu.Unlock()
	}
}

func (s *toy) LeaderChanged(leader bool) {
	s.mu.Lock()
	s.leader = leader
	var waiting map[string]chan error
	if !leader {
		// What it proposed may never commit: the caller asks the next
		// leader, as the cluster's replica does.
		waiting, s.waiting = s.waiting, nil
	}
	s.mu.Unlock()
	for _, done := range waiting {
		done <- multiraft.ErrNotLeader
	}
}

func (s *toy) Persisted() {}
func (s *toy) Failed(err error) {
	s.mu.Lock()
	s.failed = err
	s.mu.Unlock()
}

func (s *toy) Removed() {
	s.mu.Lock()
	s.removed = true
	s.mu.Unlock()
}

// Copy gives node this replica's values as they are.
func (s *toy) Copy(_ context.Context, node string) error {
	dst := s.c.sm(node, s.group)
	if dst == nil {
		return fmt.Errorf("no replica of %s on %s", s.group, node)
	}
	s.mu.Lock()
	vals, stored := maps.Clone(s.values), s.stored
	s.mu.Unlock()
	dst.mu.Lock()
	dst.values, dst.stored = vals, max(dst.stored, stored)
	dst.mu.Unlock()
	return nil
}

func (s *toy) Installed(index uint64) {
	s.mu.Lock()
	s.installed = append(s.installed, index)
	s.stored = max(s.stored, index)
	s.mu.Unlock()
}

// list returns the values in index order.
func (s *toy) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := slices.Sorted(maps.Keys(s.values))
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = s.values[x]
	}
	return out
}

func values(prefix string, n int) (out []string) {
	for i := range n {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

var abc = []string{"a", "b", "c"}

// TestElectionAndReplication: a new group elects a leader; what it
// proposes is applied everywhere in one order.
func TestElectionAndReplication(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("v", 20)...)
	got := c.converge("g", 20, abc...)
	if !slices.Equal(got, values("v", 20)) {
		t.Fatalf("applied %v", got)
	}
}

// TestLeaderIsolated: a leader cut from its peers loses the group to
// them within a few election timeouts; the new leader takes proposals;
// healed, the old leader follows and has every committed value.
func TestLeaderIsolated(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("before", 5)...)
	c.net.isolate("a", true)
	c.propose([]string{"b", "c"}, "g", values("after", 5)...)
	c.net.isolate("a", false)
	got := c.converge("g", 10, abc...)
	if !slices.Equal(got, append(values("before", 5), values("after", 5)...)) {
		t.Fatalf("applied %v", got)
	}
}

// TestProposeInItsTermOnly: a proposal made in an earlier term of the
// leadership (from a state that a newer leader may have written past) is
// refused, and never applied anywhere.
func TestProposeInItsTermOnly(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	id := c.leader("g", abc...)
	sm := c.sm(id, "g")
	sm.mu.Lock()
	g := sm.g
	sm.mu.Unlock()
	term := g.LeaderTerm()
	for _, stale := range []uint64{term - 1, term + 1} {
		done := make(chan error, 1)
		sm.mu.Lock()
		sm.pending = append(sm.pending, pendingValue{v: fmt.Sprintf("term-%d", stale), done: done, term: stale})
		sm.mu.Unlock()
		g.Wake()
		if err := <-done; !errors.Is(err, multiraft.ErrNotLeader) {
			t.Fatalf("a proposal in term %d on the leader of term %d: %v, want ErrNotLeader", stale, term, err)
		}
	}
	c.propose(abc, "g", values("v", 3)...)
	if got := c.converge("g", 3, abc...); !slices.Equal(got, values("v", 3)) {
		t.Fatalf("applied %v, want only the proposals of the leadership's term", got)
	}
}

// TestRestart: a host that stops and starts again on its log rejoins and
// gets what was committed meanwhile.
func TestRestart(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("one", 5)...)
	c.converge("g", 5, abc...)
	dir := c.nodes["c"].dir
	c.kill("c")
	c.propose(abc, "g", values("two", 5)...)
	c.start("c", dir)
	c.open("g", abc, "c")
	c.converge("g", 10, abc...)
}

// TestCopy: a replica behind the leader's compacted log gets a copy of
// the state machine, then the entries after it. A log is compacted past
// LogKeep entries, and past LogKeepBytes of their data (kept in memory as
// well as on disk): 200 entries of 64 KiB, far fewer than LogKeep, are
// compacted to their last 8 MiB.
func TestCopy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		keep  uint64
		size  int
		first uint64 // the first entry kept is past it once compacted
	}{
		{"past LogKeep", 10, 0, 100},
		// 8 MiB are 128 of them: whatever else the log holds (the
		// group's first entries, elections), the first kept is past 60.
		{"past LogKeepBytes", 5000, 64 << 10, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, tc.keep, abc...)
			c.open("g", abc, abc...)
			c.leader("g", abc...)
			dir := c.nodes["c"].dir
			c.kill("c")
			vs := values("v", 200)
			for i := range vs {
				vs[i] += strings.Repeat("x", tc.size)
			}
			c.propose(abc, "g", vs...)
			// Once the leader compacted (every SyncEvery).
			waitFor(t, "the logs compacted", func() bool {
				return c.nodes["a"].h.Group("g").FirstIndex() > tc.first && c.nodes["b"].h.Group("g").FirstIndex() > tc.first
			})
			c.propose(abc, "g", "last")
			c.start("c", dir)
			c.open("g", abc, "c")
			c.converge("g", 201, abc...)
			waitFor(t, "c installed the snapshot after its copy", func() bool {
				s := c.sm("c", "g")
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.installed) > 0
			})
		})
	}
}

// TestCompactionWaitsForAnActiveReplica: a leader keeps, past
// LogKeepBytes, what a replica it hears from lacks (here one whose disk
// hangs: it answers heartbeats, not appends), up to four times
// LogKeepBytes; a follower compacts to LogKeepBytes all the same. The
// replica catches up once its disk is back.
func TestCompactionWaitsForAnActiveReplica(t *testing.T) {
	const keepBytes, size = 256 << 10, 16 << 10 // 16 entries; 64 for a replica behind
	for _, tc := range []struct {
		name string
		n    int
		kept bool // the leader keeps what the replica lacks
	}{
		{"behind by less than four times LogKeepBytes", 48, true},
		{"behind by more", 120, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClusterBytes(t, 5000, keepBytes, abc...)
			c.open("g", abc, abc...)
			lead := c.leader("g", abc...)
			c.propose(abc, "g", "one")
			c.converge("g", 1, abc...)
			var hung, other string
			for _, id := range abc {
				switch {
				case id == lead:
				case hung == "":
					hung = id
				default:
					other = id
				}
			}
			c.nodes[hung].disk.hold(true)
			big := values("v", tc.n)
			for i := range big {
				big[i] += ":" + strings.Repeat("x", size)
			}
			c.propose(abc, "g", big...)
			waitFor(t, other+"'s log compacted to LogKeepBytes", func() bool {
				return c.nodes[other].h.Group("g").FirstIndex() > uint64(tc.n-keepBytes/size)
			})
			if now := c.leader("g", abc...); now != lead {
				t.Fatalf("the leadership moved from %s to %s", lead, now)
			}
			leader := c.nodes[lead].h.Group("g")
			if tc.kept {
				if first := leader.FirstIndex(); first > 10 {
					t.Fatalf("the leader compacted its log up to %d, past what %s, whose disk hangs, lacks", first-1, hung)
				}
			} else {
				waitFor(t, "the leader's log compacted past what "+hung+" lacks", func() bool { return leader.FirstIndex() > 10 })
			}
			c.nodes[hung].disk.hold(false)
			c.converge("g", tc.n+1, abc...)
		})
	}
}

// TestReplicaChange: a node joins as a learner, catches up and is
// promoted; a replica removed, closed, drops the group.
func TestReplicaChange(t *testing.T) {
	c := newCluster(t, 100, "a", "b", "c", "d")
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("v", 10)...)
	c.change(abc, "g", multiraft.AddLearner, "d")
	c.open("g", abc, "d")
	c.converge("g", 10, "a", "b", "c", "d")
	c.change(abc, "g", multiraft.Promote, "d")
	abcd := []string{"a", "b", "c", "d"}
	c.change(abcd, "g", multiraft.Remove, "c")
	// Closed by whoever runs the group, as the cluster does once its
	// records no longer name c.
	c.nodes["c"].h.Group("g").Close()
	waitFor(t, "c's state machine told it is removed", func() bool {
		s := c.sm("c", "g")
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.removed
	})
	if c.nodes["c"].h.Group("g") != nil {
		t.Fatal("c still runs the group")
	}
	c.propose([]string{"a", "b", "d"}, "g", "after")
	c.converge("g", 11, "a", "b", "d")
}

// TestLearnerDoesNotVote: with the leader and another voter cut off, the
// third voter and a learner do not elect a leader, though they are two of four replicas;
// healed, the group goes on with the learner caught up.
func TestLearnerDoesNotVote(t *testing.T) {
	c := newCluster(t, 100, "a", "b", "c", "d")
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.change(abc, "g", multiraft.AddLearner, "d")
	c.open("g", abc, "d")
	c.propose(abc, "g", values("v", 5)...)
	c.converge("g", 5, "a", "b", "c", "d")
	// The leader and another voter cut off: the third voter and the
	// learner are left.
	lead := c.leader("g", abc...)
	others := slices.DeleteFunc(slices.Clone(abc), func(id string) bool { return id == lead })
	c.net.isolate(lead, true)
	c.net.isolate(others[0], true)
	// The leader steps down once it misses a quorum (CheckQuorum).
	waitFor(t, "the cut-off leader steps down", func() bool { return !c.nodes[lead].h.Group("g").IsLeader() })
	deadline := time.Now().Add(30 * election)
	for time.Now().Before(deadline) {
		for _, id := range []string{others[1], "d"} {
			if c.nodes[id].h.Group("g").IsLeader() {
				t.Fatalf("%s was elected with a learner's vote", id)
			}
		}
		time.Sleep(tick)
	}
	c.net.isolate(lead, false)
	c.net.isolate(others[0], false)
	c.propose(abc, "g", "after")
	c.converge("g", 6, "a", "b", "c", "d")
	if g := c.nodes["d"].h.Group("g"); !slices.Equal(g.Learners(), []string{"d"}) || len(g.Replicas()) != 3 {
		t.Fatalf("d sees replicas %v, learners %v", g.Replicas(), g.Learners())
	}
}

// TestRemovedAndAddedAgain: a replica removed while cut off never hears
// of it; closed there (as the cluster does when its records no longer
// name it), added again as a learner, it starts from an empty log, gets
// every value back and is promoted.
func TestRemovedAndAddedAgain(t *testing.T) {
	c := newCluster(t, 100, "a", "b", "c", "d")
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("one", 5)...)
	c.converge("g", 5, abc...)
	c.net.isolate("c", true)
	c.change([]string{"a", "b"}, "g", multiraft.AddLearner, "d")
	c.open("g", abc, "d")
	c.change([]string{"a", "b"}, "g", multiraft.Promote, "d")
	c.change([]string{"a", "b", "d"}, "g", multiraft.Remove, "c")
	c.propose([]string{"a", "b", "d"}, "g", values("two", 5)...)
	g := c.nodes["c"].h.Group("g")
	if !g.Member() {
		t.Fatal("c, cut off, was told of its removal")
	}
	g.Close()
	waitFor(t, "c closed the group", func() bool { return c.nodes["c"].h.Group("g") == nil })
	c.net.isolate("c", false)
	delete(c.disks, c.nodes["c"].dir+"/g") // its state machine starts empty too
	abd := []string{"a", "b", "d"}
	c.change(abd, "g", multiraft.AddLearner, "c")
	c.open("g", abd, "c")
	c.converge("g", 10, "a", "b", "c", "d")
	c.change(abd, "g", multiraft.Promote, "c")
	c.propose(abc, "g", "three")
	got := c.converge("g", 11, "a", "b", "c", "d")
	if !slices.Equal(got, append(append(values("one", 5), values("two", 5)...), "three")) {
		t.Fatalf("applied %v", got)
	}
	if g := c.nodes["c"].h.Group("g"); g.Recovering() {
		t.Fatal("c, added again as a learner, is recovering")
	}
}

// TestAddedAgainIsANewReplica: a replica removed and added again gets a
// fresh raft id, which every replica learns, and the one it had before is
// gone for good: a message raft addressed to it (here a heartbeat of a
// later term, as a stale leader's could be) does nothing on the node,
// where the same message to its new id deposes the group's leader.
func TestAddedAgainIsANewReplica(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	lead := c.leader("g", abc...)
	c.propose(abc, "g", values("one", 5)...)
	c.converge("g", 5, abc...)
	v := "a"
	for _, id := range abc {
		if id != lead {
			v = id
			break
		}
	}
	old := c.nodes[v].h.Group("g").Self()
	if old != multiraft.ID(v) {
		t.Fatalf("%s, a first replica, has raft id %d, not %d", v, old, multiraft.ID(v))
	}
	c.change(abc, "g", multiraft.Remove, v)
	c.nodes[v].h.Group("g").Close()
	waitFor(t, v+" closed the group", func() bool { return c.nodes[v].h.Group("g") == nil })
	delete(c.disks, c.nodes[v].dir+"/g")
	rest := slices.DeleteFunc(slices.Clone(abc), func(id string) bool { return id == v })
	c.change(rest, "g", multiraft.AddLearner, v)
	fresh := c.ids["g"][v]
	if fresh == 0 || fresh == old {
		t.Fatalf("%s added again has raft id %d (it had %d)", v, fresh, old)
	}
	c.open("g", rest, v)
	c.converge("g", 5, abc...)
	c.change(rest, "g", multiraft.Promote, v)
	c.propose(abc, "g", "two")
	c.converge("g", 6, abc...)
	for _, id := range abc {
		if got := c.nodes[id].h.Group("g").IDs()[v]; got != fresh {
			t.Fatalf("%s knows %s by raft id %d, not %d", id, v, got, fresh)
		}
	}
	if got := c.nodes[v].h.Group("g").Self(); got != fresh {
		t.Fatalf("%s runs the group as raft id %d, not %d", v, got, fresh)
	}

	lead = c.leader("g", abc...)
	lg := c.nodes[lead].h.Group("g")
	term := lg.LeaderTerm()
	stale := func(to uint64) *rpb.Message {
		return &rpb.Message{Type: rpb.MessageType_MsgHeartbeat.Enum(), To: proto.Uint64(to), From: proto.Uint64(lg.Self()),
			Term: proto.Uint64(term + 5), Commit: proto.Uint64(0)}
	}
	if err := c.nodes[v].h.Step(context.Background(), "g", stale(old)); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * election); time.Now().Before(end); time.Sleep(tick) {
		if !lg.IsLeader() || lg.LeaderTerm() != term {
			t.Fatalf("a message to %s's earlier raft id deposed the leader %s of term %d", v, lead, term)
		}
	}
	// The same message to its id now is stepped: the test can tell.
	if err := c.nodes[v].h.Step(context.Background(), "g", stale(fresh)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leader of term "+fmt.Sprint(term)+" deposed", func() bool { return !lg.IsLeader() || lg.LeaderTerm() != term })
	c.propose(abc, "g", "three")
	c.converge("g", 7, abc...)
}

// TestNewReplicaByCopyKeepsItsID: a node added past the compacted log
// gets a copy, and with raft's snapshot the names of the group's raft
// ids; it and the other replicas keep the ids through restarts, given
// none by whoever runs the group.
func TestNewReplicaByCopyKeepsItsID(t *testing.T) {
	c := newCluster(t, 10, "a", "b", "c", "d")
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("v", 200)...)
	waitFor(t, "the logs compacted", func() bool {
		return c.nodes["a"].h.Group("g").FirstIndex() > 100 && c.nodes["b"].h.Group("g").FirstIndex() > 100
	})
	c.change(abc, "g", multiraft.AddLearner, "d")
	fresh := c.ids["g"]["d"]
	c.open("g", abc, "d")
	c.converge("g", 200, "a", "b", "c", "d")
	c.change(abc, "g", multiraft.Promote, "d")
	abd := []string{"a", "b", "d"}
	c.leadAway("g", "c", abd)
	c.change(abd, "g", multiraft.Remove, "c")
	c.propose(abd, "g", values("w", 100)...)
	c.converge("g", 300, abd...)
	waitFor(t, "the logs compacted past the change", func() bool {
		return c.nodes["a"].h.Group("g").FirstIndex() > 250 && c.nodes["b"].h.Group("g").FirstIndex() > 250
	})
	delete(c.ids, "g") // what is stored decides
	for _, id := range []string{"d", "b"} {
		dir := c.nodes[id].dir
		c.kill(id)
		c.start(id, dir)
		c.open("g", abc, id)
		g := c.nodes[id].h.Group("g")
		if got := slices.Sorted(slices.Values(g.Replicas())); !slices.Equal(got, abd) {
			t.Fatalf("%s restarted sees replicas %v, not %v", id, got, abd)
		}
		if id == "d" && g.Self() != fresh {
			t.Fatalf("d restarted runs as raft id %d, not %d", g.Self(), fresh)
		}
		c.propose(abd, "g", "after "+id)
	}
	c.converge("g", 302, abd...)
}

// TestRecoveringDoesNotVote: c, whose log is gone while it is a replica,
// takes no part in elections: with b down, c and a node that missed the
// last entries cannot elect a leader without them; once b is back, the
// group elects one that has everything, and c gets it all back.
func TestRecoveringDoesNotVote(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("one", 5)...)
	c.converge("g", 5, abc...)
	// a misses what b and c acknowledge next.
	c.net.isolate("a", true)
	c.propose([]string{"b", "c"}, "g", values("two", 5)...)
	c.converge("g", 10, "b", "c")
	bdir := c.nodes["b"].dir
	for _, id := range abc {
		c.kill(id)
	}
	c.net.isolate("a", false)
	// c comes back without its log: marked recovering, as the cluster
	// does when its records name c a replica.
	cdir := c.t.TempDir()
	n := c.start("c", cdir)
	if err := n.h.CheckForgotten(func() (string, bool) { return "g", true }); err != nil {
		t.Fatal(err)
	}
	c.start("a", c.t.TempDir())
	// a's log is fresh too here: what matters is that c does not vote
	// for it. Without c's vote, a (behind) cannot win.
	c.open("g", abc, "a", "c")
	deadline := time.Now().Add(50 * election)
	for time.Now().Before(deadline) {
		if g := c.nodes["a"].h.Group("g"); g.IsLeader() {
			t.Fatal("a, without the acknowledged entries, was elected with the vote of a recovering replica")
		}
		time.Sleep(tick)
	}
	if !c.nodes["c"].h.Group("g").Recovering() {
		t.Fatal("c is not recovering")
	}
	c.start("b", bdir)
	c.open("g", abc, "b")
	got := c.converge("g", 10, "b", "c")
	if !slices.Equal(got, append(values("one", 5), values("two", 5)...)) {
		t.Fatalf("applied %v", got)
	}
	waitFor(t, "c recovered", func() bool { return !c.nodes["c"].h.Group("g").Recovering() })
}

// change asks the leader of group among the nodes named for a replica
// change of node, again until the leader applied it.
func (c *cluster) change(among []string, group string, ch multiraft.Change, node string) {
	c.t.Helper()
	done := func(g *multiraft.Group) bool {
		voter, learner := slices.Contains(g.Replicas(), node), slices.Contains(g.Learners(), node)
		switch ch {
		case multiraft.AddLearner:
			return learner
		case multiraft.Promote:
			return voter
		}
		return !voter && !learner
	}
	deadline := time.Now().Add(waitLimit)
	for {
		g := c.nodes[c.leader(group, among...)].h.Group(group)
		g.RequestChange(ch, node)
		for end := time.Now().Add(20 * election); time.Now().Before(end); time.Sleep(tick) {
			if done(g) {
				c.ids[group] = g.IDs()
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replica change of %s (%s) not applied within %s", node, ch, waitLimit)
		}
	}
}

// leadAway moves the leadership of group off node, as the cluster does
// before it removes a leader, and returns once one of among leads.
func (c *cluster) leadAway(group, node string, among []string) {
	c.t.Helper()
	all := append([]string{node}, among...)
	deadline := time.Now().Add(waitLimit)
	for {
		lead := c.leader(group, all...)
		if lead != node {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s still leads %s after %s", node, group, waitLimit)
		}
		g := c.nodes[node].h.Group(group)
		g.RequestTransfer(func(n string) bool { return slices.Contains(among, n) })
		for end := time.Now().Add(10 * election); g.IsLeader() && time.Now().Before(end); {
			time.Sleep(tick)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, waitLimit)
		}
		time.Sleep(tick)
	}
}

// quiet waits until the group is quiesced on every node named.
func (c *cluster) quiet(group string, ids ...string) {
	c.t.Helper()
	waitFor(c.t, group+" quiesced on "+strings.Join(ids, ","), func() bool {
		for _, id := range ids {
			if g := c.nodes[id].h.Group(group); g == nil || !g.Quiesced() {
				return false
			}
		}
		return true
	})
}

// TestQuiesce: an idle group stops ticking on every replica; a proposal
// wakes it and commits; a quiesced leader killed is replaced, its
// followers noticing its node went silent.
func TestQuiesce(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.propose(abc, "g", values("one", 3)...)
	c.quiet("g", abc...)
	c.propose(abc, "g", "wake")
	c.converge("g", 4, abc...)
	c.quiet("g", abc...)
	lead := c.leader("g", abc...)
	rest := slices.DeleteFunc(slices.Clone(abc), func(id string) bool { return id == lead })
	c.kill(lead)
	c.propose(rest, "g", "after")
	got := c.converge("g", 5, rest...)
	if got[len(got)-1] != "after" {
		t.Fatalf("applied %v", got)
	}
}

// TestQuiescedLeaderIsolated: a quiesced leader cut off does not notice;
// its followers elect another; healed, it follows, and a proposal made to
// it while cut off commits nowhere.
func TestQuiescedLeaderIsolated(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	c.propose(abc, "g", "one")
	c.quiet("g", abc...)
	lead := c.leader("g", abc...)
	rest := slices.DeleteFunc(slices.Clone(abc), func(id string) bool { return id == lead })
	c.net.isolate(lead, true)
	c.propose(rest, "g", "two")
	c.net.isolate(lead, false)
	c.propose(abc, "g", "three")
	got := c.converge("g", 3, abc...)
	if !slices.Equal(got, []string{"one", "two", "three"}) {
		t.Fatalf("applied %v", got)
	}
}

// TestAddedReplicaReplaysTheGroupsChanges: a replica added to a group
// starts from the replicas the group has now and replays the changes
// its log holds from the group's start, which made those replicas: the
// one that added the group's only voter as a learner, then promoted it,
// among them. Replayed over a state that already has them, they leave
// it as it is; they neither demote that voter (raft stops the process
// for a group without voters) nor lose a value.
func TestAddedReplicaReplaysTheGroupsChanges(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", []string{"a"}, "a")
	c.leader("g", "a")
	c.propose([]string{"a"}, "g", values("one", 3)...)
	c.change([]string{"a"}, "g", multiraft.AddLearner, "b")
	c.open("g", []string{"a"}, "b")
	c.converge("g", 3, "a", "b")
	c.change([]string{"a"}, "g", multiraft.Promote, "b")
	c.leadAway("g", "a", []string{"b"})
	c.change([]string{"b"}, "g", multiraft.Remove, "a")
	c.propose([]string{"b"}, "g", values("two", 3)...)
	// The group's only voter is b, made by changes its log still holds.
	c.change([]string{"b"}, "g", multiraft.AddLearner, "c")
	c.open("g", []string{"b"}, "c")
	got := c.converge("g", 6, "b", "c")
	if !slices.Equal(got, append(values("one", 3), values("two", 3)...)) {
		t.Fatalf("applied %v", got)
	}
	// c applies its own addition after the values before it.
	g := c.nodes["c"].h.Group("g")
	waitFor(t, "c sees b the voter and itself a learner", func() bool {
		return slices.Equal(g.Replicas(), []string{"b"}) && slices.Equal(g.Learners(), []string{"c"})
	})
	c.change([]string{"b"}, "g", multiraft.Promote, "c")
	c.propose([]string{"b", "c"}, "g", "three")
	c.converge("g", 7, "b", "c")
}

// TestWholeGroupRestarts: every replica stops at once and starts again
// from its log, which records a commit index only beside entries and
// votes, and compacts after every applied entry: the group elects a
// leader again and goes on with every value in order.
func TestWholeGroupRestarts(t *testing.T) {
	c := newCluster(t, 1, abc...)
	c.open("g", abc, abc...)
	c.leader("g", abc...)
	c.propose(abc, "g", values("one", 20)...)
	c.converge("g", 20, abc...)
	waitFor(t, "the applied indexes recorded", func() bool {
		for _, id := range abc {
			if c.nodes[id].h.Group("g").FirstIndex() < 20 {
				return false
			}
		}
		return true
	})
	dirs := map[string]string{}
	for _, id := range abc {
		dirs[id] = c.nodes[id].dir
		c.kill(id)
	}
	for _, id := range abc {
		c.start(id, dirs[id])
		c.open("g", abc, id)
	}
	c.propose(abc, "g", "two")
	got := c.converge("g", 21, abc...)
	if !slices.Equal(got, append(values("one", 20), "two")) {
		t.Fatalf("applied %v", got)
	}
}

// TestNothingCommitsBeforeADiskHasIt: raft's log writes run beside the
// driver, and what depends on them waits for them. With every replica's
// writes held, a value proposed is applied nowhere, and the driver goes
// on (the leader keeps leading). With one follower's writes let go, one
// disk of three holds it: still applied nowhere. With the other
// follower's too, a majority does: both followers apply it, and the
// leader, whose own write is still held, once its log holds it.
func TestNothingCommitsBeforeADiskHasIt(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	lead := c.leader("g", abc...)
	c.propose(abc, "g", "one")
	c.converge("g", 1, abc...)
	var followers []string
	for _, id := range abc {
		c.nodes[id].disk.hold(true)
		if id != lead {
			followers = append(followers, id)
		}
	}
	sm := c.sm(lead, "g")
	sm.offer("two")
	waitFor(t, "every replica's write of two waiting", func() bool {
		for _, id := range abc {
			if !c.nodes[id].disk.waiting() {
				return false
			}
		}
		return true
	})
	appliedNowhere := func(what string) {
		t.Helper()
		for end := time.Now().Add(3 * election); time.Now().Before(end); time.Sleep(tick) {
			for _, id := range abc {
				if got := c.sm(id, "g").list(); len(got) != 1 {
					t.Fatalf("%s applied %v with %s", id, got, what)
				}
			}
		}
	}
	appliedNowhere("no disk holding two")
	if !c.nodes[lead].h.Group("g").IsLeader() {
		t.Fatalf("%s lost its leadership while the disks were slow", lead)
	}
	c.nodes[followers[0]].disk.hold(false)
	appliedNowhere("one disk of three holding two")
	c.nodes[followers[1]].disk.hold(false)
	c.converge("g", 2, followers...)
	if got := c.sm(lead, "g").list(); len(got) != 1 {
		t.Fatalf("the leader applied %v before its own log held two", got)
	}
	c.nodes[lead].disk.hold(false)
	c.converge("g", 2, abc...)
}

// TestLeaderWhoseLogFailsHandsOver: the leader's raft log stops taking
// writes. What it proposed after fails (the state machine is told), and
// it hands the leadership to another replica, which commits what is
// proposed to it with the third.
func TestLeaderWhoseLogFailsHandsOver(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	lead := c.leader("g", abc...)
	c.propose(abc, "g", "one")
	c.converge("g", 1, abc...)
	c.nodes[lead].disk.breakDisk()
	sm := c.sm(lead, "g")
	sm.offer("lost")
	waitFor(t, "the broken leader's state machine told", func() bool {
		sm.mu.Lock()
		defer sm.mu.Unlock()
		return sm.failed != nil
	})
	var others []string
	for _, id := range abc {
		if id != lead {
			others = append(others, id)
		}
	}
	next := c.leader("g", others...)
	if c.nodes[lead].h.Group("g").IsLeader() {
		t.Fatalf("%s leads still, its log broken", lead)
	}
	c.propose(others, "g", "two")
	got := c.converge("g", 2, others...)
	if got[len(got)-1] != "two" {
		t.Fatalf("%s's group applied %v", next, got)
	}
}

// TestReplicaWhoseDiskHangsLeavesTheInSync: a follower whose raft log
// takes no write (a hung disk) still answers heartbeats, yet it is not
// in sync once its log stood still for two election timeouts lacking an
// entry, however few it lacks: a leadership handed to it would never
// arrive. Once its disk writes again it catches up and is back in sync.
func TestReplicaWhoseDiskHangsLeavesTheInSync(t *testing.T) {
	c := newCluster(t, 100, abc...)
	c.open("g", abc, abc...)
	lead := c.leader("g", abc...)
	c.propose(abc, "g", "one")
	c.converge("g", 1, abc...)
	var hung string
	for _, id := range abc {
		if id != lead {
			hung = id
			break
		}
	}
	g := c.nodes[lead].h.Group("g")
	inSync := func() []string {
		in, _ := g.InSync()
		return in
	}
	waitFor(t, hung+" in sync", func() bool { return slices.Contains(inSync(), hung) })
	c.nodes[hung].disk.hold(true)
	c.propose(abc, "g", "two")
	waitFor(t, hung+" out of the in-sync replicas, its disk hung", func() bool { return !slices.Contains(inSync(), hung) })
	if up, _ := g.UpToDate(); slices.Contains(up, hung) {
		t.Fatalf("%s counted up to date, its disk hung: %v", hung, up)
	}
	c.nodes[hung].disk.hold(false)
	c.converge("g", 2, abc...)
	waitFor(t, hung+" back in sync", func() bool { return slices.Contains(inSync(), hung) })
}
