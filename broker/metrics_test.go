package broker_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/config"
)

// sample is one line of the Prometheus text format: a series and its value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape reads /metrics.
func scrape(t *testing.T, b *testBroker) []sample {
	t.Helper()
	resp, err := http.Get("http://" + b.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	samples, err := parseMetrics(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return samples
}

// parseMetrics parses the Prometheus text exposition format: enough of it
// for the lines client_golang writes.
func parseMetrics(r io.Reader) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			s.name = line[:i]
			end := strings.LastIndexByte(line, '}')
			if end < i {
				return nil, fmt.Errorf("bad line %q", line)
			}
			for body := line[i+1 : end]; body != ""; {
				k, v, ok := strings.Cut(body, `="`)
				if !ok {
					return nil, fmt.Errorf("bad labels in %q", line)
				}
				var val strings.Builder
				j := 0
				for ; j < len(v) && v[j] != '"'; j++ {
					if v[j] == '\\' && j+1 < len(v) {
						j++
						switch v[j] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(v[j])
						}
						continue
					}
					val.WriteByte(v[j])
				}
				s.labels[strings.TrimPrefix(k, ",")] = val.String()
				body = strings.TrimPrefix(v[min(j+1, len(v)):], ",")
			}
			rest = line[end+1:]
		} else {
			s.name, rest, _ = strings.Cut(line, " ")
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %v", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// sum adds up the series of name whose labels include want.
func sum(samples []sample, name string, want map[string]string) (float64, bool) {
	total, found := 0.0, false
	for _, s := range samples {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range want {
			if s.labels[k] != v {
				match = false
				break
			}
		}
		if match {
			total += s.value
			found = true
		}
	}
	return total, found
}

// expectation is a metric's exact value: the sum of its series with labels.
type expectation struct {
	name   string
	labels map[string]string
	want   float64
}

// scrapeUntil scrapes until every expectation holds, for at most 10 s:
// settlements reach the queue asynchronously, and retention deletes
// settled messages on its own timer. It fails with what differed last.
func scrapeUntil(t *testing.T, b *testBroker, exps []expectation) []sample {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		samples := scrape(t, b)
		var diffs []string
		for _, e := range exps {
			got, found := sum(samples, e.name, e.labels)
			if !found || got != e.want {
				diffs = append(diffs, fmt.Sprintf("%s%v = %v (found %v), want %v", e.name, e.labels, got, found, e.want))
			}
		}
		if len(diffs) == 0 {
			return samples
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s:\n  %s", strings.Join(diffs, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lbl(name string, kv ...string) map[string]string {
	m := map[string]string{"queue": name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestMetricsCountTrafficExactly(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.NodeID = "node-a" })
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	for i, p := range payloads(100, "job") {
		if rc := prod.publish("$queue/jobs", p); rc != 0 {
			t.Fatalf("publish %d: reason %#x", i, rc)
		}
	}
	// One key (the producer's client ID), ordering key: one message out at
	// a time, in order. 60 acks, 5 rejects, then one delivery left unsettled.
	cons := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	cons.subscribe(1, nil, "$queue/jobs")
	for i := 0; i < 65; i++ {
		p := cons.next(5 * time.Second)
		if i%13 == 0 {
			cons.puback(p, 0x87)
		} else {
			cons.puback(p, 0x00)
		}
	}
	held := cons.next(5 * time.Second)

	samples := scrapeUntil(t, b, []expectation{
		{"shardq_messages_enqueued_total", lbl("jobs"), 100},
		{"shardq_messages_delivered_total", lbl("jobs"), 66},
		{"shardq_messages_redelivered_total", lbl("jobs"), 0},
		{"shardq_messages_acked_total", lbl("jobs"), 60},
		{"shardq_messages_rejected_total", lbl("jobs"), 5},
		{"shardq_messages_nacked_total", lbl("jobs"), 0},
		{"shardq_messages_dead_lettered_total", lbl("jobs"), 5},
		{"shardq_messages_expired_total", lbl("jobs"), 0},
		{"shardq_leases_lost_total", lbl("jobs"), 0},
		{"shardq_partition_depth", lbl("jobs"), 35},
		{"shardq_group_lag", lbl("jobs", "group", "default"), 35},
		{"shardq_group_leased", lbl("jobs", "group", "default"), 1},
		{"shardq_group_consumers", lbl("jobs", "group", "default"), 1},
		{"shardq_group_settled_total", lbl("jobs", "group", "default"), 65},
		{"shardq_e2e_latency_seconds_count", lbl("jobs"), 60},
		{"shardq_messages_enqueued_total", lbl("jobs/$dlq"), 5},
		{"shardq_partition_depth", lbl("jobs/$dlq"), 5},
		{"shardq_mqtt_clients_connected", nil, 2},
		{"shardq_mqtt_messages_received_total", nil, 100},
		{"shardq_publish_ack_seconds_count", nil, 100},
		{"shardq_ready", nil, 1},
	})

	// The held message is the oldest the group has not settled.
	age, _ := sum(samples, "shardq_group_oldest_unsettled_age_seconds", lbl("jobs", "group", "default"))
	if age <= 0 || age > 60 {
		t.Errorf("oldest unsettled age %v s, want a positive age of the held message", age)
	}
	// Each PUBACK came after its publish's commit.
	if n, _ := sum(samples, "shardq_publish_ack_seconds_sum", nil); n <= 0 {
		t.Errorf("shardq_publish_ack_seconds_sum %v, want the positive time of 100 PUBACKs", n)
	}
	if n, _ := sum(samples, "shardq_storage_commit_duration_seconds_count", nil); n == 0 {
		t.Error("no commit observed in shardq_storage_commit_duration_seconds")
	}
	if n, _ := sum(samples, "shardq_storage_commit_writes_sum", nil); n < 100 {
		t.Errorf("commit writes sum %v, want at least the 100 appends", n)
	}
	if n, _ := sum(samples, "shardq_storage_disk_bytes", nil); n <= 0 {
		t.Errorf("storage disk bytes %v, want some", n)
	}
	for _, s := range samples {
		if !strings.HasPrefix(s.name, "shardq_") && !strings.HasPrefix(s.name, "go_") && !strings.HasPrefix(s.name, "process_") {
			t.Errorf("metric %s is named neither shardq_* nor go_* or process_*", s.name)
		}
		if s.labels["node"] != "node-a" {
			t.Errorf("metric %s%v has node %q, want node-a", s.name, s.labels, s.labels["node"])
		}
	}

	// Settling the held message moves the figures on, exactly.
	cons.puback(held, 0)
	scrapeUntil(t, b, []expectation{
		{"shardq_messages_acked_total", lbl("jobs"), 61},
		{"shardq_messages_delivered_total", lbl("jobs"), 67},
		{"shardq_group_leased", lbl("jobs", "group", "default"), 1},
		{"shardq_group_lag", lbl("jobs", "group", "default"), 34},
		{"shardq_group_settled_total", lbl("jobs", "group", "default"), 66},
	})
}

func TestMetricsRedeliveriesAndExpiredLeases(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Queues.Defaults.AckTimeout = 200 * time.Millisecond
		c.Queues.Defaults.RetryBackoff = 10 * time.Millisecond
		c.Queues.Defaults.RetryBackoffMax = 10 * time.Millisecond
		c.Queues.Defaults.MaxDeliveries = 3
	})
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/flaky", []byte("x"))
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/workers/$queue/flaky")
	cons.puback(cons.next(5*time.Second), 0x80) // nack
	cons.next(5 * time.Second)                  // lease runs out
	last := cons.next(5 * time.Second)          // third and last delivery
	cons.puback(last, 0x80)                     // max_deliveries reached: dead-lettered
	scrapeUntil(t, b, []expectation{
		{"shardq_messages_delivered_total", lbl("flaky"), 3},
		{"shardq_messages_redelivered_total", lbl("flaky"), 2},
		{"shardq_messages_nacked_total", lbl("flaky"), 2},
		{"shardq_leases_lost_total", lbl("flaky"), 1},
		{"shardq_messages_dead_lettered_total", lbl("flaky"), 1},
		{"shardq_messages_acked_total", lbl("flaky"), 0},
		{"shardq_group_lag", lbl("flaky", "group", "workers"), 0},
		{"shardq_group_settled_total", lbl("flaky", "group", "workers"), 1},
		{"shardq_group_delivered_total", lbl("flaky", "group", "workers"), 3},
		{"shardq_group_redelivered_total", lbl("flaky", "group", "workers"), 2},
		{"shardq_group_nacked_total", lbl("flaky", "group", "workers"), 2},
		{"shardq_group_leases_lost_total", lbl("flaky", "group", "workers"), 1},
		{"shardq_group_dead_lettered_total", lbl("flaky", "group", "workers"), 1},
		{"shardq_partition_depth", lbl("flaky/$dlq"), 1},
	})
}

