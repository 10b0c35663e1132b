package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestCLIHelp checks that every command answers -h, --help and help (as
// "shardq help COMMAND" and, where help cannot be an argument, "shardq
// COMMAND help") with its usage on stdout and exit 0.
func TestCLIHelp(t *testing.T) {
	commands := []struct {
		cmd  []string
		want []string // in the usage
	}{
		{[]string{"serve"}, []string{"usage: shardq serve", "--config FILE", "--log-level LEVEL"}},
		{[]string{"version"}, []string{"usage: shardq version"}},
		{[]string{"health"}, []string{"usage: shardq health", "--server URL", "--ready"}},
		{[]string{"queues"}, []string{"usage: shardq queues", "--server URL", "--json"}},
		{[]string{"queue"}, []string{"usage: shardq queue <subcommand>", "peek QUEUE", "declare QUEUE [KEY=VALUE ...]"}},
		{[]string{"queue", "peek"}, []string{"usage: shardq queue peek QUEUE", "--partition PARTITION", "--limit N"}},
		{[]string{"group"}, []string{"usage: shardq group <subcommand>", "delete QUEUE GROUP"}},
		{[]string{"dlq", "replay"}, []string{"usage: shardq dlq replay QUEUE", "--id MSGID"}},
		{[]string{"cluster"}, []string{"usage: shardq cluster <subcommand>", "status", "drain NODE", "undrain NODE",
			"placement set QUEUES=NODE[,NODE...]", "placement clear", "dev [--nodes N] [--dir DIR]"}},
		{[]string{"cluster", "status"}, []string{"usage: shardq cluster status", "draining, drained", "learners", "--server URL", "--json"}},
		{[]string{"cluster", "drain"}, []string{"usage: shardq cluster drain NODE", "cluster.max_moves", "shardq cluster undrain", "--token TOKEN"}},
		{[]string{"cluster", "undrain"}, []string{"usage: shardq cluster undrain NODE", "--token TOKEN"}},
		{[]string{"cluster", "placement"}, []string{"usage: shardq cluster placement [flags]", "placement set and clear", "--json"}},
		{[]string{"cluster", "placement", "set"}, []string{"usage: shardq cluster placement set QUEUES=NODE[,NODE...]", "'orders-*=a,b' 'audit=c'", "only seeds"}},
		{[]string{"cluster", "placement", "clear"}, []string{"usage: shardq cluster placement clear", "every queue may then live"}},
		{[]string{"cluster", "dev"}, []string{"usage: shardq cluster dev", "--nodes N", "--dir DIR", "--base-port PORT"}},
		{[]string{"migrate-shards"}, []string{"usage: shardq migrate-shards", "--data-dir DIR", "--verify MODE"}},
		{[]string{"passwd"}, []string{"usage: shardq passwd USER", "--cost N"}},
	}
	for _, c := range commands {
		forms := [][]string{
			append(slices.Clone(c.cmd), "-h"),
			append(slices.Clone(c.cmd), "--help"),
			append([]string{"help"}, c.cmd...),
		}
		if len(c.cmd) == 1 {
			forms = append(forms, append(slices.Clone(c.cmd), "help"))
		}
		for _, args := range forms {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errs := shardq(args...)
				if code != 0 {
					t.Fatalf("exit %d, stderr %q", code, errs)
				}
				for _, w := range c.want {
					if !strings.Contains(out, w) {
						t.Errorf("usage lacks %q:\n%s", w, out)
					}
				}
			})
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		if code, out, _ := shardq(args...); code != 0 || !strings.Contains(out, "commands:") {
			t.Errorf("shardq %s: exit %d\n%s", args[0], code, out)
		}
	}
	if code, _, errs := shardq(); code != 2 || !strings.Contains(errs, "commands:") {
		t.Errorf("shardq alone: exit %d, stderr %q; want 2 and the usage", code, errs)
	}
	fails(t, 2, `unknown command "frob"`, "help", "frob")
}

