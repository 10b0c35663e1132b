package cluster_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	hist "github.com/shardq/shardq/internal/history"
	"github.com/shardq/shardq/internal/netfault"
)

// ackTimeout is the queue's ack_timeout in a nemesis run.
const ackTimeout = 10 * time.Second

// TestNemesis: three nodes and etcd, each in a network namespace of its
// own, under a produce/consume load through every node, while a seeded
// schedule of faults hits them one after the other: a node (the busiest
// leader or any) cut from its peers, from etcd, from everything; a
// minority split off; a bridge; a lossy and a flapping link; kill -9 and
// restart; SIGSTOP and SIGCONT; etcd paused, killed and restarted. Each
// lasts 2 to 8 s, is healed, and the cluster must recover (every node
// ready, every partition owned, every producer acknowledged again)
// before the next. Then the queue is drained and the history judged by
// internal/history: nothing acknowledged lost, no duplicate without a
// cause, per-key order of first deliveries, DUP on every redelivery, no
// two consumers holding one message, dead letters accounted for.
//
// By default it is bounded for CI (nine faults at most, about two
// minutes). SHARDQ_CHAOS_DURATION=60m runs fault cycles for that long
// (make chaos), each of at most SHARDQ_CHAOS_CYCLE (5m) judged on its
// own, and SHARDQ_CHAOS_REPORT=FILE writes the report there.
// SHARDQ_CHAOS_SEED repeats a schedule.
func TestNemesis(t *testing.T) {
	cfg := nemesisSettings(t)
	nodes := []string{"a", "b", "c"}
	// A lease the broker holds for a consumer that is gone, or whose ack
	// it lost, runs out within the drain's quiet time.
	c, etcd := newNetCluster(t, nodes, "--config", configFile(t, fmt.Sprintf("queues:\n  defaults:\n    ack_timeout: %s\n", ackTimeout)))
	for _, id := range nodes {
		c.start(id)
	}
	n := &nemesis{t: t, c: c, etcd: etcd, net: c.net, nodes: nodes, rng: rand.New(rand.NewPCG(cfg.seed, 0)),
		recovery: cfg.recovery, repair: cfg.long}
	rep := newChaosReport(cfg)
	t.Logf("seed %d (SHARDQ_CHAOS_SEED=%d repeats the schedule)", cfg.seed, cfg.seed)
	end := time.Now().Add(cfg.duration)
	for cycle := 1; ; cycle++ {
		prefix := ""
		if cfg.long {
			prefix = "c" + strconv.Itoa(cycle) + "-"
		}
		w := newWorkload(c, nodes, prefix, cfg.keys, cfg.rate)
		if err := w.start(); err != nil {
			t.Fatal(err)
		}
		c.waitOwned(loadQueue, 8, 30*time.Second, nodes...)
		n.w = w
		// A calm moment first: every producer acknowledged, the ordinary
		// gaps between acknowledgements measured.
		if err := n.recovered(time.Now(), time.Minute); err != nil {
			t.Fatalf("cluster not serving before the first fault: %v", err)
		}
		time.Sleep(3 * time.Second)
		cycleEnd := time.Now().Add(cfg.cycle)
		if cycleEnd.After(end) {
			cycleEnd = end
		}
		faults := n.run(cycleEnd, cfg.faults)
		h, r := n.finish(w, faults)
		rep.add(cycle, faults, h, r, w)
		t.Logf("cycle %d: %d faults, %d acknowledged, %d violations", cycle, len(faults), r.Summary.Acknowledged, len(r.Violations))
		if !r.OK() {
			t.Errorf("cycle %d: history check:\n%s", cycle, r)
		}
		if !r.OK() || n.broken {
			keep(t, fmt.Sprintf("cycle%d-history.json", cycle), h)
			keep(t, fmt.Sprintf("cycle%d-faults.json", cycle), faults)
		}
		if cfg.report != "" {
			rep.took = time.Since(rep.began)
			if err := os.WriteFile(cfg.report, []byte(rep.markdown()), 0o644); err != nil {
				t.Error(err)
			}
		}
		if !cfg.long || n.broken || time.Until(end) < time.Minute {
			break
		}
	}
	rep.took = time.Since(rep.began)
	t.Logf("report:\n%s", rep.markdown())
}

