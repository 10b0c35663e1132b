// Package netfault runs shardq's processes in Linux network namespaces
// and cuts, thins and slows the links between them, for fault tests in
// the manner of Jepsen: a partitioned leader, an isolated minority, a
// bridge, a lossy link. It shells out to iproute2's ip and tc and to nft,
// and needs root; Available says why it cannot run, and tests skip with
// that message. It is for tests only.
//
// # Model
//
// New builds one network per test: a namespace per name, each with
// loopback up and an eth0 address on a private /24 (Addr), joined by veth
// pairs to a Linux bridge that lives in a namespace of its own. The test
// process itself is on the network too, under the name Host: a veth pair
// from the host's namespace to the bridge carries the subnet's .1, so the
// test's clients (and an etcd it runs) reach every namespace, and
// processes in the namespaces reach it at Addr(Host). The /24 is one of
// 10.77.0.0/16 that no address or route of the host overlaps, chosen under
// a lock file so that concurrent test binaries get different ones. The
// links carry IPv4 only (no IPv6 link-local address), so that every
// packet between two names is one the faults can match.
//
// Command starts a program inside a namespace (ip netns exec), so that a
// test runs real shardq nodes there. A namespace has no route beyond the
// /24: a node reaches the others and Host, so an etcd the test runs must
// listen on Addr(Host) (or on every address), not on loopback.
//
// Names are the ones given to New. The namespaces themselves are called
// shardq-nf-PID-SEQ-NAME (Namespace), the bridge's shardq-nf-PID-SEQ and
// the host end of the link snfPID-SEQ, after the pid of the test process
// and a count of its networks, so that runs in parallel never collide and
// leftovers name the process that made them.
//
// Everything is removed in the test's Cleanup, after a failed test too:
// processes still running in the namespaces are killed, the namespaces and
// the host end deleted. A test binary that died before its cleanup leaves
// them behind; Sweep, which New calls, removes those of processes that no
// longer run.
//
// # Faults
//
// A link is an ordered pair of names, and each link carries one state:
// the share of its packets dropped, 0 to 100. A packet is dropped where it
// arrives, by an nft rule in the input hook of the receiving namespace
// (for the host, in the bridge's forward hook, leaving the host's own
// firewall alone), so the sender sees a silent network, never a local
// error; established connections stall, they are not reset. ARP is not
// dropped.
//
//   - Partition(a, b): drop every packet between a and b, both ways.
//   - Isolate(a): partition a from every other name, Host included.
//   - Split(as, bs): partition every name of as from every name of bs.
//   - Bridge(a, mid, c): a and c partitioned, both links to mid healed.
//   - Loss(a, b, percent): drop that share of the packets between a and b,
//     at random (nft numgen), both ways; 100 is Partition, 0 is Heal.
//   - Flap(a, b, period): partition and heal a and b in turn until stopped.
//   - Throttle(a, bitsPerSecond): a token bucket (tc tbf) on what a sends.
//   - Heal(a, b): clear the link between a and b; HealAll clears every
//     link, stops every Flap and removes every Throttle.
//
// The latest call on a link wins: Loss(a, b, 30) after Partition(a, b)
// leaves 30% loss. Each call is idempotent and replaces the namespace's
// rules in one nft transaction, so a fault is never half applied.
//
// # What is not emulated
//
// Delay and jitter, reordering, duplication and corruption are not. They
// are tc netem's, and a kernel built without sch_netem refuses that qdisc;
// such kernels may lack the other ways to hold packets too (on Linux 6.18
// without netem, tbf, htb and pfifo were the only qdiscs of some twenty).
// nft drops packets but cannot hold them; its queue verdict, which would
// let a program delay them in user space, needs nft_queue, and the qdiscs
// that hold packets until a departure time (fq, etf) need the sender to
// set that time. What
// remains is Throttle: tbf delays packets only while a backlog waits
// behind its rate, so latency grows with load rather than being a fixed
// figure, and it applies to all a namespace sends, not to one link.
// Process pauses (SIGSTOP) and kills need no namespace and are the
// caller's.
//
// # Usage
//
//	if err := netfault.Available(); err != nil {
//		t.Skip(err)
//	}
//	n, err := netfault.New(t, "n1", "n2", "n3")
//	if err != nil {
//		t.Fatal(err)
//	}
//	node := n.Command("n1", shardq, "serve", "--mqtt", n.Addr("n1")+":1883", ...)
//	...
//	if err := n.Isolate("n1"); err != nil { // the leader loses its quorum
//		t.Fatal(err)
//	}
//	...
//	if err := n.HealAll(); err != nil {
//		t.Fatal(err)
//	}
//
// # Errors
//
// Every fault returns an error: ErrUnknownName for a name not given to New,
// ErrClosed after cleanup, or a *CommandError when ip, tc or nft failed
// (with what they printed). Available wraps ErrUnavailable. Addr and
// Namespace panic on an unknown name, a mistake in the test itself.
//
// # Concurrency
//
// A Net is safe for concurrent use: a nemesis goroutine may inject faults
// while the test's clients run. One mutex orders the changes to the links
// and their application, so the rules in the namespaces always follow the
// latest call.
package netfault
