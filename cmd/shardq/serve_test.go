package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeRefusesBadConfiguration checks that `shardq serve` with an
// invalid file, value or flag exits non-zero naming what is wrong, before
// it opens any storage.
func TestServeRefusesBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data := filepath.Join(dir, "data")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad duration", []string{"--config", file("a.yaml", "queues:\n  defaults:\n    ack_timeout: soon\n")}, "queues.defaults.ack_timeout"},
		{"unknown key", []string{"--config", file("b.yaml", "storage:\n  shardz: 2\n")}, "storage.shardz"},
		{"bad ordering", []string{"--config", file("c.yaml", "queues:\n  declared:\n    orders:\n      ordering: fifo\n")}, "queues.declared.orders.ordering"},
		{"not yaml", []string{"--config", file("d.yaml", "queues: [\n")}, "d.yaml"},
		{"missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"unknown flag", []string{"--colour", "blue"}, "colour"},
		{"bad address", []string{"--mqtt", "1883"}, "--mqtt"},
		{"bad log level", []string{"--log-level", "loud"}, "log_level"},
		{"fraction", []string{"--config", file("e.yaml", "queues:\n  defaults:\n    partitions: 2.5\n")}, "queues.defaults.partitions: must be an integer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(append([]string{"serve", "--data-dir", data, "--ws", "", "--http", ""}, c.args...), &out, &errb)
			if code == 0 || !strings.Contains(errb.String(), c.want) {
				t.Fatalf("exit %d, stderr %q: want a non-zero exit naming %q", code, errb.String(), c.want)
			}
			if _, err := os.Stat(data); err == nil {
				t.Fatalf("the data directory was created: the node started half-configured")
			}
		})
	}
}

// TestServeReportsEveryError checks that one run names every mistake, one
// per line.
func TestServeReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(file, []byte("queues:\n  declared:\n    orders:\n      ack_timeout: 10ms\n      partitions: 2.5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--config", file, "--log-level", "loud", "--data-dir", filepath.Join(dir, "data")}, &out, &errb)
	want := []string{
		"shardq: config: " + file + ":4: queues.declared.orders.ack_timeout: must be at least 100ms, got 10ms",
		"shardq: config: " + file + `:5: queues.declared.orders.partitions: must be an integer, got "2.5"`,
		`shardq: config: log_level: must be debug, info, warn or error, got "loud" (from --log-level)`,
	}
	if got := strings.Split(strings.TrimSpace(errb.String()), "\n"); code != 2 || !slices.Equal(got, want) {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and:\n%s", code, errb.String(), strings.Join(want, "\n"))
	}
}
