package broker

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/system"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

// The metrics of a node, all labelled node (docs/METRICS.md lists them):
// shardq_* for shardq's own, and the standard go_* and process_* of
// client_golang's Go and process collectors, under their usual names so that
// Go and process dashboards find them. Two kinds of shardq_* metrics:
//   - figures read at scrape time by collector: queue, partition and group
//     figures from queue.Queue.Info, the queues' running totals, mochi's
//     server figures and the shards' disk usage. They cost nothing between
//     scrapes.
//   - histograms fed as things happen, off the producer's path: one
//     observation per storage commit (queue.ManagerOptions.OnCommit) and
//     one per acked message (OnAck).

// Histogram buckets, in seconds or writes.
var (
	commitBuckets  = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	batchBuckets   = prometheus.ExponentialBuckets(1, 2, 13) // 1 to 4096 writes
)

// metrics holds the histograms fed as things happen.
type metrics struct {
	commitSeconds []prometheus.Observer // by shard
	commitWrites  []prometheus.Observer
	commitErrors  []prometheus.Counter
	ackLatency    *prometheus.HistogramVec
	ackByQueue    sync.Map // queue name -> prometheus.Observer
}

// instrument registers the node's metrics on b.registry, every one with
// the constant label node, and hooks the histograms into mo. With metrics
// off it does nothing.
func (b *Broker) instrument(mo *queue.ManagerOptions) error {
	if !b.cfg.Admin.Metrics {
		return nil
	}
	node := prometheus.Labels{"node": b.cfg.NodeID}
	commitSeconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "shardq_storage_commit_duration_seconds",
		Help:        "Time to write and fsync one batch to a storage shard.",
		Buckets:     commitBuckets,
		ConstLabels: node,
	}, []string{"shard"})
	commitWrites := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "shardq_storage_commit_writes",
		Help:        "Writes (appends, settlements, deletions) per committed batch.",
		Buckets:     batchBuckets,
		ConstLabels: node,
	}, []string{"shard"})
	commitErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "shardq_storage_commit_errors_total",
		Help:        "Batches a storage shard failed to commit.",
		ConstLabels: node,
	}, []string{"shard"})
	pubacks := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "shardq_publish_ack_seconds",
		Help:        "Time from reading a QoS 1 publish to a queue to writing its PUBACK: the durable acknowledgement as the broker sees it.",
		Buckets:     commitBuckets,
		ConstLabels: node,
	})
	ackLatency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "shardq_e2e_latency_seconds",
		Help:        "Time from a message's enqueue to its ack by a consumer, per queue.",
		Buckets:     latencyBuckets,
		ConstLabels: node,
	}, []string{"queue"})
	m := &metrics{ackLatency: ackLatency}
	for i := range b.cfg.Storage.Shards {
		s := strconv.Itoa(i)
		m.commitSeconds = append(m.commitSeconds, commitSeconds.WithLabelValues(s))
		m.commitWrites = append(m.commitWrites, commitWrites.WithLabelValues(s))
		m.commitErrors = append(m.commitErrors, commitErrors.WithLabelValues(s))
	}
	for _, c := range append([]prometheus.Collector{commitSeconds, commitWrites, commitErrors, pubacks, ackLatencyCollector{m, b}, newCollector(b, node), b.disk.collector(node)}, b.sec.collectors()...) {
		if err := b.registry.Register(c); err != nil {
			return err
		}
	}
	// The runtime's and the process's few metrics keep their standard
	// names and take the label through a wrapper (which rebuilds each one
	// at every scrape: too slow for the thousands of queue series above).
	process := prometheus.WrapRegistererWith(node, b.registry)
	if err := process.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	if err := process.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return err
	}
	b.pubacks = func(d time.Duration) { pubacks.Observe(d.Seconds()) }
	mo.OnCommit = m.observeCommit
	mo.OnAck = m.observeAck
	return nil
}

// metricsHandler serves the registry. Its own errors are counted in
// shardq_promhttp_metric_handler_errors_total.
func (b *Broker) metricsHandler() http.Handler {
	reg := prometheus.WrapRegistererWithPrefix("shardq_",
		prometheus.WrapRegistererWith(prometheus.Labels{"node": b.cfg.NodeID}, b.registry))
	return promhttp.HandlerFor(b.registry, promhttp.HandlerOpts{Registry: reg, ErrorLog: slogPrinter{b.log}})
}

