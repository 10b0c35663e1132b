package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// Errors of Migrate, besides ErrBadDataDir, ErrShardCountChanged and
// ErrInvalidOptions.
var (
	// ErrDataDirInUse: a shard of the data directory is open in another
	// process (or in this one): Badger's directory lock is taken.
	ErrDataDirInUse = errors.New("storage: data dir is in use by a running shardq")
	// ErrMigrationPending: the data directory holds a migration that was
	// interrupted after its point of no return, and Migrate was asked for
	// another one or for a dry run. Rerunning the interrupted migration
	// finishes it.
	ErrMigrationPending = errors.New("storage: shard migration half done")
	// ErrMigrationVerify: the new shards do not hold exactly the keys and
	// values of the old ones. Nothing was swapped.
	ErrMigrationVerify = errors.New("storage: migrated shards differ from the source")
)

// VerifyMode says how Migrate checks the new shards before it swaps them in.
type VerifyMode int

const (
	// VerifyFull checks every new shard's key count and checksum and that
	// every key sits in the shard the partition rule gives it, then reads
	// every key of the old shards again and looks it up, value and all, in
	// its new shard.
	VerifyFull VerifyMode = iota
	// VerifyChecksums does the first half of VerifyFull: counts, checksums
	// and placement of every key of the new shards.
	VerifyChecksums
)

// MigratePhase names a part of a migration in progress reports.
type MigratePhase string

// Phases of a migration, in order. A dry run has only PhaseScan.
const (
	PhaseScan    MigratePhase = "scan"    // a dry run reads the old shards
	PhaseCopy    MigratePhase = "copy"    // the old shards are copied into the new layout
	PhaseVerify  MigratePhase = "verify"  // the new shards are checked against the old
	PhaseSwap    MigratePhase = "swap"    // directories are renamed, SHARDS rewritten
	PhaseCleanup MigratePhase = "cleanup" // the old shards are removed
)

// MigrateProgress reports a migration's progress.
type MigrateProgress struct {
	Phase MigratePhase
	// Shard is the shard being read (scan, copy, the second half of a full
	// verify) or checked (verify), -1 in the swap and cleanup phases.
	Shard int
	// Keys and Bytes (key plus value) the phase has been through so far, all
	// shards together.
	Keys, Bytes int64
	// Note says what a swap or cleanup step did.
	Note string
}

// MigrateOptions configure Migrate.
type MigrateOptions struct {
	// Usually set.

	// DryRun reads every old shard and reports what would go where; it
	// writes nothing (see Migrate about shards not closed cleanly).
	DryRun bool
	// Progress, if set, is called on Migrate's goroutine every 100,000
	// keys, when a shard is done and at every swap and cleanup step.
	Progress func(MigrateProgress)
	// Verify is how the new shards are checked; the zero value is
	// VerifyFull.
	Verify VerifyMode

	// Fine tuning.

	// Storage tunes the Badger databases Migrate opens: the new shards are
	// created with it. Shards is ignored; zero fields take their defaults.
	Storage Options

	// interrupt, set by tests, is called after each step of a migration;
	// an error stops Migrate there with nothing undone, as a crash would.
	interrupt func(step string) error
}

// ShardStats sums the keys of one shard.
type ShardStats struct {
	Keys  int64
	Bytes int64 // keys plus values
	// Checksum is the sum of the CRC-64 (ECMA) of every entry (key length,
	// user meta, expiry, key, value): it does not depend on key order.
	Checksum uint64
}

func (s *ShardStats) add(size int, sum uint64) {
	s.Keys++
	s.Bytes += int64(size)
	s.Checksum += sum
}

// MigrateReport is what Migrate did, or with DryRun would do.
type MigrateReport struct {
	From, To int
	DryRun   bool
	// Sources holds what was read from each old shard and Targets what each
	// new shard received (or would). Both are nil when Migrate only
	// finished an interrupted migration or found nothing to do.
	Sources []ShardStats
	Targets []ShardStats
	// Keys and Bytes are the totals of Sources.
	Keys, Bytes int64
	// Queues counts the queue metadata records, Partitions the partitions
	// holding any key.
	Queues, Partitions int
	// Recovery says what Migrate found of an earlier, interrupted run and
	// what it did about it; empty when there was nothing.
	Recovery string
	Elapsed  time.Duration
}

