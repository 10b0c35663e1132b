package cluster_test

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/internal/netfault"
	"github.com/shardq/shardq/internal/testbin"
)

// The cluster tests run real shardq processes against an etcd embedded in
// the test binary, on loopback.

func shardqBinary(t testing.TB) string {
	t.Helper()
	return testbin.Shardq(t, raceBuild)
}

// given are the addresses freeAddr handed out: the kernel may offer a
// port again once its listener closed, and two flags of one node got the
// same one.
var (
	givenMu sync.Mutex
	given   = map[string]bool{}
)

func freeAddr(t testing.TB) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		givenMu.Lock()
		fresh := !given[addr]
		given[addr] = true
		givenMu.Unlock()
		if fresh {
			return addr
		}
	}
}

// current is the cluster of the running test.
var current *testCluster

// testCluster is an etcd and the shardq nodes of one test.
type testCluster struct {
	t     testing.TB
	etcd  string
	cli   *clientv3.Client
	nodes map[string]*node
	extra []string // flags every node gets
	// net, when set, runs each node in its network namespace of the name
	// of the node, on fixed ports of its address (newNetCluster).
	net *netfault.Net
}

type node struct {
	id, dir          string
	mqtt, http, grpc string
	cmd              *exec.Cmd
	logPath          string
	logStart         int64 // where this run's lines start in the log
	exited           chan struct{}
}

func newCluster(t testing.TB, extra ...string) *testCluster {
	t.Helper()
	endpoint, cli := cluster.StartEtcd(t)
	current = &testCluster{t: t, etcd: endpoint, cli: cli, nodes: map[string]*node{}, extra: extra}
	return current
}

// start runs node id (again, with its data dir, after a stop) and waits
// until it is ready.
func (c *testCluster) start(id string, extra ...string) *node {
	t := c.t
	t.Helper()
	n := c.nodes[id]
	if n == nil {
		n = &node{id: id, dir: t.TempDir()}
		if c.net != nil {
			ip := c.net.Addr(id)
			n.mqtt, n.http, n.grpc = ip+":1883", ip+":8990", ip+":8991"
		} else {
			n.mqtt, n.http, n.grpc = freeAddr(t), freeAddr(t), freeAddr(t)
		}
		c.nodes[id] = n
	}
	for try := 1; ; try++ {
		n.launch(t, c, extra)
		if !n.waitReadyOrPortTaken(t, 30*time.Second) {
			return n
		}
		// A port picked free was taken by another process before the
		// node bound it (other test packages run beside this one): the
		// node starts again on others.
		if c.net != nil || try == 3 {
			t.Fatalf("node %s: its ports were taken %d times:\n%s", n.id, try, n.logTail())
		}
		n.mqtt, n.http, n.grpc = freeAddr(t), freeAddr(t), freeAddr(t)
	}
}

func (n *node) launch(t testing.TB, c *testCluster, extra []string) {
	t.Helper()
	args := []string{"serve", "--data-dir", n.dir, "--mqtt", n.mqtt, "--http", n.http, "--ws", "",
		"--node-id", n.id, "--etcd", c.etcd, "--cluster-addr", n.grpc, "--log-level", "info"}
	args = append(append(args, c.extra...), extra...)
	if c.net != nil {
		n.cmd = c.net.Command(n.id, shardqBinary(t), args...)
	} else {
		n.cmd = exec.Command(shardqBinary(t), args...)
	}
	f, err := os.OpenFile(filepath.Join(n.dir, "..", n.id+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	n.logPath = f.Name()
	if fi, err := f.Stat(); err == nil {
		n.logStart = fi.Size()
	}
	n.cmd.Stdout, n.cmd.Stderr = f, f
	n.cmd.Env = append(os.Environ(), "SHARDQ_WS=")
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		_ = f.Close()
		close(done)
	}(n.cmd, n.exited)
	cmd := n.cmd
	t.Cleanup(func() {
		n.kill()
		if dir := os.Getenv("SHARDQ_TEST_LOGS"); dir != "" && (t.Failed() || os.Getenv("SHARDQ_TEST_LOGS_ALWAYS") != "") {
			// Kept for a look at a failure: SHARDQ_TEST_LOGS=DIR (and
			// SHARDQ_TEST_LOGS_ALWAYS=1: whatever the outcome).
			b, _ := os.ReadFile(n.logPath)
			_ = os.MkdirAll(dir, 0o755)
			_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+n.id+".log"), b, 0o644)
		}
		if log := n.logTail(); strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("node %s: data race:\n%s", n.id, log)
		} else if t.Failed() && n.cmd == cmd {
			// Once per node, at its last run: all a CI log keeps.
			t.Logf("node %s, the end of its log:\n%s", n.id, log)
		}
	})
}

