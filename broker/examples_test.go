package broker_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The examples in examples/ run against a real node, as a user would run
// them: the walkthrough with the mosquitto clients, the Python consumer
// with Debian's python3 and paho-mqtt. Each test skips, saying what is
// missing, where those are not installed (.ci/run installs them).

func TestExamplesWalkthrough(t *testing.T) {
	for _, tool := range []string{"bash", "mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (Debian package mosquitto-clients): the walkthrough is not run", tool)
		}
	}
	b := startBroker(t, t.TempDir(), nil)
	host, port, _ := net.SplitHostPort(b.MQTTAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../examples/walkthrough.sh")
	cmd.Env = append(cmd.Environ(), "SHARDQ_HOST="+host, "SHARDQ_PORT="+port)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("walkthrough: %v\n%s", err, out)
	}
	for _, want := range []string{
		"reading 1: PUBACK 0x00",
		"$queue/telemetry/dev-1 reading 3  [msg-id:",
		"$queue/telemetry/dev-2 reading 4",
		"refused, as expected: PUBACK 0x90",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("walkthrough output lacks %q:\n%s", want, out)
		}
	}
	// Both groups took and settled all four readings.
	scrapeUntil(t, b, []expectation{
		{"shardq_messages_enqueued_total", lbl("telemetry"), 4},
		{"shardq_messages_acked_total", lbl("telemetry"), 7},
		{"shardq_group_lag", lbl("telemetry", "group", "dash"), 1},
		{"shardq_group_lag", lbl("telemetry", "group", "archive"), 0},
	})
}

// python returns a python3 that can import paho-mqtt: the one on PATH, or
// Debian's (a python3 of pyenv or a virtualenv first on PATH does not see
// Debian's python3-paho-mqtt).
func python(t *testing.T) string {
	t.Helper()
	found := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		found = path
		if exec.Command(path, "-c", "import paho.mqtt.client").Run() == nil {
			return path
		}
	}
	if found == "" {
		t.Skip("python3 not found: the Python example is not run")
	}
	t.Skipf("paho-mqtt not importable by %s (Debian package python3-paho-mqtt): the Python example is not run", found)
	return ""
}

func TestExamplesPythonConsumer(t *testing.T) {
	py := python(t)
	b := startBroker(t, t.TempDir(), nil)
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	for i := 1; i <= 3; i++ {
		if rc := prod.publish("$queue/jobs/eu", fmt.Appendf(nil, "job %d", i)); rc != 0 {
			t.Fatalf("publish %d: reason %#x", i, rc)
		}
	}
	host, port, _ := net.SplitHostPort(b.MQTTAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "../examples/python/consumer.py", "--host", host, "--port", port,
		"--queue", "jobs", "--group", "workers", "--count", "3", "--timeout", "20")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("consumer.py: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("consumer.py printed %d lines, want 3:\n%s", len(lines), out)
	}
	for i, line := range lines {
		// One key, ordering key: in publish order, each delivered once.
		want := regexp.MustCompile(fmt.Sprintf(`^\$queue/jobs/eu msg-id=\d+-\d+ delivery-count=1: job %d$`, i+1))
		if !want.MatchString(line) {
			t.Errorf("line %d: %q, want it to match %s", i+1, line, want)
		}
	}
	// Its $ack publishes settled all three for the group.
	scrapeUntil(t, b, []expectation{
		{"shardq_messages_acked_total", lbl("jobs"), 3},
		{"shardq_messages_delivered_total", lbl("jobs"), 3},
		{"shardq_group_lag", lbl("jobs", "group", "workers"), 0},
		{"shardq_group_leased", lbl("jobs", "group", "workers"), 0},
	})
}