// progressEvery is how many keys pass between two progress reports within
// a shard.
const progressEvery = 100_000

// Names in the data directory during a migration.
const (
	stagingPrefix = ".migrate-" // .migrate-M: the new shards until the swap
	retiredPrefix = ".old-"     // .old-N: the old shards after the swap
	markerPrefix  = "migrating from "
)

// Steps after which MigrateOptions.interrupt is called.
const (
	stepCopied    = "copied"    // the new shards are written and closed
	stepVerified  = "verified"  // and checked
	stepMarked    = "marked"    // SHARDS holds the marker
	stepOldMoved  = "old-moved" // every old shard is in .old-N
	stepNewMoved  = "new-moved" // every new shard is in place
	stepCommitted = "committed" // SHARDS holds the new count
)

// Migrate rewrites the data directory dir from from to to shards, so that
// Open with to shards finds every key where the queue looks for it: the
// messages, low watermark, trim point, floors, settle and delivery marks
// and dedup-ids of a partition in the shard queue.ShardOf gives it, queue
// metadata in shard 0. Nothing may have dir open: Migrate fails with ErrDataDirInUse
// if a shard's Badger lock is taken. An old shard holding a key that the
// partition rule puts in another shard, or a key of no known kind, fails
// the migration (ErrBadDataDir, ErrCorruptRecord) before the swap.
//
// Migrate never changes the old shards' keys and values. It copies them
// as they are, in whichever layout (see doc.go), into
// dir/.migrate-M/shard-NN, all but each shard's layout version: the new
// shards have none, and their first Open converts what an older shardq
// wrote and records the version. It closes and reopens the new shards and
// verifies them (opts.Verify). Only then does it replace SHARDS with a
// marker, "migrating from N to M shards; run shardq migrate-shards ...",
// which Open refuses as not a shard count, printing it: that is the point
// of no return. It renames the old shard directories to dir/.old-N/, the
// new ones to dir/shard-NN, writes SHARDS with the new count (a synced
// temporary file renamed over it, then a synced directory) and removes
// .old-N and .migrate-M.
//
// Wherever a crash stops it, the directory is in one of three states, and
// Migrate run again with the same from and to ends it without losing a
// key:
//
//   - SHARDS says N: the old shards are whole and in place. A .migrate-M
//     is an unfinished copy, a .old-K what a finished migration left. A
//     node starts with N shards and ignores both; Migrate removes them
//     (roll back) and migrates from the start.
//   - SHARDS holds the marker: the new shards are complete and verified,
//     each in .migrate-M or already in place, and the old ones in place or
//     in .old-N. A node refuses to start. Migrate resumes the renames
//     where they stopped (roll forward): every old shard goes out before
//     any new one comes in, so while .old-N lacks an old shard every
//     shard-NN in dir is old, and once it has them all every shard-NN is
//     new.
//   - SHARDS says M: the migration is done and a node starts with M
//     shards. Migrate reports nothing to do and removes what is left of
//     .old-N and .migrate-M.
//
// Asked for another migration, or for a dry run, while the marker is
// there, Migrate fails with ErrMigrationPending. ctx stops the copy and
// the verification; past the point of no return Migrate ignores it.
//
// A migration opens the old shards read-write, which holds their locks
// from before the copy until after the marker is written; a dry run opens
// them read-only. A shard whose process crashed cannot be opened
// read-only: Badger must first replay its log, which it does, opened
// read-write, as the node's next start would, in a dry run too. That
// changes no key or value.
func Migrate(ctx context.Context, dir string, from, to int, opts MigrateOptions) (MigrateReport, error) {
	start := time.Now()
	m, err := newMigration(dir, from, to, opts)
	if err != nil {
		return MigrateReport{}, err
	}
	err = m.run(ctx)
	m.report.Elapsed = time.Since(start)
	return m.report, err
}

// migration is one run of Migrate.
type migration struct {
	dir      string
	from, to int
	opts     MigrateOptions
	storage  Options // opts.Storage with its defaults
	staging  string  // dir/.migrate-M
	retired  string  // dir/.old-N
	report   MigrateReport
}

