package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// shardsFile names the file in the data directory that records the shard
// count.
const shardsFile = "SHARDS"

// Store is a node's storage: Shards independent Badger databases under one
// data directory. It is safe for concurrent use.
type Store struct {
	dir    string
	shards []*Shard

	stop      chan struct{}  // closed by Close to end the shards' loops
	loops     sync.WaitGroup // value-log GC and recording synced commits
	closeOnce sync.Once
	closeErr  error
}

var (
	_ queue.Store = (*Store)(nil)
	_ queue.Shard = (*Shard)(nil)
)

// Open opens the store in dir, creating the directory and its shards on
// first use. The shard count is recorded in dir/SHARDS; opening with
// another count fails with an error wrapping ErrShardCountChanged.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("storage: creating data dir: %w", err)
	}
	if err := claimShardCount(dir, opts.Shards); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, stop: make(chan struct{})}
	for i := range opts.Shards {
		sh, err := openShard(i, shardDir(dir, i), opts)
		if err != nil {
			for _, open := range s.shards {
				_ = open.close() // the open error is the one worth reporting
			}
			return nil, err
		}
		s.shards = append(s.shards, sh)
	}
	for _, sh := range s.shards {
		if opts.ValueLogGCInterval > 0 {
			s.loops.Go(func() {
				every(opts.ValueLogGCInterval, s.stop, func() { sh.runGC(opts.ValueLogGCDiscardRatio, s.stop) })
			})
		}
		s.loops.Go(func() { sh.witnessLoop(opts.WitnessInterval, s.stop) })
	}
	if abs, err := filepath.Abs(dir); err == nil && opts.LogResident >= 0 {
		s.loops.Go(func() { s.releaseLoop(abs, opts.LogResident) })
	}
	return s, nil
}

// every calls fn every interval until stop is closed.
func every(interval time.Duration, stop <-chan struct{}, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// Shards returns the store's shards, shard i at index i.
func (s *Store) Shards() []queue.Shard {
	out := make([]queue.Shard, len(s.shards))
	for i, sh := range s.shards {
		out[i] = sh
	}
	return out
}

// Shard returns shard i.
func (s *Store) Shard(i int) *Shard { return s.shards[i] }

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// Close stops the shards' loops and closes every shard, waiting for reads
// and writes in progress. Calls after the first return the first's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.loops.Wait()
		var errs []error
		for _, sh := range s.shards {
			errs = append(errs, sh.close())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// shardDir is dir/shard-NN.
func shardDir(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("shard-%02d", i))
}

// ShardCount returns the shard count recorded in a data directory. It
// returns an error wrapping fs.ErrNotExist for a directory never opened.
func ShardCount(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, shardsFile))
	if err != nil {
		return 0, fmt.Errorf("storage: reading shard count: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 1 || n > MaxShards {
		return 0, fmt.Errorf("%w: %s holds %q, not a shard count", ErrBadDataDir, filepath.Join(dir, shardsFile), b)
	}
	return n, nil
}

// claimShardCount checks the recorded shard count against want, or records
// want in a directory that has none yet.
func claimShardCount(dir string, want int) error {
	have, err := ShardCount(dir)
	switch {
	case err == nil && have != want:
		return fmt.Errorf("%w: data dir %s has %d shards, config asks for %d; run shardq migrate-shards",
			ErrShardCountChanged, dir, have, want)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if existing, _ := filepath.Glob(filepath.Join(dir, "shard-*")); len(existing) > 0 {
		return fmt.Errorf("%w: %s has shard directories but no %s file", ErrBadDataDir, dir, shardsFile)
	}
	return writeFileSynced(dir, shardsFile, []byte(strconv.Itoa(want)+"\n"))
}

// writeFileSynced writes dir/name through a synced temporary file and a
// rename, then syncs dir, so that the file is either whole or absent after
// a crash.
func writeFileSynced(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return fmt.Errorf("storage: writing %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("storage: writing %s: %w", name, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// openShard opens one shard's Badger database and brings its layout up to
// date (upgrade). Before Badger opens the directory, its logs are checked
// (checkShardLogs); after, the shard must hold every commit its SYNCED
// file says was synced (witness.go). Either refuses a damaged shard with
// an error matching ErrDamaged.
func openShard(i int, dir string, o Options) (*Shard, error) {
	log := o.Logger.With("component", "badger", "shard", i)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("storage: creating %s: %w", dir, err)
	}
	if err := checkShard(i, dir, o.AsyncWrites, log); err != nil {
		return nil, err
	}
	w, err := openWitness(dir)
	if err != nil {
		return nil, err
	}
	db, err := bdg.Open(badgerOptions(dir, o, log))
	if err != nil {
		_ = w.close()
		return nil, fmt.Errorf("storage: opening shard %d in %s: %w", i, dir, err)
	}
	seq, err := checkSynced(db, dir, w.written)
	if err == nil {
		err = upgrade(db, log)
		if err != nil {
			err = fmt.Errorf("storage: opening shard %d in %s: %w", i, dir, err)
		}
	}
	if err != nil {
		_ = db.Close() // the first error is the one worth reporting
		_ = w.close()
		return nil, err
	}
	sh := &Shard{id: i, db: db, log: log, async: o.AsyncWrites, tails: map[partKey]tail{}, lows: map[partKey]uint64{},
		seq: seq, witness: w, grew: make(chan struct{}, 1)}
	sh.synced.Store(seq) // checkShard synced the logs Badger replayed
	return sh, nil
}

// checkShard runs checkShardLogs on shard i in dir.
func checkShard(i int, dir string, async bool, log *slog.Logger) error {
	err := checkShardLogs(dir, async, log)
	if errors.Is(err, errDirLocked) {
		return fmt.Errorf("%w: shard %d in %s is locked", ErrDataDirInUse, i, dir)
	}
	return err
}

// releaseLoop hands back the pages of Badger's files the node no longer
// needs resident (releaseLogPages) after writes, and every releaseIdle
// while none come (compactions write tables after the writes that caused
// them, and reads of a backlog map its pages in): an idle node does not
// read its mappings four times a second.
func (s *Store) releaseLoop(dir string, keep int64) {
	var seen uint64
	var idle time.Duration
	tops := residentTops{}
	every(releaseInterval, s.stop, func() {
		var writes uint64
		for _, sh := range s.shards {
			writes += sh.writes.Load()
		}
		if writes == seen && idle < releaseIdle {
			idle += releaseInterval
			return
		}
		seen, idle = writes, 0
		releaseLogPages(dir, keep, tops)
	})
}

// releaseIdle is how often an idle node's pages are handed back.
const releaseIdle = 10 * time.Second

// releaseInterval is how often the pages of Badger's files a node no
// longer needs resident are handed back to the kernel (releaseLogPages):
// at 65k msgs/s a shard writes about 3 MB of logs in it.
const releaseInterval = 250 * time.Millisecond