// slogPrinter hands promhttp's error messages to the node's logger.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) {
	p.log.Error("serving /metrics failed", "err", fmt.Sprint(v...))
}

// observeCommit runs on a shard's committer goroutine after each commit.
func (m *metrics) observeCommit(s queue.CommitStats) {
	if s.Shard < 0 || s.Shard >= len(m.commitSeconds) {
		return
	}
	if s.Err != nil {
		m.commitErrors[s.Shard].Inc()
		return
	}
	m.commitSeconds[s.Shard].Observe(s.Duration.Seconds())
	m.commitWrites[s.Shard].Observe(float64(s.Writes))
}

// observeAck runs with the queue's lock held: one map lookup and one
// observation.
func (m *metrics) observeAck(q string, enqueuedAt time.Time) {
	o, ok := m.ackByQueue.Load(q)
	if !ok {
		o, _ = m.ackByQueue.LoadOrStore(q, m.ackLatency.WithLabelValues(q))
	}
	o.(prometheus.Observer).Observe(time.Since(enqueuedAt).Seconds())
}

// ackLatencyCollector collects shardq_e2e_latency_seconds, first dropping
// the series of the queues that are gone (deleted here or in the
// cluster), which would otherwise stay in every scrape.
type ackLatencyCollector struct {
	m *metrics
	b *Broker
}

func (c ackLatencyCollector) Describe(ch chan<- *prometheus.Desc) { c.m.ackLatency.Describe(ch) }

func (c ackLatencyCollector) Collect(ch chan<- prometheus.Metric) {
	if mgr := c.b.manager; mgr != nil {
		c.m.ackByQueue.Range(func(k, _ any) bool {
			if q := k.(string); mgr.Queue(q) == nil {
				c.m.ackByQueue.Delete(q)
				c.m.ackLatency.DeleteLabelValues(q)
			}
			return true
		})
	}
	c.m.ackLatency.Collect(ch)
}

type mqttInfo = system.Info

// Queue totals, by queue (dead-letter queues as {queue}/$dlq).
var queueCounters = []struct {
	name, help string
	get        func(queue.Counts) uint64
}{
	{"shardq_messages_enqueued_total", "Messages stored by the queue.", func(c queue.Counts) uint64 { return c.Enqueued }},
	{"shardq_messages_delivered_total", "Deliveries to consumers, first and later ones, all groups.", func(c queue.Counts) uint64 { return c.Delivered }},
	{"shardq_messages_redelivered_total", "Deliveries after the first of a message to a group.", func(c queue.Counts) uint64 { return c.Redelivered }},
	{"shardq_messages_acked_total", "Messages acked by a consumer, all groups.", func(c queue.Counts) uint64 { return c.Acked }},
	{"shardq_messages_nacked_total", "Messages nacked by a consumer (redelivered after a backoff).", func(c queue.Counts) uint64 { return c.Nacked }},
	{"shardq_messages_released_total", "Messages given back with $release (redelivered at once, not counted toward max_deliveries).", func(c queue.Counts) uint64 { return c.Released }},
	{"shardq_messages_rejected_total", "Messages rejected by a consumer (to the dead-letter queue).", func(c queue.Counts) uint64 { return c.Rejected }},
	{"shardq_messages_dead_lettered_total", "Messages moved to the queue's dead-letter queue, all reasons.", func(c queue.Counts) uint64 { return c.DeadLettered }},
	{"shardq_messages_expired_total", "Messages past their expiry or max_age (to the dead-letter queue).", func(c queue.Counts) uint64 { return c.Expired }},
	{"shardq_messages_deduplicated_total", "Publishes acknowledged but not stored: a dedup-id seen within the window.", func(c queue.Counts) uint64 { return c.Deduplicated }},
	{"shardq_messages_dropped_total", "Messages a full dead-letter queue evicted.", func(c queue.Counts) uint64 { return c.Dropped }},
	{"shardq_leases_lost_total", "Leases that ran out (ack_timeout) before the consumer settled.", func(c queue.Counts) uint64 { return c.LeasesLost }},
}