func newMigration(dir string, from, to int, opts MigrateOptions) (*migration, error) {
	for _, n := range []int{from, to} {
		if n < 1 || n > MaxShards {
			return nil, fmt.Errorf("%w: shard counts must be between 1 and %d, got %d", ErrInvalidOptions, MaxShards, n)
		}
	}
	if from == to {
		return nil, fmt.Errorf("%w: from and to are both %d shards", ErrInvalidOptions, from)
	}
	if opts.Verify != VerifyFull && opts.Verify != VerifyChecksums {
		return nil, fmt.Errorf("%w: unknown verify mode %d", ErrInvalidOptions, opts.Verify)
	}
	o := opts.Storage
	o.Shards = 0
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &migration{
		dir:     dir,
		from:    from,
		to:      to,
		opts:    opts,
		storage: o.withDefaults(),
		staging: filepath.Join(dir, stagingPrefix+strconv.Itoa(to)),
		retired: filepath.Join(dir, retiredPrefix+strconv.Itoa(from)),
		report:  MigrateReport{From: from, To: to, DryRun: opts.DryRun},
	}, nil
}

func (m *migration) run(ctx context.Context) error {
	content, err := os.ReadFile(filepath.Join(m.dir, shardsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s has no %s file: not a shardq data dir", ErrBadDataDir, m.dir, shardsFile)
	}
	if err != nil {
		return fmt.Errorf("storage: reading shard count: %w", err)
	}
	if n, mm, ok := parseMarker(content); ok {
		return m.resume(n, mm)
	}
	have, err := ShardCount(m.dir)
	if err != nil {
		return err
	}
	switch {
	case have == m.to:
		return m.alreadyDone()
	case have != m.from:
		return fmt.Errorf("%w: data dir %s has %d shards, not %d", ErrShardCountChanged, m.dir, have, m.from)
	}
	return m.migrate(ctx)
}

// resume finishes a migration interrupted after its point of no return.
func (m *migration) resume(from, to int) error {
	if from != m.from || to != m.to || m.opts.DryRun {
		return fmt.Errorf("%w: %s is being migrated from %d to %d shards; run shardq migrate-shards --data-dir %s --from %d --to %d (not a dry run) to finish",
			ErrMigrationPending, m.dir, from, to, m.dir, from, to)
	}
	if err := m.swap(); err != nil {
		return err
	}
	m.report.Recovery = fmt.Sprintf("finished an interrupted migration from %d to %d shards: its new shards were complete and verified", from, to)
	return nil
}

// alreadyDone handles a directory that has the target count already.
func (m *migration) alreadyDone() error {
	m.report.Recovery = fmt.Sprintf("data dir already has %d shards; nothing to do", m.to)
	if m.opts.DryRun {
		return nil
	}
	left, err := m.leftovers()
	if err == nil {
		err = m.removeLeftovers(left)
	}
	if err == nil && len(left) > 0 {
		m.report.Recovery += "; removed " + strings.Join(left, ", ")
	}
	return err
}

// migrate runs a whole migration from a directory with from shards.
func (m *migration) migrate(ctx context.Context) error {
	if err := m.checkShardDirs(); err != nil {
		return err
	}
	srcs, err := m.openSources()
	if err != nil {
		return err
	}
	defer closeAll(srcs) // the shards are closed before the swap; closing again does nothing

	// The locks are held: nothing else uses the directory.
	left, err := m.leftovers()
	if err != nil {
		return err
	}
	if len(left) > 0 {
		if m.opts.DryRun {
			m.report.Recovery = "found " + strings.Join(left, ", ") + " of an earlier, unfinished run; a migration removes them"
		} else {
			if err := m.removeLeftovers(left); err != nil {
				return err
			}
			m.report.Recovery = "removed " + strings.Join(left, ", ") + " of an earlier, unfinished run"
		}
	}

	if m.opts.DryRun {
		return m.copy(ctx, srcs, nil)
	}
	if err := m.copyToStaging(ctx, srcs); err != nil {
		return err
	}
	if err := m.step(stepCopied); err != nil {
		return err
	}
	if err := m.verify(ctx, srcs); err != nil {
		return err
	}
	if err := m.step(stepVerified); err != nil {
		return err
	}
	// The point of no return, written while the old shards are still
	// locked, so that no node can start on them past this point.
	if err := writeFileSynced(m.dir, shardsFile, marker(m.dir, m.from, m.to)); err != nil {
		return err
	}
	if err := m.step(stepMarked); err != nil {
		return err
	}
	err = closeAll(srcs)
	if err == nil {
		err = m.swap()
	}
	if err != nil {
		return fmt.Errorf("%w; the new shards are verified: run the migration again to finish it", err)
	}
	return nil
}

// checkShardDirs refuses a directory holding shard directories the old
// count does not account for: the swap would have to overwrite them.
func (m *migration) checkShardDirs() error {
	found, err := filepath.Glob(filepath.Join(m.dir, "shard-*"))
	if err != nil {
		return err
	}
	for _, p := range found {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "shard-"))
		if err != nil || n < 0 || n >= m.from || p != shardDir(m.dir, n) {
			return fmt.Errorf("%w: %s is not a shard of a %d-shard data dir", ErrBadDataDir, p, m.from)
		}
	}
	return nil
}