// nemesisConfig says how long a nemesis run goes and how hard it loads.
type nemesisConfig struct {
	long bool
	// duration bounds the whole run (long) or the faults of CI mode;
	// cycle bounds one cycle's faults.
	duration, cycle time.Duration
	faults          int // at most, per cycle
	rate, keys      int
	recovery        time.Duration // bounds the wait for a recovery from a fault
	seed            uint64
	report, command string
	// code names the checkout the run's nodes were built from, as it was
	// when the run began.
	code string
}

func nemesisSettings(t *testing.T) nemesisConfig {
	cfg := nemesisConfig{duration: 70 * time.Second, cycle: 70 * time.Second, faults: 9, rate: 240, keys: 32,
		recovery: 20 * time.Second, seed: uint64(time.Now().UnixNano()),
		report: os.Getenv("SHARDQ_CHAOS_REPORT"), command: os.Getenv("SHARDQ_CHAOS_COMMAND"), code: revision()}
	if s := os.Getenv("SHARDQ_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SHARDQ_CHAOS_DURATION=%q: %v", s, err)
		}
		cfg.long, cfg.duration, cfg.cycle, cfg.faults, cfg.rate, cfg.keys = true, d, 5*time.Minute, 25, 400, 48
		cfg.recovery = time.Minute
		if s := os.Getenv("SHARDQ_CHAOS_CYCLE"); s != "" {
			if cfg.cycle, err = time.ParseDuration(s); err != nil {
				t.Fatalf("SHARDQ_CHAOS_CYCLE=%q: %v", s, err)
			}
		}
	}
	if s := os.Getenv("SHARDQ_CHAOS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SHARDQ_CHAOS_SEED=%q: %v", s, err)
		}
		cfg.seed = seed
	}
	if cfg.command == "" {
		cfg.command = "go test -run TestNemesis ./cluster/"
		if raceBuild {
			cfg.command = "go test -race -run TestNemesis ./cluster/"
		}
	}
	return cfg
}

// nemesis applies faults to a cluster in namespaces.
type nemesis struct {
	t     *testing.T
	c     *testCluster
	etcd  *netEtcd
	net   *netfault.Net
	nodes []string
	rng   *rand.Rand
	w     *workload
	deck  []faultKind // the kinds still to deal before shuffling again
	count int         // faults applied
	// recovery bounds the wait for the cluster to recover from a fault.
	recovery time.Duration
	// broken: the cluster did not recover from a fault; no more faults.
	broken bool
	// repair: once a cluster that did not recover was restarted, node
	// by node, the faults go on (long runs).
	repair bool
}

// fault is one fault applied, and what it did.
type fault struct {
	N      int
	Kind   string
	Target string
	// Start is when it was applied, Healed when it was healed, Recovered
	// when the cluster was back (zero if it never was).
	Start, Healed, Recovered time.Time
	// Resume is the longest a partition went without an acknowledged
	// publish from Start until Recovered; Stalled how many partitions
	// went a second or more.
	Resume  time.Duration
	Stalled int
	// Unknown counts the publish attempts sent from Start until
	// Recovered that were answered 0x83 or not at all.
	Unknown int
	Err     string
}

// plan is a fault chosen, ready to apply.
type plan struct {
	target string
	// cut are the nodes cut off from their peers or from the clients:
	// the consumers there end their sessions as the fault starts.
	cut         []string
	apply, heal func() error
}

// faultKind chooses a fault of one kind.
type faultKind struct {
	name   string
	choose func(n *nemesis) plan
}

