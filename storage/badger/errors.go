package badger

import (
	"errors"
	"fmt"
)

var (
	// ErrShardCountChanged: the data directory was created with another
	// shard count than the options ask for. Partitions are placed on shards
	// by hash, so the count cannot change without moving data.
	ErrShardCountChanged = errors.New("storage: shard count changed")
	// ErrBadDataDir: the data directory's SHARDS file is missing or
	// unreadable while shard directories exist.
	ErrBadDataDir = errors.New("storage: bad data directory")
	// ErrInvalidOptions: an Options field is out of range.
	ErrInvalidOptions = errors.New("storage: invalid options")
	// ErrInvalidWrite: a batch names no queue, a queue or group holding
	// U+0000, a partition outside 0..2^32-1, or a nil message. The batch is
	// refused whole.
	ErrInvalidWrite = errors.New("storage: invalid write")
	// ErrCorruptRecord: a stored record cannot be decoded.
	ErrCorruptRecord = errors.New("storage: corrupt record")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("storage: closed")
	// ErrDamaged: a shard lost or garbled writes that had been synced
	// (*CorruptionError, *LostWritesError). Open refuses it: Badger would
	// open it without them and say nothing.
	ErrDamaged = errors.New("storage: shard damaged")

	// errDirLocked: another process, or another Open in this one, holds a
	// shard directory's lock.
	errDirLocked = errors.New("directory locked")
)

// recoveryAdvice ends the errors of damage: what to do about it.
const recoveryAdvice = "restore the data directory from a backup, or rebuild this node from the replicas of its partitions " +
	"(docs/RECOVERY.md)"

// CorruptionError reports a file of a shard holding damage where synced
// writes were: Badger would cut the file there and drop what follows.
// It matches ErrDamaged.
type CorruptionError struct {
	File   string // the damaged file
	Offset int64  // where in File the damage was found
	Cause  string // what is wrong there
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("storage: %s is damaged at offset %d: %s; synced writes would be lost, so the shard is not opened: %s",
		e.File, e.Offset, e.Cause, recoveryAdvice)
}

// Is reports whether target is ErrDamaged.
func (e *CorruptionError) Is(target error) bool { return target == ErrDamaged }

// LostWritesError reports a shard that holds fewer commits than it had
// synced: the end of a log was lost whole (zeroed or cut at an entry's
// end), which the logs alone cannot show. It matches ErrDamaged.
type LostWritesError struct {
	Dir    string // the shard's directory
	Stored uint64 // the number of the last commit the shard holds
	Synced uint64 // the number of the last commit known synced (Dir/SYNCED)
}

func (e *LostWritesError) Error() string {
	return fmt.Sprintf("storage: shard %s holds commits up to number %d, but commit %d had been synced: "+
		"the end of its write-ahead log was lost, so the shard is not opened: %s", e.Dir, e.Stored, e.Synced, recoveryAdvice)
}

// Is reports whether target is ErrDamaged.
func (e *LostWritesError) Is(target error) bool { return target == ErrDamaged }