// openSources opens the old shards, read-only for a dry run.
func (m *migration) openSources() ([]*bdg.DB, error) {
	var dbs []*bdg.DB
	for i := range m.from {
		db, err := m.openSource(i)
		if err != nil {
			closeAll(dbs)
			return nil, err
		}
		dbs = append(dbs, db)
	}
	return dbs, nil
}

func (m *migration) openSource(i int) (*bdg.DB, error) {
	dir := shardDir(m.dir, i)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%w: shard %d: %w", ErrBadDataDir, i, err)
	}
	bo := m.badgerOptions(i, dir)
	if err := checkShard(i, dir, m.storage.AsyncWrites, m.storage.Logger.With("component", "badger", "shard", i)); err != nil {
		return nil, err
	}
	synced, _, err := readWitness(dir)
	if err != nil {
		return nil, err
	}
	db, err := m.openBadger(i, dir, bo)
	if err != nil {
		return nil, err
	}
	if _, err := checkSynced(db, dir, synced); err != nil {
		_ = db.Close() // the shard's damage is the error worth reporting
		return nil, err
	}
	return db, nil
}

// openBadger opens an old shard's database, read-only for a dry run when
// it was closed cleanly.
func (m *migration) openBadger(i int, dir string, bo bdg.Options) (*bdg.DB, error) {
	if m.opts.DryRun {
		db, err := bdg.Open(bo.WithReadOnly(true))
		if err == nil {
			return db, nil
		}
		if isLockError(err) {
			return nil, fmt.Errorf("%w: shard %d in %s is locked", ErrDataDirInUse, i, dir)
		}
		// Not closed cleanly: the log replay needs a read-write open.
	}
	db, err := bdg.Open(bo)
	if isLockError(err) {
		return nil, fmt.Errorf("%w: shard %d in %s is locked", ErrDataDirInUse, i, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("storage: opening shard %d in %s: %w", i, dir, err)
	}
	return db, nil
}

func (m *migration) badgerOptions(i int, dir string) bdg.Options {
	return badgerOptions(dir, m.storage, m.storage.Logger.With("component", "badger", "shard", i, "dir", dir))
}

// isLockError tells Badger's "Cannot acquire directory lock" apart. Badger
// formats the flock error into its message instead of wrapping it, so the
// message is all there is to test; TestMigrateRefusesDataDirInUse catches
// a change of wording.
func isLockError(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Cannot acquire directory lock")
}

// closeAll closes the databases; Badger's Close does nothing the second
// time.
func closeAll(dbs []*bdg.DB) error {
	var errs []error
	for _, db := range dbs {
		errs = append(errs, db.Close())
	}
	return errors.Join(errs...)
}

// copyToStaging copies the old shards into new ones in the staging
// directory and closes them.
func (m *migration) copyToStaging(ctx context.Context, srcs []*bdg.DB) error {
	if err := os.MkdirAll(m.staging, 0o755); err != nil {
		return fmt.Errorf("storage: creating %s: %w", m.staging, err)
	}
	dsts, err := m.openTargets(false)
	if err != nil {
		return err
	}
	defer closeAll(dsts)
	wbs := make([]*bdg.WriteBatch, len(dsts))
	for j, db := range dsts {
		wbs[j] = db.NewWriteBatch()
	}
	err = m.copy(ctx, srcs, wbs)
	for j, wb := range wbs {
		if err != nil {
			wb.Cancel()
			continue
		}
		if ferr := wb.Flush(); ferr != nil {
			err = fmt.Errorf("storage: writing new shard %d: %w", j, ferr)
		}
	}
	if err != nil {
		return err
	}
	if err := closeAll(dsts); err != nil {
		return fmt.Errorf("storage: closing new shards: %w", err)
	}
	for j := range m.to {
		if err := syncDir(shardDir(m.staging, j)); err != nil {
			return fmt.Errorf("storage: syncing new shard %d: %w", j, err)
		}
	}
	if err := syncDir(m.staging); err != nil {
		return fmt.Errorf("storage: syncing %s: %w", m.staging, err)
	}
	return nil
}

// openTargets opens the new shards in the staging directory.
func (m *migration) openTargets(readOnly bool) ([]*bdg.DB, error) {
	var dbs []*bdg.DB
	for j := range m.to {
		dir := shardDir(m.staging, j)
		db, err := bdg.Open(m.badgerOptions(j, dir).WithReadOnly(readOnly))
		if err != nil {
			closeAll(dbs)
			return nil, fmt.Errorf("storage: opening new shard %d in %s: %w", j, dir, err)
		}
		dbs = append(dbs, db)
	}
	return dbs, nil
}

// copy reads every old shard and, unless wbs is nil (a dry run), writes
// each entry to its new shard's batch. It fills the report's statistics.
func (m *migration) copy(ctx context.Context, srcs []*bdg.DB, wbs []*bdg.WriteBatch) error {
	phase := PhaseCopy
	if wbs == nil {
		phase = PhaseScan
	}
	rt := newRouter(m.from, m.to)
	m.report.Sources = make([]ShardStats, m.from)
	m.report.Targets = make([]ShardStats, m.to)
	var keys, size int64
	for i, src := range srcs {
		err := scanDB(ctx, src, func(item *bdg.Item, v []byte) error {
			k := item.Key()
			old, dst, err := rt.route(k)
			if err != nil {
				return fmt.Errorf("shard %d: %w", i, err)
			}
			if old != i {
				return fmt.Errorf("%w: shard %d holds key %q, which belongs in shard %d of %d",
					ErrBadDataDir, i, k, old, m.from)
			}
			n, sum := len(k)+len(v), entrySum(item, v)
			m.report.Sources[i].add(n, sum)
			m.report.Targets[dst].add(n, sum)
			if wbs != nil {
				e := bdg.NewEntry(item.KeyCopy(nil), bytes.Clone(v)).WithMeta(item.UserMeta())
				e.ExpiresAt = item.ExpiresAt()
				if err := wbs[dst].SetEntry(e); err != nil {
					return fmt.Errorf("storage: writing new shard %d: %w", dst, err)
				}
			}
			keys, size = keys+1, size+int64(n)
			if keys%progressEvery == 0 {
				m.progress(MigrateProgress{Phase: phase, Shard: i, Keys: keys, Bytes: size})
			}
			return nil
		})
		if err != nil {
			return err
		}
		m.progress(MigrateProgress{Phase: phase, Shard: i, Keys: keys, Bytes: size, Note: fmt.Sprintf("old shard %d read", i)})
	}
	m.report.Keys, m.report.Bytes = keys, size
	m.report.Queues, m.report.Partitions = rt.queues, len(rt.partitions)
	return nil
}

// verify reopens the new shards read-only and checks them against what
// the copy read, and with VerifyFull against the old shards again.
func (m *migration) verify(ctx context.Context, srcs []*bdg.DB) error {
	dsts, err := m.openTargets(true)
	if err != nil {
		return err
	}
	defer closeAll(dsts)
	rt := newRouter(m.from, m.to)
	var keys, size int64
	for j, dst := range dsts {
		var got ShardStats
		err := scanDB(ctx, dst, func(item *bdg.Item, v []byte) error {
			k := item.Key()
			_, want, err := rt.route(k)
			if err != nil {
				return fmt.Errorf("%w: new shard %d: %w", ErrMigrationVerify, j, err)
			}
			if want != j {
				return fmt.Errorf("%w: new shard %d holds key %q, which belongs in shard %d", ErrMigrationVerify, j, k, want)
			}
			got.add(len(k)+len(v), entrySum(item, v))
			keys, size = keys+1, size+int64(len(k)+len(v))
			if keys%progressEvery == 0 {
				m.progress(MigrateProgress{Phase: PhaseVerify, Shard: j, Keys: keys, Bytes: size})
			}
			return nil
		})
		if err != nil {
			return err
		}
		if want := m.report.Targets[j]; got != want {
			return fmt.Errorf("%w: new shard %d holds %d keys, %d bytes, checksum %016x; the old shards gave it %d keys, %d bytes, checksum %016x",
				ErrMigrationVerify, j, got.Keys, got.Bytes, got.Checksum, want.Keys, want.Bytes, want.Checksum)
		}
		m.progress(MigrateProgress{Phase: PhaseVerify, Shard: j, Keys: keys, Bytes: size, Note: fmt.Sprintf("new shard %d checked", j)})
	}
	if m.opts.Verify != VerifyFull {
		return nil
	}
	txns := make([]*bdg.Txn, len(dsts))
	for j, dst := range dsts {
		txns[j] = dst.NewTransaction(false)
		defer txns[j].Discard()
	}
	keys, size = 0, 0
	for i, src := range srcs {
		err := scanDB(ctx, src, func(item *bdg.Item, v []byte) error {
			k := item.Key()
			_, j, err := rt.route(k)
			if err != nil {
				return err
			}
			if err := lookUp(txns[j], item, v); err != nil {
				return fmt.Errorf("%w: key %q of old shard %d in new shard %d: %w", ErrMigrationVerify, k, i, j, err)
			}
			keys, size = keys+1, size+int64(len(k)+len(v))
			if keys%progressEvery == 0 {
				m.progress(MigrateProgress{Phase: PhaseVerify, Shard: i, Keys: keys, Bytes: size})
			}
			return nil
		})
		if err != nil {
			return err
		}
		m.progress(MigrateProgress{Phase: PhaseVerify, Shard: i, Keys: keys, Bytes: size, Note: fmt.Sprintf("every key of old shard %d found", i)})
	}
	return nil
}

// lookUp checks that txn holds the entry of item with value v.
func lookUp(txn *bdg.Txn, item *bdg.Item, v []byte) error {
	got, err := txn.Get(item.Key())
	if err != nil {
		return err
	}
	if got.UserMeta() != item.UserMeta() || got.ExpiresAt() != item.ExpiresAt() {
		return errors.New("meta or expiry differs")
	}
	return got.Value(func(gv []byte) error {
		if !bytes.Equal(gv, v) {
			return errors.New("value differs")
		}
		return nil
	})
}

// swap moves the verified new shards in place of the old ones and records
// the new count. SHARDS holds the marker. Each step is skipped when a
// previous run did it.
func (m *migration) swap() error {
	// The old shards go to .old-N, all of them before any new one comes
	// in: while .old-N lacks one of them, every shard-NN in dir is old.
	done, err := allShardsIn(m.retired, m.from)
	if err != nil {
		return err
	}
	if !done {
		if err := os.MkdirAll(m.retired, 0o755); err != nil {
			return fmt.Errorf("storage: creating %s: %w", m.retired, err)
		}
		for i := range m.from {
			cur, out := shardDir(m.dir, i), shardDir(m.retired, i)
			if err := m.moveOnce(cur, out, "old"); err != nil {
				return err
			}
		}
		if err := syncDirs(m.retired, m.dir); err != nil {
			return err
		}
	}
	if err := m.step(stepOldMoved); err != nil {
		return err
	}
	for j := range m.to {
		if err := m.moveOnce(shardDir(m.staging, j), shardDir(m.dir, j), "new"); err != nil {
			return err
		}
	}
	if err := syncDirs(m.staging, m.dir); err != nil {
		return err
	}
	if err := m.step(stepNewMoved); err != nil {
		return err
	}
	if err := writeFileSynced(m.dir, shardsFile, []byte(strconv.Itoa(m.to)+"\n")); err != nil {
		return err
	}
	m.progress(MigrateProgress{Phase: PhaseSwap, Shard: -1, Note: fmt.Sprintf("%s now says %d", shardsFile, m.to)})
	if err := m.step(stepCommitted); err != nil {
		return err
	}
	left, err := m.leftovers()
	if err != nil {
		return err
	}
	return m.removeLeftovers(left)
}

// moveOnce renames from to to unless an earlier run did; which says which
// layout the shard belongs to, for errors and progress.
func (m *migration) moveOnce(from, to, which string) error {
	fromOK, err := exists(from)
	if err != nil {
		return err
	}
	toOK, err := exists(to)
	if err != nil {
		return err
	}
	switch {
	case fromOK && toOK:
		return fmt.Errorf("%w: %s shard %s is also at %s; move one away by hand", ErrBadDataDir, which, from, to)
	case toOK:
		return nil // moved by an earlier run
	case !fromOK:
		return fmt.Errorf("%w: %s shard is in neither %s nor %s", ErrBadDataDir, which, from, to)
	}
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("storage: moving %s shard: %w", which, err)
	}
	m.progress(MigrateProgress{Phase: PhaseSwap, Shard: -1, Note: fmt.Sprintf("moved %s to %s", m.rel(from), m.rel(to))})
	return nil
}

