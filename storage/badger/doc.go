// Package badger implements the queue's storage seams (queue.Store,
// queue.Shard) on github.com/dgraph-io/badger/v4.
//
// # Shards and the data directory
//
// A Store is a fixed number of shards, each its own Badger database in
// dir/shard-NN (NN is the shard index in two digits, from 00). The queue
// places every partition, with its messages and the state of every group on
// it, in exactly one shard, chosen by hash: the shard count is therefore
// fixed for a data directory. The first Open records it in dir/SHARDS; an
// Open asking for another count fails with ErrShardCountChanged, and moving
// a directory to another count is a migration (shardq migrate-shards), not
// a restart.
//
//	st, err := badger.Open("/var/lib/shardq", badger.DefaultOptions())
//	if err != nil {
//		return err
//	}
//	defer st.Close()
//	shard := st.Shards()[0]
//	err = shard.Write(&queue.Batch{Appends: []queue.Append{
//		{Queue: "orders", Partition: 3, Message: &queue.Message{Offset: 0, Payload: p}},
//	}}, true)
//
// # Durability
//
// Every shard runs with Badger's SyncWrites on: a Write commits one Badger
// transaction and the commit fsyncs the memtable's write-ahead log and the
// value log before it returns. A Write that returns nil is on stable storage
// whatever its sync flag says; Sync has nothing left to do but is honoured.
// The queue's committer batches many requests into one Write, so one fsync
// covers many messages.
//
// SyncWrites is not made optional on purpose: with it off, Badger syncs only
// the active memtable's log on DB.Sync, and a memtable rotated since the last
// sync could lose older writes while a newer, synced one survives.
//
// A Write is one transaction unless it is larger than Badger allows (15% of
// MemTableSize, see Options): it is then committed in several parts, each
// atomic on its own. The queue's committer keeps batches far below that.
//
// # Damage
//
// Badger opens a database by replaying each memtable's write-ahead log
// (NNNNN.mem) and reading the newest value-log file (NNNNNN.vlog), and it
// cuts each of them, without a word, at the first entry that does not
// read back: a few bytes damaged in the middle of a log drop every write
// after them. That is right for a write the process was making when it
// died, never synced nor acknowledged; it is data loss for anything else.
// So Open checks before Badger opens a shard, and after:
//
//   - Before (recovery.go, logcheck.go), holding Badger's directory lock,
//     it reads the same files with a reader of Badger's entry layout. A log
//     must be whole entries whose checksums match, grouped in whole
//     transactions, then zeros to its end (Badger preallocates the files
//     sparsely). Only a write cut short may follow the last whole
//     transaction: entries of a transaction without its end, then at most
//     one entry whose missing part reads as zeros, then zeros. That tail is
//     cut off, with a warning, and the file synced. Anything else is
//     damage, refused with a *CorruptionError naming the file and the
//     offset of the first entry that does not read back: an entry with a
//     bad checksum followed by more data, an entry written to its end that
//     does not match its checksum, a memtable log cut short while a newer
//     one follows (SyncWrites synced it whole before Badger wrote to the
//     next), an entry pointing past the end of its value-log file.
//   - After, the shard must hold every commit it knew synced. Each Badger
//     transaction of a Write sets the key n 0x00 to its number, one more
//     than the last; every WitnessInterval (100 ms), a shard whose last
//     synced commit grew records its number in dir/shard-NN/SYNCED, with an
//     fsync of its own, off the write path, and at Close. A shard holding a
//     lower number than SYNCED lost synced writes whole, entries and all
//     (a log's end zeroed or cut at an entry's end, which the logs alone
//     cannot tell from a clean end): Open refuses it with a
//     *LostWritesError naming the shard and both numbers.
//
// Both match ErrDamaged. A refused shard stays refused: restore the data
// directory from a backup, or rebuild the node from the replicas of its
// partitions (docs/RECOVERY.md). What is not seen: damage to value-log
// files older than the newest, which Badger does not read at open (a
// message record read from them is checked against its own checksum,
// ErrCorruptRecord), to the LSM tree's tables and manifest, and commits
// lost within WitnessInterval before a crash when the log's end was lost
// whole. With AsyncWrites, a power cut can leave unsynced pages of a log
// written out of order, which reads as damage and is refused too.
//
// # Key layout
//
// Integers in keys are big-endian and fixed width, so keys sort by partition
// and then offset. A variable-length name is followed by 0x00, which neither
// queue nor group names may contain, unless it ends the key: so the prefix
// of a partition's messages, or of one group's marks, matches no key of
// another queue or group (queue "a" and "a.b", group "g" and "g1"). Keys
// that end with a name (floors, queue meta) are only read exactly or all
// together.
//
//	m 0x00 {queue} 0x00 {partition u32} {first u64} {last u64}  entry: records of offsets first..last
//	l 0x00 {queue} 0x00 {partition u32}                        low watermark u64
//	t 0x00 {queue} 0x00 {partition u32}                        trim point u64
//	g 0x00 {queue} 0x00 {partition u32} {group}                ack floor u64 [delivered mark u64]
//	s 0x00 {queue} 0x00 {partition u32} {group} 0x00 {offset u64}  settled, empty value
//	r 0x00 {queue} 0x00 {partition u32} {group} 0x00 {offset u64}  ended deliveries u32
//	d 0x00 {queue} 0x00 {partition u32} {dedup-id}             stored at, unix ms u64
//	q 0x00 {queue}                                             queue meta (JSON)
//	v 0x00                                                     layout version u32 (2)
//	n 0x00                                                     number of the last commit u64 (witness.go)
//	c 0x00 {record} {owner} 0x00 {name}                        session record, shard 0 only (sessions.go)
//
// Messages are stored by batch: a Write stores the appends of one
// partition as one entry per run of consecutive offsets, an entry holding
// at most 1,024 messages and, unless one message is larger, 1 MiB. One
// Badger write per entry rather than per message is what makes a batch
// cheap. The entries of a partition never overlap; keys sort by first
// offset, so Read finds the entry holding an offset as the last key at or
// before it (a reverse iterator) and goes on forward from there.
//
// An entry's value (entry.go) is a version byte, then for each offset from
// first to last the record's length, a CRC-32C of the partition prefix, the
// offset and the record, and the record. A message record (EncodeMessage)
// starts with a version byte; times are kept to the millisecond. The
// record does not hold the offset: its place in the entry does. A read
// checks the layout of each entry it reads (version, lengths, a record per
// offset) and the checksums of the records it returns; what does not
// check out yields ErrCorruptRecord.
//
// The low watermark is the highest RangeDelete.To so far. Bounds returns
// first = max(watermark, first entry's first offset) and next =
// max(last entry's last offset + 1, watermark), so next never goes back
// when every message is deleted.
//
// A RangeDelete deletes the entries that end below its To, one tombstone
// per entry (keys only), and keeps the entry holding To on disk: the trim
// point, raised to To, hides that entry's records below it, and Read never
// returns a message below the trim point. The trim point differs from the
// watermark only after a delete that leaves messages below its From (a
// hole, which the queue never makes): such a delete writes the entries it
// cuts again without the deleted records and leaves the trim point alone.
// An append at an offset the partition stores already, or below its trim
// point (neither of which the queue makes), is merged into the entries it
// overlaps the same way, the later record winning.
//
// Each shard records its layout version. A shard without one (written
// by a shardq that stored one key per message, m ... {offset u64}, or
// made by migrate-shards, which does not copy it) is converted when it is
// opened: its per-message keys, told from entry keys by their length, are
// rewritten into entries in chunks, each one transaction that writes the
// entries and deletes the keys they replace, so an interrupted conversion
// is finished by the next Open.
//
// # Errors
//
// Errors wrap the sentinels of errors.go; test them with errors.Is. Open
// refuses a damaged shard with a *CorruptionError or a *LostWritesError,
// both matching ErrDamaged (see Damage), and a shard another process holds
// with ErrDataDirInUse. A batch
// with a write the key layout cannot hold (ErrInvalidWrite) is refused whole
// before anything is written. A record that does not decode yields
// ErrCorruptRecord. Badger's own errors are wrapped with the shard index.
//
// # Concurrency
//
// Each shard has one writer at a time (queue.Writer's contract); reads run
// concurrently with it, each on its own Badger snapshot. Close waits for
// operations in progress; later calls return ErrClosed. Each shard runs
// value-log GC on a timer (Options.ValueLogGCInterval), and records its
// last synced commit on another (Options.WitnessInterval), until Close.
package badger