var faultKinds = []faultKind{
	{"partition from peers", func(n *nemesis) plan {
		x := n.victim()
		return n.network(x+" | "+strings.Join(n.others(x), " "), []string{x}, func() error { return n.net.Split([]string{x}, n.others(x)) })
	}},
	{"partition from etcd", func(n *nemesis) plan {
		x := n.victim()
		return n.network(x+" | etcd", nil, func() error { return n.net.Partition(x, etcdNS) })
	}},
	{"isolate", func(n *nemesis) plan {
		x := n.victim()
		return n.network(x, []string{x}, func() error { return n.net.Isolate(x) })
	}},
	{"minority split", func(n *nemesis) plan {
		x := n.victim()
		minority, majority := []string{x}, n.others(x)
		if n.rng.IntN(2) == 0 {
			minority = append(minority, etcdNS)
		} else {
			majority = append(majority, etcdNS)
		}
		return n.network(strings.Join(minority, " ")+" | "+strings.Join(majority, " "), []string{x},
			func() error { return n.net.Split(minority, majority) })
	}},
	{"bridge", func(n *nemesis) plan {
		p := n.rng.Perm(len(n.nodes))
		a, mid, c := n.nodes[p[0]], n.nodes[p[1]], n.nodes[p[2]]
		return n.network(a+" - "+mid+" - "+c, nil, func() error { return n.net.Bridge(a, mid, c) })
	}},
	{"loss 30%", func(n *nemesis) plan {
		a, b := n.pair()
		return n.network(a+" ~ "+b, nil, func() error { return n.net.Loss(a, b, 30) })
	}},
	{"flapping link", func(n *nemesis) plan {
		a, b := n.pair()
		period := time.Duration(200+n.rng.IntN(800)) * time.Millisecond
		return n.network(fmt.Sprintf("%s ~ %s every %s", a, b, period), nil, func() error {
			_ = n.net.Flap(a, b, period) // HealAll stops it
			return nil
		})
	}},
	{"kill -9", func(n *nemesis) plan {
		x := n.victim()
		nd := n.c.nodes[x]
		return plan{target: x, cut: []string{x},
			apply: func() error { nd.kill(); return nil },
			heal:  func() error { nd.launch(n.t, n.c, nil); return nil }}
	}},
	{"SIGSTOP", func(n *nemesis) plan {
		x := n.victim()
		nd := n.c.nodes[x]
		return plan{target: x, cut: []string{x},
			apply: func() error { return nd.cmd.Process.Signal(syscall.SIGSTOP) },
			heal:  func() error { return nd.cmd.Process.Signal(syscall.SIGCONT) }}
	}},
	{"etcd SIGSTOP", func(n *nemesis) plan {
		return plan{target: etcdNS,
			apply: func() error { return n.etcd.cmd.Process.Signal(syscall.SIGSTOP) },
			heal:  func() error { return n.etcd.cmd.Process.Signal(syscall.SIGCONT) }}
	}},
	{"etcd kill -9", func(n *nemesis) plan {
		return plan{target: etcdNS,
			apply: func() error { n.etcd.kill(); return nil },
			heal:  func() error { n.etcd.start(n.t); return nil }}
	}},
}

// network is the plan of a network fault; HealAll heals it.
func (n *nemesis) network(target string, cut []string, apply func() error) plan {
	return plan{target: target, cut: cut, apply: apply, heal: n.net.HealAll}
}

// victim is the node leading the most partitions, or half the time any
// node.
func (n *nemesis) victim() string {
	if n.rng.IntN(2) == 0 {
		if o, err := n.c.ownersWithin(loadQueue, time.Second); err == nil {
			count := map[string]int{}
			best := ""
			for _, r := range o {
				count[r.Owner]++
				if slices.Contains(n.nodes, r.Owner) && (best == "" || count[r.Owner] > count[best]) {
					best = r.Owner
				}
			}
			if best != "" {
				return best
			}
		}
	}
	return n.nodes[n.rng.IntN(len(n.nodes))]
}

// others are the nodes other than x.
func (n *nemesis) others(x string) []string {
	var out []string
	for _, id := range n.nodes {
		if id != x {
			out = append(out, id)
		}
	}
	return out
}