// leftovers lists the staging and retired directories in the data
// directory, by name.
func (m *migration) leftovers() ([]string, error) {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("storage: reading %s: %w", m.dir, err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		for _, prefix := range []string{stagingPrefix, retiredPrefix} {
			n, ok := strings.CutPrefix(name, prefix)
			if ok && e.IsDir() && isCount(n) {
				out = append(out, name)
			}
		}
	}
	return out, nil
}

// removeLeftovers removes the named directories of the data directory.
func (m *migration) removeLeftovers(names []string) error {
	for _, name := range names {
		if err := os.RemoveAll(filepath.Join(m.dir, name)); err != nil {
			return fmt.Errorf("storage: removing %s: %w", name, err)
		}
		m.progress(MigrateProgress{Phase: PhaseCleanup, Shard: -1, Note: "removed " + name})
	}
	if len(names) == 0 {
		return nil
	}
	return syncDir(m.dir)
}

func (m *migration) step(name string) error {
	if m.opts.interrupt == nil {
		return nil
	}
	return m.opts.interrupt(name)
}

func (m *migration) progress(p MigrateProgress) {
	if m.opts.Progress != nil {
		m.opts.Progress(p)
	}
}

// rel returns path relative to the data directory, for messages.
func (m *migration) rel(path string) string {
	if r, err := filepath.Rel(m.dir, path); err == nil {
		return r
	}
	return path
}

