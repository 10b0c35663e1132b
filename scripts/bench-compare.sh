#!/usr/bin/env bash
# bench-compare.sh measures shardq's durable queue cycle against plain QoS 1
# pub/sub on vanilla mochi and, where installed, mosquitto, all on this
# machine, and writes a markdown report. `make bench-compare` runs it.
#
# It builds bin/shardq and bin/mochi, starts on 127.0.0.1:
#   shardq-none  bin/shardq serve, queues with ordering: none, prefetch 1024
#   shardq-key   bin/shardq serve, queues with ordering: key, prefetch 1024
#   shardq-ki16  the same as shardq-key with key_inflight: 16
#   shardq-default  bin/shardq serve with no config: every queue default
#   mochi        bin/mochi, vanilla mochi (bench/mochi)
#   mosquitto    mosquitto with a config of its own, if `mosquitto` is found
# then runs `shardq bench pubsub` against mochi and mosquitto and
# `shardq bench cycle` against both shardq nodes (the key node with 64 and
# with 10,000 keys), and the defaults' cycle with a paho.mqtt.golang 3.1.1
# consumer against mochi's pubsub with the same consumer, and the defaults'
# cycle against mochi's pubsub at fixed rates of 10k, 20k and 25k msgs/s
# (broker CPU per message and PUBACK latency at equal load), every run once
# per round, for ROUNDS rounds; then
# shardq-none once more at half its median rate (PUBACK latency below
# saturation); then, each on a fresh node, 10,000 idle queues with one
# message each (bench/queuesprobe: the node's RSS) and a BACKLOG-message
# backlog (the node's resident memory with it, and the time until it
# accepts MQTT again after a restart). Every run passes the broker's pid,
# so each result has the broker's CPU per message. It writes the report
# (bench/cmd/benchreport). Every process it starts is stopped when it
# exits.
#
# Environment:
#   ROUNDS=3              rounds
#   DURATION=5s           measured time of each run
#   WARMUP=1s             warm-up of each run, not measured
#   BENCH_ARGS=           more flags for every run, e.g. "--producers 8"
#   IDLE_QUEUES=10000     idle queues for the memory probe (0 skips it)
#   BACKLOG=5000000       messages of the backlog probe: resident memory, restart (0 skips it)
#   OUT=docs/BENCHMARKS.md
#   WORK_DIR=             data directories, configs, logs and results; default
#                         a new directory in ${TMPDIR:-/tmp}, removed at exit
#   KEEP=1                keep WORK_DIR (it is printed)
#   GO=go
#
# It exits 1 when a broker does not come up, and, after writing the report,
# when any run was not valid (lost or reordered messages, or failed).
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
OUT=${OUT:-docs/BENCHMARKS.md}
GO=${GO:-go}
IDLE_QUEUES=${IDLE_QUEUES:-10000}
BACKLOG=${BACKLOG:-5000000}
read -ra extra_args <<<"${BENCH_ARGS:-}"

cd "$(dirname "$0")/.."

die() {
	echo "bench-compare: $*" >&2
	exit 1
}

declare -A pid port
used_ports=" "