func (n *node) waitReady(t testing.TB, within time.Duration) {
	t.Helper()
	if n.waitReadyOrPortTaken(t, within) {
		t.Fatalf("node %s exited before it was ready:\n%s", n.id, n.logTail())
	}
}

// waitReadyOrPortTaken is waitReady, but reports true rather than fail
// when the node exited because one of its addresses was in use.
func (n *node) waitReadyOrPortTaken(t testing.TB, within time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		select {
		case <-n.exited:
			// The MQTT and HTTP listeners say "the address is in use"
			// (broker.listenError), the cluster's gRPC one the system's
			// "address already in use".
			if b, _ := os.ReadFile(n.logPath); int64(len(b)) >= n.logStart {
				if log := string(b[n.logStart:]); strings.Contains(log, "the address is in use") || strings.Contains(log, "address already in use") {
					return true
				}
			}
			t.Fatalf("node %s exited before it was ready:\n%s", n.id, n.logTail())
		default:
		}
		resp, err := http.Get("http://" + n.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return false
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not ready within %s:\n%s", n.id, within, n.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *node) logTail() string {
	b, _ := os.ReadFile(n.logPath)
	if i := strings.Index(string(b), "WARNING: DATA RACE"); i >= 0 {
		return string(b[i:min(len(b), i+8000)])
	}
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

func (n *node) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

func (n *node) signal(s syscall.Signal) { _ = n.cmd.Process.Signal(s) }

// waitExit waits for the node's process to end.
func (n *node) waitExit(t testing.TB, within time.Duration) {
	t.Helper()
	select {
	case <-n.exited:
	case <-time.After(within):
		t.Fatalf("node %s still running after %s:\n%s", n.id, within, n.logTail())
	}
}

// ownership is a partition's record in etcd.
type ownership struct {
	Owner    string   `json:"owner"`
	Epoch    uint64   `json:"epoch"`
	Replicas []string `json:"replicas"`
	Learners []string `json:"learners"`
	// IDs: the raft ids of replicas added to the group, by node.
	IDs map[string]uint64 `json:"ids"`
}

// owners reads the owners of the queue's partitions from etcd.
func (c *testCluster) owners(queue string) map[int]ownership {
	c.t.Helper()
	out, err := c.ownersWithin(queue, 5*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// ownersWithin reads the owners of the queue's partitions from etcd, or
// fails when etcd did not answer within that time.
func (c *testCluster) ownersWithin(queue string, within time.Duration) (map[int]ownership, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	prefix := "/shardq/owners/" + queue + "/"
	resp, err := c.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[int]ownership{}
	for _, kv := range resp.Kvs {
		p, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), prefix))
		if err != nil {
			continue
		}
		var o ownership
		_ = json.Unmarshal(kv.Value, &o)
		out[p] = o
	}
	return out, nil
}

// waitOwned waits until every partition of the queue is owned by one of
// the nodes given, and each of them serves it.
func (c *testCluster) waitOwned(queue string, partitions int, within time.Duration, nodes ...string) map[int]ownership {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		o := c.owners(queue)
		ok := len(o) == partitions
		for _, r := range o {
			found := false
			for _, id := range nodes {
				found = found || r.Owner == id
			}
			ok = ok && found
		}
		if ok {
			return o
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("partitions of %s not owned by %v within %s: %v", queue, nodes, within, o)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// client is an MQTT 5 client of a test.
type client struct {
	t  testing.TB
	c  *paho.Client
	mu sync.Mutex
	// got records each received publish; ack decides whether it is acked.
	got  []*paho.Publish
	wake chan struct{}
}

// arrivals is every publish the test's clients received, in the order
// they arrived.
var arrivals arrivalLog

type arrivalLog struct {
	mu  sync.Mutex
	log []arrival
}

type arrival struct {
	client string
	p      *paho.Publish
}

func (a *arrivalLog) add(client string, p *paho.Publish) {
	a.mu.Lock()
	a.log = append(a.log, arrival{client, p})
	a.mu.Unlock()
}

// since returns the arrivals after the first n.
func (a *arrivalLog) since(n int) []arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]arrival(nil), a.log[n:]...)
}