// marker is what SHARDS holds between the point of no return and the end
// of the swap. Open refuses it (it is not a count) and prints it.
func marker(dir string, from, to int) []byte {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return fmt.Appendf(nil, "%s%d to %d shards; run shardq migrate-shards --data-dir %s --from %d --to %d to finish\n",
		markerPrefix, from, to, dir, from, to)
}

// parseMarker returns the counts of a marker.
func parseMarker(b []byte) (from, to int, ok bool) {
	rest, ok := bytes.CutPrefix(b, []byte(markerPrefix))
	if !ok {
		return 0, 0, false
	}
	f := strings.Fields(string(rest))
	if len(f) < 3 || f[1] != "to" || !isCount(f[0]) || !isCount(f[2]) {
		return 0, 0, false
	}
	from, _ = strconv.Atoi(f[0])
	to, _ = strconv.Atoi(f[2])
	return from, to, true
}

// isCount tells whether s is a shard count as written in names and files.
func isCount(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= MaxShards && strconv.Itoa(n) == s
}

func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("storage: %w", err)
	}
	return true, nil
}

// allShardsIn tells whether dir holds shard-00 to shard-(n-1).
func allShardsIn(dir string, n int) (bool, error) {
	for i := range n {
		ok, err := exists(shardDir(dir, i))
		if !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

func syncDirs(dirs ...string) error {
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return fmt.Errorf("storage: syncing %s: %w", d, err)
		}
	}
	return nil
}

