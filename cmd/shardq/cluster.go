package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/config"
)

// clusterCommand runs shardq cluster: status, drain, undrain and
// placement (admin commands, admin.go) or dev.
func clusterCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 && args[0] == "dev" {
		return clusterDev(ctx, args[1:], stdout, stderr, getenv)
	}
	return adminCommand(ctx, append([]string{"cluster"}, args...), stdout, stderr, getenv)
}

func printCluster(w io.Writer, c broker.ClusterView) {
	if !c.Clustered {
		fmt.Fprintf(w, "%s is a single node: it owns every partition\n\n", c.Node)
	}
	t := table(w)
	fmt.Fprintln(t, "NODE\tSTATE\tMQTT\tHTTP\tCLUSTER\tREPLICAS\tLEADS")
	for _, n := range c.Nodes {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", n.ID, n.State, dash(n.MQTT), dash(n.HTTP), dash(n.ClusterAddr), n.Replicas, n.Leads)
	}
	t.Flush()
	if len(c.Partitions) == 0 {
		fmt.Fprintln(w, "\nno queues")
		return
	}
	// Learners show only while some partition has one: a replica being
	// added, catching up before it votes.
	learners := slices.ContainsFunc(c.Partitions, func(p cluster.PartitionStatus) bool { return len(p.Learners) > 0 })
	fmt.Fprintln(w)
	t = table(w)
	head := "QUEUE\tPARTITION\tOWNER\tEPOCH\tREPLICAS\tIN-SYNC"
	if learners {
		head += "\tLEARNERS"
	}
	fmt.Fprintln(t, head)
	unowned := 0
	for _, p := range c.Partitions {
		if p.Owner == "" {
			unowned++
		}
		fmt.Fprintf(t, "%s\t%d\t%s\t%d\t%s\t%s", p.Queue, p.Partition, dash(p.Owner), p.Epoch,
			dash(strings.Join(p.Replicas, ",")), dash(strings.Join(p.InSync, ",")))
		if learners {
			fmt.Fprintf(t, "\t%s", dash(strings.Join(p.Learners, ",")))
		}
		fmt.Fprintln(t)
	}
	t.Flush()
	if unowned > 0 {
		fmt.Fprintf(w, "\n%d partitions have no owner yet\n", unowned)
	}
}

