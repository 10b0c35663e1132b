package cluster_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cycleQueues are the queue settings of BenchmarkReplicatedCycle, on the
// cluster and the single node alike: those of shardq-none in
// scripts/bench-compare.sh.
const cycleQueues = "queues:\n  defaults:\n    ordering: none\n    prefetch: 1024\n    durability: fsync\n"

// BenchmarkReplicatedCycle runs `shardq bench cycle` against three nodes
// and against a single node (`shardq serve` without etcd), alternately,
// 3 rounds of 5s each: 4 producers spread over the cluster's nodes, 3
// consumers of one group, one on each node; the single node gets the same
// load. Queues have ordering none and prefetch 1024 (shardq-none of
// scripts/bench-compare.sh). The warm-up is 3s: a cluster creates each
// run's queue at its first publish, and its partitions elect their
// leaders within about 2s. rf3 is a cluster's default, replication factor
// 3 with ack_policy quorum; rf1 keeps each partition on its owner only:
// forwarding without raft. Run with
//
//	go test ./cluster -run '^$' -bench ReplicatedCycle -benchtime 1x -timeout 30m
//
// SHARDQ_BENCH_ARGS adds flags to every `shardq bench` run, e.g.
// "--duration 1s --rounds 1". It reports the medians over the rounds of
// msgs/s and PUBACK p50 and p99 of each, and of the cluster/single ratio.
func BenchmarkReplicatedCycle(b *testing.B) {
	for _, v := range []struct{ name, cfg string }{
		{"rf3", cycleQueues + "    replication_factor: 3\n    ack_policy: quorum\n"},
		{"rf1", cycleQueues + "    replication_factor: 1\n"},
	} {
		b.Run(v.name, func(b *testing.B) {
			c := newCluster(b, "--config", configFile(b, v.cfg), infoLog)
			ids := []string{"a", "b", "c"}
			var mqtt []string
			for _, id := range ids {
				mqtt = append(mqtt, c.start(id).mqtt)
			}
			single := startSingle(b, configFile(b, cycleQueues))
			nodes := strings.Join(mqtt, ",")
			var cmp cycleComparison
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := runCycle(b, "--broker", nodes, "--consume-broker", nodes, "--vs", single.mqtt)
				cmp.A = append(cmp.A, r.A...)
				cmp.B = append(cmp.B, r.B...)
				cmp.Ratios = append(cmp.Ratios, r.Ratios...)
			}
			b.StopTimer()
			for i := range cmp.A {
				b.Logf("round %d: cluster %s, single %s, ratio %s", i+1, cmp.A[i], cmp.B[i], ratioText(cmp.Ratios[i]))
			}
			b.ReportMetric(medianOf(cmp.A, func(r cycleResult) float64 { return *r.Throughput }), "cluster-msgs/s")
			b.ReportMetric(medianOf(cmp.B, func(r cycleResult) float64 { return *r.Throughput }), "single-msgs/s")
			b.ReportMetric(medianOf(cmp.Ratios, func(r *float64) float64 { return *r }), "ratio")
			b.ReportMetric(medianOf(cmp.A, func(r cycleResult) float64 { return r.PubAckP50Ms }), "cluster-puback-p50-ms")
			b.ReportMetric(medianOf(cmp.A, func(r cycleResult) float64 { return r.PubAckP99Ms }), "cluster-puback-p99-ms")
			b.ReportMetric(medianOf(cmp.B, func(r cycleResult) float64 { return r.PubAckP50Ms }), "single-puback-p50-ms")
			b.ReportMetric(medianOf(cmp.B, func(r cycleResult) float64 { return r.PubAckP99Ms }), "single-puback-p99-ms")
		})
	}
}

// cycleComparison is the part of `shardq bench --vs --json` read here.
type cycleComparison struct {
	A      []cycleResult `json:"a"`
	B      []cycleResult `json:"b"`
	Ratios []*float64    `json:"ratios"`
}

