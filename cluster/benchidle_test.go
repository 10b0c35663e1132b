package cluster_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkIdleGroups measures what idle replicated partitions cost:
// three nodes, QUEUES queues of 8 partitions with replication factor 3
// (QUEUES*8 raft groups on every node), each queue created by one
// publish; once every partition has its owner, the nodes' CPU time over
// 10 s with no traffic. Run with
//
//	go test ./cluster -run '^$' -bench IdleGroups -benchtime 1x -timeout 30m
//
// It reports the three nodes' CPU use together as a percentage of one
// core, for 100 queues (800 partitions) and 500 (4,000).
func BenchmarkIdleGroups(b *testing.B) {
	for _, queues := range []int{100, 500} {
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
	for q := 0; q < queues; q++ {
		c.waitOwned(fmt.Sprintf("idle%d", q), 8, 5*time.Minute, ids...)
	}
	b.Logf("%d partitions owned %s after the first publish", queues*8, time.Since(created).Round(time.Millisecond))
	before := make([]time.Duration, len(ids))
	for i, id := range ids {
		before[i] = processCPU(b, c.nodes[id].cmd.Process.Pid)
	}
	start := time.Now()
	time.Sleep(10 * time.Second)
	elapsed := time.Since(start)
	var used time.Duration
	for i, id := range ids {
		used += processCPU(b, c.nodes[id].cmd.Process.Pid) - before[i]
	}
	b.ReportMetric(100*used.Seconds()/elapsed.Seconds(), "idle-cpu-%core")
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
