package badger

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/queue/queuetest"
)

// testOptions keeps test stores small and quiet.
func testOptions(shards int) Options {
	o := DefaultOptions()
	o.Shards = shards
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.MemTableSize = 4 << 20
	return o
}

func openTest(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	st, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return st
}

func TestStoreSuite(t *testing.T) {
	queuetest.RunStoreSuite(t, func(t *testing.T, dir string) queue.Store {
		return openTest(t, dir, testOptions(2))
	})
}

func TestStoreShardCountFixed(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(2))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"SHARDS", "shard-00", "shard-01"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("data dir lacks %s: %v", name, err)
		}
	}
	if n, err := ShardCount(dir); err != nil || n != 2 {
		t.Fatalf("ShardCount = %d, %v; want 2", n, err)
	}

	_, err := Open(dir, testOptions(4))
	if !errors.Is(err, ErrShardCountChanged) {
		t.Fatalf("Open with 4 shards on a 2-shard dir: %v, want ErrShardCountChanged", err)
	}
	want := fmt.Sprintf("storage: shard count changed: data dir %s has 2 shards, config asks for 4; run shardq migrate-shards", dir)
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
	if _, err := os.Stat(shardDir(dir, 2)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused Open created %s: %v", shardDir(dir, 2), err)
	}

	st = openTest(t, dir, testOptions(2))
	if n := len(st.Shards()); n != 2 {
		t.Errorf("reopened store has %d shards, want 2", n)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// Shard directories without a SHARDS file are refused, not adopted.
	if err := os.Remove(filepath.Join(dir, shardsFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, testOptions(2)); !errors.Is(err, ErrBadDataDir) {
		t.Fatalf("Open without SHARDS: %v, want ErrBadDataDir", err)
	}
}

func TestStoreOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	bad := []struct {
		name string
		set  func(o *Options)
	}{
		{"shards", func(o *Options) { o.Shards = MaxShards + 1 }},
		{"value_log_gc_discard_ratio", func(o *Options) { o.ValueLogGCDiscardRatio = 1 }},
		{"memtable_size", func(o *Options) { o.MemTableSize = 1000 }},
		{"value_threshold", func(o *Options) { o.MemTableSize, o.ValueThreshold = 1<<20, 1<<19 }},
		{"value_log_file_size", func(o *Options) { o.ValueLogFileSize = 2 << 30 }},
		{"num_compactors", func(o *Options) { o.NumCompactors = 1 }},
		{"witness_interval", func(o *Options) { o.WitnessInterval = -time.Second }},
	}
	for _, c := range bad {
		o := DefaultOptions()
		c.set(&o)
		err := o.Validate()
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: Validate = %v", c.name, err)
		}
		if _, err := Open(t.TempDir(), o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: Open = %v", c.name, err)
		}
	}
}

func TestStoreBadgerSettings(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	defer st.Close()
	got := st.Shard(0).db.Opts()
	if !got.SyncWrites || got.DetectConflicts || got.NumVersionsToKeep != 1 || got.ValueThreshold != 1<<10 {
		t.Fatalf("badger options: SyncWrites=%v DetectConflicts=%v NumVersionsToKeep=%d ValueThreshold=%d",
			got.SyncWrites, got.DetectConflicts, got.NumVersionsToKeep, got.ValueThreshold)
	}
}

