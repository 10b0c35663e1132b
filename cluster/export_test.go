package cluster

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardq/shardq/cluster/devetcd"
	"github.com/shardq/shardq/queue"
)

// StartEtcd starts an embedded etcd for a test and a client of it, both
// stopped when the test ends; it returns the endpoint and the client.
func StartEtcd(t testing.TB) (string, *clientv3.Client) {
	t.Helper()
	e, err := devetcd.Start(devetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return e.Endpoint(), cli
}

// PreferredReplica returns the node, of those live, that the partition's
// leadership goes to when all of them are its replicas.
func PreferredReplica(live []string, queueName string, partition int) string {
	v := newView()
	for _, node := range live {
		v.nodes[node] = NodeInfo{ID: node}
	}
	return v.top(queue.PartitionID{Queue: queueName, Partition: partition}, nil, 1)[0]
}

// WantedReplicas returns the k nodes, of those live and not drained, that
// placement wants as the partition's replicas, the preferred first.
func WantedReplicas(live []string, drained []string, queueName string, partition int, k int) []string {
	v := newView()
	for _, node := range live {
		v.nodes[node] = NodeInfo{ID: node}
	}
	for _, node := range drained {
		v.draining[node] = true
	}
	return v.top(queue.PartitionID{Queue: queueName, Partition: partition}, nil, k)
}
