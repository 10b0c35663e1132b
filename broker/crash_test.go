package broker_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// TestQueueKill9KeepsEveryAcknowledgedMessage publishes from several
// pipelining producers, kills the broker with SIGKILL mid-stream, restarts
// it on the same data and consumes: every message that got a success
// PUBACK must be there.
func TestQueueKill9KeepsEveryAcknowledgedMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	for round := 0; round < 2; round++ {
		p := startProcess(t, dir)
		var acked sync.Map
		var count atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				c := dialRaw(t, p.mqtt, fmt.Sprintf("r%d-p%d", round, w), connectOpts{})
				window := make(chan struct{}, 64)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case window <- struct{}{}:
					}
					payload := fmt.Sprintf("r%d-p%d-%06d", round, w, i)
					ch := c.publishAsync("$queue/crash", []byte(payload), "key", fmt.Sprintf("k%d", i%16))
					go func() {
						defer func() { <-window }()
						select {
						case a := <-ch:
							if a.ReasonCode == 0 {
								acked.Store(payload, true)
								count.Add(1)
							}
						case <-c.closed:
						}
					}()
				}
			}(w)
		}
		deadline := time.Now().Add(30 * time.Second)
		for count.Load() < 2000 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: only %d publishes acknowledged in 30s", round, count.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.kill()
		close(stop)
		wg.Wait()

		p2 := startProcess(t, dir)
		cons := dialRaw(t, p2.mqtt, fmt.Sprintf("verify-%d", round), connectOpts{})
		cons.subscribe(1, nil, fmt.Sprintf("$share/verify%d/$queue/crash", round))
		got := map[string]bool{}
		missing := func() int {
			n := 0
			acked.Range(func(k, _ any) bool {
				if !got[k.(string)] {
					n++
				}
				return true
			})
			return n
		}
		deadline = time.Now().Add(60 * time.Second)
		for missing() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d acknowledged messages missing after kill -9 (of %d)", round, missing(), count.Load())
			}
			select {
			case m := <-cons.msgs:
				got[string(m.Payload)] = true
				cons.puback(m, 0)
			case <-time.After(5 * time.Second):
			}
		}
		t.Logf("round %d: %d acknowledged before SIGKILL, all present after restart (%d delivered)", round, count.Load(), len(got))
		cons.close()
		p2.term(t)
	}
}

// TestQueueMosquittoClients drives a queue with Debian's mosquitto_pub and
// mosquitto_sub, the clients a user reaches for first.
func TestQueueMosquittoClients(t *testing.T) {
	for _, tool := range []string{"mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (apt-get install mosquitto-clients)", tool)
		}
	}
	b := startBroker(t, t.TempDir(), nil)
	host, port, _ := strings.Cut(b.MQTTAddr(), ":")
	for i := 0; i < 5; i++ {
		out, err := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv5", "-q", "1",
			"-t", "$queue/sensors/dev-1", "-m", "reading-"+strconv.Itoa(i), "-D", "publish", "user-property", "key", "dev-1").CombinedOutput()
		if err != nil {
			t.Fatalf("mosquitto_pub: %v\n%s", err, out)
		}
	}
	// v3.1.1 too.
	if out, err := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv311", "-q", "1",
		"-t", "$queue/sensors/dev-1", "-m", "reading-5").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub v3.1.1: %v\n%s", err, out)
	}
	out, err := exec.Command("mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv5", "-q", "1", "-c", "-i", "sub-1",
		"-t", "$share/g/$queue/sensors/#", "-C", "6", "-W", "10", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 6 {
		t.Fatalf("mosquitto_sub printed %d lines, want 6:\n%s", len(lines), out)
	}
	for i, l := range lines {
		if want := "$queue/sensors/dev-1 reading-" + strconv.Itoa(i); l != want {
			t.Errorf("line %d = %q, want %q (per-key order)", i, l, want)
		}
	}
	// mosquitto_sub acknowledged every delivery: a new consumer of the same
	// group gets nothing.
	cons := dialRaw(t, b.MQTTAddr(), "after", connectOpts{})
	cons.subscribe(1, nil, "$share/g/$queue/sensors")
	cons.none(300 * time.Millisecond)
	_ = packets.PUBLISH
}

// TestQueueAsyncDurabilityKill9 runs a queue with durability async: PUBACKs
// come before the fsync, which happens every sync_interval. Every message
// acknowledged more than one interval before a SIGKILL must survive it.
func TestQueueAsyncDurabilityKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	cfg := dir + "/shardq.yaml"
	if err := os.WriteFile(cfg, []byte("queues:\n  defaults:\n    durability: async\nstorage:\n  sync_interval: 50ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, dir+"/data", "--config", cfg)
	c := dialRaw(t, p.mqtt, "async-producer", connectOpts{})
	type ack struct {
		payload string
		at      time.Time
	}
	var acked []ack
	var pending []chan *packets.Puback
	var payloads []string
	for i := 0; i < 3000; i++ {
		payload := fmt.Sprintf("a-%05d", i)
		pending = append(pending, c.publishAsync("$queue/fast", []byte(payload), "key", strconv.Itoa(i%8)))
		payloads = append(payloads, payload)
		if len(pending) == 64 || i == 2999 {
			for j, ch := range pending {
				if a := c.waitAck(ch); a.ReasonCode == 0 {
					acked = append(acked, ack{payloads[j], time.Now()})
				}
			}
			pending, payloads = pending[:0], payloads[:0]
		}
	}
	time.Sleep(120 * time.Millisecond) // more than two sync intervals
	killed := time.Now()
	p.kill()

	p2 := startProcess(t, dir+"/data", "--config", cfg)
	cons := dialRaw(t, p2.mqtt, "async-verify", connectOpts{})
	cons.subscribe(1, map[string]string{"prefetch": "1000"}, "$queue/fast")
	got := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(acked) && time.Now().Before(deadline) {
		select {
		case m := <-cons.msgs:
			got[string(m.Payload)] = true
			cons.puback(m, 0)
		case <-time.After(2 * time.Second):
		}
	}
	for _, a := range acked {
		if killed.Sub(a.at) > 50*time.Millisecond && !got[a.payload] {
			t.Fatalf("%s, acknowledged %s before the kill, is lost", a.payload, killed.Sub(a.at))
		}
	}
	t.Logf("%d acknowledged with durability async, %d back after SIGKILL", len(acked), len(got))
}
