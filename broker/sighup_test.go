package broker_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecuritySIGHUPReloads checks that SIGHUP reloads the users file of a
// running shardq process, keeps its connections, survives an invalid
// file, and never stops the node.
func TestSecuritySIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	users := writeUsers(t, dir, "alice")
	p := startProcess(t, t.TempDir(), "--users-file", users)
	alice := dialAs(t, p.mqtt, "alice", "alice")
	if code := connackCode(t, p.mqtt, "bob", creds{user: "bob", pass: "bob-pw"}); code != 0x86 {
		t.Fatalf("bob before the reload: CONNACK %#x", code)
	}

	writeUsers(t, dir, "alice", "bob")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for connackCode(t, p.mqtt, "bob", creds{user: "bob", pass: "bob-pw"}) != 0 {
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(p.log.Name())
			t.Fatalf("bob refused 10s after SIGHUP:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rc := alice.publish("$queue/hup", []byte("x")); rc != 0 {
		t.Fatalf("alice's connection after SIGHUP: PUBACK %#x", rc)
	}

	// An invalid users file: logged, nothing changes, the node serves on.
	if err := os.WriteFile(users, []byte("bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		out, _ := os.ReadFile(p.log.Name())
		if strings.Contains(string(out), "auth.users_file") && strings.Contains(string(out), "nothing changed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload error logged 10s after SIGHUP:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := connackCode(t, p.mqtt, "bob-2", creds{user: "bob", pass: "bob-pw"}); code != 0 {
		t.Errorf("bob after a failed reload: CONNACK %#x, want 0", code)
	}
	if rc := alice.publish("$queue/hup", []byte("y")); rc != 0 {
		t.Errorf("alice after a failed reload: PUBACK %#x", rc)
	}
	alice.close()
	p.term(t)
}
