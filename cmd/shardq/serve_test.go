package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardq/shardq/auth"
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
		{"open mqtt without users", []string{"--mqtt", "0.0.0.0:0"}, `listen.mqtt: "0.0.0.0:0" is not a loopback address`},
		{"open http without a token", []string{"--http", ":0"}, `listen.http: ":0" is not a loopback address: the admin API needs http.admin_token`},
		{"missing users file", []string{"--users-file", filepath.Join(dir, "users")}, "auth.users_file: cannot read"},
		{"bad acl", []string{"--config", file("f.yaml", "auth:\n  acl:\n    - {user: x, action: read, pattern: a, permission: allow}\n")}, "f.yaml:3: auth.acl[0].action"},
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

// TestServePasswd checks shardq passwd: the line it prints for a password
// on standard input authenticates that password, and bad input is refused.
func TestServePasswd(t *testing.T) {
	var out, errb bytes.Buffer
	if code := passwdCommand([]string{"alice", "--cost", "4"}, strings.NewReader("s3cret pass\n"), nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	line := strings.TrimSpace(out.String())
	users, err := auth.ParseUsers(strings.NewReader(line))
	if err != nil || !strings.HasPrefix(line, "alice:$2a$04$") {
		t.Fatalf("printed %q: %v", line, err)
	}
	if !users.Authenticate("alice", "s3cret pass") || users.Authenticate("alice", "s3cret") {
		t.Error("the printed hash does not check the password")
	}
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{[]string{}, "x\n", 2, "want one argument"},
		{[]string{"a:b"}, "x\n", 2, "holds ':'"},
		{[]string{"alice", "--cost", "99"}, "x\n", 2, "--cost must be from 4 to 31"},
		{[]string{"alice"}, "\n", 1, "must be 1 to 72 bytes"},
		{[]string{"alice"}, "", 1, "reading the password"},
	} {
		var out, errb bytes.Buffer
		if code := passwdCommand(tc.args, strings.NewReader(tc.stdin), nil, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("passwd %v: exit %d, stderr %q; want %d mentioning %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// TestServePortInUse: a node whose MQTT port is taken exits saying so,
// naming the flag and the config key that set it, as its last line.
func TestServePortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--data-dir", t.TempDir(), "--ws", "", "--http", "", "--mqtt", l.Addr().String()}, &out, &errb)
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	last := lines[len(lines)-1]
	if code != 1 || !strings.Contains(last, "the address is in use") || !strings.Contains(last, "--mqtt") || !strings.Contains(last, "listen.mqtt") {
		t.Fatalf("exit %d, last line %q: want exit 1 and a last line saying the address is in use, naming --mqtt and listen.mqtt", code, last)
	}
}