func (a *arrivalLog) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.log)
}

func dial(t testing.TB, addr, id string, rm uint16) *client {
	t.Helper()
	return dialClient(t, addr, id, rm, false)
}

// dialManual connects a client that never acknowledges what it receives.
func dialManual(t testing.TB, addr, id string, rm uint16) *client {
	t.Helper()
	return dialClient(t, addr, id, rm, true)
}

// dialSession connects a client that keeps its session (clean start
// false, a session expiry of an hour) unless clean.
func dialSession(t testing.TB, addr, id string, clean bool) *client {
	t.Helper()
	return dialWith(t, addr, id, 32, false, clean)
}

func dialClient(t testing.TB, addr, id string, rm uint16, manual bool) *client {
	t.Helper()
	return dialWith(t, addr, id, rm, manual, true)
}

func dialWith(t testing.TB, addr, id string, rm uint16, manual, clean bool) *client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl := &client{t: t, wake: make(chan struct{}, 1)}
	cl.c = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id, EnableManualAcknowledgment: manual,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			cl.mu.Lock()
			cl.got = append(cl.got, r.Packet)
			cl.mu.Unlock()
			arrivals.add(id, r.Packet)
			select {
			case cl.wake <- struct{}{}:
			default:
			}
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	expiry := uint32(0)
	if !clean {
		expiry = 3600
	}
	if _, err := cl.c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm, SessionExpiryInterval: &expiry}}); err != nil {
		t.Fatalf("connect %s to %s: %v", id, addr, err)
	}
	t.Cleanup(func() { _ = cl.c.Disconnect(&paho.Disconnect{}) })
	return cl
}

func (cl *client) subscribe(filter string) {
	cl.t.Helper()
	cl.subscribeWith(filter, nil)
}

// subscribeWith subscribes with the user properties props.
func (cl *client) subscribeWith(filter string, props map[string]string) {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}
	if len(props) > 0 {
		s.Properties = &paho.SubscribeProperties{}
		for k, v := range props {
			s.Properties.User = append(s.Properties.User, paho.UserProperty{Key: k, Value: v})
		}
	}
	sa, err := cl.c.Subscribe(ctx, s)
	if err != nil {
		cl.t.Fatalf("subscribe %s: %v", filter, err)
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] > 1 {
		cl.t.Fatalf("subscribe %s: reasons %v", filter, sa.Reasons)
	}
}

// publish sends a QoS 1 publish and returns its PUBACK reason code.
func (cl *client) publish(topic, key string, payload []byte) (byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p := &paho.Publish{Topic: topic, QoS: 1, Payload: payload}
	if key != "" {
		p.Properties = &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}
	}
	resp, err := cl.c.Publish(ctx, p)
	if err != nil {
		if resp != nil {
			return resp.ReasonCode, nil
		}
		return 0, err
	}
	return resp.ReasonCode, nil
}

func (cl *client) received() []*paho.Publish {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return append([]*paho.Publish(nil), cl.got...)
}

// waitCount waits until the clients together received at least n
// publishes.
func waitCount(t testing.TB, n int, within time.Duration, cls ...*client) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		total := 0
		for _, cl := range cls {
			total += len(cl.received())
		}
		if total >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d publishes within %s", total, n, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ledger records what a producer published and how each was answered.
type ledger struct {
	mu    sync.Mutex
	acked map[string]bool // payloads answered 0x00
	codes map[byte]int
	errs  int
}

// produce publishes to topic from cl until stop is closed, keys k0..k(keys-1)
// in turn, one publish at a time; done is closed when it stops.
func produce(cl *client, topic string, keys int, stop <-chan struct{}) (*ledger, <-chan struct{}) {
	return produceKeys(cl, topic, "k", keys, stop)
}