// pair is two nodes, or a node and etcd.
func (n *nemesis) pair() (string, string) {
	all := append(slices.Clone(n.nodes), etcdNS)
	p := n.rng.Perm(len(all))
	return all[p[0]], all[p[1]]
}

// next deals the next kind: every kind once, in a random order, then
// again. SHARDQ_CHAOS_KINDS, the names of some kinds separated by commas,
// deals only those.
func (n *nemesis) next() faultKind {
	if len(n.deck) == 0 {
		n.deck = slices.Clone(faultKinds)
		if only := os.Getenv("SHARDQ_CHAOS_KINDS"); only != "" {
			names := strings.Split(only, ",")
			n.deck = slices.DeleteFunc(n.deck, func(k faultKind) bool { return !slices.Contains(names, k.name) })
			if len(n.deck) == 0 {
				n.t.Fatalf("SHARDQ_CHAOS_KINDS=%q names no fault kind", only)
			}
		}
		n.rng.Shuffle(len(n.deck), func(i, j int) { n.deck[i], n.deck[j] = n.deck[j], n.deck[i] })
	}
	k := n.deck[0]
	n.deck = n.deck[1:]
	return k
}

// run applies faults one after the other until max were applied or the
// time is up, or the cluster does not recover from one.
func (n *nemesis) run(until time.Time, max int) []*fault {
	var faults []*fault
	for len(faults) < max && time.Now().Before(until) && !n.broken {
		faults = append(faults, n.apply(n.next()))
	}
	return faults
}

// apply applies one fault for 2 to 8 s, heals it and waits until the
// cluster recovered, then a moment more.
func (n *nemesis) apply(k faultKind) *fault {
	n.count++
	p := k.choose(n)
	f := &fault{N: n.count, Kind: k.name, Target: p.target}
	d := time.Duration(2000+n.rng.IntN(6000)) * time.Millisecond
	n.w.cut(p.cut)
	f.Start = time.Now()
	if err := p.apply(); err != nil {
		f.Err = "applying it: " + err.Error()
		n.t.Errorf("fault %d (%s %s): %s", f.N, f.Kind, f.Target, f.Err)
	}
	n.t.Logf("fault %d: %s (%s) for %s", f.N, f.Kind, f.Target, d)
	time.Sleep(d)
	if err := p.heal(); err != nil {
		f.Err = "healing it: " + err.Error()
		n.t.Errorf("fault %d (%s %s): %s", f.N, f.Kind, f.Target, f.Err)
	}
	f.Healed = time.Now()
	n.w.uncut()
	if err := n.recovered(f.Healed, n.recovery); err != nil {
		n.dumpGoroutines(fmt.Sprintf("fault%d", f.N))
		f.Err = fmt.Sprintf("not recovered %s after the heal: %v", n.recovery, err)
		n.t.Errorf("fault %d (%s %s): %s", f.N, f.Kind, f.Target, f.Err)
		// Repaired, so that the drain judges what was stored, not what
		// a stuck node holds; only long runs go on after it.
		if err := n.restartAll(); err != nil {
			n.broken = true
			f.Err += "; not recovered from a restart of every node either: " + err.Error()
		} else {
			f.Err += " (repaired: every node restarted)"
			n.broken = !n.repair
		}
		return f
	}
	f.Recovered = time.Now()
	n.t.Logf("fault %d: recovered %s after the heal", f.N, f.Recovered.Sub(f.Healed).Round(time.Millisecond))
	time.Sleep(time.Second)
	n.w.rehome()
	return f
}

// restartAll kills and restarts every node in turn, each once the one
// before is ready, then waits for the cluster to recover: what an
// operator does with a cluster that did not recover by itself.
func (n *nemesis) restartAll() error {
	for _, id := range n.nodes {
		n.t.Logf("restarting %s (kill -9) to repair the cluster", id)
		n.w.cut([]string{id})
		nd := n.c.nodes[id]
		nd.kill()
		nd.launch(n.t, n.c, nil)
		n.w.uncut()
		for deadline := time.Now().Add(n.recovery); !nd.ready(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s not ready %s after its restart:\n%s", id, n.recovery, nd.logTail())
			}
		}
	}
	if err := n.recovered(time.Now(), n.recovery); err != nil {
		return err
	}
	n.w.rehome()
	return nil
}

