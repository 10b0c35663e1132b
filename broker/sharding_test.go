package broker_test

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// TestConsumerSharding (SPEC 12, consumer-side sharding): two consumers
// of one group, shard-by=region and shard-count=2, one taking shard 0 and
// the other, mosquitto_sub, shard 1, get each message at the consumer
// FNV-1a-64 of its region says, every message once, in publish order per
// region; the messages of shard 1 wait while it has no consumer and are
// delivered once mosquitto_sub joins for it. A subscription sharding the
// group another way gets SUBACK 0x8F saying the group's.
func TestConsumerSharding(t *testing.T) {
	if _, err := exec.LookPath("mosquitto_sub"); err != nil {
		t.Skip("mosquitto_sub not installed (apt-get install mosquitto-clients)")
	}
	b := startBroker(t, t.TempDir(), nil)
	sharding := func(shards string) map[string]string {
		return map[string]string{"shard-by": "region", "shard-count": "2", "shards": shards}
	}
	zero := dialRaw(t, b.MQTTAddr(), "zero", connectOpts{})
	if codes := zero.subscribe(1, sharding("0"), "$share/g/$queue/orders"); len(codes) != 1 || codes[0] != 1 {
		t.Fatalf("SUBACK of a sharded subscription: %v", codes)
	}
	regions := []string{"eu-1", "eu-2", "us-1", "us-2", "asia-1", "asia-2"}
	shardOf := func(region string) int {
		return queue.MessageShard(&queue.Message{Headers: queue.Headers{User: []queue.Property{{Name: "region", Value: region}}}}, []string{"region"}, 2)
	}
	want := [2][]string{}
	prod := dialRaw(t, b.MQTTAddr(), "p", connectOpts{})
	for i := range 30 {
		region := regions[i%len(regions)]
		payload := fmt.Sprintf("%s-%d", region, i)
		if code := prod.publish("$queue/orders", []byte(payload), "region", region, "key", region); code != 0 {
			t.Fatalf("publish %s: %#x", payload, code)
		}
		want[shardOf(region)] = append(want[shardOf(region)], payload)
	}
	if len(want[0]) == 0 || len(want[1]) == 0 {
		t.Fatalf("the regions fall in one shard: %v", want)
	}
	var got []string
	for range want[0] {
		p := zero.next(5 * time.Second)
		got = append(got, string(p.Payload))
		zero.puback(p, 0)
	}
	zero.none(200 * time.Millisecond) // shard 1 waits for a consumer
	if !samePerRegion(got, want[0]) {
		t.Fatalf("shard 0's consumer got %v, want %v in this order per region", got, want[0])
	}

	other := dialRaw(t, b.MQTTAddr(), "other", connectOpts{})
	sa := other.subscribeAck(1, map[string]string{"shard-count": "3", "shards": "1"}, "$share/g/$queue/orders")
	if len(sa.Reasons) != 1 || sa.Reasons[0] != 0x8F || !strings.Contains(sa.Properties.ReasonString, "sharded by region into 2 shards") {
		t.Fatalf("another sharding for group g: SUBACK %v %q, want 0x8F naming the group's", sa.Reasons, sa.Properties.ReasonString)
	}

	host, port, _ := strings.Cut(b.MQTTAddr(), ":")
	out, err := exec.Command("mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv5", "-q", "1", "-i", "one",
		"-D", "subscribe", "user-property", "shard-by", "region",
		"-D", "subscribe", "user-property", "shard-count", "2",
		"-D", "subscribe", "user-property", "shards", "1",
		"-t", "$share/g/$queue/orders", "-C", fmt.Sprint(len(want[1])), "-W", "10").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub: %v\n%s", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); !samePerRegion(lines, want[1]) {
		t.Fatalf("shard 1's consumer (mosquitto_sub) got %v, want %v in this order per region", lines, want[1])
	}
	waitFor(t, func() bool {
		g, _ := groupOf(show(t, b, "orders"), "g")
		return g.Lag == 0
	})
	zero.none(100 * time.Millisecond)
}

// samePerRegion reports whether got are the payloads of want ("region-i"),
// in want's order within each region (the key): regions are in different
// partitions, which nothing orders.
func samePerRegion(got, want []string) bool {
	per := func(ps []string) map[string][]string {
		m := map[string][]string{}
		for _, p := range ps {
			region := p[:strings.LastIndex(p, "-")]
			m[region] = append(m[region], p)
		}
		return m
	}
	g, w := per(got), per(want)
	if len(got) != len(want) || len(g) != len(w) {
		return false
	}
	for region, ps := range w {
		if !slices.Equal(g[region], ps) {
			return false
		}
	}
	return true
}
