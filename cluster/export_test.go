package cluster

import "github.com/shardq/shardq/queue"

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
