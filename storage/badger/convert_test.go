package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// oldMessageKey is a message key of formatMessages: m 0 queue 0 partition
// offset.
func oldMessageKey(q string, p uint32, off uint64) []byte {
	return binary.BigEndian.AppendUint64(partitionPrefix(kindMessage, q, p), off)
}

// writeOldLayout applies b to db as a shardq of formatMessages did: one
// key per message, deletes message by message. Every other key is as it
// is now.
func writeOldLayout(t *testing.T, db *bdg.DB, b *queue.Batch) {
	t.Helper()
	err := db.Update(func(txn *bdg.Txn) error {
		for _, q := range b.Queues {
			v, err := EncodeQueueMeta(q)
			if err == nil {
				err = txn.Set(queueKey(q.Name), v)
			}
			if err != nil {
				return err
			}
		}
		for _, a := range b.Appends {
			if err := txn.Set(oldMessageKey(a.Queue, uint32(a.Partition), a.Message.Offset), EncodeMessage(a.Message)); err != nil {
				return err
			}
		}
		for _, r := range b.Deletes {
			p := uint32(r.Partition)
			for off := r.From; off < r.To; off++ {
				if err := txn.Delete(oldMessageKey(r.Queue, p, off)); err != nil {
					return err
				}
			}
			if low, _, err := getUint64(txn, lowKey(r.Queue, p)); err != nil || low >= r.To {
				if err != nil {
					return err
				}
				continue
			}
			if err := txn.Set(lowKey(r.Queue, p), putU64(r.To)); err != nil {
				return err
			}
		}
		for _, f := range b.Floors {
			if err := txn.Set(floorKey(f.Queue, uint32(f.Partition), f.Group), putU64(f.Floor)); err != nil {
				return err
			}
		}
		for _, m := range b.Marks {
			if err := txn.Set(markKey(kindSettled, m.Queue, uint32(m.Partition), m.Group, m.Offset), nil); err != nil {
				return err
			}
		}
		for _, d := range b.Deliveries {
			if err := txn.Set(markKey(kindDelivery, d.Queue, uint32(d.Partition), d.Group, d.Offset), putU32(d.Count)); err != nil {
				return err
			}
		}
		for _, d := range b.Dedups {
			if err := txn.Set(dedupKey(d.Queue, uint32(d.Partition), d.ID), putU64(uint64(d.At.UnixMilli()))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// oldLayoutBatches is what TestConvertOldLayout stores, by shard of 2.
func oldLayoutBatches() map[int][]*queue.Batch {
	at := time.UnixMilli(1_700_000_000_000).UTC()
	out := map[int][]*queue.Batch{0: {{Queues: []queue.QueueMeta{{Name: "orders", Partitions: 4}, {Name: "a.b", Partitions: 2}}}}}
	add := func(q string, p int, b *queue.Batch) {
		sh := queue.ShardOf(q, p, 2)
		out[sh] = append(out[sh], b)
	}
	for p := range 4 {
		// 3,000 messages (offset 1,000 with a large payload), a group, a
		// dedup-id, and retention up to 100 + p.
		var appends []queue.Append
		for off := range uint64(3000) {
			m := &queue.Message{Offset: off, Key: fmt.Sprintf("k%d", off%7), EnqueuedAt: at.Add(time.Duration(off) * time.Millisecond),
				Payload: fmt.Appendf(nil, "orders/%d/%d", p, off)}
			if off == 1000 {
				m.Payload = append(m.Payload, make([]byte, 64<<10)...)
			}
			appends = append(appends, queue.Append{Queue: "orders", Partition: p, Message: m})
		}
		add("orders", p, &queue.Batch{
			Appends:    appends,
			Floors:     []queue.FloorWrite{{Queue: "orders", Group: "billing", Partition: p, Floor: 200}},
			Marks:      []queue.SettleMark{{Queue: "orders", Group: "billing", Partition: p, Offset: 202, Set: true}},
			Deliveries: []queue.DeliveryMark{{Queue: "orders", Group: "billing", Partition: p, Offset: 201, Count: 2}},
			Dedups:     []queue.DedupMark{{Queue: "orders", Partition: p, ID: fmt.Sprintf("id-%d", p), At: at}},
		})
		add("orders", p, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "orders", Partition: p, From: 0, To: 100 + uint64(p)}}})
	}
	// A partition with a hole below its watermark, offsets that skip, and
	// every message of another partition deleted.
	add("a.b", 0, &queue.Batch{Appends: appendsAt("a.b", 0, 0, 0, 1, 2, 3, 4, 5, 9, 10, 5000)})
	add("a.b", 0, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a.b", Partition: 0, From: 0, To: 1}, {Queue: "a.b", Partition: 0, From: 3, To: 5}}})
	add("a.b", 1, &queue.Batch{Appends: appendsAt("a.b", 1, 0, 0, 1)})
	add("a.b", 1, &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a.b", Partition: 1, From: 0, To: 2}}})
	return out
}

// oldLayoutDir writes oldLayoutBatches into a new 2-shard data directory
// in the old layout, twice: through writeOldLayout, and through Open and
// Write into a reference directory. It returns both.
func oldLayoutDir(t *testing.T) (old, ref string) {
	t.Helper()
	old, ref = t.TempDir(), t.TempDir()
	if err := claimShardCount(old, 2); err != nil {
		t.Fatal(err)
	}
	st := openTest(t, ref, testOptions(2))
	for i, bs := range oldLayoutBatches() {
		db, err := bdg.Open(badgerOptions(shardDir(old, i), testOptions(2).withDefaults(), testOptions(2).Logger))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			writeOldLayout(t, db, b)
			mustWrite(t, st.Shard(i), b)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return old, ref
}

// checkConverted opens dir, of the given shard count, and checks that it
// holds what ref, of 2 shards, holds, in the new layout only.
func checkConverted(t *testing.T, dir string, shards int, ref string) {
	t.Helper()
	want := snapshotDir(t, ref, 2)
	got := snapshotDir(t, dir, shards)
	sameSnap(t, got, want)
	if n := got.messages(); n != 4*3000-(100+101+102+103)+6 {
		t.Errorf("%d messages, want %d", n, 4*3000-(100+101+102+103)+6)
	}
	ab := got.Partitions["a.b/0"]
	if offs := offsetsOf(ab.Messages); !reflect.DeepEqual(offs, []uint64{1, 2, 5, 9, 10, 5000}) || ab.First != 5 || ab.Next != 5001 {
		t.Errorf("a.b/0 holds %v, bounds (%d, %d)", offs, ab.First, ab.Next)
	}
	if ab := got.Partitions["a.b/1"]; len(ab.Messages) != 0 || ab.First != 2 || ab.Next != 2 {
		t.Errorf("a.b/1 holds %d messages, bounds (%d, %d)", len(ab.Messages), ab.First, ab.Next)
	}
	st := openTest(t, dir, testOptions(shards))
	defer st.Close()
	for i := range shards {
		txn := st.Shard(i).db.NewTransaction(false)
		if v, err := getFormat(txn); err != nil || v != formatEntries {
			t.Errorf("shard %d: layout version %d, %v", i, v, err)
		}
		n := 0
		err := scan(txn, []byte{kindMessage, sep}, false, func(k, _ []byte) error {
			pl, ok := messagePrefixLen(k)
			if !ok || len(k) != pl+16 {
				return fmt.Errorf("key %q is no entry key", k)
			}
			n++
			return nil
		})
		txn.Discard()
		if err != nil || n == 0 {
			t.Errorf("shard %d: %d entries, %v", i, n, err)
		}
	}
}

func offsetsOf(msgs []*queue.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Offset
	}
	return out
}

func getFormat(txn *bdg.Txn) (uint32, error) {
	item, err := txn.Get(formatKey)
	if err != nil {
		return 0, err
	}
	var v uint32
	err = item.Value(func(b []byte) (err error) {
		v, err = getU32(b)
		return err
	})
	return v, err
}

// TestConvertOldLayout opens a data directory written with one key per
// message.
func TestConvertOldLayout(t *testing.T) {
	old, ref := oldLayoutDir(t)
	checkConverted(t, old, 2, ref)
	checkConverted(t, old, 2, ref) // a converted shard is left alone
}

// TestConvertInterrupted stops a conversion after some of its
// transactions, as a crash would, and lets the next Open finish it.
func TestConvertInterrupted(t *testing.T) {
	old, ref := oldLayoutDir(t)
	for i := range 2 {
		db, err := bdg.Open(badgerOptions(shardDir(old, i), testOptions(2).withDefaults(), testOptions(2).Logger))
		if err != nil {
			t.Fatal(err)
		}
		c := &converter{db: db, chunkKeys: 500}
		done, err := c.run(3)
		if err != nil || done || c.chunks != 3 || c.messages != 1500 {
			t.Fatalf("shard %d: run(3) = %v, %v after %d chunks of %d messages", i, done, err, c.chunks, c.messages)
		}
		var entries, olds int
		err = db.View(func(txn *bdg.Txn) error {
			if _, err := getFormat(txn); !errors.Is(err, bdg.ErrKeyNotFound) {
				return fmt.Errorf("layout version recorded half way: %v", err)
			}
			return scan(txn, []byte{kindMessage, sep}, false, func(k, _ []byte) error {
				if pl, _ := messagePrefixLen(k); len(k) == pl+16 {
					entries++
				} else {
					olds++
				}
				return nil
			})
		})
		if err != nil || entries == 0 || olds == 0 {
			t.Fatalf("shard %d half converted: %d entries, %d old keys, %v", i, entries, olds, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	checkConverted(t, old, 2, ref)
}

// TestConvertAfterMigrate migrates a data directory whose shards are in
// the old layout, one of them half converted: Migrate copies the keys as
// they are, and the new shards are converted when they are opened.
func TestConvertAfterMigrate(t *testing.T) {
	old, ref := oldLayoutDir(t)
	db, err := bdg.Open(badgerOptions(shardDir(old, 1), testOptions(2).withDefaults(), testOptions(2).Logger))
	if err != nil {
		t.Fatal(err)
	}
	c := &converter{db: db, chunkKeys: 500}
	if _, err := c.run(2); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rep := mustMigrate(t, old, 2, 3, migrateOptions())
	checkReport(t, rep, 2, 3)
	checkConverted(t, old, 3, ref)
}

func TestConvertRefusesNewerLayout(t *testing.T) {
	dir := t.TempDir()
	if err := openTest(t, dir, testOptions(1)).Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bdg.Open(badgerOptions(shardDir(dir, 0), testOptions(1).withDefaults(), testOptions(1).Logger))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *bdg.Txn) error { return txn.Set(formatKey, putU32(formatEntries+1)) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, testOptions(1)); !errors.Is(err, ErrBadDataDir) {
		t.Fatalf("Open of a shard of layout %d: %v, want ErrBadDataDir", formatEntries+1, err)
	}
}
