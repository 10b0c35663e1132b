package netfault_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/internal/netfault"
)

// The test binary is its own helper process: with helperEnv set it runs
// the helper named there instead of the tests.
const (
	helperEnv = "SHARDQ_NETFAULT_HELPER"
	addrEnv   = "SHARDQ_NETFAULT_ADDR"
	echoPort  = "7000"
	// dialTimeout bounds a probe's dial and its read of the echo.
	dialTimeout = time.Second
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "echo":
		echoServer(os.Getenv(addrEnv))
	case "probe":
		if err := echo(os.Getenv(addrEnv)); err != nil {
			fmt.Println(reason(err))
			os.Exit(3)
		}
		os.Exit(0)
	case "sleep":
		time.Sleep(time.Minute)
	}
	os.Exit(2)
}

// echoServer echoes TCP and UDP on addr and prints "ready" once it
// listens.
func echoServer(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				os.Exit(1)
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	fmt.Println("ready")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

// echo dials addr, sends a line and waits for it to come back, each
// within dialTimeout.
func echo(addr string) error {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echoed %q", line)
	}
	return nil
}

// reason names how a probe failed: "timeout" when the network dropped it,
// "refused" when nothing listened.
func reason(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	}
	return err.Error()
}

// newNet makes a network of names, or skips the test where namespaces
// cannot be made.
func newNet(t *testing.T, names ...string) *netfault.Net {
	t.Helper()
	if err := netfault.Available(); err != nil {
		t.Skip(err)
	}
	n, err := netfault.New(t, names...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// helper returns the command that runs the named helper in name's
// namespace with addr.
func helper(n *netfault.Net, ctx context.Context, name, mode, addr string) *exec.Cmd {
	cmd := n.CommandContext(ctx, name, os.Args[0], "-test.run=^$")
	// Under the race detector a process sleeps a second before it exits,
	// unless told not to.
	gorace := strings.TrimSpace("atexit_sleep_ms=0 " + os.Getenv("GORACE"))
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, addrEnv+"="+addr, "GORACE="+gorace)
	return cmd
}

// startEcho runs the echo server in name's namespace and returns its
// address once it listens; the test's cleanup stops it.
func startEcho(t *testing.T, n *netfault.Net, name string) string {
	t.Helper()
	cmd := helper(n, context.Background(), name, "echo", ":"+echoPort)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("echo server said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("echo server not ready after 10s")
	}
	return net.JoinHostPort(n.Addr(name), echoPort)
}

// probe echoes a line to addr from name's namespace, from this process
// for netfault.Host, and returns "" when it came back, else why not. An
// error is a probe that could not run.
func probe(n *netfault.Net, from, addr string) (string, error) {
	if from == netfault.Host {
		if err := echo(addr); err != nil {
			return reason(err), nil
		}
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := helper(n, ctx, from, "probe", addr).Output()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return "", nil
	case errors.As(err, &exit) && exit.ExitCode() == 3:
		return strings.TrimSpace(string(out)), nil
	case exit != nil:
		return "", fmt.Errorf("probe from %s: %v: %s", from, err, exit.Stderr)
	}
	return "", fmt.Errorf("probe from %s: %v", from, err)
}

// reach probes addr from each name of want at once and checks that the
// ones wanted true get their echo and the others time out.
func reach(t *testing.T, n *netfault.Net, addr string, want map[string]bool) {
	t.Helper()
	got, errs := map[string]string{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for from := range want {
		wg.Go(func() {
			r, err := probe(n, from, addr)
			mu.Lock()
			got[from], errs[from] = r, err
			mu.Unlock()
		})
	}
	wg.Wait()
	for from, ok := range want {
		switch {
		case errs[from] != nil:
			t.Error(errs[from])
		case ok && got[from] != "":
			t.Errorf("%s to %s: %s, want an echo", from, addr, got[from])
		case !ok && got[from] != "timeout":
			t.Errorf("%s to %s: %q, want a timeout", from, addr, or(got[from], "echoed"))
		}
	}
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func TestNetfaultFaults(t *testing.T) {
	n := newNet(t, "a", "b", "c")
	addr := startEcho(t, n, "a")
	const h = netfault.Host
	cases := []struct {
		name  string
		fault func() error
		want  map[string]bool // can reach a
	}{
		{"none", func() error { return nil }, map[string]bool{"b": true, "c": true, h: true}},
		{"partition a b", func() error { return n.Partition("a", "b") },
			map[string]bool{"b": false, "c": true, h: true}},
		{"partition b a is the same", func() error { return n.Partition("b", "a") },
			map[string]bool{"b": false, "c": true}},
		{"heal a b", func() error {
			return errors.Join(n.Partition("a", "b"), n.Heal("b", "a"))
		}, map[string]bool{"b": true, "c": true}},
		{"partition twice heal once", func() error {
			return errors.Join(n.Partition("a", "b"), n.Partition("a", "b"), n.Heal("a", "b"))
		}, map[string]bool{"b": true}},
		{"partition host a", func() error { return n.Partition(h, "a") },
			map[string]bool{"b": true, "c": true, h: false}},
		{"isolate a", func() error { return n.Isolate("a") },
			map[string]bool{"b": false, "c": false, h: false}},
		{"isolate b", func() error { return n.Isolate("b") },
			map[string]bool{"b": false, "c": true, h: true}},
		{"bridge a b c heals a b", func() error {
			return errors.Join(n.Partition("a", "b"), n.Bridge("a", "b", "c"))
		}, map[string]bool{"b": true, "c": false, h: true}},
		{"split", func() error { return n.Split([]string{"a", "b"}, []string{"c", h}) },
			map[string]bool{"b": true, "c": false, h: false}},
		{"loss 100", func() error { return n.Loss("a", "b", 100) },
			map[string]bool{"b": false, "c": true}},
		{"loss 0 heals", func() error {
			return errors.Join(n.Loss("a", "b", 100), n.Loss("a", "b", 0))
		}, map[string]bool{"b": true, "c": true}},
		{"loss 0 heals a partition", func() error {
			return errors.Join(n.Partition("a", "b"), n.Loss("b", "a", 0))
		}, map[string]bool{"b": true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := n.HealAll(); err != nil {
				t.Fatal(err)
			}
			if err := tc.fault(); err != nil {
				t.Fatal(err)
			}
			reach(t, n, addr, tc.want)
		})
	}
	t.Run("heal all", func(t *testing.T) {
		if err := errors.Join(n.Isolate("a"), n.Loss("b", "c", 50), n.HealAll()); err != nil {
			t.Fatal(err)
		}
		reach(t, n, addr, map[string]bool{"b": true, "c": true, h: true})
	})
	t.Run("mistakes", func(t *testing.T) {
		if err := n.Partition("a", "zz"); !errors.Is(err, netfault.ErrUnknownName) {
			t.Errorf("Partition with an unknown name: %v, want ErrUnknownName", err)
		}
		if err := n.Isolate("zz"); !errors.Is(err, netfault.ErrUnknownName) {
			t.Errorf("Isolate of an unknown name: %v, want ErrUnknownName", err)
		}
		if err := n.Partition("a", "a"); err == nil {
			t.Error("Partition of a name from itself: no error")
		}
		if err := n.Loss("a", "b", 101); err == nil {
			t.Error("Loss of 101%: no error")
		}
		if err := n.Command("zz", "true").Run(); !errors.Is(err, netfault.ErrUnknownName) {
			t.Errorf("Command in an unknown name: %v, want ErrUnknownName", err)
		}
	})
}

// TestNetfaultPartitionStallsConnection checks that a partition drops the
// packets of an open connection without resetting it: once healed, what
// was sent during the partition arrives.
func TestNetfaultPartitionStallsConnection(t *testing.T) {
	n := newNet(t, "a")
	addr := startEcho(t, n, "a")
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := n.Partition(netfault.Host, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("during\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if line, err := r.ReadString('\n'); reason(err) != "timeout" {
		t.Fatalf("read during the partition: %q, %v; want a timeout", line, err)
	}
	if err := n.Heal(netfault.Host, "a"); err != nil {
		t.Fatal(err)
	}
	// TCP retransmits with backoff: the first retry after the heal may
	// take a few seconds.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "during\n" {
		t.Fatalf("read after the heal: %q, %v; want \"during\"", line, err)
	}
}

// TestNetfaultLossPartial checks that a loss below 100% drops about that
// share: 30% each way lets about 49% of UDP round trips through.
func TestNetfaultLossPartial(t *testing.T) {
	n := newNet(t, "a")
	addr := startEcho(t, n, "a")
	if err := n.Loss("a", netfault.Host, 30); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const sent = 400
	for i := range sent {
		if _, err := fmt.Fprintf(c, "%d", i); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // the echo server's socket buffer
	}
	got := 0
	buf := make([]byte, 64)
	for {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		got++
	}
	t.Logf("%d of %d round trips through 30%% loss each way", got, sent)
	if got < sent*35/100 || got > sent*65/100 {
		t.Errorf("%d of %d round trips came back, want about 49%%", got, sent)
	}
}

// TestNetfaultThrottle checks that a throttled namespace sends no faster
// than its rate, and that HealAll removes the limit.
func TestNetfaultThrottle(t *testing.T) {
	n := newNet(t, "a")
	addr := startEcho(t, n, "a")
	const rate = 4_000_000 // bit/s
	if err := n.Throttle("a", rate); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 256<<10)
	start := time.Now()
	go c.Write(payload)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, len(payload))); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// 2.1 Mbit at 4 Mbit/s is 0.52 s, less the bucket's 5 kB burst.
	t.Logf("256 KiB echoed through %d bit/s in %v", rate, took)
	if min := 400 * time.Millisecond; took < min {
		t.Errorf("256 KiB echoed in %v, want at least %v", took, min)
	}
	if err := n.HealAll(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "exec", n.Namespace("a"), "tc", "qdisc", "show", "dev", "eth0").CombinedOutput()
	if err != nil || strings.Contains(string(out), "tbf") {
		t.Errorf("after HealAll: tc qdisc show: %v %s", err, out)
	}
}

