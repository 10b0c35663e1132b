package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// serve runs shardq serve until ctx is done, then drains the node. It
// returns 0 after a clean shutdown, 1 when the node failed and 2 for an
// invalid configuration, which it reports whole before opening anything.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout)
		return 0
	}
	if err != nil {
		// One line per error: a config file may have several.
		for line := range strings.Lines(err.Error()) {
			fmt.Fprintf(stderr, "shardq: %s", strings.TrimSuffix(line, "\n")+"\n")
		}
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
