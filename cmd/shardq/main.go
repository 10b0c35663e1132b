// Command shardq runs an MQTT broker with durable, partitioned $queue/ topics.
//
//	shardq serve [--config FILE] [--data-dir DIR] [--mqtt ADDR] [--ws ADDR] [--http ADDR] [--node-id ID]
//	shardq bench SCENARIO --broker HOST:PORT [...]
//	shardq migrate-shards --data-dir DIR --from N --to M [--dry-run]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shardq/shardq/bench"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

const usage = `usage: shardq <command> [flags]

commands:
  serve   run a node (shardq serve --help for its flags)
  bench   run a load scenario against any MQTT broker (shardq bench --help)
  migrate-shards
          rewrite a stopped node's data directory to another storage.shards
  queues, queue, group, dlq
          inspect and steer a running node's queues (shardq queue --help)
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "bench":
		return bench.Main(ctx, args[1:], stdout, stderr)
	case "migrate-shards":
		return migrateShards(ctx, args[1:], stdout, stderr)
	case "queues", "queue", "group", "dlq":
		return adminCommand(ctx, args, stdout, stderr, os.Getenv)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "shardq: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	cfg, err := config.Load(args, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "shardq: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	b, err := broker.New(cfg, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	served := make(chan error, 1)
	go func() { served <- b.Serve() }()
	select {
	case err := <-served:
		log.Error("stopped", "err", err)
		_ = b.Shutdown(context.Background())
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Shutdown(sctx); err != nil {
		log.Error("shutdown incomplete", "err", err)
		return 1
	}
	if err := <-served; err != nil && !errors.Is(err, broker.ErrServerClosed) {
		return 1
	}
	return 0
}
