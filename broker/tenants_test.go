package broker_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/shardq/shardq/config"
)

// TestTenants (SPEC 12, tenants): alice, limited to 100 publishes a
// second, pipelines 600 and gets 0x97 past her rate while bob, at the
// same time, gets 0x00 for each of his 600; alice's queues and bytes are
// bounded (0x97 past them, her queue not created); her second connection
// is refused; the metrics say so per tenant.
func TestTenants(t *testing.T) {
	dir := t.TempDir()
	users := writeUsers(t, dir, "alice", "bob", "carol")
	b := startBroker(t, dir, func(c *config.Config) {
		c.Auth.UsersFile = users
		c.Tenants = map[string]config.Tenant{
			config.DefaultTenant: {MaxQueues: 10},
			"alice":              {PublishRate: 100, MaxQueues: 2, MaxBytes: 64 << 10, MaxConnections: 1},
			"carol":              {PublishRate: 50, Throttle: true},
		}
		c.Admin.Metrics = true
	})
	alice := dialRaw(t, b.MQTTAddr(), "alice-1", connectOpts{user: "alice"})
	bob := dialRaw(t, b.MQTTAddr(), "bob-1", connectOpts{user: "bob"})

	const n = 600
	codes := map[string]map[byte]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, c := range map[string]*rawClient{"alice": alice, "bob": bob} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acks := make([]chan *packets.Puback, 0, n)
			for i := range n {
				acks = append(acks, c.publishAsync("$queue/"+name+"-jobs", []byte(fmt.Sprint(i))))
			}
			got := map[byte]int{}
			for _, a := range acks {
				got[c.waitAck(a).ReasonCode]++
			}
			mu.Lock()
			codes[name] = got
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes["bob"][0] != n {
		t.Fatalf("bob's publishes: %v, want %d with 0x00", codes["bob"], n)
	}
	// One second of burst, then 100/s for as long as the 600 took.
	if ok, refused := codes["alice"][0], codes["alice"][0x97]; ok+refused != n || refused == 0 || ok < 100 || ok > 400 {
		t.Fatalf("alice's publishes: %v, want about 100 a second with 0x00 and the rest 0x97", codes["alice"])
	}

	// Her second queue is made; a third is not.
	time.Sleep(time.Second) // a second of tokens back
	if code := alice.publish("$queue/alice-second", []byte("x")); code != 0 {
		t.Fatalf("alice's second queue: %#x", code)
	}
	if code := alice.publish("$queue/alice-third", []byte("x")); code != 0x97 {
		t.Fatalf("alice's third queue: %#x, want 0x97", code)
	}
	if codes := alice.subscribe(1, nil, "$share/g/$queue/alice-fourth"); codes[0] != 0x97 && codes[0] != 0x8F {
		t.Fatalf("alice's subscription creating a queue past her max_queues: SUBACK %#x", codes[0])
	}
	time.Sleep(100 * time.Millisecond)
	if q := get[map[string]any](t, b, "GET", "/api/v1/queues", "", "", 200); strings.Contains(fmt.Sprint(q), "alice-third") || strings.Contains(fmt.Sprint(q), "alice-fourth") {
		t.Fatalf("a refused queue was created: %v", q)
	}

	// Her bytes: publishes of 8 KiB fill her 64 KiB, then 0x97 within a
	// refresh.
	payload := make([]byte, 8<<10)
	refusedAt := -1
	for i := 0; i < 40 && refusedAt < 0; i++ {
		time.Sleep(100 * time.Millisecond) // below her rate
		if code := alice.publish("$queue/alice-second", payload); code == 0x97 {
			refusedAt = i
		} else if code != 0 {
			t.Fatalf("publish %d of 8 KiB: %#x", i, code)
		}
	}
	if refusedAt < 0 {
		t.Fatal("alice stored 320 KiB against a max_bytes of 64 KiB")
	}
	if code := bob.publish("$queue/bob-jobs", payload); code != 0 {
		t.Fatalf("bob, under no byte limit: %#x", code)
	}

	// A second connection of alice's is refused; bob may have several.
	conn, err := net.Dial("tcp", b.MQTTAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if ca := connectOn(t, conn, "alice-2", creds{user: "alice", pass: password("alice")}); ca.ReasonCode != 0x97 {
		t.Fatalf("alice's second connection: CONNACK %#x, want 0x97", ca.ReasonCode)
	}
	dialRaw(t, b.MQTTAddr(), "bob-2", connectOpts{user: "bob"})

	// carol's rate throttles her instead: 150 publishes, every one
	// stored, 100 of them past her second of burst at 50 a second.
	carol := dialRaw(t, b.MQTTAddr(), "carol-1", connectOpts{user: "carol"})
	start := time.Now()
	var acks []chan *packets.Puback
	for i := range 150 {
		acks = append(acks, carol.publishAsync("$queue/carol-jobs", []byte(fmt.Sprint(i))))
	}
	for i, a := range acks {
		if code := carol.waitAck(a).ReasonCode; code != 0 {
			t.Fatalf("carol's publish %d, throttled: %#x", i, code)
		}
	}
	if took := time.Since(start); took < 1900*time.Millisecond {
		t.Fatalf("carol's 150 publishes took %s; at 50 a second past 50 of burst they take 2s", took)
	}

	scrapeUntil(t, b, []expectation{
		{"shardq_tenant_refusals_total", map[string]string{"tenant": "alice", "limit": "publish_rate"}, float64(codes["alice"][0x97])},
		{"shardq_tenant_refusals_total", map[string]string{"tenant": "bob", "limit": "publish_rate"}, 0},
		{"shardq_tenant_refusals_total", map[string]string{"tenant": "alice", "limit": "max_connections"}, 1},
		{"shardq_tenant_refusals_total", map[string]string{"tenant": "alice", "limit": "max_queues"}, 2},
		{"shardq_tenant_connections", map[string]string{"tenant": "alice"}, 1},
		{"shardq_tenant_connections", map[string]string{"tenant": "bob"}, 2},
		{"shardq_tenant_queues", map[string]string{"tenant": "alice"}, 2},
		{"shardq_tenant_queues", map[string]string{"tenant": "bob"}, 1},
		{"shardq_tenant_refusals_total", map[string]string{"tenant": "carol", "limit": "publish_rate"}, 0},
		{"shardq_tenant_publishes_total", map[string]string{"tenant": "carol"}, 150},
	})
}
