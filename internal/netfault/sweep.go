package netfault

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// netnsDir is where ip netns keeps its named namespaces.
const netnsDir = "/run/netns"

// Available reports why this process cannot make namespaces and faults
// (not root, ip, tc or nft missing, a kernel without veth, bridges or the nft
// expressions the faults use), or nil. It tries once per process, in a
// namespace of its own. Tests skip with its message.
func Available() error { return available() }

var available = sync.OnceValue(func() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (euid %d)", ErrUnavailable, os.Geteuid())
	}
	for _, prog := range []string{"ip", "tc", "nft"} {
		if _, err := exec.LookPath(prog); err != nil {
			return fmt.Errorf("%w: %s not installed (Debian: iproute2, nftables): %v", ErrUnavailable, prog, err)
		}
	}
	ns := fmt.Sprintf("%s%d-probe", prefix, os.Getpid())
	defer removeNamespace(ns)
	probe := "add table inet " + table + "\n" +
		"add chain inet " + table + " input { type filter hook input priority -300; policy accept; }\n" +
		"add rule inet " + table + " input ip saddr 10.77.0.2 numgen random mod 100 < 50 drop\n" +
		"add table bridge " + table + "\n" +
		"add chain bridge " + table + " forward { type filter hook forward priority -300; policy accept; }\n" +
		"add rule bridge " + table + " forward ip daddr 10.77.0.1 ip saddr 10.77.0.2 drop\n"
	steps := []struct {
		input string
		args  []string
	}{
		{"", []string{"ip", "netns", "add", ns}},
		{"", []string{"ip", "-n", ns, "link", "add", "br0", "type", "bridge"}},
		{"", []string{"ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"}},
		{probe, []string{"ip", "netns", "exec", ns, "nft", "-f", "-"}},
	}
	for _, s := range steps {
		var input []byte
		if s.input != "" {
			input = []byte(s.input)
		}
		if _, err := run(input, s.args...); err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	return nil
})

// Sweep removes the namespaces and host links left by test processes that
// died before their cleanup: those named with this package's prefix and
// the pid of a process that no longer runs. Processes still running in
// them are killed. Those of running processes are left alone.
func Sweep() error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	return sweep()
}

// sweep is Sweep. The lock must be held.
func sweep() error {
	var errs []error
	out, err := run(nil, "ip", "-o", "link", "show")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		// "7: snf123-1@if6: <BROADCAST,...> ..."
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if pid, ok := ownerPid(name, linkPrefix); ok && stale(pid) {
			if _, err := run(nil, "ip", "link", "del", name); err != nil && linkExists(name) {
				errs = append(errs, err)
			}
		}
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netfault: %w", err)
	}
	for _, e := range entries {
		if pid, ok := ownerPid(e.Name(), prefix); ok && stale(pid) {
			if err := removeNamespace(e.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// ownerPid returns the pid in a name made of pre, the pid, '-' and more.
func ownerPid(name, pre string) (int, bool) {
	rest, ok := strings.CutPrefix(name, pre)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}

// stale reports whether pid is not this process and runs no more. A pid
// taken again by another process keeps its leftovers until that one ends.
func stale(pid int) bool {
	if pid == os.Getpid() {
		return false
	}
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return errors.Is(err, os.ErrNotExist)
}

// removeNamespace deletes the named namespace and kills the processes in
// it; one already gone is no error.
func removeNamespace(ns string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(netnsDir, ns), &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil
		}
		return fmt.Errorf("netfault: %s: %w", ns, err)
	}
	if _, err := run(nil, "ip", "netns", "del", ns); err != nil {
		if _, serr := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(serr, os.ErrNotExist) {
			return err
		}
	}
	// Once it is unnamed nothing new enters it, but an ip netns exec that
	// opened it just before may still join: scan until two scans in a row
	// find no one.
	id := fmt.Sprintf("net:[%d]", st.Ino)
	for empty, deadline := 0, time.Now().Add(2*time.Second); empty < 2 && time.Now().Before(deadline); {
		if killIn(id) == 0 {
			empty++
		} else {
			empty = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// killIn kills every process whose network namespace is id, as
// /proc/PID/ns/net names it (processes the tests started there and did
// not stop), and returns how many it found.
func killIn(id string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	found := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if link, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil && link == id {
			found++
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return found
}

// linkExists reports whether the host's namespace has a link of that name.
func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}
