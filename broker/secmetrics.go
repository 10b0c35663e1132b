package broker

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardq/shardq/auth"
)

// Labels of shardq_limit_refusals_total.
const (
	limitMaxQueues      = "max_queues"
	limitMaxConnections = "max_connections"
	limitMaxPacketSize  = "max_packet_size"
	limitMaxDelay       = "max_delay"
	limitQueueFull      = "queue_full"
	limitDiskFull       = "disk_full"
)

// Labels of shardq_auth_failures_total.
const (
	authBadCredentials = "bad_credentials"
	authNoCredentials  = "no_credentials"
	authClientIDTaken  = "client_id_taken"
)

// securityMetrics count what the node refused and why. They exist with
// metrics off too (unregistered), so that callers need no check; every
// count is on a path that refuses something, none on a path that serves.
type securityMetrics struct {
	authFailures *prometheus.CounterVec
	aclDenials   *prometheus.CounterVec
	limits       *prometheus.CounterVec
	malformed    *prometheus.CounterVec
	reloads      *prometheus.CounterVec
	panics       *prometheus.CounterVec
}

func newSecurityMetrics(node prometheus.Labels) *securityMetrics {
	counter := func(name, help string, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: node}, []string{label})
	}
	m := &securityMetrics{
		authFailures: counter("shardq_auth_failures_total",
			"CONNECTs refused: bad_credentials (CONNACK 0x86), no_credentials (0x86), client_id_taken (0x85: the ID is another user's session).", "reason"),
		aclDenials: counter("shardq_acl_denials_total",
			"Requests the ACL denied, by action: publish, subscribe, produce, consume, admin.", "action"),
		limits: counter("shardq_limit_refusals_total",
			"Requests refused by a limit: max_queues, max_connections, max_packet_size, max_delay, queue_full (max_messages or max_bytes), disk_full (below storage.min_free_bytes).", "limit"),
		malformed: counter("shardq_mqtt_malformed_packets_total",
			"Connections ended for a malformed or forbidden packet, by reason code (0x95 is counted as the max_packet_size limit).", "code"),
		reloads: counter("shardq_config_reloads_total",
			"Reloads of certificates, users and ACL (SIGHUP), by result: ok or failed.", "result"),
		panics: counter("shardq_client_panics_total",
			"Panics while handling a client's packet, by hook method (mochi's) or writer (the client's delivery writer); the client was closed, the node kept serving.", "hook"),
	}
	// Every label value exists from the start, at 0.
	for _, r := range []string{authBadCredentials, authNoCredentials, authClientIDTaken} {
		m.authFailures.WithLabelValues(r)
	}
	for _, a := range []auth.Action{auth.Publish, auth.Subscribe, auth.Produce, auth.Consume, auth.Admin} {
		m.aclDenials.WithLabelValues(string(a))
	}
	for _, l := range []string{limitMaxQueues, limitMaxConnections, limitMaxPacketSize, limitMaxDelay, limitQueueFull, limitDiskFull} {
		m.limits.WithLabelValues(l)
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("failed")
	return m
}

func (m *securityMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.authFailures, m.aclDenials, m.limits, m.malformed, m.reloads, m.panics}
}

func (m *securityMetrics) authFailure(reason string) { m.authFailures.WithLabelValues(reason).Inc() }
func (m *securityMetrics) denied(a auth.Action)      { m.aclDenials.WithLabelValues(string(a)).Inc() }
func (m *securityMetrics) limit(name string)         { m.limits.WithLabelValues(name).Inc() }
func (m *securityMetrics) malformedPacket(code byte) {
	m.malformed.WithLabelValues(fmt.Sprintf("0x%02x", code)).Inc()
}