// produceKeys is produce with keys named prefix0, prefix1...
func produceKeys(cl *client, topic, prefix string, keys int, stop <-chan struct{}) (*ledger, <-chan struct{}) {
	l := &ledger{acked: map[string]bool{}, codes: map[byte]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			for k := 0; k < keys; k++ {
				select {
				case <-stop:
					return
				default:
				}
				key := prefix + strconv.Itoa(k)
				payload := message(key, i)
				code, err := cl.publish(topic, key, payload)
				l.record(payload, code, err)
			}
		}
	}()
	return l, done
}

// produceAcross is produceKeys from a client that connects to the nodes
// named, in turn, whenever its connection fails (a node killed).
func (c *testCluster) produceAcross(nodes []string, prefix string, keys int, stop <-chan struct{}) (*ledger, <-chan struct{}) {
	l := &ledger{acked: map[string]bool{}, codes: map[byte]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var cl *client
		next := 0
		for i := 0; ; i++ {
			for k := 0; k < keys; k++ {
				select {
				case <-stop:
					return
				default:
				}
				for cl == nil {
					n := c.nodes[nodes[next%len(nodes)]]
					next++
					cl = tryDial(n.mqtt, "producer-"+prefix)
					if cl == nil {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
					}
				}
				key := prefix + strconv.Itoa(k)
				payload := message(key, i)
				code, err := cl.publish("$queue/orders", key, payload)
				l.record(payload, code, err)
				if err != nil {
					_ = cl.c.Disconnect(&paho.Disconnect{})
					cl = nil
				}
			}
		}
	}()
	return l, done
}

// tryDial connects an MQTT 5 client, or returns nil.
func tryDial(addr, id string) *client {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil
	}
	cl := &client{wake: make(chan struct{}, 1)}
	cl.c = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cl.c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		_ = conn.Close()
		return nil
	}
	return cl
}

// record notes how the publish of payload was answered.
func (l *ledger) record(payload []byte, code byte, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs++
		return
	}
	l.codes[code]++
	if code == 0 {
		l.acked[string(payload)] = true
	}
}

func (l *ledger) codeCounts() map[byte]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.codes)
}

func (l *ledger) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// check compares what consumers received with the ledger: every acked
// message must have arrived; it returns how many arrived that were not
// acked (refused or unanswered publishes may still be stored).
func (l *ledger) check(t testing.TB, got []arrival) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]int{}
	for _, a := range got {
		seen[string(a.p.Payload)]++
	}
	lost := 0
	for p := range l.acked {
		if seen[p] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged message %s never consumed", p)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged messages lost (codes %v)", lost, len(l.acked), l.codes)
	}
	// A message published once and acknowledged is stored once: it
	// arrives under one msg-id however often it is redelivered.
	ids := map[string]map[string]bool{}
	for _, a := range got {
		p := string(a.p.Payload)
		if !l.acked[p] || a.p.Properties == nil {
			continue
		}
		if ids[p] == nil {
			ids[p] = map[string]bool{}
		}
		ids[p][a.p.Properties.User.Get("msg-id")] = true
	}
	twice := 0
	for p, set := range ids {
		if len(set) > 1 {
			twice++
			if twice <= 5 {
				t.Errorf("message %s, published once and acknowledged, stored at msg-ids %v", p, slices.Sorted(maps.Keys(set)))
			}
		}
	}
	if twice > 0 {
		t.Errorf("%d acknowledged messages stored twice", twice)
	}
}

// startThree starts nodes a, b and c, publishes a first message through
// a so that the queue orders exists, and waits until its 8 partitions
// are served; it returns a's producer client.
func (c *testCluster) startThree() *client {
	c.t.Helper()
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	prod := dial(c.t, c.nodes["a"].mqtt, "producer", 64)
	if code, err := prod.publish("$queue/orders", "k0", message("first", 0)); err != nil || code != 0 {
		c.t.Fatalf("publish: %#x %v", code, err)
	}
	c.waitOwned("orders", 8, 15*time.Second, "a", "b", "c")
	return prod
}

func TestMain(m *testing.M) {
	if listen := os.Getenv(etcdListenEnv); listen != "" {
		serveEtcd(listen, os.Getenv(etcdDirEnv)) // the etcd of a test in namespaces
	}
	testbin.Main(m)
}
