package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/queue"
)

// adminConfig declares jobs (2 partitions, replication factor 3 as every
// queue in a cluster, a delivery not acked within a second dead-lettered)
// and solo (6 partitions, one replica each).
const adminConfig = `queues:
  declared:
    jobs:
      partitions: 2
      ack_timeout: 1s
      max_deliveries: 1
    solo:
      partitions: 6
      replication_factor: 1
`

// queueFigures is the part of GET /api/v1/queues/{q} the test reads.
type queueFigures struct {
	Depth      uint64             `json:"depth"`
	Partitions []partitionFigures `json:"partitions"`
	Groups     []groupFigures     `json:"groups"`
	DLQ        *struct {
		Depth uint64 `json:"depth"`
	} `json:"dlq"`
	NodesMissing []string `json:"nodes_missing"`
}

type groupFigures struct {
	Name      string `json:"name"`
	Lag       uint64 `json:"lag"`
	Consumers int    `json:"consumers"`
}

type partitionFigures struct {
	Partition int `json:"partition"`
	Shard     int `json:"shard"`
}

func (f queueFigures) lag(group string) (uint64, bool) {
	for _, g := range f.Groups {
		if g.Name == group {
			return g.Lag, true
		}
	}
	return 0, false
}

// call sends an admin call to a node and returns its status and body.
func (c *testCluster) call(node, method, path, body string) (int, []byte) {
	c.t.Helper()
	req, _ := http.NewRequest(method, "http://"+c.nodes[node].http+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// waitFigures waits until every node given sees the queue's figures,
// gathered from the whole cluster, as ok says.
func (c *testCluster) waitFigures(queue string, within time.Duration, ok func(queueFigures) bool, nodes ...string) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for _, n := range nodes {
		for {
			status, body := c.call(n, http.MethodGet, "/api/v1/queues/"+queue, "")
			var f queueFigures
			if status == http.StatusOK && json.Unmarshal(body, &f) == nil && len(f.NodesMissing) == 0 && ok(f) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("node %s's view of %s within %s: HTTP %d %s", n, queue, within, status, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestAdminChangesAcrossNodes: every admin change is sent to a node that
// leads none of the queue's partitions and acts on all of them, through
// their replicated logs: 10 dead letters replayed show as 10 more lag of
// their group in every node's view; a purge leaves depth 0 everywhere, and
// still after the leader of a partition is killed; a group with a
// consumer connected is not deleted (409), then is, everywhere; the
// replication factor changes at run time (3 to 2; 3 to 1 refused). A purge
// of a queue of one replica per partition whose owner is down answers 503
// naming those partitions and saying which were purged.
func TestAdminChangesAcrossNodes(t *testing.T) {
	c := newCluster(t, "--config", configFile(t, adminConfig))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	// Every partition with its three replicas in sync: one may be lost.
	c.waitPlaced("jobs", 2, []string{"a", "b", "c"}, nil, 60*time.Second)
	owners := c.owners("jobs")
	leaders := map[string]bool{}
	for _, o := range owners {
		leaders[o.Owner] = true
	}
	x := "" // leads no partition of jobs
	for _, id := range []string{"a", "b", "c"} {
		if !leaders[id] {
			x = id
		}
	}
	live := []string{"a", "b", "c"}

	// 10 dead letters of group g: delivered, never acked.
	cons := dialManual(t, c.nodes[x].mqtt, "worker", 32)
	cons.subscribe("$share/g/$queue/jobs")
	prod := dial(t, c.nodes[x].mqtt, "producer", 32)
	for i := range 10 {
		if code, err := prod.publish("$queue/jobs", fmt.Sprintf("k%d", i), fmt.Appendf(nil, "job %d", i)); err != nil || code != 0 {
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
	}
	waitCount(t, 10, 15*time.Second, cons)
	c.waitFigures("jobs", 20*time.Second, func(f queueFigures) bool { return f.DLQ != nil && f.DLQ.Depth == 10 }, live...)
	// Each partition names the storage shard it is kept in.
	c.waitFigures("jobs", time.Second, func(f queueFigures) bool {
		return len(f.Partitions) == 2 && !slices.ContainsFunc(f.Partitions, func(p partitionFigures) bool { return p.Shard < 0 })
	}, live...)

	// Group delete while its consumer is connected: refused, nothing deleted.
	if status, body := c.call(x, http.MethodDelete, "/api/v1/queues/jobs/groups/g", ""); status != http.StatusConflict {
		t.Fatalf("deleting a group with a consumer connected: HTTP %d %s, want 409", status, body)
	}
	c.waitFigures("jobs", 5*time.Second, func(f queueFigures) bool { _, ok := f.lag("g"); return ok }, live...)
	_ = cons.c.Disconnect(&paho.Disconnect{})
	// Gone from every node (its streams to the leaders too): what the
	// replay brings back waits for the group's next consumer.
	c.waitFigures("jobs", 10*time.Second, func(f queueFigures) bool {
		return !slices.ContainsFunc(f.Groups, func(g groupFigures) bool { return g.Consumers > 0 })
	}, live...)

	// Replay: the 10 go back to g.
	status, body := c.call(x, http.MethodPost, "/api/v1/queues/jobs/dlq/replay", "")
	var replay struct {
		Replayed   int   `json:"replayed"`
		Partitions []int `json:"partitions"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &replay) != nil || replay.Replayed != 10 || !slices.Equal(replay.Partitions, []int{0, 1}) {
		t.Fatalf("replay through %s: HTTP %d %s; want 10 replayed from partitions 0 and 1", x, status, body)
	}
	c.waitFigures("jobs", 10*time.Second, func(f queueFigures) bool { lag, _ := f.lag("g"); return lag == 10 && f.Depth == 10 }, live...)

	// Purge: depth 0 everywhere.
	status, body = c.call(x, http.MethodPost, "/api/v1/queues/jobs/purge", "")
	var purge struct {
		Purged     uint64 `json:"purged"`
		Partitions []int  `json:"partitions"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &purge) != nil || purge.Purged < 10 || !slices.Equal(purge.Partitions, []int{0, 1}) {
		t.Fatalf("purge through %s: HTTP %d %s; want at least the 10 replayed, from partitions 0 and 1", x, status, body)
	}
	empty := func(f queueFigures) bool { lag, _ := f.lag("g"); return f.Depth == 0 && lag == 0 }
	c.waitFigures("jobs", 10*time.Second, empty, live...)

	// Each solo partition gets a message, then the owner of some of them
	// (not x), which also leads a partition of jobs, is killed.
	for i := range 30 {
		if code, err := prod.publish("$queue/solo", fmt.Sprintf("s%d", i), []byte("solo")); err != nil || code != 0 {
			t.Fatalf("publish to solo: %#x %v", code, err)
		}
	}
	soloOwners := c.waitOwned("solo", 6, 30*time.Second, "a", "b", "c")
	victim := owners[0].Owner
	var lost []int
	for p, o := range soloOwners {
		if o.Owner == victim {
			lost = append(lost, p)
		}
	}
	slices.Sort(lost)
	c.nodes[victim].kill()
	live = slices.DeleteFunc(live, func(id string) bool { return id == victim })

	// The purge holds on the new leader.
	c.waitOwned("jobs", 2, 30*time.Second, live...)
	c.waitFigures("jobs", 10*time.Second, empty, live...)

	// Group delete, everywhere.
	status, body = c.call(x, http.MethodDelete, "/api/v1/queues/jobs/groups/g", "")
	if status != http.StatusOK {
		t.Fatalf("group delete through %s: HTTP %d %s", x, status, body)
	}
	c.waitFigures("jobs", 5*time.Second, func(f queueFigures) bool { _, ok := f.lag("g"); return !ok }, live...)
	if status, body := c.call(x, http.MethodDelete, "/api/v1/queues/jobs/groups/g", ""); status != http.StatusNotFound {
		t.Fatalf("deleting the deleted group: HTTP %d %s, want 404", status, body)
	}

	// Replication settings change at run time: with 2 replicas, the
	// partitions of jobs drop the dead node's replica at once (with 3
	// they would keep it for cluster.replace_after, a minute).
	if status, body := c.call(x, http.MethodPut, "/api/v1/queues/jobs", `{"replication_factor": 1}`); status != http.StatusConflict {
		t.Fatalf("replication factor 3 to 1: HTTP %d %s, want 409", status, body)
	}
	c.admin(x, http.MethodPut, "/api/v1/queues/jobs", `{"replication_factor": 2, "ack_policy": "leader"}`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := c.owners("jobs")
		if len(o) == 2 && sameNodes(o[0].Replicas, live) && sameNodes(o[1].Replicas, live) && len(o[0].Learners)+len(o[1].Learners) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs with 2 replicas still has %v 20s later, want %v each", o, live)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range live {
		status, body := c.call(n, http.MethodGet, "/api/v1/queues/jobs", "")
		var v struct {
			Settings struct {
				ReplicationFactor int    `json:"replication_factor"`
				AckPolicy         string `json:"ack_policy"`
			} `json:"settings"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Settings.ReplicationFactor != 2 || v.Settings.AckPolicy != "leader" {
			t.Errorf("node %s shows jobs: HTTP %d %s; want replication_factor 2, ack_policy leader", n, status, body)
		}
	}

	// A purge of solo with the owner of some of its partitions down.
	if len(lost) == 0 {
		t.Logf("%s owned no partition of solo: the purge with an owner down is not tried", victim)
		return
	}
	status, body = c.call(x, http.MethodPost, "/api/v1/queues/solo/purge", "")
	var refusal struct {
		Error string `json:"error"`
		Purge *struct {
			Partitions []int `json:"partitions"`
		} `json:"purge"`
	}
	if status != http.StatusServiceUnavailable || json.Unmarshal(body, &refusal) != nil || refusal.Purge == nil {
		t.Fatalf("purge of solo with %s down: HTTP %d %s; want 503 saying what was purged", victim, status, body)
	}
	for _, p := range lost {
		if !strings.Contains(refusal.Error, fmt.Sprintf("solo/%d ", p)) {
			t.Errorf("the refusal does not name solo/%d, owned by %s: %s", p, victim, refusal.Error)
		}
	}
	for p := range 6 {
		if slices.Contains(lost, p) == slices.Contains(refusal.Purge.Partitions, p) {
			t.Errorf("purge says partitions %v were purged; %s owned %v", refusal.Purge.Partitions, victim, lost)
			break
		}
	}
}

// seekConfig declares stream: 2 partitions, three replicas each, its
// messages kept for an hour whether acked or not.
const seekConfig = "queues:\n  declared:\n    stream:\n      partitions: 2\n      ordering: none\n      retention: time\n      max_age: 1h\n"

// startStream starts nodes a, b and c with seekConfig, its partitions
// placed, and returns them with the node that leads neither partition of
// stream (two partitions, three nodes: there is one) and the owners.
func startStream(t *testing.T) (*testCluster, string, map[int]ownership) {
	t.Helper()
	c := newCluster(t, "--config", configFile(t, seekConfig))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	c.waitPlaced("stream", 2, []string{"a", "b", "c"}, nil, 60*time.Second)
	owners := c.owners("stream")
	for _, id := range []string{"a", "b", "c"} {
		if owners[0].Owner != id && owners[1].Owner != id {
			return c, id, owners
		}
	}
	t.Fatalf("every node leads a partition of stream: %v", owners)
	return nil, "", nil
}

// TestSeekAcrossNodes (SPEC 12, seek and retention time in a cluster): a
// group moved to earliest through a node that leads none of the queue's
// partitions moves on every partition, through their replicated logs: its
// next consumer gets again everything it had acked (kept: retention time),
// as first deliveries, and still after the leader of a partition is
// killed. Refused while the group has a consumer, on whichever node.
func TestSeekAcrossNodes(t *testing.T) {
	c, x, owners := startStream(t)
	prod := dial(t, c.nodes[x].mqtt, "producer", 32)
	want := map[string]bool{}
	for i := range 10 {
		p := fmt.Sprintf("m%d", i)
		if code, err := prod.publish("$queue/stream", fmt.Sprintf("k%d", i), []byte(p)); err != nil || code != 0 {
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
		want[p] = true
	}
	read := func(id string) *client {
		cl := dial(t, c.nodes[x].mqtt, id, 32)
		cl.subscribe("$share/g/$queue/stream")
		waitCount(t, 10, 15*time.Second, cl)
		got := map[string]bool{}
		for _, p := range cl.received() {
			if p.Duplicate() {
				t.Errorf("%s got %s as a redelivery", id, p.Payload)
			}
			got[string(p.Payload)] = true
		}
		if len(got) != len(want) || len(cl.received()) != 10 {
			t.Fatalf("%s got %d publishes of %d messages, want the 10 once", id, len(cl.received()), len(got))
		}
		return cl
	}
	first := read("first")
	c.waitFigures("stream", 10*time.Second, func(f queueFigures) bool { lag, ok := f.lag("g"); return ok && lag == 0 }, "a", "b", "c")

	seek := "/api/v1/queues/stream/groups/g/seek"
	if status, body := c.call(x, http.MethodPost, seek, `{"to": "earliest"}`); status != http.StatusConflict {
		t.Fatalf("seek with a consumer connected: HTTP %d %s, want 409", status, body)
	}
	_ = first.c.Disconnect(&paho.Disconnect{})
	c.waitFigures("stream", 10*time.Second, func(f queueFigures) bool {
		return !slices.ContainsFunc(f.Groups, func(g groupFigures) bool { return g.Name == "g" && g.Consumers > 0 })
	}, "a", "b", "c")
	status, body := c.call(x, http.MethodPost, seek, `{"to": "earliest"}`)
	var res struct {
		Partitions []struct {
			Partition int    `json:"partition"`
			To        uint64 `json:"to"`
		} `json:"partitions"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &res) != nil || len(res.Partitions) != 2 {
		t.Fatalf("seek through %s: HTTP %d %s; want both partitions moved", x, status, body)
	}
	c.waitFigures("stream", 10*time.Second, func(f queueFigures) bool { lag, _ := f.lag("g"); return lag == 10 }, "a", "b", "c")

	// The move is in the replicated log: a new leader has it.
	victim := owners[0].Owner
	c.nodes[victim].kill()
	live := slices.DeleteFunc([]string{"a", "b", "c"}, func(id string) bool { return id == victim })
	c.waitOwned("stream", 2, 30*time.Second, live...)
	read("second")
}

// TestSubjectFilterAcrossNodes (SPEC 12, subject filters in a cluster): a
// consumer on a node that leads none of the queue's partitions, in a group
// with the filter eu/#, gets exactly the eu subjects from the partitions'
// leaders, on their own topics; the group keeps its filter on every
// leader, which refuses another one for it.
func TestSubjectFilterAcrossNodes(t *testing.T) {
	c, x, owners := startStream(t)
	eu := dial(t, c.nodes[x].mqtt, "eu", 32)
	eu.subscribe("$share/eu/$queue/stream/eu/#")
	prod := dial(t, c.nodes[owners[0].Owner].mqtt, "producer", 32)
	for i := range 12 {
		region := []string{"eu/de", "us/ny", "eu/fr"}[i%3]
		if code, err := prod.publish("$queue/stream/"+region, fmt.Sprintf("k%d", i), []byte(region)); err != nil || code != 0 {
			t.Fatalf("publish %d: %#x %v", i, code, err)
		}
	}
	waitCount(t, 8, 15*time.Second, eu)
	c.waitFigures("stream", 10*time.Second, func(f queueFigures) bool { lag, ok := f.lag("eu"); return ok && lag == 0 }, "a", "b", "c")
	for _, p := range eu.received() {
		if !strings.HasPrefix(string(p.Payload), "eu/") || p.Topic != "$queue/stream/"+string(p.Payload) {
			t.Errorf("eu/# got %s on %s", p.Payload, p.Topic)
		}
	}
	if n := len(eu.received()); n != 8 {
		t.Fatalf("eu/# got %d messages, want the 8 eu ones", n)
	}
	// A consumer with another filter for the group, on a leader: refused.
	leader := c.nodes[owners[1].Owner]
	us := dial(t, leader.mqtt, "us", 32)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sa, err := us.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$share/eu/$queue/stream/us/#", QoS: 1}}})
	if sa == nil || len(sa.Reasons) != 1 || sa.Reasons[0] != 0x8F {
		t.Fatalf("another filter for group eu on a leader: SUBACK %+v (%v), want 0x8F", sa, err)
	}

	// Consumer-side sharding across nodes (SPEC 12): group sh sharded by
	// key into 3, shards 0 and 2 on the node leading neither partition,
	// shard 1 on a leader. Each gets exactly its shards' messages, from
	// both partitions.
	sharded := func(addr, id, shards string) *client {
		cl := dial(t, addr, id, 32)
		props := &paho.SubscribeProperties{User: paho.UserProperties{{Key: "shard-count", Value: "3"}, {Key: "shards", Value: shards}, {Key: "start", Value: "latest"}}}
		sa, err := cl.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$share/sh/$queue/stream", QoS: 1}}, Properties: props})
		if err != nil || len(sa.Reasons) != 1 || sa.Reasons[0] != 1 {
			t.Fatalf("sharded subscription on %s: %+v %v", id, sa, err)
		}
		return cl
	}
	shards := map[string]*client{"02": sharded(c.nodes[x].mqtt, "shard02", "0,2"), "1": sharded(leader.mqtt, "shard1", "1")}
	for i := range 12 {
		key := fmt.Sprintf("k%d", i)
		if code, err := prod.publish("$queue/stream", key, []byte(key)); err != nil || code != 0 {
			t.Fatalf("publish %s: %#x %v", key, code, err)
		}
	}
	waitCount(t, 12, 15*time.Second, shards["02"], shards["1"])
	c.waitFigures("stream", 10*time.Second, func(f queueFigures) bool { lag, ok := f.lag("sh"); return ok && lag == 0 }, "a", "b", "c")
	for name, cl := range shards {
		for _, p := range cl.received() {
			s := queue.MessageShard(&queue.Message{Key: string(p.Payload)}, []string{queue.ShardByKey}, 3)
			if !strings.Contains(name, fmt.Sprint(s)) {
				t.Errorf("the consumer of shards %s got %s, of shard %d", name, p.Payload, s)
			}
		}
	}
	if n := len(shards["02"].received()) + len(shards["1"].received()); n != 12 {
		t.Fatalf("the sharded consumers got %d messages, want 12, each once", n)
	}
}

// tenantsConfig: queues of one replica, tenants alice and bob, alice
// limited to one queue.
const tenantsConfig = `queues:
  defaults:
    partitions: 2
    replication_factor: 1
tenants:
  alice:
    max_queues: 1
auth:
  users_file: %s
`

// TestTenantsAcrossNodes (SPEC 12, tenants in a cluster): placement rules
// by tenant put each tenant's queues on its nodes, whichever node its
// client created them through; a tenant's max_queues counts its queues
// over the cluster, so a second queue made through another node is
// refused with 0x97.
func TestTenantsAcrossNodes(t *testing.T) {
	dir := t.TempDir()
	var users strings.Builder
	for _, u := range []string{"alice", "bob"} {
		h, err := auth.HashPassword(u+"-pw", auth.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users.WriteString(auth.Line(u, h) + "\n")
	}
	usersFile := filepath.Join(dir, "users")
	if err := os.WriteFile(usersFile, []byte(users.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, "--config", configFile(t, fmt.Sprintf(tenantsConfig, usersFile)))
	for _, id := range []string{"a", "b", "c"} {
		c.start(id)
	}
	c.admin("a", http.MethodPut, "/api/v1/cluster/placement", `{"rules":[{"tenants":["alice"],"nodes":["a"]},{"tenants":["bob"],"nodes":["b"]}]}`)
	alice := dialUser(t, c.nodes["c"].mqtt, "alice-1", "alice")
	bob := dialUser(t, c.nodes["c"].mqtt, "bob-1", "bob")
	for _, p := range []struct {
		cl    *client
		queue string
	}{{alice, "alice-q"}, {bob, "bob-q"}} {
		if code, err := p.cl.publish("$queue/"+p.queue, "k", []byte("x")); err != nil || code != 0 {
			t.Fatalf("publish to %s: %#x %v", p.queue, code, err)
		}
	}
	for queue, node := range map[string]string{"alice-q": "a", "bob-q": "b"} {
		deadline := time.Now().Add(time.Minute)
		for {
			owners := c.owners(queue)
			placed := len(owners) == 2
			for _, o := range owners {
				placed = placed && o.Owner == node && (len(o.Replicas) == 0 || slices.Equal(o.Replicas, []string{node}))
			}
			if placed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's partitions are on %+v, not on %s alone", queue, owners, node)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	other := dialUser(t, c.nodes["b"].mqtt, "alice-2", "alice")
	if code, err := other.publish("$queue/alice-more", "k", []byte("x")); err != nil || code != 0x97 {
		t.Fatalf("alice's second queue, through another node: %#x %v, want 0x97", code, err)
	}
}

// dialUser connects a client as user (password user-pw).
func dialUser(t *testing.T, addr, id, user string) *client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl := &client{t: t, wake: make(chan struct{}, 1)}
	cl.c = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
		UsernameFlag: true, Username: user, PasswordFlag: true, Password: []byte(user + "-pw")}); err != nil {
		t.Fatalf("connect %s to %s: %v", id, addr, err)
	}
	t.Cleanup(func() { _ = cl.c.Disconnect(&paho.Disconnect{}) })
	return cl
}
