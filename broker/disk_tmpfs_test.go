//go:build linux

package broker_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// startBrokerNotReady starts a node like startBroker but waits only for its
// listeners, not for readiness (a node on a full disk is never ready).
func startBrokerNotReady(t *testing.T, dir string, edit func(*config.Config)) *testBroker {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.MQTT = "127.0.0.1:0"
	cfg.WS = ""
	cfg.HTTP = "127.0.0.1:0"
	edit(cfg)
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	tb := &testBroker{Broker: b, dir: dir, errc: make(chan error, 1)}
	go func() { tb.errc <- b.Serve() }()
	waitFor(t, func() bool { return b.MQTTAddr() != "" })
	t.Cleanup(func() { tb.stop(t) })
	return tb
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, or skips the
// test when it cannot (not root, no mount, a container without the right).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs (the disk-full case on a real file system)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

func freeOf(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// On a real 64 MiB file system filled by a file: publishes are refused
// with 0x97 and the node is not ready, consumers drain, removing the file
// brings publishes and readiness back, and across a restart every
// acknowledged message is consumed: none lost, none refused stored.
func TestDiskFullOnASmallTmpfs(t *testing.T) {
	root := mountTmpfs(t, "64m")
	data := filepath.Join(root, "data")
	const watermark = 16 << 20
	edit := func(c *config.Config) { c.Storage.MinFreeBytes = watermark }
	b := startBroker(t, data, edit)

	acked := map[string]bool{}
	prod := dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	publish := func(n int, prefix string) (ok, refused int) {
		for i := range n {
			p := fmt.Sprintf("%s-%04d", prefix, i)
			switch code := prod.publish("$queue/tmpfs", []byte(p)); code {
			case 0:
				acked[p] = true
				ok++
			case 0x97:
				refused++
			default:
				t.Fatalf("publish %s: 0x%02x", p, code)
			}
		}
		return ok, refused
	}
	if ok, _ := publish(200, "a"); ok != 200 {
		t.Fatalf("with room: %d of 200 taken", ok)
	}

	// Fill the file system to 8 MiB short of full: below the watermark.
	fill := filepath.Join(root, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for freeOf(t, root) > 8<<20 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatalf("filling: %v", err)
		}
	}
	_ = f.Close()
	waitFor(t, func() bool { return readyz(b.HTTPAddr()) == http.StatusServiceUnavailable })
	if ok, refused := publish(50, "full"); ok != 0 || refused != 50 {
		t.Fatalf("below the watermark: %d taken, %d refused; want 0 and 50", ok, refused)
	}

	// A consumer drains while the disk is full, settling as it goes.
	cons := dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	cons.subscribe(1, nil, "$queue/tmpfs")
	got := map[string]bool{}
	for len(got) < 100 {
		d := cons.next(10 * time.Second)
		got[string(d.Payload)] = true
		cons.puback(d, 0)
	}

	// A restart on the full file system: the node starts, not ready, and
	// refuses publishes from the first one; consumers still drain.
	cons.close()
	prod.close()
	b.stop(t)
	b = startBrokerNotReady(t, data, edit)
	if s, body := readyzBody(b.HTTPAddr()); s != http.StatusServiceUnavailable || !strings.Contains(body, "min_free_bytes") {
		t.Fatalf("/readyz after a restart on a full disk: %d %q", s, body)
	}
	prod = dialRaw(t, b.MQTTAddr(), "producer", connectOpts{})
	if ok, refused := publish(10, "full-again"); ok != 0 || refused != 10 {
		t.Fatalf("restarted below the watermark: %d taken, %d refused; want 0 and 10", ok, refused)
	}
	cons = dialRaw(t, b.MQTTAddr(), "consumer", connectOpts{})
	cons.subscribe(1, nil, "$queue/tmpfs")
	for len(got) < 150 {
		d := cons.next(10 * time.Second)
		if !acked[string(d.Payload)] {
			t.Fatalf("delivered %q, which was never acknowledged", d.Payload)
		}
		got[string(d.Payload)] = true
		cons.puback(d, 0)
	}

	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return readyz(b.HTTPAddr()) == http.StatusOK })
	if ok, _ := publish(100, "b"); ok != 100 {
		t.Fatalf("after space returned: %d of 100 taken", ok)
	}
	cons.close()
	prod.close()
	b.stop(t)

	// Every acknowledged message is there after a restart, nothing refused is.
	b2 := startBroker(t, data, edit)
	cons2 := dialRaw(t, b2.MQTTAddr(), "consumer", connectOpts{})
	cons2.subscribe(1, nil, "$queue/tmpfs")
	for len(got) < len(acked) {
		d := cons2.next(10 * time.Second)
		p := string(d.Payload)
		if !acked[p] {
			t.Fatalf("delivered %q, which was never acknowledged", p)
		}
		got[p] = true
		cons2.puback(d, 0)
	}
	for p := range acked {
		if !got[p] {
			t.Fatalf("acknowledged message %q lost", p)
		}
	}
	cons2.none(300 * time.Millisecond)
}
