package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
)

// Layouts of a shard, recorded under formatKey as a u32. Layout 1,
// formatMessages, was never recorded: one key per message, m 0 queue 0
// partition offset, holding its record; a shard without a format is of
// it.
const (
	// formatEntries: one entry per run of consecutive offsets of a
	// partition written by one Write (entry.go), and the trim point.
	formatEntries uint32 = 2
)

// convertChunkKeys bounds the message keys of formatMessages one
// transaction of a conversion replaces; Badger's transaction limits bound
// it further.
const convertChunkKeys = 16 << 10

// upgrade brings a shard's database to formatEntries. A database without
// a format key is new, was written by a shardq that kept one key per
// message, or was made by Migrate, which copies no format key. Its message
// keys of the old layout, told from entry keys by their length, are
// rewritten into entries in chunks, each one transaction that writes the
// entries and deletes the keys they replace: a conversion stopped half
// way leaves every message in exactly one of the two forms, and the next
// Open finishes it. The format key is written last.
func upgrade(db *bdg.DB, log *slog.Logger) error {
	var format uint32
	var found bool
	err := db.View(func(txn *bdg.Txn) error {
		item, err := txn.Get(formatKey)
		if errors.Is(err, bdg.ErrKeyNotFound) {
			return nil
		}
		if err == nil {
			err = item.Value(func(v []byte) (err error) {
				format, err = getU32(v)
				return err
			})
		}
		found = err == nil
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("reading the layout version: %w", err)
	case found && format == formatEntries:
		return nil
	case found && format > formatEntries:
		return fmt.Errorf("%w: shard layout version %d is newer than this shardq's (%d)", ErrBadDataDir, format, formatEntries)
	}
	c := &converter{db: db, chunkKeys: convertChunkKeys}
	start := time.Now()
	if _, err := c.run(0); err != nil {
		return fmt.Errorf("converting to one entry per batch: %w", err)
	}
	if c.messages > 0 {
		log.Info("shard converted to one entry per batch", "messages", c.messages, "entries", c.entries,
			"transactions", c.chunks, "elapsed", time.Since(start).Round(time.Millisecond))
	}
	return db.Update(func(txn *bdg.Txn) error {
		return txn.Set(formatKey, putU32(formatEntries))
	})
}

// converter rewrites message keys of formatMessages into entries.
type converter struct {
	db        *bdg.DB
	chunkKeys int // old keys per transaction at most

	chunks, messages, entries int // done so far
}

// oldMessage is a message key of formatMessages and its record.
type oldMessage struct {
	key       []byte
	prefixLen int // of the partition prefix
	rec       []byte
}

// run converts chunks until no old key is left or, if limit > 0, until
// limit chunks are done; done says whether no old key is left.
func (c *converter) run(limit int) (done bool, err error) {
	start := []byte{kindMessage, sep}
	for limit <= 0 || c.chunks < limit {
		next, err := c.chunk(start)
		if err != nil || next == nil {
			return err == nil, err
		}
		start = next
	}
	return false, nil
}

// chunk converts old keys from start on in one transaction and returns
// the key the next chunk starts at, nil when no old key is left.
func (c *converter) chunk(start []byte) (next []byte, err error) {
	txn := c.db.NewTransaction(true)
	defer txn.Discard()
	olds, next, err := c.collect(txn, start)
	if err != nil || len(olds) == 0 {
		return nil, err
	}
	e := &entryWriter{set: func(k, v []byte) error {
		c.entries++
		return txn.Set(k, v)
	}}
	var part []byte
	for _, o := range olds {
		if prefix := o.key[:o.prefixLen]; !bytes.Equal(prefix, part) {
			part = prefix
			q := string(prefix[2 : len(prefix)-5])
			p := binary.BigEndian.Uint32(prefix[len(prefix)-4:])
			if err := e.partition(q, p); err != nil {
				return nil, err
			}
			// The old layout could keep messages below the low watermark
			// (a delete inside the retained range): lookups of this
			// partition scan from its first key until retention has
			// deleted from the front again (see trimPoint).
			if err := txn.Set(trimKey(q, p), trimPoint{holes: true}.encode()); err != nil {
				return nil, err
			}
		}
		if err := e.addRecord(keyOffset(o.key), o.rec); err != nil {
			return nil, err
		}
		if err := txn.Delete(o.key); err != nil {
			return nil, err
		}
	}
	if err := e.flush(); err != nil {
		return nil, err
	}
	if err := txn.Commit(); err != nil {
		return nil, err
	}
	c.chunks++
	c.messages += len(olds)
	return next, nil
}

// collect reads the old keys of one chunk, from start on, skipping
// entries; next is the old key that did not fit, nil if none is left.
func (c *converter) collect(txn *bdg.Txn, start []byte) (olds []oldMessage, next []byte, err error) {
	// Half of Badger's limits: a margin for what the estimate misses.
	maxSize, maxCount := c.db.MaxBatchSize()/2, c.db.MaxBatchCount()/2
	var size int64
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: []byte{kindMessage, sep}}) // keys only
	defer it.Close()
	for it.Seek(start); it.Valid(); it.Next() {
		item := it.Item()
		k := item.Key()
		n, ok := messagePrefixLen(k)
		switch {
		case ok && len(k) == n+16:
			continue // an entry
		case !ok || len(k) != n+8:
			return nil, nil, fmt.Errorf("%w: message key %q", ErrCorruptRecord, k)
		}
		// Its tombstone and, at worst, an entry of its own.
		cost := int64(2*len(k)) + item.ValueSize() + 64
		if len(olds) > 0 && (len(olds) >= c.chunkKeys || size+cost > maxSize || int64(2*len(olds)+2) > maxCount) {
			return olds, item.KeyCopy(nil), nil
		}
		rec, err := item.ValueCopy(nil)
		if err != nil {
			return nil, nil, err
		}
		olds = append(olds, oldMessage{key: item.KeyCopy(nil), prefixLen: n, rec: rec})
		size += cost
	}
	return olds, nil, nil
}

// messagePrefixLen returns the length of the partition prefix of a
// message key: the queue name ends at the first 0x00 after the kind.
func messagePrefixLen(k []byte) (int, bool) {
	if len(k) < 2 || k[0] != kindMessage || k[1] != sep {
		return 0, false
	}
	i := bytes.IndexByte(k[2:], sep)
	if i <= 0 || len(k) < 2+i+1+4 {
		return 0, false
	}
	return 2 + i + 1 + 4, true
}
