package badger

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// MaxShards bounds Options.Shards: shard directories are numbered with two
// digits.
const MaxShards = 99

// Options configure a Store. A zero field takes its default; DefaultOptions
// returns every default.
type Options struct {
	// Usually set.

	// Shards is the number of independent Badger databases, 1 to MaxShards.
	// It is fixed when the data directory is created.
	Shards int `yaml:"shards"`
	// Logger receives the store's and Badger's warnings and errors; Badger's
	// info messages go to it at debug level. nil means slog.Default().
	Logger *slog.Logger `yaml:"-"`
	// AsyncWrites lets Write return before its batch is fsynced when its
	// sync flag is false (queues with durability async). A Write with sync
	// true is still durable when it returns: it syncs the logs explicitly.
	// Off (the default), every commit fsyncs in Badger itself.
	AsyncWrites bool `yaml:"async_writes"`

	// Fine tuning.

	// ValueLogGCInterval is how often each shard rewrites value-log files
	// that are mostly garbage. Negative turns value-log GC off.
	ValueLogGCInterval time.Duration `yaml:"value_log_gc_interval"`
	// ValueLogGCDiscardRatio is the share of garbage, in (0, 1), past which
	// a value-log file is rewritten.
	ValueLogGCDiscardRatio float64 `yaml:"value_log_gc_discard_ratio"`
	// MemTableSize is the size of one Badger memtable. It also bounds one
	// Badger transaction at 15% of it; a larger batch is split.
	MemTableSize int64 `yaml:"memtable_size"`
	// NumMemtables is how many memtables a shard keeps before it stalls
	// writes to flush them.
	NumMemtables int `yaml:"num_memtables"`
	// ValueThreshold is the size from which a value, such as an entry of
	// messages (one partition's appends of one Write), lives in the value
	// log instead of the LSM tree. Must not exceed 15% of MemTableSize.
	ValueThreshold int64 `yaml:"value_threshold"`
	// BlockCacheSize is each shard's cache of LSM blocks. Badger advises
	// none when neither compression nor encryption is on, as here.
	BlockCacheSize int64 `yaml:"block_cache_size"`
	// ValueLogFileSize is the size of one value-log file, 1 MiB to 2 GiB;
	// value-log GC rewrites whole files.
	ValueLogFileSize int64 `yaml:"value_log_file_size"`
	// LogResident is how much of each value log and memtable log,
	// counted back from its newest write, stays resident: after writes,
	// four times a second (every 10 s while none come), the older pages of
	// those logs, and all but the index at the end of each LSM table, are
	// handed back to the kernel (Linux only),
	// so that a node's memory does not grow with what it wrote or holds.
	// Negative keeps every page, as Badger alone does.
	LogResident int64 `yaml:"log_resident"`
	// NumCompactors is the number of compaction goroutines of each shard;
	// 0 or at least 2.
	NumCompactors int `yaml:"num_compactors"`
	// WitnessInterval is how often each shard records the number of its
	// last synced commit in its SYNCED file, with an fsync of its own, if
	// it changed. Open refuses a shard that lost commits synced this long
	// before a crash (see "Damage" in the package doc).
	WitnessInterval time.Duration `yaml:"witness_interval"`
}

