#!/usr/bin/env bash
# A walk through shardq's queues with Debian's mosquitto clients
# (apt-get install mosquitto-clients). Start a node first: go run ./cmd/shardq serve
set -euo pipefail
H=${SHARDQ_HOST:-127.0.0.1}
P=${SHARDQ_PORT:-1883}

echo "1. Publish three readings of one device (QoS 1: each PUBACK means stored and fsynced)."
for i in 1 2 3; do
  mosquitto_pub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$queue/telemetry/dev-1' -m "reading $i"
done

echo "2. Nobody was subscribed; the queue kept them. Consume them in group 'dash'."
echo "   The topic keeps its subject (dev-1) because the filter ends in /#; [..] are shardq's user properties."
mosquitto_sub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$share/dash/$queue/telemetry/#' -C 3 -W 5 -v -F '%t %p  [%P]'

echo "3. A second group gets every message too, independently."
mosquitto_pub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$queue/telemetry/dev-2' -m "reading 4"
mosquitto_sub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$share/archive/$queue/telemetry/#' -C 4 -W 5 -v

echo "4. An invalid queue name is refused (v5 PUBACK 0x90), never acknowledged."
mosquitto_pub -h "$H" -p "$P" -V mqttv5 -q 1 -t '$queue/bad name' -m x || echo "   refused, as expected"
