package netfault

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// table is the nft table that holds a receiver's drops.
const table = "shardq_netfault"

// Partition drops every packet between a and b, both ways.
func (n *Net) Partition(a, b string) error {
	return n.set(100, [][2]string{{a, b}}, nil)
}

// Heal clears the link between a and b, both ways: no drops.
func (n *Net) Heal(a, b string) error {
	return n.set(0, [][2]string{{a, b}}, nil)
}

// Loss drops percent (0 to 100) of the packets between a and b, each way,
// chosen at random per packet.
func (n *Net) Loss(a, b string, percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("netfault: loss of %d%%: want 0 to 100", percent)
	}
	return n.set(percent, [][2]string{{a, b}}, nil)
}

// Isolate partitions name from every other name, Host included.
func (n *Net) Isolate(name string) error {
	var pairs [][2]string
	for _, other := range n.all() {
		if other != name {
			pairs = append(pairs, [2]string{name, other})
		}
	}
	return n.set(100, pairs, nil)
}

// Split partitions every name of as from every name of bs; the links
// inside each group are left as they are.
func (n *Net) Split(as, bs []string) error {
	var pairs [][2]string
	for _, a := range as {
		for _, b := range bs {
			pairs = append(pairs, [2]string{a, b})
		}
	}
	return n.set(100, pairs, nil)
}

// Bridge partitions a from c and heals the links from both to mid: a and
// c see mid but not each other.
func (n *Net) Bridge(a, mid, c string) error {
	return n.set(100, [][2]string{{a, c}}, [][2]string{{a, mid}, {c, mid}})
}

