package broker_test

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/internal/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m) }

// shardqBinary builds the shardq command once per test run.
func shardqBinary(t *testing.T) string {
	t.Helper()
	return testbin.Shardq(t, false)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a shardq process started by a test.
type proc struct {
	cmd        *exec.Cmd
	mqtt, http string
	log        *os.File
}

// startProcess runs `shardq serve` on free loopback ports and waits until
// /readyz answers.
func startProcess(t *testing.T, dir string, extra ...string) *proc {
	t.Helper()
	p := &proc{mqtt: freeAddr(t), http: freeAddr(t)}
	args := append([]string{"serve", "--data-dir", dir, "--mqtt", p.mqtt, "--http", p.http, "--ws", ""}, extra...)
	p.cmd = exec.Command(shardqBinary(t), args...)
	logf, err := os.CreateTemp(t.TempDir(), "shardq-log")
	if err != nil {
		t.Fatal(err)
	}
	p.log = logf
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), "SHARDQ_WS=")
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logf.Name())
			t.Fatalf("shardq not ready in 20s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to end.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// term sends SIGTERM and waits for a clean exit.
func (p *proc) term(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			out, _ := os.ReadFile(p.log.Name())
			t.Fatalf("shardq exited with %v after SIGTERM:\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("shardq did not exit within 30s of SIGTERM")
	}
}