// TestMetricsGroupSettledRate checks that each group of a queue has its
// own settle count, so that a slow group shows apart from a fast one.
func TestMetricsGroupSettledRate(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i, p := range payloads(10, "m") {
		if rc := prod.publish("$queue/shared", p); rc != 0 {
			t.Fatalf("publish %d: %#x", i, rc)
		}
	}
	// Both groups exist before either settles: retention deletes what
	// every existing group has settled.
	slow := dialRaw(t, b.MQTTAddr(), "slow", connectOpts{})
	slow.subscribe(1, nil, "$share/slow/$queue/shared")
	fast := dialRaw(t, b.MQTTAddr(), "fast", connectOpts{})
	fast.subscribe(1, nil, "$share/fast/$queue/shared")
	for range 10 {
		fast.puback(fast.next(5*time.Second), 0)
	}
	for range 3 {
		slow.puback(slow.next(5*time.Second), 0)
	}
	scrapeUntil(t, b, []expectation{
		{"shardq_group_settled_total", lbl("shared", "group", "fast"), 10},
		{"shardq_group_settled_total", lbl("shared", "group", "slow"), 3},
		{"shardq_group_lag", lbl("shared", "group", "slow"), 7},
		{"shardq_messages_acked_total", lbl("shared"), 13},
		{"shardq_group_acked_total", lbl("shared", "group", "fast"), 10},
		{"shardq_group_acked_total", lbl("shared", "group", "slow"), 3},
		{"shardq_group_delivered_total", lbl("shared", "group", "slow"), 4}, // one key: one message out at a time
	})
}

