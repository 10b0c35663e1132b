package cluster_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/internal/netfault"
)

// A cluster in network namespaces: etcd and each node in a namespace of
// its own (internal/netfault), the test process on the same subnet as
// netfault.Host, so that faults can cut, thin and flap the links between
// them. etcd runs in a second copy of the test binary (TestMain hands it
// to serveEtcd), so that it can be paused, killed and cut off like a node.

const (
	// etcdListenEnv and etcdDirEnv make the test binary an etcd server
	// on that address with that data directory, until SIGTERM.
	etcdListenEnv = "SHARDQ_TEST_ETCD_LISTEN"
	etcdDirEnv    = "SHARDQ_TEST_ETCD_DIR"
	// etcdNS is the name of etcd's namespace.
	etcdNS = "etcd"
	// netToken and netAdminToken are the cluster and admin tokens of the
	// nodes: off loopback a node needs both.
	netToken      = "nemesis-cluster-token"
	netAdminToken = "nemesis-admin-token"
)

// serveEtcd runs an etcd on listen (host:port) with its data in dir,
// prints "ready" once it serves, and exits when told to stop.
func serveEtcd(listen, dir string) {
	host, port, err := net.SplitHostPort(listen)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want host:port\n", etcdListenEnv, listen)
		os.Exit(2)
	}
	e, err := devetcd.Start(devetcd.Options{Dir: dir, Host: host, ClientPort: p})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	e.Close()
	os.Exit(0)
}

// netEtcd is the etcd process of a cluster in namespaces.
type netEtcd struct {
	n       *netfault.Net
	listen  string // host:port
	dir     string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// start runs etcd (again, on its data directory) and waits until it
// serves.
func (e *netEtcd) start(t testing.TB) {
	t.Helper()
	e.cmd = e.n.Command(etcdNS, os.Args[0], "-test.run=^$")
	gorace := strings.TrimSpace("atexit_sleep_ms=0 " + os.Getenv("GORACE"))
	e.cmd.Env = append(os.Environ(), etcdListenEnv+"="+e.listen, etcdDirEnv+"="+e.dir, "GORACE="+gorace)
	f, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := f.Seek(0, 2)
	e.cmd.Stdout, e.cmd.Stderr = f, f
	if err := e.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	e.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		_ = f.Close()
		close(done)
	}(e.cmd, e.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(e.logPath)
		if int64(len(b)) > start && strings.Contains(string(b[start:]), "ready\n") {
			return
		}
		select {
		case <-e.exited:
			t.Fatalf("etcd exited before it was ready:\n%s", b[start:])
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd not ready within 30s:\n%s", b[start:])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *netEtcd) kill() {
	if e.cmd != nil && e.cmd.Process != nil {
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
}

func (e *netEtcd) signal(s syscall.Signal) { _ = e.cmd.Process.Signal(s) }

// newNetCluster makes a network of namespaces for etcd and the nodes
// named, starts etcd there and returns a cluster whose nodes start in
// their namespaces (start, as on loopback). It skips the test where
// namespaces cannot be made.
func newNetCluster(t testing.TB, nodes []string, extra ...string) (*testCluster, *netEtcd) {
	t.Helper()
	if err := netfault.Available(); err != nil {
		t.Skip(err)
	}
	n, err := netfault.New(t, append([]string{etcdNS}, nodes...)...)
	if err != nil {
		t.Fatal(err)
	}
	e := &netEtcd{n: n, listen: n.Addr(etcdNS) + ":2379", dir: t.TempDir()}
	e.logPath = filepath.Join(e.dir, "..", "etcd.log")
	e.start(t)
	t.Cleanup(func() {
		if e.cmd.ProcessState == nil {
			e.signal(syscall.SIGCONT)
			e.signal(syscall.SIGTERM)
			select {
			case <-e.exited:
			case <-time.After(10 * time.Second):
				e.kill()
			}
		}
	})
	endpoint := "http://" + e.listen
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	flags := []string{"--allow-anonymous", "true", "--admin-token", netAdminToken,
		"--cluster-allow-insecure", "true", "--cluster-token", netToken}
	current = &testCluster{t: t, etcd: endpoint, cli: cli, nodes: map[string]*node{},
		extra: append(flags, extra...), net: n}
	return current, e
}

// probe is an HTTP client for a node that may be cut off.
var probe = &http.Client{Timeout: time.Second}

// ready reports whether the node answers /readyz with 200.
func (n *node) ready() bool {
	resp, err := probe.Get("http://" + n.http + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
