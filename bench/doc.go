// Package bench is a load generator for MQTT brokers that checks what it
// measures. It speaks MQTT v5 over TCP (paho.golang) to any broker, so the
// same load runs against shardq, a vanilla mochi broker (bench/mochi) and
// mosquitto, and a run that lost messages is reported as such instead of as
// a throughput.
//
// # Scenarios
//
//   - pubsub: P producers publish at QoS 1 to the plain topic bench/{run};
//     C subscribers receive it (with C > 1 as the shared subscription
//     $share/bench/bench/{run}). The reference any broker can run.
//   - produce: P producers publish to $queue/bench-{run} with no consumer.
//     Throughput is PUBACKs per second; the latency is publish to PUBACK.
//   - cycle: producers publish to $queue/bench-{run}; C consumers of group
//     bench ($share/bench/$queue/bench-{run}) settle every delivery with a
//     manual PUBACK after recording it.
//   - fanin: cycle with many producers (64 unless --producers is given).
//   - backlog: producers fill $queue/bench-{run} (--messages, or for
//     --duration) with no consumer; then the consumers start and drain it.
//     Reports the fill and drain rates and, with --broker-pid, the broker's
//     resident memory after the fill and after the drain. On a broker
//     without durable queues the backlog is simply gone: LOSS.
//
// {run} is a fresh random id per run, so rounds never see each other's
// messages. Against a plain broker the $queue/ topics are ordinary topics,
// which is what makes cycle and fanin comparable.
//
// # Messages
//
// Every payload starts with a HeaderSize-byte header: producer id, the
// producer's sequence number (dense from 0), the send time in Unix
// nanoseconds, and a key index; zero padding brings it to --size. The key
// index also travels as the v5 user property `key` ("k17"). Producer i's
// message j has key (i + j*P) mod K, so with K a multiple of P every key
// belongs to one producer and each producer cycles through its keys.
//
// A producer keeps up to --window publishes in flight, but writes them to
// the connection strictly in sequence order (one sending goroutine,
// paho's asynchronous publish, acknowledgements observed through the
// session state). The broker therefore receives each producer's messages
// in sequence order, which is what makes the ordering check exact.
//
// # Accounting
//
// The Ledger keeps two bits per message, acknowledged and received, plus a
// last-seen sequence per producer and key:
//
//   - missing: acknowledged with a success reason code (QoS 0: written) and
//     never received by the end of the drain. Any missing message makes the
//     run invalid: status LOSS, "valid": false, no throughput. A message
//     received before its PUBACK arrived is not missing; a publish that got
//     no PUBACK (unacked) or a failure reason code (rejected) is not
//     expected and not missing.
//   - duplicates: a second receipt of the same producer and sequence with
//     no sign of redelivery. Receipts flagged by the broker (DUP set, or a
//     delivery-count user property above 1) are counted as redeliveries
//     instead: at-least-once delivery allows them.
//   - reordered: a first receipt whose sequence is lower than one already
//     received from the same producer with the same key. Redeliveries are
//     not judged. Reordering is reported but only invalidates a run with
//     --ordering-check (for brokers that promise per-key order; a plain
//     broker's shared subscription spreads a key over its members).
//
// The counts cover the whole run, warm-up included. Throughput and
// latencies cover the measurement window only: events (first deliveries,
// or PUBACKs in produce) between the end of the warm-up and the end of
// --duration (or the last event, when --messages ends the run first), and
// latencies of messages sent after the warm-up. Latencies are kept in a
// log-linear Histogram (1 µs resolution, under 1% error, up to 60 s).
// With --rate the send time is the actual send time, so a stalled broker
// shows as lower throughput rather than as queueing delay.
//
// After the producers stop, each waits (up to --drain) for its
// outstanding PUBACKs, then the consumers get up to --drain to receive
// every acknowledged message; the wait ends as soon as they have.
//
// # Comparing brokers
//
// With --vs, the scenario runs against --broker (A) and --vs (B)
// alternately, A B A B ..., for --rounds rounds (3 by default). Each round
// yields the throughput ratio A/B (none when either run is invalid); the
// report gives the median ratio.
//
//	go run ./bench/mochi --addr 127.0.0.1:1884 &
//	go run ./cmd/shardq bench cycle --broker 127.0.0.1:1883 --vs 127.0.0.1:1884 --json
//
// `make bench-compare` (scripts/bench-compare.sh) starts shardq,
// bench/mochi and mosquitto side by side, runs cycle against shardq and
// pubsub against the others, every broker once per round, and writes
// docs/BENCHMARKS.md with bench/cmd/benchreport; bench/fsyncprobe measures
// the disk for its machine line.
//
// From Go:
//
//	cfg := bench.DefaultConfig()
//	cfg.Scenario, cfg.Broker = bench.ScenarioCycle, "127.0.0.1:1883"
//	res, err := bench.Run(ctx, cfg)
//	if err != nil { ... }          // the run could not be carried out
//	if !res.Valid { ... }          // it could, and the broker lost messages
//
// # Errors
//
// Run returns an error when the run cannot be carried out: an invalid
// Config (ErrInvalidConfig), a broker that cannot be reached or refuses a
// subscription (ErrSubscribeRefused), a connection lost mid-run
// (ErrConnectionLost), or ctx ending. Misbehaviour of a broker that keeps
// its connections (loss, duplicates, reordering, rejected publishes) is
// never an error: it is in the Result. Main maps these to exit codes
// ExitOK, ExitInvalid and ExitUsage.
//
// # Concurrency
//
// Each producer has one sending goroutine and paho's reading goroutine,
// which records acknowledgements. Each consumer records deliveries on
// paho's delivery goroutine and acknowledges them in order. Ledger and
// Histogram are safe for concurrent use (a mutex per producer in the
// ledger, atomic counters in the histogram). Run and Compare block until
// the run is over; Config.Progress is called from a goroutine of its own.
package bench
