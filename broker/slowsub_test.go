package broker_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/shardq/shardq/config"
)

// dialStuck connects an MQTT 3.1.1 client with a small receive buffer,
// subscribes it to filter at QoS 1, and then never reads again.
func dialStuck(t *testing.T, addr, id, filter string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	connect := []byte{0x10, 0, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, byte(len(id))}
	connect = append(connect, id...)
	connect[1] = byte(len(connect) - 2)
	sub := []byte{0x82, 0, 0, 1, 0, byte(len(filter))}
	sub = append(sub, filter...)
	sub = append(sub, 1)
	sub[1] = byte(len(sub) - 2)
	var connack, suback [5]byte
	if _, err := conn.Write(connect); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, connack[:4]); err != nil || connack[3] != 0 {
		t.Fatalf("CONNACK %x: %v", connack[:4], err)
	}
	if _, err := conn.Write(sub); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, suback[:]); err != nil || suback[4] != 1 {
		t.Fatalf("SUBACK %x: %v", suback, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn
}

// noPuback stands for a PUBACK that did not come.
const noPuback = 0xff

// A plain subscriber that stops reading holds at most
// mqtt.max_queued_messages, and its publishers do not wait for it: mochi
// takes the client's lock for each QoS 1 message routed to it, and a
// write that does not end holds that lock, until mqtt.write_timeout closes
// the connection.
func TestPlainSubscriberThatStopsReading(t *testing.T) {
	cases := []struct {
		name    string
		size    int  // payload bytes
		queued  int  // mqtt.max_queued_messages
		cut     bool // the stuck client's socket fills before its queue: it is disconnected
		dropped int  // at least this many dropped
	}{
		{"its queue fills first", 512, 100, false, 1000}, // 100 of 512 bytes fit in any socket buffer
		{"its socket fills first", 100 << 10, 1000, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := startBroker(t, t.TempDir(), func(c *config.Config) {
				c.Protocol.MaxQueuedMessages, c.Protocol.WriteTimeout = tc.queued, 2*time.Second
			})
			dialStuck(t, b.MQTTAddr(), "stuck", "feed/#")
			pub := dialRaw(t, b.MQTTAddr(), "pub", connectOpts{})

			// Each PUBACK within 10 s (waitAck), though the stuck client
			// takes none of the messages routed to it.
			payload := bytes.Repeat([]byte("x"), tc.size)
			const total, window = 2000, 16
			inflight := make(chan chan byte, window)
			go func() {
				for range total {
					ch := make(chan byte, 1)
					inflight <- ch
					ack := pub.publishAsync("feed/a", payload)
					go func() {
						select {
						case a := <-ack:
							ch <- a.ReasonCode
						case <-time.After(10 * time.Second):
							ch <- noPuback
						}
					}()
				}
			}()
			for i := range total {
				switch code := <-<-inflight; code {
				case 0:
				case noPuback:
					t.Fatalf("publish %d: no PUBACK within 10s", i)
				default:
					t.Fatalf("publish %d: PUBACK 0x%02x", i, code)
				}
			}

			if tc.cut {
				deadline := time.Now().Add(10 * time.Second)
				for findClient(clients(t, b, "/api/v1/clients"), "stuck") != nil {
					if time.Now().After(deadline) {
						t.Fatal("the stuck client is still connected 10s after the publishes, with mqtt.write_timeout 2s")
					}
					time.Sleep(50 * time.Millisecond)
				}
			} else {
				stuck := findClient(clients(t, b, "/api/v1/clients"), "stuck")
				if stuck == nil || stuck.Unacknowledged < 1 || stuck.Unacknowledged > tc.queued {
					t.Fatalf("the stuck client: %+v; want it connected with 1 to %d unacknowledged", stuck, tc.queued)
				}
			}
			var dropped float64
			for _, s := range scrape(t, b) {
				if s.name == "shardq_mqtt_messages_dropped_total" {
					dropped += s.value
				}
			}
			if dropped < float64(tc.dropped) {
				t.Fatalf("shardq_mqtt_messages_dropped_total %v, want at least %d", dropped, tc.dropped)
			}

			// Others still get what is published.
			reader := dialRaw(t, b.MQTTAddr(), "reader", connectOpts{})
			reader.subscribe(1, nil, "feed/#")
			if code := pub.publish("feed/b", []byte("after")); code != 0 {
				t.Fatalf("publish after: PUBACK 0x%02x", code)
			}
			// The fan-out of the last publishes to feed/a may still be
			// on its way (mochi acknowledges a publish before it fans it
			// out): those may reach the new reader first.
			for {
				p := reader.next(10 * time.Second)
				if p.Topic == "feed/a" {
					continue
				}
				if string(p.Payload) != "after" {
					t.Fatalf("the reader got %v, want the message published after", p)
				}
				break
			}
		})
	}
}
