package cluster_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkReplicatedAtRate runs the durable cycle of
// BenchmarkReplicatedCycle at a fixed rate, 5,000 msgs/s unless
// SHARDQ_BENCH_RATE says otherwise: through three nodes with replication
// factor 3 and ack_policy quorum, and through a single node, 3 rounds of
// each, alternately. Beside PUBACK latency it reports the CPU each side
// spends per message: the user and system time of its shardq processes
// over the whole run (from /proc; etcd, in the test process, is not
// counted) divided by the messages they acknowledged. Each side idles
// while the other runs: that idle time counts too (a few percent of a
// core). Run with
//
//	go test ./cluster -run '^$' -bench ReplicatedAtRate -benchtime 1x -timeout 30m
func BenchmarkReplicatedAtRate(b *testing.B) {
	rate := 5000
	if s := os.Getenv("SHARDQ_BENCH_RATE"); s != "" {
		var err error
		if rate, err = strconv.Atoi(s); err != nil || rate <= 0 {
			b.Fatalf("SHARDQ_BENCH_RATE=%q: want a positive number of messages a second", s)
		}
	}
	c := newCluster(b, "--config", configFile(b, cycleQueues+"    replication_factor: 3\n    ack_policy: quorum\n"), infoLog)
	var mqtt []string
	var cluster []*node
	for _, id := range []string{"a", "b", "c"} {
		n := c.start(id)
		mqtt = append(mqtt, n.mqtt)
		cluster = append(cluster, n)
	}
	single := startSingle(b, configFile(b, cycleQueues))
	nodes := strings.Join(mqtt, ",")
	var cpuCluster, cpuSingle time.Duration
	var ackedCluster, ackedSingle int64
	var cmp cycleComparison
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0, s0 := cpuOf(b, cluster...), cpuOf(b, single)
		r := runCycle(b, "--broker", nodes, "--consume-broker", nodes, "--vs", single.mqtt, "--rate", strconv.Itoa(rate))
		cpuCluster += cpuOf(b, cluster...) - c0
		cpuSingle += cpuOf(b, single) - s0
		for j := range r.A {
			ackedCluster += r.A[j].Acked
			ackedSingle += r.B[j].Acked
		}
		cmp.A = append(cmp.A, r.A...)
		cmp.B = append(cmp.B, r.B...)
	}
	b.StopTimer()
	if ackedCluster == 0 || ackedSingle == 0 {
		b.Fatalf("nothing acknowledged: cluster %d, single %d", ackedCluster, ackedSingle)
	}
	perCluster := float64(cpuCluster.Microseconds()) / float64(ackedCluster)
	perSingle := float64(cpuSingle.Microseconds()) / float64(ackedSingle)
	for i := range cmp.A {
		b.Logf("round %d: cluster %s, single %s", i+1, cmp.A[i], cmp.B[i])
	}
	b.Logf("CPU per message: cluster %.1f µs (%s over %d), single %.1f µs (%s over %d), ratio %.2f",
		perCluster, cpuCluster.Round(time.Millisecond), ackedCluster, perSingle, cpuSingle.Round(time.Millisecond), ackedSingle, perCluster/perSingle)
	b.ReportMetric(perCluster, "cluster-cpu-µs/msg")
	b.ReportMetric(perSingle, "single-cpu-µs/msg")
	b.ReportMetric(perCluster/perSingle, "cpu-ratio")
	b.ReportMetric(medianOf(cmp.A, func(r cycleResult) float64 { return r.PubAckP50Ms }), "cluster-puback-p50-ms")
	b.ReportMetric(medianOf(cmp.A, func(r cycleResult) float64 { return r.PubAckP99Ms }), "cluster-puback-p99-ms")
	b.ReportMetric(medianOf(cmp.B, func(r cycleResult) float64 { return r.PubAckP50Ms }), "single-puback-p50-ms")
	b.ReportMetric(medianOf(cmp.B, func(r cycleResult) float64 { return r.PubAckP99Ms }), "single-puback-p99-ms")
}

// cpuOf is the user and system time the nodes' processes have used.
func cpuOf(tb testing.TB, nodes ...*node) time.Duration {
	tb.Helper()
	var total time.Duration
	for _, n := range nodes {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
		if err != nil {
			tb.Skipf("no CPU times of node %s: %v", n.id, err)
		}
		// The fields after the command name, which ends at the last ')':
		// utime and stime are the 14th and 15th of the line, in ticks of
		// 1/100 s (USER_HZ).
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		for _, k := range []int{11, 12} {
			ticks, err := strconv.ParseInt(f[k], 10, 64)
			if err != nil {
				tb.Fatalf("/proc/%d/stat: %v", n.cmd.Process.Pid, err)
			}
			total += time.Duration(ticks) * 10 * time.Millisecond
		}
	}
	return total
}
