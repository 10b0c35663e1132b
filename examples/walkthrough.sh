#!/usr/bin/env bash
# A walk through shardq's queues with Debian's mosquitto clients
# (apt-get install mosquitto-clients). Start a node first: go run ./cmd/shardq serve
set -euo pipefail
H=${SHARDQ_HOST:-127.0.0.1}
P=${SHARDQ_PORT:-1883}

# puback publishes one QoS 1 message (mosquitto_pub's arguments) and prints
# the reason code of its PUBACK, in decimal. mosquitto_pub exits 0 even when
# the broker refuses the message: its debug output (-d) is where the
# PUBACK's reason code shows.
puback() {
  local out
  out=$(mosquitto_pub -h "$H" -p "$P" -V mqttv5 -q 1 -d "$@" 2>&1)
  printf '%s\n' "$out" | sed -n 's/.*received PUBACK (Mid: [0-9]*, RC:\([0-9]*\)).*/\1/p'
}

echo "1. Publish three readings of one device (QoS 1: each PUBACK 0x00 means stored and fsynced)."
for i in 1 2 3; do
  rc=$(puback -t '$queue/telemetry/dev-1' -m "reading $i")
  printf '   reading %s: PUBACK 0x%02x\n' "$i" "${rc:-255}"
  [ "$rc" = 0 ] || { echo "   not stored: is shardq running on $H:$P?" >&2; exit 1; }
done

echo "2. Nobody was subscribed; the queue kept them. Consume them in group 'dash'."
echo "   The topic keeps its subject (dev-1) because the filter ends in /#; [..] are shardq's user properties."
mosquitto_sub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$share/dash/$queue/telemetry/#' -C 3 -W 5 -v -F '%t %p  [%P]'

echo "3. A second group gets every message too, independently."
mosquitto_pub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$queue/telemetry/dev-2' -m "reading 4"
mosquitto_sub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$share/archive/$queue/telemetry/#' -C 4 -W 5 -v

echo "4. An invalid queue name is refused (v5 PUBACK 0x90), never acknowledged."
rc=$(puback -t '$queue/bad name' -m x)
if [ "$rc" = 144 ]; then
  echo "   refused, as expected: PUBACK 0x90 Topic Name invalid, nothing stored"
else
  echo "   unexpected: PUBACK reason ${rc:-none}, want 0x90" >&2
  exit 1
fi