// scanDB calls fn with every live entry of db and its value, in key order,
// from one snapshot, but the layout version and the commit number
// (isDatabaseKey): they belong to the database, not to a partition, and
// are not copied. The item and value
// are valid only during the call.
func scanDB(ctx context.Context, db *bdg.DB, fn func(item *bdg.Item, v []byte) error) error {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(bdg.DefaultIteratorOptions)
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		item := it.Item()
		if isDatabaseKey(item.Key()) {
			continue
		}
		if err := item.Value(func(v []byte) error { return fn(item, v) }); err != nil {
			return err
		}
	}
	return ctx.Err()
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// entrySum is the CRC-64 of an entry: key length, user meta, expiry, key,
// value.
func entrySum(item *bdg.Item, v []byte) uint64 {
	k := item.Key()
	var head [17]byte
	binary.BigEndian.PutUint64(head[:8], uint64(len(k)))
	head[8] = item.UserMeta()
	binary.BigEndian.PutUint64(head[9:], item.ExpiresAt())
	h := crc64.Update(0, crcTable, head[:])
	h = crc64.Update(h, crcTable, k)
	return crc64.Update(h, crcTable, v)
}

// router places keys by the partition rule, under the old and the new
// shard count. Keys come sorted, so consecutive keys mostly share their
// partition: the last one's shards are kept.
type router struct {
	from, to   int
	last       []byte // sep queue sep partition of the last partition key
	lastFrom   int
	lastTo     int
	queues     int
	partitions map[string]struct{}
}

