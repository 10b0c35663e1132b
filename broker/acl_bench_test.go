package broker_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/queue"
)

// benchRules returns an ACL of n rules where the rule allowing the
// benchmark's client comes last: the other n-2 apply to every user (so
// each is checked) but name other topics and queues.
func benchRules(n int) []auth.Rule {
	if n == 0 {
		return nil
	}
	var rules []auth.Rule
	for i := 0; len(rules) < n-2; i++ {
		if i%2 == 0 {
			rules = append(rules, auth.Rule{User: "*", Action: auth.Publish, Pattern: fmt.Sprintf("site/%d/+/telemetry/#", i), Permission: auth.Allow})
		} else {
			rules = append(rules, auth.Rule{User: "*", Action: auth.Produce, Pattern: fmt.Sprintf("tenant-%d-*", i), Permission: auth.Allow})
		}
	}
	return append(rules,
		auth.Rule{User: "*", Action: auth.Publish, Pattern: "devices/%u/#", Permission: auth.Allow},
		auth.Rule{User: "*", Action: auth.Produce, Pattern: "bench*", Permission: auth.Allow},
	)
}

// BenchmarkPublishACL measures the publish path with and without an ACL
// of 100 rules (the matching one last): one MQTT 5 producer with 64 QoS 1
// publishes in flight, 64-byte payloads, to a plain topic (no subscriber:
// mochi acknowledges at once, so the ACL's share shows most) and to a
// queue (durability async, ordering none). Every publish is checked to be
// acknowledged with success.
//
//	go test -run '^$' -bench BenchmarkPublishACL -benchtime 20000x ./broker/
func BenchmarkPublishACL(b *testing.B) {
	for _, target := range []string{"plain", "queue"} {
		for _, rules := range []int{0, 100} {
			b.Run(fmt.Sprintf("topic=%s,rules=%d", target, rules), func(b *testing.B) {
				users := writeUsers(b, b.TempDir(), "alice")
				node := startBroker(b, b.TempDir(), func(c *config.Config) {
					c.Auth.UsersFile = users
					c.Auth.ACL = benchRules(rules)
					c.Queues.Defaults.Durability = queue.DurabilityAsync
					c.Queues.Defaults.Ordering = queue.OrderNone
				})
				topic := "devices/alice/temp"
				if target == "queue" {
					topic = "$queue/bench"
				}
				runPublishBench(b, node, topic)
			})
		}
	}
}

func runPublishBench(b *testing.B, node *testBroker, topic string) {
	conn, err := net.Dial("tcp", node.MQTTAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if ca := connectOn(b, conn, "bench", creds{user: "alice", pass: password("alice")}); ca.ReasonCode != 0 {
		b.Fatalf("CONNACK %#x", ca.ReasonCode)
	}
	payload := make([]byte, 64)
	publish := func(id uint16) error {
		_, err := (&packets.Publish{Topic: topic, Payload: payload, QoS: 1, PacketID: id, Properties: &packets.Properties{}}).WriteTo(conn)
		return err
	}
	// PUBACKs come back in the order of the publishes: the reader matches
	// each with the time its publish was sent.
	sent := make(chan time.Time, 64) // the window: 64 publishes in flight
	total := b.N + 1                 // one to warm up
	lat := make([]time.Duration, 0, total)
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < total; i++ {
			p, err := packets.ReadPacket(conn)
			if err != nil {
				errc <- err
				return
			}
			a, ok := p.Content.(*packets.Puback)
			if !ok {
				i--
				continue
			}
			if a.ReasonCode != 0 && a.ReasonCode != 0x10 {
				errc <- fmt.Errorf("PUBACK %#x", a.ReasonCode)
				return
			}
			lat = append(lat, time.Since(<-sent))
		}
		errc <- nil
	}()
	sent <- time.Now()
	if err := publish(1); err != nil {
		b.Fatal(err)
	}
	for len(lat) == 0 && len(errc) == 0 {
		time.Sleep(time.Millisecond) // the warm-up's PUBACK: the queue exists
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		sent <- time.Now()
		if err := publish(uint16(i%60000) + 2); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatalf("after %d of %d PUBACKs: %v", len(lat), total, err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	lat = lat[1:]
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}