// TestNetfaultFlap checks that a flap cuts and heals the link, and that
// stopping it or HealAll leaves the link healed.
func TestNetfaultFlap(t *testing.T) {
	n := newNet(t, "a")
	addr := startEcho(t, n, "a")
	stop := n.Flap("a", netfault.Host, 300*time.Millisecond)
	seen := map[bool]bool{}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(seen) < 2; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		seen[err == nil] = true
	}
	if !seen[true] || !seen[false] {
		t.Errorf("dials during the flap: succeeded %v, failed %v; want both", seen[true], seen[false])
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	reach(t, n, addr, map[string]bool{netfault.Host: true})
	n.Flap("a", netfault.Host, 100*time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	if err := n.HealAll(); err != nil {
		t.Fatal(err)
	}
	reach(t, n, addr, map[string]bool{netfault.Host: true})
}

// TestNetfaultCleanup checks that a test's end removes its namespaces and
// host link and kills what it left running there.
func TestNetfaultCleanup(t *testing.T) {
	var ns, hostAddr string
	var cmd *exec.Cmd
	t.Run("net", func(t *testing.T) {
		n := newNet(t, "x")
		ns, hostAddr = n.Namespace("x"), n.Addr(netfault.Host)
		cmd = helper(n, context.Background(), "x", "sleep", "")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	})
	if cmd == nil {
		return // skipped or failed
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Error("the process left in the namespace still runs after cleanup")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	bridge := strings.TrimSuffix(ns, "-x")
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == ns || f[0] == bridge) {
			t.Errorf("namespace %s left after cleanup", f[0])
		}
	}
	addrs, err := exec.Command("ip", "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(addrs), " "+hostAddr+"/") {
		t.Errorf("host address %s left after cleanup:\n%s", hostAddr, addrs)
	}
}

// TestNetfaultSweep checks that Sweep removes what a dead process left
// and keeps what a live one has.
func TestNetfaultSweep(t *testing.T) {
	live := newNet(t, "x")
	dead := deadPid(t)
	ns := fmt.Sprintf("shardq-nf-%d-1-x", dead)
	link := fmt.Sprintf("snf%d-1", dead)
	for _, args := range [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", link, "type", "veth", "peer", "name", "host", "netns", ns},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", link).Run()
	})
	if err := netfault.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/netns/" + ns); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace %s of dead pid %d left by Sweep: %v", ns, dead, err)
	}
	if _, err := os.Stat("/sys/class/net/" + link); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("link %s of dead pid %d left by Sweep: %v", link, dead, err)
	}
	if _, err := os.Stat("/run/netns/" + live.Namespace("x")); err != nil {
		t.Errorf("Sweep removed a live namespace: %v", err)
	}
}

// deadPid returns a pid that no process has.
func deadPid(t *testing.T) int {
	t.Helper()
	for pid := 4_000_000; pid > 1; pid-- {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			return pid
		}
	}
	t.Fatal("no free pid")
	return 0
}