// TestStoreSplitsLargeBatch writes and deletes more than one Badger
// transaction holds.
func TestStoreSplitsLargeBatch(t *testing.T) {
	o := testOptions(1)
	o.MemTableSize = 1 << 20 // transactions of about 150 KiB
	st := openTest(t, t.TempDir(), o)
	defer st.Close()
	sh := st.Shard(0)
	const n = 20000
	// Every other offset: each message is an entry of its own, of about
	// 100 bytes, kept in the LSM tree.
	b := &queue.Batch{}
	for i := range uint64(n) {
		b.Appends = append(b.Appends, queue.Append{Queue: "big", Partition: 1, Message: &queue.Message{
			Offset: 2 * i, Payload: []byte(fmt.Sprintf("%064d", 2*i)),
		}})
	}
	if err := sh.Write(b, true); err != nil {
		t.Fatal(err)
	}
	if sh.splits.Load() == 0 {
		t.Fatal("a 20,000-entry batch fit one transaction: the test proves nothing")
	}
	first, next, err := sh.Bounds("big", 1)
	if err != nil || first != 0 || next != 2*n-1 {
		t.Fatalf("Bounds = (%d, %d), %v; want (0, %d)", first, next, err, 2*n-1)
	}
	msgs, err := sh.Read("big", 1, 0, math.MaxUint64, n+1)
	if err != nil || len(msgs) != n {
		t.Fatalf("Read returned %d messages, %v; want %d", len(msgs), err, n)
	}
	for i, m := range msgs {
		if m.Offset != 2*uint64(i) || string(m.Payload) != fmt.Sprintf("%064d", 2*i) {
			t.Fatalf("message %d: offset %d payload %q", i, m.Offset, m.Payload)
		}
	}

	splits := sh.splits.Load()
	del := &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "big", Partition: 1, From: 0, To: 2 * n}}}
	if err := sh.Write(del, true); err != nil {
		t.Fatal(err)
	}
	if sh.splits.Load() == splits {
		t.Error("deleting 20,000 entries fit one transaction")
	}
	if first, next, err := sh.Bounds("big", 1); err != nil || first != 2*n || next != 2*n {
		t.Fatalf("Bounds after deleting all = (%d, %d), %v; want (%d, %d)", first, next, err, 2*n, 2*n)
	}
	if msgs, err := sh.Read("big", 1, 0, math.MaxUint64, 10); err != nil || len(msgs) != 0 {
		t.Fatalf("Read after deleting all returned %d messages, %v", len(msgs), err)
	}
	if got := entrySpans(t, sh, "big", 1); len(got) != 0 {
		t.Fatalf("%d entries left after deleting all", len(got))
	}
}

func TestStoreClosed(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	sh := st.Shard(0)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := sh.Write(&queue.Batch{Queues: []queue.QueueMeta{{Name: "q"}}}, true); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v", err)
	}
	if _, err := sh.Read("q", 0, 0, 10, 10); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close = %v", err)
	}
	if _, _, err := sh.Bounds("q", 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Bounds after Close = %v", err)
	}
}

// durableDirEnv names the data directory TestHelperProcess writes to.
const durableDirEnv = "SHARDQ_BADGER_DURABLE_DIR"

// durableBatch is what the child process writes before it is killed.
func durableBatch() *queue.Batch {
	b := &queue.Batch{
		Floors:     []queue.FloorWrite{{Queue: "orders", Group: "billing", Partition: 2, Floor: 7}},
		Marks:      []queue.SettleMark{{Queue: "orders", Group: "billing", Partition: 2, Offset: 9, Set: true}},
		Deliveries: []queue.DeliveryMark{{Queue: "orders", Group: "billing", Partition: 2, Offset: 8, Count: 3}},
		Queues:     []queue.QueueMeta{{Name: "orders", Partitions: 4}},
	}
	for off := range uint64(1000) {
		b.Appends = append(b.Appends, queue.Append{Queue: "orders", Partition: 2, Message: &queue.Message{
			Offset:     off,
			Key:        fmt.Sprintf("k%d", off%7),
			EnqueuedAt: time.UnixMilli(1_700_000_000_000 + int64(off)),
			Payload:    []byte(fmt.Sprintf("payload %d", off)),
		}})
	}
	return b
}

// TestHelperProcess is not a test: TestStoreDurableAfterKill runs it in a
// child process, which writes durableBatch, says so, and waits to be killed.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(durableDirEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestStoreDurableAfterKill")
	}
	st, err := Open(dir, testOptions(2))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	if err := st.Shard(1).Write(durableBatch(), true); err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("written")
	select {} // until SIGKILL
}