// TestMetricsStandardGoAndProcess checks that the Go runtime's and the
// process's metrics carry their standard names, which Go and process
// dashboards query, and the node label.
func TestMetricsStandardGoAndProcess(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.NodeID = "node-std" })
	samples := scrape(t, b)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "go_gc_duration_seconds_count",
		"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} {
		v, ok := sum(samples, name, map[string]string{"node": "node-std"})
		if !ok || v <= 0 {
			t.Errorf("%s{node=\"node-std\"} = %v (found %v), want a positive value", name, v, ok)
		}
	}
	for _, s := range samples {
		if strings.HasPrefix(s.name, "shardq_go_") || strings.HasPrefix(s.name, "shardq_process_") {
			t.Errorf("%s: the runtime's and process's metrics are no longer prefixed", s.name)
		}
	}
}

func TestMetricsOff(t *testing.T) {
	b := startBroker(t, t.TempDir(), func(c *config.Config) { c.Admin.Metrics = false })
	resp, err := http.Get("http://" + b.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics with metrics off: %s, want 404", resp.Status)
	}
	// The broker works the same.
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	if rc := prod.publish("$queue/q", []byte("x")); rc != 0 {
		t.Fatalf("publish: %#x", rc)
	}
}

func TestMetricsNamesAreDocumented(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/doc", []byte("x"))
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$queue/doc")
	cons.puback(cons.next(5*time.Second), 0)
	samples := scrapeUntil(t, b, []expectation{{"shardq_messages_acked_total", lbl("doc"), 1}})
	doc := readDoc(t, "../docs/METRICS.md")
	var missing []string
	for _, s := range samples {
		name := s.name
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if strings.HasSuffix(name, suffix) && strings.Contains(doc, "`"+strings.TrimSuffix(name, suffix)+"`") {
				name = strings.TrimSuffix(name, suffix)
			}
		}
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue // the Go runtime's and the process's, listed as families
		}
		if !strings.Contains(doc, "`"+name+"`") && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("metrics not listed in docs/METRICS.md: %s", strings.Join(missing, ", "))
	}
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return string(data)
}

// TestMetricsDashboardAndAlertsQueryExportedNames checks that every metric
// the Grafana dashboard and the alert rules of examples/ query is one a
// node exports, so that they follow a rename.
func TestMetricsDashboardAndAlertsQueryExportedNames(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/doc", []byte("x"))
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/g/$queue/doc")
	cons.puback(cons.next(5*time.Second), 0)
	samples := scrapeUntil(t, b, []expectation{{"shardq_messages_acked_total", lbl("doc"), 1}})
	exported := map[string]bool{}
	for _, s := range samples {
		exported[s.name] = true
	}
	// A single node exports no cluster metric: those are the names
	// cluster/metrics.go defines (a histogram's series add a suffix).
	for _, m := range regexp.MustCompile(`Name: +"(shardq_cluster_[a-z0-9_]+)"`).FindAllStringSubmatch(readDoc(t, "../cluster/metrics.go"), -1) {
		exported[m[1]] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			exported[m[1]+suffix] = true
		}
	}
	name := regexp.MustCompile(`\b(?:shardq|go|process)_[a-z0-9_]+\b`)
	for _, file := range []string{"../examples/grafana/shardq.json", "../examples/shardq-alerts.yml"} {
		used := name.FindAllString(readDoc(t, file), -1)
		if len(used) == 0 {
			t.Errorf("%s queries no metric", file)
		}
		for _, m := range used {
			if !exported[m] {
				t.Errorf("%s queries %s, which a node does not export", file, m)
			}
		}
	}
}

// A deleted queue's series leave the scrape, its latency histogram too.
func TestMetricsOfADeletedQueueGo(t *testing.T) {
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	prod.publish("$queue/gone", []byte("x"))
	cons := dialRaw(t, b.MQTTAddr(), "c", connectOpts{})
	cons.subscribe(1, nil, "$share/g/$queue/gone")
	cons.puback(cons.next(5*time.Second), 0)
	scrapeUntil(t, b, []expectation{{"shardq_e2e_latency_seconds_count", lbl("gone"), 1}})
	cons.close()
	if status, body := call(t, b, http.MethodDelete, "/api/v1/queues/gone", "", ""); status != http.StatusOK {
		t.Fatalf("DELETE: HTTP %d %s", status, body)
	}
	for _, s := range scrape(t, b) {
		if q := s.labels["queue"]; q == "gone" || q == "gone/$dlq" {
			t.Errorf("after the delete: %s%v", s.name, s.labels)
		}
	}
}
