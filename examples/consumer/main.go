// Command consumer consumes a shardq queue in a consumer group with
// paho.golang (MQTT 5) and manual acknowledgement: a message is settled only
// when the handler is done with it. A message whose handler fails is not
// acknowledged; shardq delivers it again when the lease (ack_timeout) runs
// out, or at once if the consumer disconnects.
//
//	go run ./examples/consumer -broker 127.0.0.1:1883 -queue orders -group billing
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"

	"github.com/eclipse/paho.golang/paho"
)

func main() {
	addr := flag.String("broker", "127.0.0.1:1883", "shardq MQTT address")
	queue := flag.String("queue", "orders", "queue name")
	group := flag.String("group", "billing", "consumer group")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	conn, err := net.Dial("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var c *paho.Client
	c = paho.NewClient(paho.ClientConfig{
		Conn:                       conn,
		ClientID:                   "example-consumer",
		EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) {
				p := r.Packet
				fmt.Printf("%s msg-id=%s delivery-count=%s: %s\n", p.Topic,
					p.Properties.User.Get("msg-id"), p.Properties.User.Get("delivery-count"), p.Payload)
				// Process the message here; ack only when it is done.
				if err := c.Ack(p); err != nil {
					log.Printf("ack: %v", err)
				}
				return true, nil
			},
		},
	})
	// Receive Maximum caps how many unsettled messages shardq sends us.
	rm := uint16(16)
	if _, err := c.Connect(ctx, &paho.Connect{CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}}); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: fmt.Sprintf("$share/%s/$queue/%s/#", *group, *queue), QoS: 1},
	}}); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	_ = c.Disconnect(&paho.Disconnect{})
}
