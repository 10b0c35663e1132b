// Command shardq-bench is the load generator of package bench:
//
//	shardq-bench cycle --broker 127.0.0.1:1883 --vs 127.0.0.1:1884 --json
//
// Run it without arguments for the usage.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardq/shardq/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := bench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