// HealAll stops every Flap, clears every link and removes every Throttle.
func (n *Net) HealAll() error {
	n.mu.Lock()
	flaps := n.takeFlapsLocked()
	n.mu.Unlock()
	var first error
	for _, f := range flaps {
		if err := f.stop(); err != nil && first == nil {
			first = err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	clear(n.loss)
	if err := n.applyLocked(n.all()); err != nil && first == nil {
		first = err
	}
	for name := range n.throttle {
		if err := n.throttleLocked(name, 0); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// all returns the names and Host.
func (n *Net) all() []string { return append(n.Names(), Host) }

// set gives the links of pairs, both ways, percent loss, and clears the
// links of heal, then applies the rules of the receivers that changed.
func (n *Net) set(percent int, pairs, heal [][2]string) error {
	for _, p := range append(slices.Clone(pairs), heal...) {
		for _, name := range p {
			if err := n.check(name); err != nil {
				return err
			}
		}
		if p[0] == p[1] {
			return fmt.Errorf("netfault: a link from %q to itself", p[0])
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	var receivers []string
	put := func(p [2]string, percent int) {
		for _, l := range []link{{p[0], p[1]}, {p[1], p[0]}} {
			if percent == 0 {
				delete(n.loss, l)
			} else {
				n.loss[l] = percent
			}
			receivers = append(receivers, l.to)
		}
	}
	for _, p := range pairs {
		put(p, percent)
	}
	for _, p := range heal {
		put(p, 0)
	}
	return n.applyLocked(receivers)
}

// applyLocked replaces the drop rules of each receiver whose rules
// changed, each in one nft transaction. n.mu must be held.
func (n *Net) applyLocked(receivers []string) error {
	slices.Sort(receivers)
	for _, to := range slices.Compact(receivers) {
		script := n.scriptLocked(to)
		if n.applied[to] == script {
			continue
		}
		ns := n.base + "-" + to
		if to == Host {
			ns = n.base
		}
		if _, err := run([]byte(script), "ip", "netns", "exec", ns, "nft", "-f", "-"); err != nil {
			delete(n.applied, to) // unknown now: rewrite it next time
			return err
		}
		n.applied[to] = script
	}
	return nil
}

// scriptLocked renders the nft script that replaces the drops of the
// packets to name. In a namespace they are dropped in its input hook; for
// Host, in the bridge's forward hook, before the host end of its link.
// Hooks run at priority -300, ahead of connection tracking. n.mu must be
// held.
func (n *Net) scriptLocked(to string) string {
	family, chain, hook, match := "inet", "input", "input", ""
	if to == Host {
		family, chain, hook, match = "bridge", "forward", "forward", "ip daddr "+n.addrs[Host]+" "
	}
	var rules []string
	for _, from := range n.all() {
		percent := n.loss[link{from, to}]
		switch {
		case percent == 0:
			continue
		case percent >= 100:
			rules = append(rules, match+"ip saddr "+n.addrs[from]+" drop")
		default:
			rules = append(rules, match+"ip saddr "+n.addrs[from]+" numgen random mod 100 < "+strconv.Itoa(percent)+" drop")
		}
	}
	var b strings.Builder
	// Adding the table first makes deleting it valid when it is absent;
	// the three are one transaction.
	fmt.Fprintf(&b, "add table %s %s\ndelete table %s %s\n", family, table, family, table)
	if len(rules) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "table %s %s {\n\tchain %s {\n\t\ttype filter hook %s priority -300; policy accept;\n", family, table, chain, hook)
	for _, r := range rules {
		fmt.Fprintf(&b, "\t\t%s\n", r)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// Throttle limits what name sends to bitsPerSecond with a token bucket
// (tc tbf) on its end of its link, queueing up to a second of traffic at
// that rate before dropping; 0 removes the limit. Packets wait only
// behind a backlog: this slows a busy link, it does not add a fixed delay.
func (n *Net) Throttle(name string, bitsPerSecond int64) error {
	if err := n.check(name); err != nil {
		return err
	}
	if bitsPerSecond < 0 {
		return fmt.Errorf("netfault: throttle to %d bit/s", bitsPerSecond)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return n.throttleLocked(name, bitsPerSecond)
}

// throttleLocked sets or removes name's tbf. n.mu must be held.
func (n *Net) throttleLocked(name string, bitsPerSecond int64) error {
	prefix := []string{"tc", "qdisc"}
	dev := "eth0"
	if name == Host {
		dev = n.hostIf
	} else {
		prefix = []string{"ip", "netns", "exec", n.base + "-" + name, "tc", "qdisc"}
	}
	if bitsPerSecond == 0 {
		if _, ok := n.throttle[name]; !ok {
			return nil
		}
		if _, err := run(nil, append(prefix, "del", "dev", dev, "root")...); err != nil {
			return err
		}
		delete(n.throttle, name)
		return nil
	}
	// A burst of 10 ms at the rate, at least two full frames, and a queue
	// of one second.
	burst := max(bitsPerSecond/8/100, 3000)
	limit := max(bitsPerSecond/8, 2*burst)
	args := append(prefix, "replace", "dev", dev, "root", "tbf",
		"rate", strconv.FormatInt(bitsPerSecond, 10)+"bit",
		"burst", strconv.FormatInt(burst, 10), "limit", strconv.FormatInt(limit, 10))
	if _, err := run(nil, args...); err != nil {
		return err
	}
	n.throttle[name] = bitsPerSecond
	return nil
}

// flap is a Flap's goroutine.
type flap struct {
	done    chan struct{}
	stopped chan struct{}
	once    sync.Once
	err     error // set before stopped is closed
	heal    func() error
}

// stop ends the flapping, heals the link and returns the first error.
func (f *flap) stop() error {
	f.once.Do(func() {
		close(f.done)
		<-f.stopped
		if err := f.heal(); err != nil && f.err == nil {
			f.err = err
		}
	})
	return f.err
}

// Flap partitions a and b, heals them a period later, and so on until
// stop is called or HealAll or the test's cleanup stops it. stop heals
// the link and returns the first error the flapping met.
func (n *Net) Flap(a, b string, period time.Duration) (stop func() error) {
	if err := errors.Join(n.check(a), n.check(b)); err != nil {
		return func() error { return err }
	}
	if a == b || period <= 0 {
		return func() error { return fmt.Errorf("netfault: flap of %q and %q every %v", a, b, period) }
	}
	f := &flap{done: make(chan struct{}), stopped: make(chan struct{})}
	f.heal = func() error {
		if err := n.Heal(a, b); !errors.Is(err, ErrClosed) {
			return err
		}
		return nil
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return func() error { return ErrClosed }
	}
	n.flaps[f] = struct{}{}
	n.mu.Unlock()
	go func() {
		defer close(f.stopped)
		t := time.NewTicker(period)
		defer t.Stop()
		cut := true
		for {
			var err error
			if cut {
				err = n.Partition(a, b)
			} else {
				err = n.Heal(a, b)
			}
			if err != nil {
				f.err = err
				return
			}
			cut = !cut
			select {
			case <-f.done:
				return
			case <-t.C:
			}
		}
	}()
	return func() error {
		n.mu.Lock()
		delete(n.flaps, f)
		n.mu.Unlock()
		return f.stop()
	}
}

// takeFlapsLocked removes and returns the running flaps. n.mu must be
// held.
func (n *Net) takeFlapsLocked() []*flap {
	var fs []*flap
	for f := range n.flaps {
		fs = append(fs, f)
	}
	clear(n.flaps)
	return fs
}