func newRouter(from, to int) *router {
	return &router{from: from, to: to, partitions: map[string]struct{}{}}
}

// route returns the shard of k under the old and the new count.
func (r *router) route(k []byte) (from, to int, err error) {
	if len(k) < 3 || k[1] != sep {
		return 0, 0, fmt.Errorf("%w: key %q fits no key kind", ErrCorruptRecord, k)
	}
	rest := k[2:]
	if k[0] == kindQueue {
		if bytes.IndexByte(rest, sep) >= 0 {
			return 0, 0, fmt.Errorf("%w: queue meta key %q", ErrCorruptRecord, k)
		}
		r.queues++
		return 0, 0, nil
	}
	if k[0] == kindSession { // sessions.go: shard 0, whatever the count
		if !validSessionKey(k) {
			return 0, 0, fmt.Errorf("%w: session key %q", ErrCorruptRecord, k)
		}
		return 0, 0, nil
	}
	i := bytes.IndexByte(rest, sep)
	if i <= 0 || len(rest) < i+1+4 || !validTail(k[0], rest[i+5:]) {
		return 0, 0, fmt.Errorf("%w: key %q fits no key kind", ErrCorruptRecord, k)
	}
	part := k[1 : 2+i+5]
	if bytes.Equal(part, r.last) {
		return r.lastFrom, r.lastTo, nil
	}
	q, p := string(rest[:i]), int(binary.BigEndian.Uint32(rest[i+1:]))
	r.last = append(r.last[:0], part...)
	r.lastFrom, r.lastTo = queue.ShardOf(q, p, r.from), queue.ShardOf(q, p, r.to)
	r.partitions[string(part)] = struct{}{}
	return r.lastFrom, r.lastTo, nil
}

// validTail checks what follows the partition in a key of the kind. A
// kind missing here fails the migration rather than risk misplacing keys.
func validTail(kind byte, tail []byte) bool {
	switch kind {
	case kindMessage:
		return len(tail) == 16 || len(tail) == 8 // an entry, or a message of formatMessages
	case kindLow, kindTrim:
		return len(tail) == 0
	case kindFloor:
		return bytes.IndexByte(tail, sep) < 0
	case kindSettled, kindDelivery:
		return len(tail) >= 9 && bytes.IndexByte(tail, sep) == len(tail)-9
	case kindDedup:
		return len(tail) > 0
	}
	return false
}
