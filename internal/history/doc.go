// Package history checks what a fault test's producers were told against
// what its consumers got, the queue-shaped counterpart of Jepsen's
// checkers: while nodes are killed, paused and cut off, MQTT clients
// record every publish, delivery and settlement in a Recorder; afterwards
// Check judges the History against shardq's promises (SPEC sections 2 to
// 5, 7 and the dead-letter queue) and returns a Report of violations.
//
// # Model
//
// A history is four kinds of events, each as a client saw it, timed by
// the test process's clock (time.Now, so comparisons use its monotonic
// reading):
//
//   - Publish: one publish attempt. The producer puts a unique ID in the
//     payload; a retry of the same message is another Publish with the
//     same ID. Its Answer is Acked (0x00: stored), Refused with a Code
//     (not stored; but CodeUnknown, 0x83, may be) or NoAnswer (the
//     connection was lost or the producer stopped waiting: may be stored).
//   - Delivery: one PUBLISH received by a consumer of a group, from the
//     queue or from its dead-letter queue, with the DUP flag and the
//     broker's msg-id and delivery-count user properties when present.
//   - Settlement: what the consumer then did: Ack, Nack, Reject, Release,
//     Extend, or Disconnected (its connection ended holding it).
//   - Disconnect: a consumer's connection ended; every lease it held ends.
//
// A message is its ID. A stored copy of it is its msg-id: the broker
// stores a message once per publish that reached it, so a message has one
// msg-id unless a producer may have stored it twice. A delivery is a
// lease: it starts when the consumer receives it and ends at the first of
// its consumer's settlement (other than Extend), its consumer's
// disconnect, the lease timeout after the delivery or its last Extend,
// and its next delivery to the same consumer.
//
// # Checks
//
// Every violation is a Finding with the message, key, group, the times,
// nodes and clients involved and a sentence.
//
//   - Lost: a message acknowledged at least once that a group named in
//     Options.Groups never received, and that no dead-letter queue
//     delivered either. Needs every publish's answer and every delivery of
//     those groups, with the consumers drained to the end.
//   - Duplicate: a message stored more than once: delivered at two
//     msg-ids (the original-msg-id of its dead letters included), or first
//     delivered (DUP not set, not a known msg-id) more than once in one
//     group. When its producer may have stored it that often (attempts
//     acknowledged, answered 0x83 or not answered, counted together) it is
//     an explained duplicate, counted by Cause in the Summary, not a
//     violation. Needs every publish attempt, including the refused and
//     unanswered ones.
//   - WithoutDUP: a delivery without DUP that the broker itself counts as
//     a redelivery (delivery-count above 1), or whose msg-id the group
//     received before. Needs DUP, and msg-id or delivery-count; without
//     them (a v3.1.1 consumer) a second delivery without DUP counts as a
//     Duplicate instead.
//   - Reorder: for two messages of one queue, key and producer, the first
//     acknowledged before the second was sent (at its first attempt that
//     may have stored it), their first deliveries to a group came the
//     other way. Redeliveries are not judged, nor publishes in flight at
//     once, nor queues in Options.Unordered. Needs Sent and Answered.
//   - LeaseOverlap: two consumers of a group held leases on one stored
//     copy at the same time, by more than Options.Slack. Needs every
//     settlement, the consumers' disconnects (record one when a consumer
//     is stopped, too) and Options.LeaseTimeout. Copies of a message whose
//     deliveries carry no msg-id cannot be told apart, so a message stored
//     twice and delivered without msg-ids is not checked.
//   - Vanished: with Options.DLQConsumed, a message that a group rejected,
//     or whose deliveries to a group ended Options.MaxDeliveries times
//     without an ack (nack, disconnect, lease timeout; not Release), and
//     that no dead-letter queue delivered. An ack, even a late one, clears
//     it. Needs the dead-letter queue consumed after the queue's consumers
//     stopped.
//   - Orphan: a dead letter whose message no publish could have stored:
//     never published, or only refused with a definite reason code.
//   - Unexpected: the same, of a delivery from the queue.
//
// # Time
//
// The clients see what the broker did a little later than it did it: a
// delivery after its lease was granted, a dropped connection after the
// broker dropped it. Client times of a settlement are earlier than the
// broker's, which keeps a checked overlap real; Options.Slack forgives
// the rest. A consumer cut off by a network partition may see its
// disconnect much later than the broker decided it; record the broker's
// instant where the test knows it (the fault's start), or allow Slack for
// the keepalive.
//
// # Use
//
//	var rec history.Recorder
//	// producers: rec.Publish(history.Publish{ID: id, Key: k, Queue: "orders", Node: n,
//	//         Producer: cid, Sent: sent, Answered: time.Now(), Answer: history.Acked})
//	// consumers: rec.Deliver(...) on receipt, rec.Settle(...) with the PUBACK,
//	//         rec.Disconnect(...) when a connection ends
//	opts := history.DefaultOptions()
//	opts.Groups = map[string][]string{"orders": {"billing", "audit"}}
//	r := history.Check(rec.History(), opts)
//	os.WriteFile(filepath.Join(dir, "history.md"), []byte(r.Markdown()), 0o644)
//	if !r.OK() {
//		t.Error(r)
//	}
//
// # Errors and concurrency
//
// Check returns no error: what it finds is the Report, and any Options
// value is valid (negative durations count as zero). A Recorder is safe
// for concurrent use; its History is a copy. Check runs on one goroutine
// and does not change the History it is given.
package history
