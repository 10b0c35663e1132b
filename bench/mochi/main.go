// Command mochi is a vanilla mochi-mqtt v2 broker: no queue hooks, every
// client allowed, one TCP listener. It is the reference broker that shardq
// is compared against:
//
//	go run ./bench/mochi --addr 127.0.0.1:1884 &
//	bench cycle --broker 127.0.0.1:1883 --vs 127.0.0.1:1884
//
// A subscriber without Receive Maximum (MQTT 3.1.1) gets every message
// mochi has for it queued on its connection, up to mochi's
// MaximumClientWritesPending packets and MaximumInflight unacknowledged
// QoS 1 messages (8,192 each by default); past either mochi drops messages
// to it, QoS 1 included. --client-queue raises both (at most 65,535, the
// packet ids) when such a subscriber is measured at full speed.
//
// The broker omits the publish's user properties from its acknowledgements
// (Compatibilities.NoInheritedPropertiesOnAck), which paho clients require.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:1884", "TCP listen address")
	verbose := flag.Bool("v", false, "log connections and warnings (default: errors only)")
	clientQueue := flag.Int("client-queue", int(mqtt.NewDefaultServerCapabilities().MaximumClientWritesPending),
		"packets queued, and QoS 1 messages unacknowledged, per connection before mochi drops messages to it (at most 65535)")
	flag.Parse()
	if *clientQueue < 1 || *clientQueue > 65535 {
		fmt.Fprintf(os.Stderr, "mochi: --client-queue %d: want 1 to 65535\n", *clientQueue)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *verbose, *clientQueue); err != nil {
		fmt.Fprintln(os.Stderr, "mochi:", err)
		os.Exit(1)
	}
}

// run serves MQTT on addr until ctx ends.
func run(ctx context.Context, addr string, verbose bool, clientQueue int) error {
	level := slog.LevelError // mochi warns once per dropped message: costly under overload
	if verbose {
		level = slog.LevelInfo
	}
	caps := mqtt.NewDefaultServerCapabilities()
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	caps.MaximumClientWritesPending = int32(clientQueue)
	caps.MaximumInflight = uint16(clientQueue)
	server := mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	})
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		return fmt.Errorf("add auth hook: %w", err)
	}
	if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := server.Serve(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintf(os.Stderr, "mochi: listening on %s (pid %d)\n", addr, os.Getpid())
	<-ctx.Done()
	if err := server.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
