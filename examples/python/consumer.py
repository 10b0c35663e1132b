#!/usr/bin/env python3
"""Consume a shardq queue in a consumer group with paho-mqtt (MQTT 5),
settling each message by hand once its work is done.

The subscription asks for explicit settlement (user property ack=explicit):
the PUBACK paho sends as a message arrives only says "received", and the
message stays leased to this consumer until it publishes the message's
msg-id to $queue/{queue}/$ack (done), $nack (failed: redelivered after a
backoff) or $reject (to the dead-letter queue). A consumer that dies before
settling loses nothing: its messages go back to the group at once.

Runs with Debian's python3-paho-mqtt (paho-mqtt 1.6) and with paho-mqtt 2:

    apt-get install python3-paho-mqtt
    python3 examples/python/consumer.py --queue orders --group billing
"""

import argparse
import queue
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions


def new_client(client_id):
    """An MQTT 5 client, with paho-mqtt 2's callbacks where it has them."""
    if hasattr(mqtt, "CallbackAPIVersion"):  # paho-mqtt 2
        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    return mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv5)


def handle(msg, props):
    """The work. An exception nacks the message: shardq delivers it again."""
    print(f"{msg.topic} msg-id={props['msg-id']} delivery-count={props['delivery-count']}: "
          f"{msg.payload.decode(errors='replace')}", flush=True)


def settle(client, queue_name, group, msg_id, verb):
    """Publishes msg_id to $queue/{queue}/{verb} and waits for its PUBACK."""
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("msg-id", msg_id)]
    if group != "default":
        props.UserProperty.append(("group", group))
    info = client.publish(f"$queue/{queue_name}/{verb}", payload=b"", qos=1, properties=props)
    info.wait_for_publish(timeout=10)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="shardq's MQTT host")
    p.add_argument("--port", type=int, default=1883, help="shardq's MQTT port")
    p.add_argument("--queue", default="orders", help="the queue to consume")
    p.add_argument("--group", default="billing", help="the consumer group to join")
    p.add_argument("--client-id", default="python-consumer", help="this consumer's MQTT client ID")
    p.add_argument("--prefetch", type=int, default=16, help="unsettled messages held at most")
    p.add_argument("--count", type=int, default=0, help="stop after this many messages (0: never)")
    p.add_argument("--timeout", type=float, default=0,
                   help="fail when no message comes for this many seconds (0: wait forever)")
    args = p.parse_args()

    inbox = queue.Queue()  # messages and errors, from paho's network thread
    client = new_client(args.client_id)

    def on_connect(client, userdata, flags, reason_code, properties):
        if reason_code != 0:
            inbox.put(RuntimeError(f"connection refused: {reason_code}"))
            return
        sub = Properties(PacketTypes.SUBSCRIBE)
        sub.UserProperty = [("ack", "explicit"), ("prefetch", str(args.prefetch))]
        client.subscribe(f"$share/{args.group}/$queue/{args.queue}/#",
                         options=SubscribeOptions(qos=1), properties=sub)

    def on_subscribe(client, userdata, mid, reason_codes, properties):
        for rc in reason_codes:
            if getattr(rc, "value", rc) >= 0x80:  # a ReasonCode(s) object, or an int
                inbox.put(RuntimeError(f"subscription refused: {rc}"))

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = lambda client, userdata, msg: inbox.put(msg)

    connect = Properties(PacketTypes.CONNECT)
    connect.ReceiveMaximum = args.prefetch
    client.connect(args.host, args.port, keepalive=30, clean_start=True, properties=connect)
    client.loop_start()
    done = 0
    try:
        while args.count == 0 or done < args.count:
            try:
                msg = inbox.get(timeout=args.timeout or None)
            except queue.Empty:
                print(f"consumer: no message for {args.timeout:g} s", file=sys.stderr)
                return 1
            if isinstance(msg, Exception):
                print(f"consumer: {msg}", file=sys.stderr)
                return 1
            props = dict(getattr(msg.properties, "UserProperty", []))
            # The work runs here, on the main thread, not in paho's callback:
            # settling waits for a PUBACK that paho's thread reads.
            try:
                handle(msg, props)
                verb = "$ack"
            except Exception as e:
                print(f"consumer: {props['msg-id']} failed, nacked: {e}", file=sys.stderr)
                verb = "$nack"
            settle(client, args.queue, args.group, props["msg-id"], verb)
            done += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.disconnect()
        client.loop_stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
