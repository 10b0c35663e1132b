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
	if code := run([]string{"completion", "tcsh"}, &out, &errb); code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2 (usage)", code)
	}
}

// The fish completion completes the same: commands, subcommands and a
// command's flags (read from its --help).
func TestCompletionFish(t *testing.T) {
	if _, err := exec.LookPath("fish"); err != nil {
		t.Skip("no fish here (Debian: fish)")
	}
	var out, errb bytes.Buffer
	if code := run([]string{"completion", "fish"}, &out, &errb); code != 0 {
		t.Fatalf("shardq completion fish: exit %d: %s", code, errb.String())
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "shardq.fish")
	if err := os.WriteFile(script, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var help bytes.Buffer
	run([]string{"queue", "peek", "--help"}, &help, &help)
	helpFile := filepath.Join(dir, "help.txt")
	if err := os.WriteFile(helpFile, help.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for line, want := range map[string]string{
		"shardq qu":             "queue queues",
		"shardq queue p":        "peek purge",
		"shardq group s":        "seek",
		"shardq cluster d":      "dev drain",
		"shardq queue peek --l": "--limit",
		"shardq queue peek --d": "--dlq",
	} {
		cmd := exec.Command("fish", "--no-config", "-c", `function shardq; cat $HELP; end; source $SCRIPT; complete -C "`+line+`"`)
		cmd.Env = append(os.Environ(), "SCRIPT="+script, "HELP="+helpFile)
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v: %s", line, err, got)
		}
		var words []string
		for _, l := range strings.Split(strings.TrimSpace(string(got)), "\n") {
			w, _, _ := strings.Cut(l, "\t") // fish adds a description after a tab
			words = append(words, w)
		}
		if strings.Join(words, " ") != want {
			t.Errorf("completing %q: %q, want %q", line, strings.Join(words, " "), want)
		}
	}
}