// TestCLIServeHelpListsEveryFlag checks that shardq serve --help shows each
// flag with its default and its environment variable.
func TestCLIServeHelpListsEveryFlag(t *testing.T) {
	_, out, _ := shardq("serve", "--help")
	for _, f := range [][3]string{
		{"--config FILE", "none", "SHARDQ_CONFIG"},
		{"--data-dir DIR", "./data", "SHARDQ_DATA_DIR"},
		{"--mqtt ADDR", "127.0.0.1:1883", "SHARDQ_MQTT"},
		{"--ws ADDR", "127.0.0.1:8083", "SHARDQ_WS"},
		{"--http ADDR", "127.0.0.1:8990", "SHARDQ_HTTP"},
		{"--mqtts ADDR", "none", "SHARDQ_MQTTS"},
		{"--users-file FILE", "none", "SHARDQ_USERS_FILE"},
		{"--allow-anonymous BOOL", "false", "SHARDQ_ALLOW_ANONYMOUS"},
		{"--admin-token TOKEN", "none", "SHARDQ_ADMIN_TOKEN"},
		{"--node-id ID", "the host name", "SHARDQ_NODE_ID"},
		{"--log-level LEVEL", "info", "SHARDQ_LOG_LEVEL"},
	} {
		_, block, ok := strings.Cut(out, "  "+f[0]+"\n")
		block, _, _ = strings.Cut(block, "  --")
		if !ok || !strings.Contains(block, "default "+f[1]+"; env "+f[2]) {
			t.Errorf("serve --help lacks %s with default %s and env %s:\n%s", f[0], f[1], f[2], out)
		}
	}
	if strings.Contains(out, "help requested") {
		t.Errorf("serve --help printed an error:\n%s", out)
	}
}

// TestCLICommandsTakeOnlyTheirFlags checks that a flag of another command
// is refused, naming it, before anything is called.
func TestCLICommandsTakeOnlyTheirFlags(t *testing.T) {
	tests := []struct {
		args []string
		flag string
	}{
		{[]string{"queues", "--limit", "3"}, "--limit"},
		{[]string{"queues", "--dlq"}, "--dlq"},
		{[]string{"queue", "show", "jobs", "--partition", "1"}, "--partition"},
		{[]string{"queue", "purge", "jobs", "--id", "0-1"}, "--id"},
		{[]string{"queue", "declare", "jobs", "--dlq"}, "--dlq"},
		{[]string{"group", "delete", "jobs", "g", "--limit", "1"}, "--limit"},
		{[]string{"dlq", "replay", "jobs", "--dlq"}, "--dlq"},
		{[]string{"health", "--token", "x"}, "--token"},
		{[]string{"version", "--json"}, "--json"},
		{[]string{"serve", "--server", "http://x"}, "--server"},
		{[]string{"migrate-shards", "--server", "http://x"}, "--server"},
		{[]string{"cluster", "drain", "b", "--dlq"}, "--dlq"},
		{[]string{"cluster", "placement", "set", "orders-*=a", "--limit", "1"}, "--limit"},
		{[]string{"cluster", "placement", "clear", "--id", "x"}, "--id"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			// The server is a closed port: a command that called it would
			// fail with exit 1, not 2.
			t.Setenv("SHARDQ_SERVER", "http://127.0.0.1:1")
			fails(t, 2, tc.flag, tc.args...)
		})
	}
	// Each command takes its own.
	_, server := startNode(t)
	must(t, "queue", "peek", "jobs", "--partition", "0", "--limit", "1", "--dlq", "--server", server, "--token", cliToken)
	must(t, "queue", "show", "jobs", "--json", "--server", server, "--token", cliToken)
}

