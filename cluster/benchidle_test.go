package cluster_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkIdleGroups measures what idle replicated partitions cost:
// three nodes, QUEUES queues of 8 partitions with replication factor 3
// (QUEUES*8 raft groups on every node), each queue created by one
// publish; once every replica is in sync, the nodes' CPU time with no
// traffic (the median of five windows of 10 s: one window can catch the
// machine's own noise), their resident memory, and the PUBACK latency of
// 1,000 publishes to idle partitions, which wake their groups. Run with
//
//	go test ./cluster -run '^$' -bench IdleGroups -benchtime 1x -timeout 30m
//
// It reports how long after the last creating publish every replica was
// in sync (every group quiesced on the three nodes), the three nodes' CPU
// use together as a percentage of one core, and the publishes' p50 and
// p99, for 1 queue (the nodes' own cost), 100 queues (800 partitions),
// 500 (4,000) and 1,000 (8,000).
// SHARDQ_IDLE_PROFILE=FILE writes a CPU profile of one node meanwhile.
func BenchmarkIdleGroups(b *testing.B) {
	for _, queues := range []int{1, 100, 500, 1000} {
		b.Run(fmt.Sprintf("queues=%d", queues), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				idleGroups(b, queues)
			}
		})
	}
}

func idleGroups(b *testing.B, queues int) {
	c := newCluster(b, infoLog)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		c.start(id)
	}
	cl := dial(b, c.nodes["a"].mqtt, "creator", 64)
	created := time.Now()
	for q := 0; q < queues; q++ {
		if code, err := cl.publish(fmt.Sprintf("$queue/idle%d", q), "k", []byte("x")); err != nil || code != 0 {
			b.Fatalf("publish to idle%d: %#x %v", q, code, err)
		}
	}
	last := time.Now()
	partitions := queues * 8
	// Every replica of every partition holds every entry once its group
	// quiesced on all three nodes.
	deadline := last.Add(10 * time.Minute)
	for {
		quiet := 0.0
		for _, id := range ids {
			quiet += c.nodes[id].metric(b, "shardq_cluster_raft_quiesced_groups")
		}
		if int(quiet) >= 3*partitions {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%v of %d replicas in sync and quiesced 10 minutes after the last publish", quiet, 3*partitions)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Logf("%d partitions (%d replicas) created by %s of publishes, every replica in sync %s after the last", partitions, 3*partitions,
		last.Sub(created).Round(time.Millisecond), time.Since(last).Round(time.Millisecond))
	b.ReportMetric(time.Since(last).Seconds(), "s-to-in-sync")
	// The nodes' CPU over idleWindows windows of 10 s, the median
	// reported: a window can catch the machine's own noise.
	var uses []float64
	for w := 0; w < idleWindows; w++ {
		uses = append(uses, idleWindow(b, c, ids, w == 0))
	}
	slices.Sort(uses)
	use := uses[len(uses)/2]
	b.ReportMetric(use, "idle-cpu-%core")
	var rss []string
	for _, id := range ids {
		rss = append(rss, fmt.Sprintf("%s %d MiB", id, processRSS(b, c.nodes[id].cmd.Process.Pid)>>20))
	}
	b.Logf("idle: the three nodes used %.1f%% of one core (median of %d windows of 10 s: %.1f); RSS %s", use, idleWindows, uses, strings.Join(rss, ", "))

	// A publish to an idle partition wakes its group: its PUBACK, through
	// the node the client is on (the partition's leader or not).
	var lat []time.Duration
	publishes := 1000
	if queues < 100 {
		publishes = 10 * queues // each round of them waits a second
	}
	for i := range publishes {
		t0 := time.Now()
		if code, err := cl.publish(fmt.Sprintf("$queue/idle%d", (i*7919)%queues), fmt.Sprintf("w%d", i), []byte("x")); err != nil || code != 0 {
			b.Fatalf("publish to an idle queue: %#x %v", code, err)
		}
		lat = append(lat, time.Since(t0))
		if queues < 1000 && i%queues == queues-1 {
			// Every queue woken: wait until they are quiet again.
			time.Sleep(time.Second)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "idle-publish-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "idle-publish-p99-ms")
}

// idleWindows is how many windows of 10 s idleGroups measures.
const idleWindows = 5

// idleWindow returns the CPU the nodes used together over 10 s, as a
// percentage of one core; profile takes node a's CPU profile meanwhile
// (SHARDQ_IDLE_PROFILE).
func idleWindow(b *testing.B, c *testCluster, ids []string, profile bool) float64 {
	before := make([]time.Duration, len(ids))
	for i, id := range ids {
		before[i] = processCPU(b, c.nodes[id].cmd.Process.Pid)
	}
	start := time.Now()
	if path := os.Getenv("SHARDQ_IDLE_PROFILE"); profile && path != "" {
		// A CPU profile of node a over the idle time, to see what is left.
		resp, err := http.Get("http://" + c.nodes["a"].http + "/debug/pprof/profile?seconds=10")
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := os.WriteFile(path, data, 0o644); err != nil {
			b.Fatal(err)
		}
	} else {
		time.Sleep(10 * time.Second)
	}
	elapsed := time.Since(start)
	var used time.Duration
	for i, id := range ids {
		used += processCPU(b, c.nodes[id].cmd.Process.Pid) - before[i]
	}
	return 100 * used.Seconds() / elapsed.Seconds()
}

// processRSS reads the resident memory of process pid, in bytes.
func processRSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// processCPU reads the CPU time, user and system, process pid used.
func processCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command's name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticks
}
