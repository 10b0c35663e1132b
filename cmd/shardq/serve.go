package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// serve runs shardq serve until ctx is done, then drains the node. It
// returns 0 after a clean shutdown, 1 when the node failed and 2 for an
// invalid configuration, which it reports whole before opening anything.
//
// SIGHUP reads the configuration again (the same flags, file and
// environment) and reloads the users, the ACL, the admin token and the
// certificates; an invalid configuration is logged and changes nothing.
// It never stops the node.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
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
	for stop := false; !stop; {
		select {
		case err := <-served:
			log.Error("stopped", "err", err)
			_ = b.Shutdown(context.Background())
			fmt.Fprintf(stderr, "shardq: %v\n", err) // the reason, plain, as the last line
			return 1
		case <-hup:
			log.Info("SIGHUP: reloading users, ACL and certificates")
			_ = b.Reload(func() (*config.Config, error) { return config.Load(args, os.Getenv) }) // logs its outcome
		case <-ctx.Done():
			stop = true
		}
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
