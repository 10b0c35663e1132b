package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

func storeOptions(shards int) badger.Options {
	o := badger.DefaultOptions()
	o.Shards = shards
	o.Logger = slog.New(slog.DiscardHandler)
	o.MemTableSize = 4 << 20
	return o
}

// fillDataDir stores messages in two queues of a new data directory with
// the given shard count, through queue.Manager, and has a group ack some.
// It returns how many messages are stored.
func fillDataDir(t *testing.T, dir string, shards int) int {
	t.Helper()
	st, err := badger.Open(dir, storeOptions(shards))
	if err != nil {
		t.Fatal(err)
	}
	o := queue.DefaultManagerOptions()
	o.Store = st
	o.RetainEvery = time.Hour
	m, err := queue.NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range 50 {
		for _, q := range []string{"orders", "events"} {
			done := make(chan error, 1)
			m.Publish(context.Background(), q, &queue.Message{Key: fmt.Sprint(i), Payload: fmt.Appendf(nil, "%s %d", q, i)},
				func(err error) { done <- err })
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return n
}

// countMessages opens dir with the given shard count and counts the
// messages where the queue would read them.
func countMessages(t *testing.T, dir string, shards int) int {
	t.Helper()
	st, err := badger.Open(dir, storeOptions(shards))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	metas, err := st.Shards()[0].Queues()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, meta := range metas {
		for p := range meta.Partitions {
			msgs, err := st.Shards()[queue.ShardOf(meta.Name, p, shards)].Read(meta.Name, p, 0, math.MaxUint64, math.MaxInt32)
			if err != nil {
				t.Fatal(err)
			}
			n += len(msgs)
		}
	}
	return n
}

func runMigrate(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(append([]string{"migrate-shards"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestMigrateShardsCommand(t *testing.T) {
	dir := t.TempDir()
	stored := fillDataDir(t, dir, 2)

	code, out, errs := runMigrate("--data-dir", dir, "--from", "2", "--to", "4", "--dry-run")
	if code != 0 {
		t.Fatalf("dry run exited %d: %s", code, errs)
	}
	if !strings.Contains(out, "dry run: would migrate "+dir+" from 2 to 4 shards") || strings.Count(out, "new  ") != 4 {
		t.Errorf("dry run summary:\n%s", out)
	}
	if n, err := badger.ShardCount(dir); err != nil || n != 2 {
		t.Fatalf("after a dry run ShardCount = %d, %v; want 2", n, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".migrate-*")); len(m) > 0 {
		t.Errorf("a dry run wrote %v", m)
	}

	code, out, errs = runMigrate("--data-dir", dir, "--from", "2", "--to", "4")
	if code != 0 {
		t.Fatalf("migrate-shards exited %d: %s", code, errs)
	}
	for _, want := range []string{"migrated " + dir + " from 2 to 4 shards", "start the node with storage.shards: 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"copy: old shard 0 read", "verify: new shard 3 checked", "swap: moved shard-00 to .old-2", "swap: SHARDS now says 4", "cleanup: removed .old-2"} {
		if !strings.Contains(errs, want) {
			t.Errorf("progress lacks %q:\n%s", want, errs)
		}
	}
	if _, err := badger.Open(dir, storeOptions(2)); !errors.Is(err, badger.ErrShardCountChanged) {
		t.Errorf("Open with 2 shards after the migration: %v", err)
	}
	if n := countMessages(t, dir, 4); n != stored {
		t.Errorf("%d messages after migrating, want %d", n, stored)
	}

	// Again: nothing to do.
	code, out, errs = runMigrate("--data-dir", dir, "--from", "2", "--to", "4")
	if code != 0 || !strings.Contains(out, "already has 4 shards") {
		t.Errorf("second run exited %d:\n%s%s", code, out, errs)
	}
}

func TestMigrateShardsCommandFails(t *testing.T) {
	dir := t.TempDir()
	fillDataDir(t, dir, 2)

	t.Run("in use", func(t *testing.T) {
		st, err := badger.Open(dir, storeOptions(2))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		code, _, errs := runMigrate("--data-dir", dir, "--from", "2", "--to", "4")
		if code != 1 || !strings.Contains(errs, "data dir is in use by a running shardq") {
			t.Errorf("exit %d, stderr:\n%s", code, errs)
		}
	})
	t.Run("wrong from", func(t *testing.T) {
		code, _, errs := runMigrate("--data-dir", dir, "--from", "3", "--to", "4")
		if code != 1 || !strings.Contains(errs, "has 2 shards, not 3") {
			t.Errorf("exit %d, stderr:\n%s", code, errs)
		}
	})
	usage := []struct {
		name string
		args []string
		want string
	}{
		{"no data dir", []string{"--from", "2", "--to", "4"}, "--data-dir is required"},
		{"no to", []string{"--data-dir", dir, "--from", "2"}, "--from and --to are required"},
		{"bad verify", []string{"--data-dir", dir, "--from", "2", "--to", "4", "--verify", "some"}, "--verify must be full or checksums"},
		{"argument", []string{"--data-dir", dir, "--from", "2", "--to", "4", "now"}, `unexpected argument "now"`},
		{"bad flag", []string{"--shards", "4"}, "flag provided but not defined"},
	}
	for _, c := range usage {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runMigrate(c.args...)
			if code != 2 || !strings.Contains(errs, c.want) || !strings.Contains(errs, "usage: shardq migrate-shards") {
				t.Errorf("exit %d, stderr:\n%s", code, errs)
			}
		})
	}
	if n, err := badger.ShardCount(dir); err != nil || n != 2 {
		t.Errorf("ShardCount = %d, %v; want 2", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".migrate-4")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed run left .migrate-4: %v", err)
	}
}