// printPlacement prints the placement rules in the order they apply.
func printPlacement(w io.Writer, v broker.PlacementView) {
	if len(v.Rules) == 0 {
		fmt.Fprintln(w, "no placement rules: every queue on every node")
		return
	}
	t := table(w)
	fmt.Fprintln(t, "RULE\tQUEUES\tNODES")
	for i, r := range v.Rules {
		what := r.Queues
		if len(r.Tenants) > 0 {
			what = "tenants " + strings.Join(r.Tenants, ",")
		}
		fmt.Fprintf(t, "%d\t%s\t%s\n", i+1, what, strings.Join(r.Nodes, ","))
	}
	t.Flush()
	fmt.Fprintln(w, "\nthe first rule that matches a queue's name decides; a queue no rule matches lives on any node")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

const clusterDevUsage = `usage: shardq cluster dev [--nodes N] [--dir DIR] [--config FILE] [flags]

Runs a cluster on this machine, to try one: an embedded etcd and N nodes
(node-1 ... node-N) in this process, on loopback. Node i (from 0) listens
for MQTT on 127.0.0.1:(--base-port + i), for HTTP on
127.0.0.1:(--http-port + i) and for the cluster on
127.0.0.1:(--cluster-port + i); a port of 0 lets the system pick free
ones. WebSocket is off. The addresses are printed once every node is ready.
Ctrl-C (SIGINT or SIGTERM) stops the nodes one by one, each handing its
partitions to those still running, then etcd. Each node keeps its data in
DIR/node-i and etcd in DIR/etcd: run it again with the same --dir and the
nodes find their queues; without --dir, a temporary directory is used and
removed at exit. With --config, every node takes its settings from FILE
(queues, limits, cluster settings, as shardq serve reads it) except its
node id, data directory, listeners and etcd, which cluster dev sets.
Without a token or users in FILE, clients need no credentials and the
admin API no token: everything listens on 127.0.0.1 only. Production runs shardq serve --etcd
against an external etcd (see the README, Running a cluster).
`

// clusterDev runs shardq cluster dev until ctx is done.
func clusterDev(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := newCommand("cluster dev", clusterDevUsage)
	nodes := c.flags.Int("nodes", 3, "run `N` nodes, 1 to 9")
	dir := c.flags.String("dir", "", "the `DIR` of the nodes' and etcd's data, kept at exit (default a temporary directory, removed at exit)")
	mqttPort := c.flags.Int("base-port", 1883, "the MQTT `PORT` of node-1; node i+1 gets PORT+i")
	httpPort := c.flags.Int("http-port", 8990, "the HTTP `PORT` of node-1; node i+1 gets PORT+i")
	clusterPort := c.flags.Int("cluster-port", 9001, "the cluster (gRPC) `PORT` of node-1; node i+1 gets PORT+i")
	etcdPort := c.flags.Int("etcd-port", 0, "etcd's client `PORT` (default a free one)")
	level := c.flags.String("log-level", "warn", "the least `LEVEL` the nodes log, on stderr: debug, info, warn or error")
	file := c.flags.String("config", "", "the YAML config `FILE` every node takes its settings from (default the built-in ones)")
	if code := c.parseNoArgs(args, getenv, stdout, stderr); code >= 0 {
		return code
	}
	if *nodes < 1 || *nodes > 9 {
		return c.fail(stderr, "--nodes: want 1 to 9, got %d", *nodes)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return c.fail(stderr, "--log-level: want debug, info, warn or error, got %q", *level)
	}
	load := func() (*config.Config, error) { return config.Default(), nil }
	if *file != "" {
		load = func() (*config.Config, error) { return config.Load([]string{"--config", *file}, nil) }
		if _, err := load(); err != nil {
			return c.fail(stderr, "--config: %v", err)
		}
	}
	if err := checkPorts(*nodes, map[string]int{"--base-port": *mqttPort, "--http-port": *httpPort, "--cluster-port": *clusterPort, "--etcd-port": *etcdPort}); err != nil {
		return c.fail(stderr, "%v", err)
	}

	root := *dir
	if root == "" {
		tmp, err := os.MkdirTemp("", "shardq-cluster-")
		if err != nil {
			fmt.Fprintf(stderr, "shardq cluster dev: %v\n", err)
			return 1
		}
		root = tmp
		defer os.RemoveAll(tmp)
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		fmt.Fprintf(stderr, "shardq cluster dev: %v\n", err)
		return 1
	}

	etcd, err := devetcd.Start(devetcd.Options{Dir: filepath.Join(root, "etcd"), ClientPort: *etcdPort, Fsync: *dir != ""})
	if err != nil {
		fmt.Fprintf(stderr, "shardq cluster dev: %v\n", err)
		return 1
	}
	defer etcd.Close()

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	port := func(base, i int) string {
		if base == 0 {
			return "127.0.0.1:0"
		}
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i))
	}
	var (
		brokers []*broker.Broker
		served  = make(chan error, *nodes)
	)
	// stop shuts the nodes down last first: each hands its partitions to
	// those still running; the last keeps its own.
	stop := func() int {
		code := 0
		for i := len(brokers) - 1; i >= 0; i-- {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := brokers[i].Shutdown(sctx); err != nil {
				fmt.Fprintf(stderr, "shardq cluster dev: node-%d: shutdown incomplete: %v\n", i+1, err)
				code = 1
			}
			cancel()
		}
		return code
	}
	for i := range *nodes {
		id := fmt.Sprintf("node-%d", i+1)
		cfg, err := load()
		if err != nil {
			fmt.Fprintf(stderr, "shardq cluster dev: %s: %v\n", id, err)
			stop()
			return 1
		}
		cfg.NodeID = id
		cfg.DataDir = filepath.Join(root, id)
		cfg.MQTT, cfg.WS, cfg.HTTP = port(*mqttPort, i), "", port(*httpPort, i)
		cfg.LogLevel = lvl
		cfg.Cluster.Etcd.Endpoints = []string{etcd.Endpoint()}
		cfg.Cluster.Addr = port(*clusterPort, i)
		b, err := broker.New(cfg, logger.With("node", id))
		if err != nil {
			fmt.Fprintf(stderr, "shardq cluster dev: %s: %v\n", id, err)
			stop()
			return 1
		}
		brokers = append(brokers, b)
		go func() {
			if err := b.Serve(); err != nil && !errors.Is(err, broker.ErrServerClosed) {
				served <- fmt.Errorf("%s: %w", id, err)
			}
		}()
	}
	if err := waitReady(ctx, brokers, served, 60*time.Second); err != nil {
		fmt.Fprintf(stderr, "shardq cluster dev: %v\n", err)
		stop()
		return 1
	}
	if ctx.Err() != nil {
		return stop()
	}

	t := table(stdout)
	fmt.Fprintf(t, "etcd\t%s\n", etcd.Endpoint())
	for _, b := range brokers {
		n := b.Cluster()
		fmt.Fprintf(t, "%s\tmqtt %s\thttp http://%s\tcluster %s\n", n.ID(), b.MQTTAddr(), b.HTTPAddr(), n.Addr())
	}
	t.Flush()
	fmt.Fprintf(stdout, "data in %s", root)
	if *dir == "" {
		fmt.Fprint(stdout, " (removed at exit)")
	}
	fmt.Fprintf(stdout, "\ncluster of %d nodes ready: shardq cluster status --server http://%s; Ctrl-C stops it\n", len(brokers), brokers[0].HTTPAddr())

	select {
	case <-ctx.Done():
		fmt.Fprintln(stdout, "stopping")
		return stop()
	case err := <-served:
		fmt.Fprintf(stderr, "shardq cluster dev: %v\n", err)
		stop()
		return 1
	}
}

// waitReady waits until every node is ready.
func waitReady(ctx context.Context, brokers []*broker.Broker, served <-chan error, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ready := true
		for _, b := range brokers {
			ready = ready && b.Ready()
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the nodes were not ready after %s", within)
		}
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkPorts refuses ranges of ports that overlap or pass 65535 (0: the
// system picks).
func checkPorts(nodes int, bases map[string]int) error {
	used := map[int]string{}
	for _, name := range []string{"--base-port", "--http-port", "--cluster-port", "--etcd-port"} {
		base := bases[name]
		if base == 0 {
			continue
		}
		n := nodes
		if name == "--etcd-port" {
			n = 1
		}
		if base < 0 || base+n-1 > 65535 {
			return fmt.Errorf("%s: want a port from 1 to %d (or 0), got %d", name, 65536-n, base)
		}
		for p := base; p < base+n; p++ {
			if other, ok := used[p]; ok {
				return fmt.Errorf("%s and %s both take port %d", other, name, p)
			}
			used[p] = name
		}
	}
	return nil
}
