// Command producer publishes messages to a shardq queue with paho.golang
// (MQTT 5). Each publish returns once shardq has stored it durably.
//
//	go run ./examples/producer -broker 127.0.0.1:1883 -queue orders -n 10
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

func main() {
	addr := flag.String("broker", "127.0.0.1:1883", "shardq MQTT address")
	queue := flag.String("queue", "orders", "queue name")
	n := flag.Int("n", 10, "messages to publish")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := net.Dial("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "example-producer"})
	if _, err := c.Connect(ctx, &paho.Connect{CleanStart: true, KeepAlive: 30}); err != nil {
		log.Fatal(err)
	}
	defer c.Disconnect(&paho.Disconnect{})

	for i := 0; i < *n; i++ {
		customer := fmt.Sprintf("customer-%d", i%3)
		resp, err := c.Publish(ctx, &paho.Publish{
			Topic:   "$queue/" + *queue,
			QoS:     1,
			Payload: []byte(fmt.Sprintf(`{"order":%d,"customer":%q}`, i, customer)),
			// Messages with the same key are delivered in order.
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: customer}}},
		})
		if err != nil {
			log.Fatalf("publish %d: %v", i, err)
		}
		if resp.ReasonCode != 0 {
			log.Fatalf("publish %d refused: reason %#x %s", i, resp.ReasonCode, resp.Properties.ReasonString)
		}
		fmt.Printf("stored order %d (key %s)\n", i, customer)
	}
}