// groupCounters are the per-group totals, labelled queue and group.
var groupCounters = []struct {
	name, help string
	get        func(queue.GroupCounts) uint64
}{
	{"shardq_group_delivered_total", "Deliveries to the group's consumers, first and later ones.", func(c queue.GroupCounts) uint64 { return c.Delivered }},
	{"shardq_group_redelivered_total", "Deliveries to the group after the first of a message.", func(c queue.GroupCounts) uint64 { return c.Redelivered }},
	{"shardq_group_acked_total", "Messages the group's consumers acked.", func(c queue.GroupCounts) uint64 { return c.Acked }},
	{"shardq_group_nacked_total", "Messages the group's consumers nacked.", func(c queue.GroupCounts) uint64 { return c.Nacked }},
	{"shardq_group_released_total", "Messages the group's consumers gave back with $release.", func(c queue.GroupCounts) uint64 { return c.Released }},
	{"shardq_group_rejected_total", "Messages the group's consumers rejected.", func(c queue.GroupCounts) uint64 { return c.Rejected }},
	{"shardq_group_dead_lettered_total", "Messages the group moved to the dead-letter queue (rejected, max_deliveries, expired before delivery).", func(c queue.GroupCounts) uint64 { return c.DeadLettered }},
	{"shardq_group_leases_lost_total", "Leases of the group that ran out before their consumer settled.", func(c queue.GroupCounts) uint64 { return c.LeasesLost }},
}

// mochi's server figures, as it counts them: every PUBLISH packet received
// (queue publishes included), the PUBLISHes it sent itself (plain pub/sub;
// queue deliveries are written by the queue hook and counted in
// shardq_messages_delivered_total).
var mqttFigures = []struct {
	name, help string
	kind       prometheus.ValueType
	get        func(*mqttInfo) int64
}{
	{"shardq_mqtt_clients_connected", "MQTT clients connected.", prometheus.GaugeValue, func(i *mqttInfo) int64 { return i.ClientsConnected }},
	{"shardq_mqtt_subscriptions", "MQTT subscriptions, queue subscriptions included.", prometheus.GaugeValue, func(i *mqttInfo) int64 { return i.Subscriptions }},
	{"shardq_mqtt_retained_messages", "Retained messages held.", prometheus.GaugeValue, func(i *mqttInfo) int64 { return i.Retained }},
	{"shardq_mqtt_messages_received_total", "PUBLISH packets received, queue publishes included.", prometheus.CounterValue, func(i *mqttInfo) int64 { return i.MessagesReceived }},
	{"shardq_mqtt_messages_sent_total", "PUBLISH packets sent for plain pub/sub.", prometheus.CounterValue, func(i *mqttInfo) int64 { return i.MessagesSent }},
	{"shardq_mqtt_messages_dropped_total", "Plain pub/sub messages dropped for a subscriber holding mqtt.max_queued_messages already.", prometheus.CounterValue, func(i *mqttInfo) int64 { return i.MessagesDropped + i.InflightDropped }},
	{"shardq_mqtt_bytes_received_total", "Bytes received from MQTT clients.", prometheus.CounterValue, func(i *mqttInfo) int64 { return i.BytesReceived }},
	{"shardq_mqtt_bytes_sent_total", "Bytes sent to MQTT clients by mochi (queue deliveries and PUBACKs not included).", prometheus.CounterValue, func(i *mqttInfo) int64 { return i.BytesSent }},
}

// collector reads the node's figures at scrape time. Its descriptions
// carry the node label themselves.
type collector struct {
	b *Broker

	counters []*prometheus.Desc // as queueCounters
	groups   []*prometheus.Desc // as groupCounters
	mqtt     []*prometheus.Desc // as mqttFigures

	partitionDepth, groupConsumers, groupLag, groupLeased, groupOldest *prometheus.Desc
	groupSettled, storageBytes, ready                                  *prometheus.Desc
}

