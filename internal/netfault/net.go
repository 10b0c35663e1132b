package netfault

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Host names the test process's own namespace in faults and in Addr.
const Host = "host"

const (
	// prefix starts the name of every namespace and of every host link
	// end this package makes, followed by the pid of the process that made
	// it.
	prefix     = "shardq-nf-"
	linkPrefix = "snf"
	// maxNames keeps the namespaces' addresses (.10 and up) inside the /24.
	maxNames = 240
	// cmdTimeout bounds one run of ip, tc or nft.
	cmdTimeout = 30 * time.Second
	// lockFile serializes the choice of subnets across test binaries.
	lockFile = "/run/shardq-netfault.lock"
)

var (
	seq       atomic.Int64
	validName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
)

// Net is one test's network: a namespace per name joined by a bridge, and
// the faults between them.
type Net struct {
	tb     testing.TB
	base   string // the bridge's namespace; a node's is base + "-" + name
	hostIf string // the host's end of the host link
	names  []string
	addrs  map[string]string // name (Host included) -> IPv4 address

	mu       sync.Mutex
	closed   bool
	loss     map[link]int      // percent dropped; absent is 0
	applied  map[string]string // receiver -> nft script last applied
	throttle map[string]int64  // name -> bits per second
	flaps    map[*flap]struct{}
}

// link is the traffic from one name to another.
type link struct{ from, to string }

// New makes a namespace for each name, joined to each other and to the
// test process by a bridge, and removes them all in tb's cleanup. Names
// are 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or digit,
// and not Host. It first removes the leftovers of test processes that
// died (Sweep).
func New(tb testing.TB, names ...string) (*Net, error) {
	tb.Helper()
	if err := Available(); err != nil {
		return nil, err
	}
	if len(names) == 0 || len(names) > maxNames {
		return nil, fmt.Errorf("netfault: %d names: want 1 to %d", len(names), maxNames)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if !validName.MatchString(name) || name == Host {
			return nil, fmt.Errorf("netfault: invalid name %q", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("netfault: name %q given twice", name)
		}
		seen[name] = true
	}
	s := seq.Add(1)
	n := &Net{
		tb:       tb,
		base:     fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), s),
		hostIf:   fmt.Sprintf("%s%d-%d", linkPrefix, os.Getpid(), s),
		names:    append([]string(nil), names...),
		addrs:    map[string]string{},
		loss:     map[link]int{},
		applied:  map[string]string{},
		throttle: map[string]int64{},
		flaps:    map[*flap]struct{}{},
	}
	if len(n.hostIf) > 15 {
		return nil, fmt.Errorf("netfault: host link name %q longer than 15 bytes", n.hostIf)
	}
	tb.Cleanup(n.close)
	unlock, err := lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := sweep(); err != nil {
		return nil, err
	}
	if err := n.build(); err != nil {
		return nil, err
	}
	return n, nil
}

