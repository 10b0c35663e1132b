package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/shardq/shardq/storage/badger"
)

const migrateUsage = `usage: shardq migrate-shards --data-dir DIR --from N --to M [--dry-run] [--verify full|checksums]

Rewrites a stopped node's data directory from N to M storage shards, so that
the node can start with storage.shards: M. The old shards are left untouched
until the new ones are written and verified. If the command is interrupted,
run it again with the same flags: it finishes or starts over without losing
data. --dry-run reads everything and reports what would go where, writing
nothing.
`

// migrateShards runs shardq migrate-shards. It returns 0 on success, 1
// when the migration failed and 2 for bad flags.
func migrateShards(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("migrate-shards", migrateUsage)
	flags := c.flags
	dir := flags.String("data-dir", "", "`DIR` holding the node's data (required)")
	from := flags.Int("from", 0, "shard `COUNT` the data dir has now (required)")
	to := flags.Int("to", 0, "shard `COUNT` to migrate to (required)")
	dryRun := flags.Bool("dry-run", false, "read everything and report what would move; write nothing")
	verify := flags.String("verify", "full", "`MODE` of the check before the swap: full (every key looked up again) or checksums")
	if code := c.parseNoArgs(args, func(string) string { return "" }, stdout, stderr); code >= 0 {
		return code
	}
	switch {
	case *dir == "":
		return c.fail(stderr, "--data-dir is required")
	case *from == 0 || *to == 0:
		return c.fail(stderr, "--from and --to are required")
	}
	opts := badger.MigrateOptions{DryRun: *dryRun}
	switch *verify {
	case "full":
		opts.Verify = badger.VerifyFull
	case "checksums":
		opts.Verify = badger.VerifyChecksums
	default:
		return c.fail(stderr, "--verify must be full or checksums, got %q", *verify)
	}
	opts.Storage = badger.DefaultOptions()
	opts.Storage.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts.Progress = func(p badger.MigrateProgress) {
		line := fmt.Sprintf("%s: shard %d", p.Phase, p.Shard)
		if p.Note != "" {
			line = fmt.Sprintf("%s: %s", p.Phase, p.Note)
		}
		if p.Shard >= 0 {
			line += fmt.Sprintf(" (%d keys, %s so far)", p.Keys, formatBytes(p.Bytes))
		}
		fmt.Fprintln(stderr, line)
	}

	rep, err := badger.Migrate(ctx, *dir, *from, *to, opts)
	if err != nil {
		fmt.Fprintf(stderr, "shardq migrate-shards: %v\n", err)
		switch {
		case errors.Is(err, badger.ErrDataDirInUse):
			fmt.Fprintln(stderr, "stop the node before migrating its data dir")
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(stderr, "interrupted; run the same command again to finish or start over")
		}
		return 1
	}
	writeMigrateReport(stdout, *dir, rep)
	return 0
}

// writeMigrateReport writes the summary of a migration.
func writeMigrateReport(w io.Writer, dir string, rep badger.MigrateReport) {
	if rep.Recovery != "" {
		fmt.Fprintf(w, "%s: %s\n", dir, rep.Recovery)
	}
	if rep.Sources == nil {
		return
	}
	verb := "migrated"
	if rep.DryRun {
		verb = "dry run: would migrate"
	}
	fmt.Fprintf(w, "%s %s from %d to %d shards in %s: %d keys, %s; %d queues, %d partitions\n",
		verb, dir, rep.From, rep.To, rep.Elapsed.Round(time.Millisecond), rep.Keys, formatBytes(rep.Bytes), rep.Queues, rep.Partitions)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tshard\tkeys\tbytes\tchecksum\t")
	for i, s := range rep.Sources {
		fmt.Fprintf(tw, "old\t%d\t%d\t%s\t%016x\t\n", i, s.Keys, formatBytes(s.Bytes), s.Checksum)
	}
	for j, s := range rep.Targets {
		fmt.Fprintf(tw, "new\t%d\t%d\t%s\t%016x\t\n", j, s.Keys, formatBytes(s.Bytes), s.Checksum)
	}
	_ = tw.Flush() // w's errors are the caller's to see
	if !rep.DryRun {
		fmt.Fprintf(w, "start the node with storage.shards: %d\n", rep.To)
	}
}

// formatBytes writes n in B, KiB, MiB or GiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, s := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