// DefaultOptions returns the defaults: 4 shards, value-log GC every minute
// at a discard ratio of 0.5, 4 MiB memtables (2 of them), values of 1 KiB
// or more in the value log, no block cache, 256 MiB value-log files, the
// newest 4 MiB of each log resident, 2 compactors per shard, and the last
// synced commit recorded every 100 ms.
//
// Four shards because fsyncs of separate databases overlap: on 2 cores,
// batches of 64 messages from one writer per shard reached about 67k msgs/s
// with 1 shard, 90k with 2, 168k with 4 and 178k with 8
// (BenchmarkStoreWrite) when each message was a Badger key of its own.
// With one entry per batch, runs on a shared 2-core machine gave 68-155k
// with 1 shard, 168-204k with 2, 231-251k with 4 and 230-280k with 8.
//
// 4 MiB memtables, 2 of them: each memtable is an arena in memory plus a
// mapped write-ahead log, and each flush builds its table in a buffer of
// its size. With 8 MiB, a node running the durable cycle (ordering none,
// 62-66k msgs/s) peaked at 126-139 MB resident; with 4 MiB at 89-95 MB,
// at the same throughput (16 MiB and 3 memtables had held 197 MB).
func DefaultOptions() Options {
	return Options{
		Shards:                 4,
		ValueLogGCInterval:     time.Minute,
		ValueLogGCDiscardRatio: 0.5,
		MemTableSize:           4 << 20,
		NumMemtables:           2,
		ValueThreshold:         1 << 10,
		BlockCacheSize:         0,
		ValueLogFileSize:       256 << 20,
		LogResident:            4 << 20,
		NumCompactors:          2,
		WitnessInterval:        100 * time.Millisecond,
	}
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Shards == 0 {
		o.Shards = d.Shards
	}
	if o.ValueLogGCInterval == 0 {
		o.ValueLogGCInterval = d.ValueLogGCInterval
	}
	if o.ValueLogGCDiscardRatio == 0 {
		o.ValueLogGCDiscardRatio = d.ValueLogGCDiscardRatio
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = d.MemTableSize
	}
	if o.NumMemtables == 0 {
		o.NumMemtables = d.NumMemtables
	}
	if o.ValueThreshold == 0 {
		o.ValueThreshold = d.ValueThreshold
	}
	if o.ValueLogFileSize == 0 {
		o.ValueLogFileSize = d.ValueLogFileSize
	}
	if o.LogResident == 0 {
		o.LogResident = d.LogResident
	}
	if o.NumCompactors == 0 {
		o.NumCompactors = d.NumCompactors
	}
	if o.WitnessInterval == 0 {
		o.WitnessInterval = d.WitnessInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports the first invalid field, named as in the config file.
// Zero fields count as their defaults.
func (o Options) Validate() error {
	o = o.withDefaults()
	var why string
	switch {
	case o.Shards < 1 || o.Shards > MaxShards:
		why = fmt.Sprintf("shards must be between 1 and %d, got %d", MaxShards, o.Shards)
	case o.ValueLogGCDiscardRatio <= 0 || o.ValueLogGCDiscardRatio >= 1:
		why = fmt.Sprintf("value_log_gc_discard_ratio must be between 0 and 1, got %g", o.ValueLogGCDiscardRatio)
	case o.MemTableSize < 1<<20:
		why = fmt.Sprintf("memtable_size must be at least 1 MiB, got %d", o.MemTableSize)
	case o.NumMemtables < 1:
		why = fmt.Sprintf("num_memtables must be at least 1, got %d", o.NumMemtables)
	case o.ValueThreshold < 0 || o.ValueThreshold > 1<<20 || o.ValueThreshold > o.MemTableSize*15/100:
		why = fmt.Sprintf("value_threshold must be between 0 and min(1 MiB, 15%% of memtable_size), got %d", o.ValueThreshold)
	case o.BlockCacheSize < 0:
		why = fmt.Sprintf("block_cache_size must not be negative, got %d", o.BlockCacheSize)
	case o.ValueLogFileSize < 1<<20 || o.ValueLogFileSize >= 2<<30:
		why = fmt.Sprintf("value_log_file_size must be at least 1 MiB and below 2 GiB, got %d", o.ValueLogFileSize)
	case o.NumCompactors < 0 || o.NumCompactors == 1:
		why = fmt.Sprintf("num_compactors must be 0 or at least 2, got %d", o.NumCompactors)
	case o.WitnessInterval < 0:
		why = fmt.Sprintf("witness_interval must not be negative, got %s", o.WitnessInterval)
	default:
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOptions, why)
}

// badgerOptions returns the Badger options of one shard. o has its defaults.
//
// SyncWrites makes every commit fsync the memtable's write-ahead log and the
// value log before it returns: Write is durable when it returns nil, whatever
// its sync flag. With AsyncWrites, SyncWrites is off and Write syncs the logs
// itself when its sync flag asks for it (see Shard.Write). Conflict detection is off because one goroutine writes each
// shard. One version per key is kept: nothing reads old versions.
//
// Every level's tables are as large as the first level's (2 MiB; Badger
// doubles the size at each level by default): a compaction builds each
// table in a buffer of twice its size, and Badger keeps up to eight such
// buffers for reuse. With a 5M-message backlog the doubling held 96 MB of
// them, 44 MB without it.
func badgerOptions(dir string, o Options, log *slog.Logger) bdg.Options {
	bo := bdg.DefaultOptions(dir).
		WithSyncWrites(!o.AsyncWrites).
		WithDetectConflicts(false).
		WithNumVersionsToKeep(1).
		WithLogger(slogLogger{log}).
		WithCompression(options.None).
		WithMemTableSize(o.MemTableSize).
		WithNumMemtables(o.NumMemtables).
		WithValueThreshold(o.ValueThreshold).
		WithBlockCacheSize(o.BlockCacheSize).
		WithValueLogFileSize(o.ValueLogFileSize).
		WithNumCompactors(o.NumCompactors).
		WithMetricsEnabled(false)
	bo.TableSizeMultiplier = 1
	return bo
}

// slogLogger adapts slog to Badger's Logger. Badger reports every table it
// opens and every compaction at info level: those go to debug, Badger's own
// debug messages are dropped, warnings and errors keep their level.
type slogLogger struct{ log *slog.Logger }

func (l slogLogger) Errorf(format string, args ...any)   { l.emit(slog.LevelError, format, args) }
func (l slogLogger) Warningf(format string, args ...any) { l.emit(slog.LevelWarn, format, args) }
func (l slogLogger) Infof(format string, args ...any)    { l.emit(slog.LevelDebug, format, args) }
func (l slogLogger) Debugf(string, ...any)               {}

func (l slogLogger) emit(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	l.log.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(format, args...)))
}