func newCollector(b *Broker, node prometheus.Labels) *collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, node)
	}
	c := &collector{
		b:              b,
		partitionDepth: desc("shardq_partition_depth", "Messages stored in the partition and not yet deleted.", "queue", "partition"),
		groupConsumers: desc("shardq_group_consumers", "Consumers connected to the group.", "queue", "group"),
		groupLag:       desc("shardq_group_lag", "Messages of the partition the group has not settled.", "queue", "group", "partition"),
		groupLeased:    desc("shardq_group_leased", "Messages of the partition delivered to the group and not settled (in-flight leases).", "queue", "group", "partition"),
		groupOldest:    desc("shardq_group_oldest_unsettled_age_seconds", "Age of the oldest message of the partition the group has not settled; 0 when none.", "queue", "group", "partition"),
		groupSettled:   desc("shardq_group_settled_total", "The group's position: offsets of the queue's partitions it has settled (acked, dead-lettered, or expired or dropped by retention), those before it existed included. Its rate is the group's settle rate.", "queue", "group"),
		storageBytes:   desc("shardq_storage_disk_bytes", "Bytes a storage shard takes on disk, by kind of file (sst, vlog, wal, other).", "shard", "kind"),
		ready:          desc("shardq_ready", "1 when the node is ready: storage recovered, listeners up, storage writes not failing, disk not below storage.min_free_bytes, not shutting down."),
	}
	for _, x := range queueCounters {
		c.counters = append(c.counters, desc(x.name, x.help, "queue"))
	}
	for _, x := range groupCounters {
		c.groups = append(c.groups, desc(x.name, x.help, "queue", "group"))
	}
	for _, x := range mqttFigures {
		c.mqtt = append(c.mqtt, desc(x.name, x.help))
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range c.groups {
		ch <- d
	}
	for _, d := range c.mqtt {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.partitionDepth, c.groupConsumers, c.groupLag, c.groupLeased, c.groupOldest, c.groupSettled, c.storageBytes, c.ready} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, boolValue(b.Ready()))
	if b.manager != nil {
		now := time.Now()
		for _, q := range b.manager.Queues() {
			c.collectQueue(ch, q.Info(), now)
		}
	}
	if b.server != nil {
		info := b.server.Info.Clone()
		for i, x := range mqttFigures {
			ch <- prometheus.MustNewConstMetric(c.mqtt[i], x.kind, float64(x.get(info)))
		}
	}
	if st, ok := b.store.(*badger.Store); ok {
		for i, u := range st.DiskUsage() {
			s := strconv.Itoa(i)
			for _, k := range []struct {
				kind string
				n    int64
			}{{"sst", u.SST}, {"vlog", u.VLog}, {"wal", u.WAL}, {"other", u.Other}} {
				ch <- prometheus.MustNewConstMetric(c.storageBytes, prometheus.GaugeValue, float64(k.n), s, k.kind)
			}
		}
	}
}

func (c *collector) collectQueue(ch chan<- prometheus.Metric, info queue.Info, now time.Time) {
	name := info.Name
	for i, x := range queueCounters {
		ch <- prometheus.MustNewConstMetric(c.counters[i], prometheus.CounterValue, float64(x.get(info.Counts)), name)
	}
	for _, p := range info.Partitions {
		ch <- prometheus.MustNewConstMetric(c.partitionDepth, prometheus.GaugeValue, float64(p.Depth()), name, strconv.Itoa(p.Partition))
	}
	for _, g := range info.Groups {
		ch <- prometheus.MustNewConstMetric(c.groupConsumers, prometheus.GaugeValue, float64(g.Consumers), name, g.Name)
		for i, x := range groupCounters {
			ch <- prometheus.MustNewConstMetric(c.groups[i], prometheus.CounterValue, float64(x.get(g.Counts)), name, g.Name)
		}
		// The group's position: its count of settled offsets, those below
		// its floor and those it settled above.
		var settled uint64
		for _, p := range g.Partitions {
			settled += p.Floor + uint64(p.SettledAboveFloor)
		}
		ch <- prometheus.MustNewConstMetric(c.groupSettled, prometheus.CounterValue, float64(settled), name, g.Name)
		for _, p := range g.Partitions {
			part := strconv.Itoa(p.Partition)
			ch <- prometheus.MustNewConstMetric(c.groupLag, prometheus.GaugeValue, float64(p.Lag), name, g.Name, part)
			ch <- prometheus.MustNewConstMetric(c.groupLeased, prometheus.GaugeValue, float64(p.Leased), name, g.Name, part)
			var age float64
			if !p.OldestUnsettled.IsZero() {
				age = max(0, now.Sub(p.OldestUnsettled).Seconds())
			}
			ch <- prometheus.MustNewConstMetric(c.groupOldest, prometheus.GaugeValue, age, name, g.Name, part)
		}
	}
}

func boolValue(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
