package main

import (
	"strings"
	"testing"
)

// TestPubSub: shardq pub prints the broker's answer to each publish, and
// shardq sub prints each delivery and settles it as asked: a nack brings
// it back with the next delivery count and DUP, a reject sends it to the
// dead-letter queue. Bad usage and a broker that is not there are said.
func TestPubSub(t *testing.T) {
	b, _ := startNode(t)
	mqtt := b.MQTTAddr()
	out := must(t, "pub", "$queue/tasks", "--message", "hello", "--key", "k1", "--count", "2", "--broker", mqtt)
	if !strings.Contains(out, `"hello 1" stored (0x00)`) || !strings.Contains(out, `"hello 2" stored (0x00)`) {
		t.Fatalf("pub:\n%s", out)
	}
	sub := func(settle string) string {
		return must(t, "sub", "$share/w/$queue/tasks", "--count", "1", "--settle", settle, "--broker", mqtt)
	}
	if out := sub("nack"); !strings.Contains(out, `key=k1 delivery-count=1 "hello 1"`) || !strings.Contains(out, "  nacked") {
		t.Fatalf("sub --settle nack:\n%s", out)
	}
	// One key: hello 1 again, before hello 2, counted and marked.
	if out := sub("reject"); !strings.Contains(out, `key=k1 delivery-count=2 dup "hello 1"`) || !strings.Contains(out, "  rejected") {
		t.Fatalf("sub --settle reject:\n%s", out)
	}
	// hello 2 may have been sent to the rejecting sub before it left
	// (ending a delivery): its count is not checked.
	if out := sub("ack"); !strings.Contains(out, `"hello 2"`) {
		t.Fatalf("sub --settle ack:\n%s", out)
	}
	if out := must(t, "sub", "$queue/tasks/$dlq", "--count", "1", "--broker", mqtt); !strings.Contains(out, `"hello 1"`) {
		t.Fatalf("the rejected message is not in the dead-letter queue:\n%s", out)
	}
	code, out, _ := shardq("pub", "$queue/bad name", "--message", "x", "--broker", mqtt)
	if code != 1 || !strings.Contains(out, `"x" refused: 0x`) {
		t.Fatalf("pub to a bad queue name: exit %d\n%s", code, out)
	}
	fails(t, 2, "want one TOPIC", "pub", "--broker", mqtt)
	fails(t, 2, "want ack, nack, reject, release or none", "sub", "$queue/tasks", "--settle", "maybe", "--broker", mqtt)
	fails(t, 1, "is the broker's MQTT listener there?", "pub", "$queue/tasks", "--broker", "127.0.0.1:1")
	fails(t, 1, "nothing for 200ms", "sub", "$queue/tasks", "--wait", "200ms", "--broker", mqtt)
}