type cycleResult struct {
	Status      string   `json:"status"`
	Valid       bool     `json:"valid"`
	Throughput  *float64 `json:"throughput_msgs_per_s"`
	PubAckP50Ms float64  `json:"puback_p50_ms"`
	PubAckP99Ms float64  `json:"puback_p99_ms"`
	E2EP99Ms    float64  `json:"e2e_p99_ms"`
	Acked       int64    `json:"acked"`
	Rejected    int64    `json:"rejected"`
	Missing     int64    `json:"missing"`
	Unacked     int64    `json:"unacked"`
}

func (r cycleResult) String() string {
	if r.Throughput == nil {
		return r.Status
	}
	return strings.Join([]string{
		fmtFloat(*r.Throughput, 0) + " msgs/s",
		"puback p50 " + fmtFloat(r.PubAckP50Ms, 3) + " p99 " + fmtFloat(r.PubAckP99Ms, 3) + " ms",
		"e2e p99 " + fmtFloat(r.E2EP99Ms, 3) + " ms",
	}, ", ")
}

// runCycle runs `shardq bench cycle --json` with the flags given and
// fails the benchmark unless every run was valid.
func runCycle(b *testing.B, args ...string) cycleComparison {
	b.Helper()
	args = append([]string{"bench", "cycle", "--consumers", "3", "--receive-max", "1024",
		"--rounds", "3", "--duration", "5s", "--warmup", "3s", "--json"}, args...)
	args = append(args, strings.Fields(os.Getenv("SHARDQ_BENCH_ARGS"))...)
	cmd := exec.Command(shardqBinary(b), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var cmp cycleComparison
	if err := json.Unmarshal(stdout.Bytes(), &cmp); err != nil {
		b.Fatalf("shardq %s: %v, %v\n%s", strings.Join(args, " "), runErr, err, stderr.Bytes())
	}
	for i := range cmp.A {
		for side, r := range map[string]cycleResult{"cluster": cmp.A[i], "single": cmp.B[i]} {
			if !r.Valid {
				b.Errorf("round %d, %s: %s: acked %d, rejected %d, unacked %d, missing %d", i+1, side, r.Status, r.Acked, r.Rejected, r.Unacked, r.Missing)
			}
		}
	}
	if runErr != nil || b.Failed() {
		b.Fatalf("shardq %s: %v\n%s", strings.Join(args, " "), runErr, stderr.Bytes())
	}
	return cmp
}

// startSingle runs `shardq serve` without etcd, a single node, and waits
// until it is ready.
func startSingle(tb testing.TB, cfg string) *node {
	tb.Helper()
	n := &node{id: "single", dir: tb.TempDir(), mqtt: freeAddr(tb), http: freeAddr(tb)}
	n.cmd = exec.Command(shardqBinary(tb), "serve", "--data-dir", n.dir, "--mqtt", n.mqtt, "--http", n.http,
		"--ws", "", "--node-id", n.id, "--config", cfg, infoLog)
	f, err := os.Create(filepath.Join(n.dir, "..", n.id+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	n.logPath = f.Name()
	n.cmd.Stdout, n.cmd.Stderr = f, f
	n.cmd.Env = append(os.Environ(), "SHARDQ_WS=", "SHARDQ_ETCD=")
	if err := n.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	n.exited = make(chan struct{})
	go func() {
		_ = n.cmd.Wait()
		_ = f.Close()
		close(n.exited)
	}()
	tb.Cleanup(n.kill)
	n.waitReady(tb, 30*time.Second)
	return n
}

// medianOf is the median of f over vs.
func medianOf[T any](vs []T, f func(T) float64) float64 {
	var s []float64
	for _, v := range vs {
		s = append(s, f(v))
	}
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func ratioText(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmtFloat(*r, 3)
}

func fmtFloat(f float64, prec int) string { return strconv.FormatFloat(f, 'f', prec, 64) }