// TestStoreDurableAfterKill kills a process with SIGKILL as soon as its
// Write returned and finds every write of the batch after reopening. It
// shows that a returned Write no longer depends on the process; that it
// also reached the disk rests on SyncWrites (TestStoreBadgerSettings), which
// only a power cut could show.
func TestStoreDurableAfterKill(t *testing.T) {
	dir := t.TempDir()
	killAfterWritten(t, "TestHelperProcess", durableDirEnv+"="+dir)

	st := openTest(t, dir, testOptions(2))
	defer st.Close()
	sh := st.Shard(1)
	want := durableBatch()
	msgs, err := sh.Read("orders", 2, 0, math.MaxUint64, 2000)
	if err != nil || len(msgs) != len(want.Appends) {
		t.Fatalf("after kill, Read returned %d messages, %v; want %d", len(msgs), err, len(want.Appends))
	}
	for i, m := range msgs {
		w := want.Appends[i].Message
		if m.Offset != w.Offset || m.Key != w.Key || !m.EnqueuedAt.Equal(w.EnqueuedAt) || string(m.Payload) != string(w.Payload) {
			t.Fatalf("message %d after kill: %+v, want %+v", i, m, w)
		}
	}
	groups, err := sh.Groups("orders", 2)
	if err != nil || len(groups) != 1 || groups[0].Floor != 7 || len(groups[0].Settled) != 1 || groups[0].Deliveries[8] != 3 {
		t.Fatalf("after kill, Groups = %+v, %v", groups, err)
	}
	if qs, err := sh.Queues(); err != nil || len(qs) != 1 || qs[0].Partitions != 4 {
		t.Fatalf("after kill, Queues = %+v, %v", qs, err)
	}
}

// TestStoreValueLogGC runs value-log GC on a short timer over records that
// live in the value log and were deleted, and shows Close stops it.
func TestStoreValueLogGC(t *testing.T) {
	o := testOptions(2)
	o.ValueLogGCInterval = 5 * time.Millisecond
	o.ValueLogFileSize = 1 << 20
	st := openTest(t, t.TempDir(), o)
	big := make([]byte, 8<<10) // past ValueThreshold: stored in the value log
	for i, sh := range st.Shards() {
		b := &queue.Batch{}
		for off := range uint64(256) {
			b.Appends = append(b.Appends, queue.Append{Queue: "gc", Partition: i, Message: &queue.Message{Offset: off, Payload: big}})
		}
		if err := sh.Write(b, true); err != nil {
			t.Fatal(err)
		}
		del := &queue.Batch{Deletes: []queue.RangeDelete{{Queue: "gc", Partition: i, From: 0, To: 200}}}
		if err := sh.Write(del, true); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openTest(t, st.Dir(), o)
	defer st.Close()
	for i, sh := range st.Shards() {
		msgs, err := sh.Read("gc", i, 0, math.MaxUint64, 1000)
		if err != nil || len(msgs) != 56 || len(msgs[0].Payload) != len(big) {
			t.Fatalf("shard %d after GC: %d messages, %v", i, len(msgs), err)
		}
	}
}

// killAfterWritten runs the test named test in a child process with env
// set, waits for it to print "written", and kills it with SIGKILL.
func killAfterWritten(t *testing.T, test, env string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if kerr := cmd.Process.Kill(); kerr != nil {
		t.Fatal(kerr)
	}
	_ = cmd.Wait() // killed: the error says so
	if err != nil || strings.TrimSpace(line) != "written" {
		t.Fatalf("child said %q, %v", line, err)
	}
}

// entrySpans returns the first and last offsets of the partition's
// entries, in key order, and checks each entry.
func entrySpans(t *testing.T, sh *Shard, q string, p uint32) [][2]uint64 {
	t.Helper()
	var out [][2]uint64
	prefix := partitionPrefix(kindMessage, q, p)
	err := sh.db.View(func(txn *bdg.Txn) error {
		return scan(txn, prefix, true, func(k, v []byte) error {
			first, last, ok := entrySpan(k, len(prefix))
			if !ok {
				return badEntryKey(k)
			}
			if _, err := entryRecords(k, len(prefix), v, 0, math.MaxUint64, nil); err != nil {
				return err
			}
			out = append(out, [2]uint64{first, last})
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
