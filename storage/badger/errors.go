package badger

import "errors"

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
)
