package cluster

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	rpb "go.etcd.io/raft/v3/raftpb"

	"github.com/shardq/shardq/queue"
)

// Metrics are the cluster's series, shardq_cluster_*.
type Metrics struct {
	owned    *prometheus.GaugeVec
	epoch    *prometheus.GaugeVec
	forwards *prometheus.CounterVec
	latency  prometheus.Histogram
	moves    *prometheus.CounterVec
	claims   prometheus.Counter
	routed   prometheus.Counter
	remote   prometheus.Counter
	// leasesLost counts the cluster leases this node lost in etcd.
	leasesLost prometheus.Counter
	// Replication.
	elections prometheus.Counter
	// recovering counts the raft groups of this node that take no part in
	// elections until they have their entries back.
	recovering prometheus.Gauge
	// quiesced counts the raft groups of this node that stopped ticking,
	// idle.
	quiesced  prometheus.Gauge
	lag       *prometheus.GaugeVec
	proposals prometheus.Histogram
	copies    prometheus.Counter
	logWrite  prometheus.Histogram
	// raftIn counts the raft messages this node received, by type
	// (raftpb.MessageType); raftInByType holds its children.
	raftIn       *prometheus.CounterVec
	raftInByType [rpb.MsgForgetLeader + 1]prometheus.Counter
}

// NewMetrics returns the cluster's metrics, registered on reg when it is
// not nil; node labels every series.
func NewMetrics(reg prometheus.Registerer, node string) *Metrics {
	l := prometheus.Labels{"node": node}
	m := &Metrics{
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_cluster_partition_owned",
			Help: "1 for each partition this node serves.", ConstLabels: l}, []string{"queue", "partition"}),
		epoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_cluster_partition_epoch",
			Help: "The epoch under which this node serves each partition.", ConstLabels: l}, []string{"queue", "partition"}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardq_cluster_forwards_total",
			Help: "Publishes forwarded to the partition's owner, by result.", ConstLabels: l}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardq_cluster_forward_seconds",
			Help: "Time from forwarding a publish to the owner's answer.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardq_cluster_moves_total",
			Help: "Partitions this node handed over to another, by result.", ConstLabels: l}, []string{"result"}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_claims_total",
			Help: "Ownership records this node wrote (each raises a partition's epoch).", ConstLabels: l}),
		routed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_routed_total",
			Help: "Plain MQTT publishes sent to other nodes' subscribers.", ConstLabels: l}),
		remote: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_remote_deliveries_total",
			Help: "Queue deliveries sent to consumers connected to other nodes.", ConstLabels: l}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_leases_lost_total",
			Help: "Times this node lost its cluster lease in etcd (it serves no partition until it joined again).", ConstLabels: l}),
		recovering: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardq_cluster_raft_recovering_groups",
			Help: "Raft groups of this node whose log lost entries (salvaged after damage): they take no part in elections until a leader has given them back every committed entry.", ConstLabels: l}),
		quiesced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardq_cluster_raft_quiesced_groups",
			Help: "Raft groups of this node that are idle and stopped ticking and heartbeating; the first write or message wakes them.", ConstLabels: l}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_leader_changes_total",
			Help: "Times this node became or stopped being the raft leader of a partition.", ConstLabels: l}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_cluster_replication_lag_entries",
			Help: "Raft entries each replica lacks of the partitions this node leads.", ConstLabels: l}, []string{"queue", "partition", "replica"}),
		proposals: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardq_cluster_proposal_seconds",
			Help: "Time from proposing a partition's write to raft to storing it committed.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		logWrite: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardq_cluster_raft_log_write_seconds",
			Help: "Time to write and sync one batch of raft entries of every group of this node.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		copies: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardq_cluster_replica_copies_total",
			Help: "Copies of a partition this leader sent to a replica its compacted raft log had left behind.", ConstLabels: l}),
		raftIn: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardq_cluster_raft_messages_received_total",
			Help: "Raft messages this node received from other nodes, by type (MsgApp: entries or a commit index from a leader, MsgAppResp: a replica's answer, MsgHeartbeat, MsgVote and so on).", ConstLabels: l}, []string{"type"}),
	}
	for t := range m.raftInByType {
		m.raftInByType[t] = m.raftIn.WithLabelValues(rpb.MessageType(t).String())
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.owned, m.epoch, m.forwards, m.latency, m.moves, m.claims, m.routed, m.remote, m.leasesLost, m.elections, m.recovering, m.quiesced, m.lag, m.proposals, m.copies, m.logWrite, m.raftIn} {
			reg.MustRegister(c)
		}
	}
	return m
}

// Metrics returns the node's metrics.
func (n *Node) Metrics() *Metrics { return n.opts.Metrics }

func (m *Metrics) setOwned(id queue.PartitionID, epoch uint64, owned bool) {
	p := strconv.Itoa(id.Partition)
	if owned {
		m.owned.WithLabelValues(id.Queue, p).Set(1)
		m.epoch.WithLabelValues(id.Queue, p).Set(float64(epoch))
		return
	}
	m.owned.DeleteLabelValues(id.Queue, p)
	m.epoch.DeleteLabelValues(id.Queue, p)
}

// raftReceived counts a raft message received.
func (m *Metrics) raftReceived(t rpb.MessageType) {
	if int(t) < len(m.raftInByType) {
		m.raftInByType[t].Inc()
	}
}