// build makes the namespaces and links. The subnet lock must be held.
func (n *Net) build() error {
	subnet, err := freeSubnet()
	if err != nil {
		return err
	}
	ip := func(host int) string {
		b := subnet.Addr().As4()
		b[3] = byte(host)
		return netip.AddrFrom4(b).String()
	}
	steps := [][]string{
		{"ip", "netns", "add", n.base},
		{"ip", "-n", n.base, "link", "set", "lo", "up"},
		{"ip", "-n", n.base, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", n.base, "link", "set", "br0", "addrgenmode", "none"},
		{"ip", "-n", n.base, "link", "set", "br0", "up"},
	}
	for i, name := range n.names {
		ns, port := n.base+"-"+name, "n"+strconv.Itoa(i)
		n.addrs[name] = ip(10 + i)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", n.base, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", n.base, "link", "set", port, "addrgenmode", "none"},
			[]string{"ip", "-n", n.base, "link", "set", port, "master", "br0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "addrgenmode", "none"},
			[]string{"ip", "-n", ns, "addr", "add", n.addrs[name] + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
		)
	}
	n.addrs[Host] = ip(1)
	steps = append(steps,
		[]string{"ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", "host", "netns", n.base},
		[]string{"ip", "-n", n.base, "link", "set", "host", "addrgenmode", "none"},
		[]string{"ip", "-n", n.base, "link", "set", "host", "master", "br0", "up"},
		[]string{"ip", "link", "set", n.hostIf, "addrgenmode", "none"},
		[]string{"ip", "addr", "add", n.addrs[Host] + "/24", "dev", n.hostIf},
		[]string{"ip", "link", "set", n.hostIf, "up"},
	)
	for _, s := range steps {
		if _, err := run(nil, s...); err != nil {
			return err
		}
	}
	return nil
}

// close removes the network: it stops the flaps, kills what still runs
// in the namespaces and deletes them and the host link.
func (n *Net) close() {
	n.mu.Lock()
	n.closed = true
	flaps := n.takeFlapsLocked()
	n.mu.Unlock()
	for _, f := range flaps {
		f.stop()
	}
	var errs []error
	for _, name := range n.names {
		if err := removeNamespace(n.base + "-" + name); err != nil {
			errs = append(errs, err)
		}
	}
	if linkExists(n.hostIf) {
		if _, err := run(nil, "ip", "link", "del", n.hostIf); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeNamespace(n.base); err != nil {
		errs = append(errs, err)
	}
	for _, err := range errs {
		n.tb.Errorf("netfault: cleanup: %v", err)
	}
}

// Names returns the names given to New.
func (n *Net) Names() []string { return append([]string(nil), n.names...) }

// Addr returns the IPv4 address of name, or of the test process's end of
// the network for Host. It panics on a name not given to New.
func (n *Net) Addr(name string) string {
	a, ok := n.addrs[name]
	if !ok {
		panic(fmt.Sprintf("netfault: Addr of unknown name %q", name))
	}
	return a
}

// Namespace returns the network namespace of name, as ip netns knows it,
// for tools the test runs itself. It panics on a name not given to New
// and on Host, which is no named namespace.
func (n *Net) Namespace(name string) string {
	if n.check(name) != nil || name == Host {
		panic(fmt.Sprintf("netfault: Namespace of unknown name %q", name))
	}
	return n.base + "-" + name
}

// Command returns a command that runs prog with args inside name's
// namespace (through ip netns exec, which runs prog in its place, so the
// Cmd's process is prog's). Host runs it in the test process's own
// namespace. An unknown name makes a Cmd whose Start fails.
func (n *Net) Command(name, prog string, args ...string) *exec.Cmd {
	return n.command(context.Background(), name, prog, args...)
}

// CommandContext is Command with a context that kills the process when
// done, as exec.CommandContext.
func (n *Net) CommandContext(ctx context.Context, name, prog string, args ...string) *exec.Cmd {
	return n.command(ctx, name, prog, args...)
}

func (n *Net) command(ctx context.Context, name, prog string, args ...string) *exec.Cmd {
	argv := append([]string{prog}, args...)
	if name != Host {
		argv = append([]string{"ip", "netns", "exec", n.base + "-" + name}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if ctx != context.Background() {
		cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	}
	if err := n.check(name); err != nil {
		cmd.Err = err
	}
	return cmd
}

// check reports whether name is one of the network's, Host included.
func (n *Net) check(name string) error {
	if _, ok := n.addrs[name]; !ok {
		return fmt.Errorf("%w: %q", ErrUnknownName, name)
	}
	return nil
}

// run runs a command with input on its stdin and returns its output.
func run(input []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if input != nil {
		cmd.Stdin = bytes.NewReader(input)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), &CommandError{Args: args, Output: string(out), Err: err}
	}
	return string(out), nil
}

// lock takes the lock file that serializes among test processes the
// choice of subnets and the removal of leftovers, waiting up to a minute.
// Its holder must not take it again.
func lock() (unlock func(), err error) {
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netfault: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("netfault: locking %s: %w", lockFile, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeSubnet returns a /24 of 10.77.0.0/16 that no address or route of
// the host's namespace overlaps. The subnet lock must be held.
func freeSubnet() (netip.Prefix, error) {
	routes, err := run(nil, "ip", "-4", "route", "show", "table", "all")
	if err != nil {
		return netip.Prefix{}, err
	}
	addrs, err := run(nil, "ip", "-4", "-o", "addr", "show")
	if err != nil {
		return netip.Prefix{}, err
	}
	used := usedPrefixes(routes, addrs)
	start := os.Getpid() % 254
	for i := range 254 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(1 + (start+i)%254), 0}), 24)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("netfault: no free /24 in 10.77.0.0/16")
}

// routeTypes are the words ip route may print before a destination.
var routeTypes = map[string]bool{
	"unicast": true, "local": true, "broadcast": true, "multicast": true, "anycast": true,
	"unreachable": true, "blackhole": true, "prohibit": true, "throw": true, "nat": true,
}

// usedPrefixes parses the destinations of `ip -4 route show` and the
// addresses of `ip -4 -o addr show`; default routes are left out.
func usedPrefixes(routes, addrs string) []netip.Prefix {
	var used []netip.Prefix
	add := func(s string) {
		if p, err := netip.ParsePrefix(s); err == nil {
			used = append(used, p.Masked())
		} else if a, err := netip.ParseAddr(s); err == nil {
			used = append(used, netip.PrefixFrom(a, 32))
		}
	}
	for _, line := range strings.Split(routes, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && routeTypes[f[0]] {
			f = f[1:]
		}
		if len(f) > 0 && f[0] != "default" {
			add(f[0])
		}
	}
	for _, line := range strings.Split(addrs, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				add(f[i+1])
			}
		}
	}
	return used
}
