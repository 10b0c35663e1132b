package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The bash completion completes commands, subcommands and a command's
// flags (read from its --help).
func TestCompletionBash(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash here")
	}
	var out, errb bytes.Buffer
	if code := run([]string{"completion", "bash"}, &out, &errb); code != 0 {
		t.Fatalf("shardq completion bash: exit %d: %s", code, errb.String())
	}
	script := filepath.Join(t.TempDir(), "shardq.bash")
	if err := os.WriteFile(script, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// Flags come from "shardq CMD SUB --help": the actual binary's output.
	var help bytes.Buffer
	run([]string{"queue", "peek", "--help"}, &help, &help)
	helpFile := filepath.Join(t.TempDir(), "help.txt")
	if err := os.WriteFile(helpFile, help.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for line, want := range map[string]string{
		"shardq qu":             "queues queue",
		"shardq queue p":        "peek purge",
		"shardq dlq ":           "peek purge replay",
		"shardq cluster d":      "dev drain",
		"shardq queue peek --l": "--limit",
		"shardq queue peek --d": "--dlq",
	} {
		words := strings.Split(line, " ")
		cmd := exec.Command("bash", "-c", `shardq() { cat "$HELP"; }; source "$SCRIPT"; COMP_WORDS=(`+line+`); COMP_CWORD=`+
			string(rune('0'+len(words)-1))+`; _shardq; echo "${COMPREPLY[*]}"`)
		cmd.Env = append(os.Environ(), "SCRIPT="+script, "HELP="+helpFile)
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v: %s", line, err, got)
		}
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("completing %q: %q, want %q", line, strings.TrimSpace(string(got)), want)
		}
	}
	if code := run([]string{"completion", "fish"}, &out, &errb); code != 2 {
		t.Errorf("completion fish: exit %d, want 2 (usage)", code)
	}
}