cleanup() {
	local name
	for name in "${!pid[@]}"; do
		kill -TERM "${pid[$name]}" 2>/dev/null || true
	done
	for name in "${!pid[@]}"; do
		for _ in $(seq 100); do
			kill -0 "${pid[$name]}" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "${pid[$name]}" 2>/dev/null; then
			echo "bench-compare: $name (pid ${pid[$name]}) did not stop in 10s: killing it" >&2
			kill -KILL "${pid[$name]}" 2>/dev/null || true
		fi
		wait "${pid[$name]}" 2>/dev/null || true
	done
	if [[ -n ${work:-} && ${KEEP:-} != 1 && -z ${WORK_DIR:-} ]]; then
		rm -rf "$work"
	elif [[ -n ${work:-} ]]; then
		echo "bench-compare: logs, configs and results are in $work" >&2
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_port sets REPLY to a port nothing listens on, below Linux's ephemeral
# range so that no outgoing connection holds it.
free_port() {
	local p
	for _ in $(seq 200); do
		p=$((20000 + RANDOM % 12000))
		[[ $used_ports == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			used_ports+="$p "
			REPLY=$p
			return
		fi
	done
	die "no free TCP port found on 127.0.0.1"
}

# start NAME CMD...: runs CMD in the background, logging to WORK/NAME.log,
# on the port free_port picked last.
start() {
	local name=$1
	shift
	"$@" >"$work/$name.log" 2>&1 &
	pid[$name]=$!
	port[$name]=$REPLY
}

# wait_up NAME: waits until NAME accepts TCP connections.
wait_up() {
	local name=$1
	for _ in $(seq 200); do
		if ! kill -0 "${pid[$name]}" 2>/dev/null; then
			echo "bench-compare: $name exited before accepting connections; its log:" >&2
			tail -n 20 "$work/$name.log" >&2
			exit 1
		fi
		if (exec 3<>"/dev/tcp/127.0.0.1/${port[$name]}") 2>/dev/null; then
			echo "  $name: pid ${pid[$name]}, 127.0.0.1:${port[$name]}"
			return
		fi
		sleep 0.1
	done
	echo "bench-compare: $name does not accept connections on 127.0.0.1:${port[$name]} after 20s; its log:" >&2
	tail -n 20 "$work/$name.log" >&2
	exit 1
}

if [[ -n ${WORK_DIR:-} ]]; then
	work=$WORK_DIR
	mkdir -p "$work"
else
	work=$(mktemp -d "${TMPDIR:-/tmp}/shardq-bench.XXXXXX")
fi
rm -rf "$work/results" "$work"/data-* # a WORK_DIR used before
mkdir -p "$work/results" "$work/bin"

echo "building bin/shardq, bin/mochi and the report tools"
$GO build -o bin/shardq ./cmd/shardq
$GO build -o bin/mochi ./bench/mochi
$GO build -o "$work/bin/benchreport" ./bench/cmd/benchreport
$GO build -o "$work/bin/fsyncprobe" ./bench/fsyncprobe
$GO build -o "$work/bin/queuesprobe" ./bench/queuesprobe

# The disk, measured before any broker runs, where the data directories are.
"$work/bin/fsyncprobe" --dir "$work" --json >"$work/fsync.json"
fs_type=$(df --output=fstype "$work" 2>/dev/null | tail -n 1 || true)

mosquitto_bin=$(command -v mosquitto || true)
if [[ -z $mosquitto_bin && -x /usr/sbin/mosquitto ]]; then
	mosquitto_bin=/usr/sbin/mosquitto # Debian's, when /usr/sbin is not on PATH
fi

for ordering in none key; do
	cat >"$work/shardq-$ordering.yaml" <<EOF
# shardq for scripts/bench-compare.sh
queues:
  defaults:
    ordering: $ordering
    prefetch: 1024
    durability: fsync
EOF
done
cat >"$work/shardq-ki16.yaml" <<EOF
# shardq for scripts/bench-compare.sh
queues:
  defaults:
    ordering: key
    key_inflight: 16
    prefetch: 1024
    durability: fsync
EOF

echo "starting the brokers"
free_port
start shardq-none bin/shardq serve --config "$work/shardq-none.yaml" --data-dir "$work/data-none" \
	--mqtt "127.0.0.1:$REPLY" --ws "" --http "" --node-id bench-none
free_port
start shardq-key bin/shardq serve --config "$work/shardq-key.yaml" --data-dir "$work/data-key" \
	--mqtt "127.0.0.1:$REPLY" --ws "" --http "" --node-id bench-key
free_port
start shardq-ki16 bin/shardq serve --config "$work/shardq-ki16.yaml" --data-dir "$work/data-ki16" \
	--mqtt "127.0.0.1:$REPLY" --ws "" --http "" --node-id bench-ki16
free_port
start shardq-default bin/shardq serve --data-dir "$work/data-default" \
	--mqtt "127.0.0.1:$REPLY" --ws "" --http "" --node-id bench-default
free_port
# A 3.1.1 subscriber has no Receive Maximum: mochi queues what it has for
# it up to --client-queue, and drops messages past it (QoS 1 too).
start mochi bin/mochi --addr "127.0.0.1:$REPLY" --client-queue 65535
if [[ -n $mosquitto_bin ]]; then
	free_port
	cat >"$work/mosquitto.conf" <<EOF
# mosquitto for scripts/bench-compare.sh
listener $REPLY 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
max_inflight_messages 0
max_queued_messages 0
persistence false
log_dest stderr
log_type error
log_type warning
EOF
	start mosquitto "$mosquitto_bin" -c "$work/mosquitto.conf"
else
	echo "  mosquitto is not installed: measuring shardq and mochi only"
fi
for name in shardq-none shardq-key shardq-ki16 shardq-default mochi mosquitto; do
	[[ -n ${pid[$name]:-} ]] && wait_up "$name"
done

# The runs in the order each round runs them: RUN BROKER SCENARIO FLAGS...
runs=(
	"mochi mochi pubsub"
	"mosquitto mosquitto pubsub"
	"shardq-none shardq-none cycle --receive-max 1024"
	"shardq-key shardq-key cycle --receive-max 1024 --keys 64 --ordering-check"
	"shardq-key10k shardq-key cycle --receive-max 1024 --keys 10000 --ordering-check"
	"shardq-key-ki16 shardq-ki16 cycle --receive-max 1024 --keys 64 --ordering-check"
	"mochi-311 mochi pubsub --consumer-client paho311"
	"shardq-default-311 shardq-default cycle --consumer-client paho311 --keys 10000 --ordering-check"
	"shardq-default-311-64keys shardq-default cycle --consumer-client paho311 --ordering-check"
	"mochi-10k mochi pubsub --rate 10000"
	"shardq-default-10k shardq-default cycle --receive-max 1024 --keys 10000 --ordering-check --rate 10000"
	"mochi-20k mochi pubsub --rate 20000"
	"shardq-default-20k shardq-default cycle --receive-max 1024 --keys 10000 --ordering-check --rate 20000"
	"mochi-25k mochi pubsub --rate 25000"
	"shardq-default-25k shardq-default cycle --receive-max 1024 --keys 10000 --ordering-check --rate 25000"
)
failed=()
results=()

# measure RUN BROKER SCENARIO ROUND [FLAGS...]: one run, its result in
# WORK/results/RUN-rROUND.json.
measure() {
	local run=$1 name=$2 scenario=$3 round=$4
	shift 4
	kill -0 "${pid[$name]}" 2>/dev/null || die "$name (pid ${pid[$name]}) has exited; its log: $work/$name.log"
	local out="$work/results/$run-r$round.json" code=0
	results+=("$out")
	bin/shardq bench "$scenario" --broker "127.0.0.1:${port[$name]}" --broker-pid "${pid[$name]}" \
		--duration "$DURATION" --warmup "$WARMUP" --json \
		"$@" ${extra_args[@]+"${extra_args[@]}"} \
		>"$out" 2>"${out%.json}.err" || code=$?
	local status rate
	status=$(sed -n 's/^  "status": "\(.*\)",$/\1/p' "$out")
	rate=$(sed -n 's/^  "throughput_msgs_per_s": \([0-9]*\).*/\1/p' "$out")
	printf '  round %d  %-14s %-7s %-8s %s\n' "$round" "$run" "$scenario" "${status:-ERROR}" "${rate:+$rate msgs/s}"
	if [[ $code == 2 ]]; then
		cat "${out%.json}.err" >&2
		die "shardq bench refused its arguments"
	fi
	if [[ $code != 0 ]]; then
		failed+=("$run round $round: ${status:-$(head -n 1 "${out%.json}.err")}")
	fi
}

for round in $(seq "$ROUNDS"); do
	for spec in "${runs[@]}"; do
		read -r run name scenario flags <<<"$spec"
		[[ -n ${pid[$name]:-} ]] || continue
		read -ra run_flags <<<"${flags:-}"
		measure "$run" "$name" "$scenario" "$round" ${run_flags[@]+"${run_flags[@]}"}
	done
done

# PUBACK latency below saturation: shardq-none at half its median rate.
rates=$(for f in "$work"/results/shardq-none-r*.json; do sed -n 's/^  "throughput_msgs_per_s": \([0-9]*\).*/\1/p' "$f"; done | sort -n)
half=0
if [[ -n $rates ]]; then
	n=$(wc -l <<<"$rates")
	half=$(($(sed -n "$(((n + 1) / 2))p" <<<"$rates") / 2))
fi
if ((half > 0)); then
	measure shardq-none-half shardq-none cycle 1 --receive-max 1024 --rate "$half"
fi

# Idle queues: a fresh node, one message to each of IDLE_QUEUES queues.
idle_note=""
if ((IDLE_QUEUES > 0)); then
	printf '# shardq for scripts/bench-compare.sh: room for the idle queues\nlimits:\n  max_queues: %d\n' \
		$((IDLE_QUEUES + 10)) >"$work/shardq-idle.yaml"
	free_port
	start shardq-idle bin/shardq serve --config "$work/shardq-idle.yaml" --data-dir "$work/data-idle" --mqtt "127.0.0.1:$REPLY" --ws "" --http "" --node-id bench-idle
	wait_up shardq-idle
	if "$work/bin/queuesprobe" --broker "127.0.0.1:${port[shardq-idle]}" --pid "${pid[shardq-idle]}" \
		-n "$IDLE_QUEUES" --json >"$work/idle.json" 2>"$work/idle.err"; then
		idle_rss=$(sed -n 's/.*"rss_bytes":\([0-9]*\).*/\1/p' "$work/idle.json")
		idle_note="**Idle queues:** a fresh node given one QoS 1 message in each of $IDLE_QUEUES new queues (\`bench/queuesprobe\`) holds $((idle_rss >> 20)) MB resident (goal: at most 256 MB)."
		echo "  idle queues: $IDLE_QUEUES, RSS $((idle_rss >> 20)) MB"
	else
		failed+=("idle queues: $(head -n 1 "$work/idle.err")")
	fi
	kill -TERM "${pid[shardq-idle]}" && wait "${pid[shardq-idle]}" 2>/dev/null || true
	unset 'pid[shardq-idle]'
fi

# Restart with a backlog: fill BACKLOG messages, stop the node, time its
# start until it accepts MQTT connections (recovery happens before).
restart_note=""
if ((BACKLOG > 0)); then
	free_port
	backlog_port=$REPLY
	start shardq-backlog bin/shardq serve --data-dir "$work/data-backlog" --mqtt "127.0.0.1:$backlog_port" --ws "" --http "" --node-id bench-backlog
	wait_up shardq-backlog
	# A fill by count measures no window (its status says NO DATA): what
	# matters is that every message was acknowledged.
	bin/shardq bench produce --broker "127.0.0.1:$backlog_port" --messages "$BACKLOG" --warmup 0s --duration 30m --json \
		>"$work/backlog.json" 2>"$work/backlog.err" || true
	acked=$(sed -n 's/^  "acked": \([0-9]*\),$/\1/p' "$work/backlog.json")
	[[ ${acked:-0} == "$BACKLOG" ]] || failed+=("backlog fill: ${acked:-0} of $BACKLOG acknowledged $(head -n 1 "$work/backlog.err")")
	# What the node holds resident with the backlog, anonymous memory and
	# mapped files apart.
	rss_of() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB$/\1/p" "/proc/${pid[shardq-backlog]}/status"; }
	backlog_rss=$(rss_of VmRSS) backlog_anon=$(rss_of RssAnon) backlog_file=$(rss_of RssFile)
	kill -TERM "${pid[shardq-backlog]}" && wait "${pid[shardq-backlog]}" 2>/dev/null || true
	REPLY=$backlog_port
	t0=$(date +%s%N)
	start shardq-backlog bin/shardq serve --data-dir "$work/data-backlog" --mqtt "127.0.0.1:$backlog_port" --ws "" --http "" --node-id bench-backlog
	until (exec 3<>"/dev/tcp/127.0.0.1/$backlog_port") 2>/dev/null; do
		kill -0 "${pid[shardq-backlog]}" 2>/dev/null || die "shardq-backlog exited on restart; its log: $work/shardq-backlog.log"
		sleep 0.005
	done
	t1=$(date +%s%N)
	ms=$(((t1 - t0) / 1000000))
	restart_note="**Backlog:** a node given $BACKLOG messages (\`shardq bench produce --messages $BACKLOG\`, no consumer) holds $((${backlog_rss:-0} >> 10)) MB resident with them ($((${backlog_anon:-0} >> 10)) MB anonymous, $((${backlog_file:-0} >> 10)) MB of mapped files; goal: at most 300 MB for 5,000,000), and accepts MQTT connections ${ms} ms after \`shardq serve\` starts again (SIGTERM before; recovery runs before the listener opens)."
	echo "  backlog of $BACKLOG: ${backlog_rss:-?} kB resident, restart ${ms} ms"
fi

mochi_version=$($GO list -m -f '{{.Version}}' github.com/mochi-mqtt/server/v2)
commit="commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n $(git status --porcelain 2>/dev/null) ]]; then
	commit+=" with uncommitted changes"
fi

report_args=(
	-o "$OUT" -fsync "$work/fsync.json" -fs "$fs_type" -commit "$commit"
	-duration "$DURATION" -warmup "$WARMUP"
	-run "mochi=vanilla mochi-mqtt/server $mochi_version (bench/mochi: no hooks, allow-all auth; \`--client-queue 65535\` so that it does not drop messages to a 3.1.1 subscriber), \`pubsub\`: a plain topic at QoS 1, in memory"
)
if [[ -n ${pid[mosquitto]:-} ]]; then
	mosquitto_version=$({ "$mosquitto_bin" -h 2>&1 || true; } | sed -n 's/^mosquitto version //p' | head -n 1)
	report_args+=(-run "mosquitto=mosquitto $mosquitto_version, \`pubsub\`: a plain topic at QoS 1, in memory; \`set_tcp_nodelay true\`, no in-flight or queued limit")
fi
report_args+=(
	-run "shardq-none=shardq \`cycle\`: publish to \`\$queue/bench-{run}\`, each PUBACK after the fsync of its batch (\`durability: fsync\`); one consumer in a group settling each delivery with a PUBACK; \`ordering: none\`, \`prefetch: 1024\`, consumer Receive Maximum 1024"
	-run "shardq-key=the same with \`ordering: key\`: one unsettled message per key at a time, 64 keys; a run with any per-key reordering is invalid"
	-run "shardq-key10k=the same with 10,000 keys"
	-run "shardq-key-ki16=\`shardq-key\` with \`key_inflight: 16\`: up to 16 unsettled messages per key, with one consumer; 64 keys, per-key order checked"
	-ratio shardq-none/mochi@0.9
)
if ((half > 0)); then
	report_args+=(-run "shardq-none-half=\`shardq-none\` at half its median rate (\`--rate $half\`): PUBACK latency below saturation (goal: p99 at most 5 ms)")
fi
if [[ -n ${pid[mosquitto]:-} ]]; then
	report_args+=(-ratio shardq-none/mosquitto@1)
fi
report_args+=(
	-run "mochi-311=\`mochi\` with the consumer on paho.mqtt.golang at MQTT 3.1.1 (\`--consumer-client paho311\`)"
	-run "shardq-default-311=shardq with every queue setting at its default (\`ordering: key\`, \`prefetch: 1024\` with the adaptive window, \`durability: fsync\`), the consumer on paho.mqtt.golang at MQTT 3.1.1, 10,000 keys, per-key order checked"
	-run "shardq-default-311-64keys=the same with 64 keys: one unsettled message per key caps it at 64 per round trip"
	-ratio shardq-default-311/mochi-311@1
	-ratio shardq-default-311-64keys/mochi-311
	-run "mochi-10k=\`mochi\` at a fixed 10,000 msgs/s (\`--rate 10000\`)"
	-run "shardq-default-10k=shardq with every queue setting at its default, 10,000 keys, per-key order checked, consumer Receive Maximum 1024, at a fixed 10,000 msgs/s"
	-run "mochi-20k=\`mochi\` at 20,000 msgs/s"
	-run "shardq-default-20k=\`shardq-default-10k\` at 20,000 msgs/s"
	-run "mochi-25k=\`mochi\` at 25,000 msgs/s"
	-run "shardq-default-25k=\`shardq-default-10k\` at 25,000 msgs/s (goal: PUBACK p99 at most 5 ms, and at most 1.5 times mochi's)"
	-ratio cpu:shardq-default-10k/mochi-10k@1.5
	-ratio cpu:shardq-default-20k/mochi-20k@1.2
	-ratio p99:shardq-default-25k/mochi-25k@1.5
	-ratio cpu:shardq-default-25k/mochi-25k
)
report_args+=(-ratio shardq-key10k/shardq-none@0.8 -ratio shardq-key-ki16/shardq-none@0.8 -ratio shardq-key/mochi)
if [[ -n ${pid[mosquitto]:-} ]]; then
	report_args+=(-ratio shardq-key/mosquitto)
else
	report_args+=(-note "mosquitto is not installed on this machine: not measured.")
fi
report_args+=(
	-note "Each run is \`shardq bench SCENARIO --broker 127.0.0.1:PORT --duration $DURATION --warmup $WARMUP${BENCH_ARGS:+ $BENCH_ARGS} --json\`, with \`--receive-max 1024\` against shardq and \`--keys 64 --ordering-check\` (\`--keys 10000\` for \`shardq-key10k\`) against \`shardq-key\`; the brokers run side by side, idle but for the one measured."
	-attach "shardq-none, \`--config\`=$work/shardq-none.yaml"
	-attach "shardq-key, \`--config\`=$work/shardq-key.yaml"
	-attach "shardq-ki16, \`--config\`=$work/shardq-ki16.yaml"
)
if [[ -n ${pid[mosquitto]:-} ]]; then
	report_args+=(-attach "mosquitto, \`-c\` (the port changes from run to run)=$work/mosquitto.conf")
fi

report_args+=(-note "**Clients:** producers are paho.golang clients; consumers use the load generator's own MQTT 5 client (\`bench/wire.go\`: CONNECT, SUBSCRIBE, PUBLISH in, PUBACKs batched every millisecond), the same for every broker (the \`-311\` runs: paho.mqtt.golang at MQTT 3.1.1, acknowledging each message as its handler returns), because paho.golang's decoding of string properties cost the generator more CPU per delivery than the broker under test spent, on the cores they share.")
[[ -n $idle_note ]] && report_args+=(-note "$idle_note")
[[ -n $restart_note ]] && report_args+=(-note "$restart_note")

mkdir -p "$(dirname "$OUT")"
# The section "## Cluster" of the report is written by hand from the
# cluster's Go benchmarks: it is kept, from the file this run replaces.
cluster_section=""
if [[ -f $OUT ]]; then
	cluster_section=$(sed -n '/^## Cluster$/,$p' "$OUT")
fi
"$work/bin/benchreport" "${report_args[@]}" "${results[@]}"
if [[ -n $cluster_section ]]; then
	printf '\n%s\n' "$cluster_section" >>"$OUT"
fi
echo "wrote $OUT"

if ((${#failed[@]} > 0)); then
	echo "bench-compare: runs that were not valid:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