// recovered waits until every node is ready, every partition of the
// queue owned by a node and every producer acknowledged since.
func (n *nemesis) recovered(since time.Time, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := n.health(since)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *nemesis) health(since time.Time) error {
	for _, id := range n.nodes {
		nd := n.c.nodes[id]
		select {
		case <-nd.exited:
			return fmt.Errorf("node %s exited:\n%s", id, nd.logTail())
		default:
		}
		if !nd.ready() {
			return fmt.Errorf("node %s not ready:\n%s", id, nd.logTail())
		}
	}
	o, err := n.c.ownersWithin(loadQueue, time.Second)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	for p := range 8 {
		if !slices.Contains(n.nodes, o[p].Owner) {
			return fmt.Errorf("partition %d has no owner (%v)", p, o)
		}
	}
	for _, p := range n.w.producers {
		if p.lastAck.Load() < since.UnixNano() {
			return errors.New("no publish of " + p.name + " acknowledged since")
		}
	}
	return nil
}

// finish heals everything, stops the load, drains the queue and its
// dead-letter queue and judges the history.
func (n *nemesis) finish(w *workload, faults []*fault) (hist.History, hist.Report) {
	if err := n.net.HealAll(); err != nil {
		n.t.Error(err)
	}
	w.uncut()
	if err := n.recovered(time.Now(), n.recovery); err != nil {
		n.dumpGoroutines("end")
		n.t.Errorf("not recovered %s after the last heal: %v", n.recovery, err)
		if err := n.restartAll(); err != nil {
			n.broken = true
			n.t.Errorf("not recovered from a restart of every node either: %v", err)
		}
	}
	w.stopProducers()
	if missing := w.drain(15 * time.Second); missing > 0 {
		n.t.Logf("%d acknowledged messages not delivered, none delivered for 15s", missing)
	}
	w.stopConsumers()
	dlq := n.nodes[0]
	for _, id := range n.nodes {
		if n.c.nodes[id].ready() {
			dlq = id
			break
		}
	}
	if err := w.drainDLQ(dlq, 3*time.Second); err != nil {
		n.t.Errorf("reading the dead-letter queue on %s: %v", dlq, err)
	}
	opts := hist.DefaultOptions()
	opts.LeaseTimeout = ackTimeout
	opts.Groups = map[string][]string{loadQueue: {loadGroup}}
	opts.DLQConsumed = true
	h := w.rec.History()
	measureResume(faults, h, w.partitions())
	return h, hist.Check(h, opts)
}

// dumpGoroutines keeps every node's goroutines (/debug/pprof/goroutine)
// in SHARDQ_TEST_LOGS, when set, each file named after the node and when.
func (n *nemesis) dumpGoroutines(when string) {
	for _, id := range n.nodes {
		req, err := http.NewRequest("GET", "http://"+n.c.nodes[id].http+"/debug/pprof/goroutine?debug=2", nil)
		if err != nil {
			continue
		}
		req.Header.Set("Authorization", "Bearer "+netAdminToken)
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			n.t.Logf("goroutines of %s: %v", id, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		keep(n.t, fmt.Sprintf("%s-goroutines-%s.txt", when, id), b)
	}
}

// keep writes v (bytes as they are, anything else as JSON) into
// SHARDQ_TEST_LOGS, when set, for a look at a failure.
func keep(t *testing.T, name string, v any) {
	dir := os.Getenv("SHARDQ_TEST_LOGS")
	if dir == "" {
		return
	}
	b, ok := v.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Logf("keeping %s: %v", name, err)
			return
		}
	}
	path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name)
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Logf("keeping %s: %v", name, err)
		return
	}
	t.Logf("kept %s", path)
}
