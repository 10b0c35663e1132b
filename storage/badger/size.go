package badger

import (
	"io/fs"
	"path/filepath"
)

// DiskUsage is the space one shard takes on disk, by kind of file.
type DiskUsage struct {
	// SST is the LSM tree's tables (keys and small values).
	SST int64
	// VLog is the value log (large values).
	VLog int64
	// WAL is the memtables' write-ahead logs.
	WAL int64
	// Other is everything else in the shard's directory (manifest, ...).
	Other int64
}

// Total is the shard's bytes on disk.
func (u DiskUsage) Total() int64 { return u.SST + u.VLog + u.WAL + u.Other }

// DiskUsage measures the space each shard takes on disk now, shard i at
// index i. Badger preallocates its log files sparsely, so the figures are
// the blocks allocated, not the files' apparent sizes, where the system
// tells them apart. It reads the directories only, never the databases: it
// is safe at any time, concurrently with anything.
func (s *Store) DiskUsage() []DiskUsage {
	out := make([]DiskUsage, len(s.shards))
	for i := range s.shards {
		u := &out[i]
		_ = filepath.WalkDir(shardDir(s.dir, i), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil // a file removed meanwhile (compaction, GC): skip it
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			n := allocated(fi)
			switch filepath.Ext(path) {
			case ".sst":
				u.SST += n
			case ".vlog":
				u.VLog += n
			case ".mem":
				u.WAL += n
			default:
				u.Other += n
			}
			return nil
		})
	}
	return out
}