func TestCLIVersion(t *testing.T) {
	code, out, _ := shardq("version")
	if code != 0 || !strings.HasPrefix(out, "shardq ") || !strings.Contains(out, "\ncommit ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("version: exit %d\n%s", code, out)
	}

	// A binary built as make build does says the version and commit it was given.
	dir := t.TempDir()
	buildAndRun := func(name string, buildFlags ...string) []string {
		t.Helper()
		bin := filepath.Join(dir, name)
		build := exec.Command("go", append(append([]string{"build", "-o", bin}, buildFlags...), ".")...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", strings.Join(buildFlags, " "), err, out)
		}
		got, err := exec.Command(bin, "version").Output()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(got)), "\n")
		if len(lines) != 3 || lines[2] != runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH {
			t.Fatalf("version of a built binary:\n%s", got)
		}
		return lines
	}
	lines := buildAndRun("stamped", "-ldflags", "-X main.version=v1.2.3-test -X main.commit=0123abcd")
	if lines[0] != "shardq v1.2.3-test" || !strings.HasPrefix(lines[1], "commit 0123abcd") {
		t.Errorf("built with -ldflags -X: %q", lines)
	}
	// Without them, it reads the commit Go records when it builds in a git
	// checkout (not in a git worktree, where Go records none).
	lines = buildAndRun("vcs", "-buildvcs=auto")
	info, err := exec.Command("go", "version", "-m", filepath.Join(dir, "vcs")).Output()
	if err != nil {
		t.Fatal(err)
	}
	_, rev, ok := strings.Cut(string(info), "vcs.revision=")
	if !ok {
		if lines[1] != "commit unknown" {
			t.Errorf("no commit recorded, but version says %q", lines[1])
		}
		t.Logf("go recorded no commit in the binary (not a git checkout, or a worktree): only the fallback is checked")
		return
	}
	rev, _, _ = strings.Cut(rev, "\n")
	if !strings.HasPrefix(lines[1], "commit "+strings.TrimSpace(rev)+" (") {
		t.Errorf("commit line %q, want commit %s and its time", lines[1], rev)
	}
}

func TestCLIHealth(t *testing.T) {
	_, server := startNode(t)
	if out := must(t, "health", "--server", server); out != "ok\n" {
		t.Errorf("health: %q", out)
	}
	if out := must(t, "health", "--ready", "--server", server); out != "ready\n" {
		t.Errorf("health --ready: %q", out)
	}
	t.Setenv("SHARDQ_SERVER", server)
	must(t, "health")
	t.Setenv("SHARDQ_SERVER", "")
	fails(t, 1, "connection refused", "health", "--server", "http://127.0.0.1:1")
	fails(t, 1, "404", "health", "--server", server+"/nope")

	// Without --server nor SHARDQ_SERVER, the node's own SHARDQ_HTTP.
	for addr, want := range map[string]string{
		"":              defaultServer,
		":8991":         "http://127.0.0.1:8991",
		"0.0.0.0:8992":  "http://127.0.0.1:8992",
		"[::]:8993":     "http://127.0.0.1:8993",
		"10.1.2.3:8994": "http://10.1.2.3:8994",
		"[::1]:8995":    "http://[::1]:8995",
	} {
		if got := healthServer(func(k string) string { return map[string]string{"SHARDQ_HTTP": addr}[k] }); got != want {
			t.Errorf("SHARDQ_HTTP=%q: health asks %s, want %s", addr, got, want)
		}
	}
}

func TestMain(m *testing.M) {
	// The tests run commands as a user would; the user's environment must
	// not steer them.
	for _, k := range []string{"SHARDQ_SERVER", "SHARDQ_TOKEN", "SHARDQ_HTTP"} {
		os.Unsetenv(k)
	}
	os.Exit(m.Run())
}

// TestCLIVersionFlag: shardq --version is shardq version.
func TestCLIVersionFlag(t *testing.T) {
	_, want, _ := shardq("version")
	for _, flag := range []string{"--version", "-v"} {
		if code, out, errs := shardq(flag); code != 0 || out != want {
			t.Errorf("shardq %s: exit %d, %q (stderr %q); want %q", flag, code, out, errs, want)
		}
	}
}
