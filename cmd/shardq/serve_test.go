package main

import (
	"bytes"
	"os"
	"path/filepath"
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
