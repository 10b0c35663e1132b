package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// damageDirEnv names the data directory TestDamageChildProcess writes to.
const damageDirEnv = "SHARDQ_BADGER_DAMAGE_DIR"

const (
	damagePartitions = 8
	damageRounds     = 250
	damagePerRound   = 2    // messages per partition and round
	damageSize       = 1100 // bytes of payload
	// damageEntry bounds an entry of the value log: a partition's
	// messages of a round, and its key.
	damageEntry = damagePerRound*(damageSize+64) + 64
)

// damageOptions: one shard. Every message is larger than ValueThreshold,
// so that each entry of messages lives in the value log and the memtable
// log holds entries of about 60 bytes pointing to them.
func damageOptions(log *slog.Logger) Options {
	o := testOptions(1)
	o.ValueLogFileSize = 16 << 20
	if log != nil {
		o.Logger = log
	}
	return o
}

func damagePayload(p int, off uint64) []byte {
	head := fmt.Sprintf("%d/%d ", p, off)
	return []byte(head + strings.Repeat("x", damageSize-len(head)))
}

// TestDamageChildProcess is not a test: TestStoreRefusesDamage runs it in
// a child process, which records queue "orders" in the catalog and appends
// damageRounds rounds of damagePerRound messages to each of its
// partitions through the shard's committer, each round acknowledged
// before the next starts, waits until the shard's SYNCED file holds its
// last commit, says so, and waits to be killed.
func TestDamageChildProcess(t *testing.T) {
	dir := os.Getenv(damageDirEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestStoreRefusesDamage")
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	st, err := Open(dir, damageOptions(nil))
	if err != nil {
		fail(err)
	}
	logs, err := st.OpenLogs(queue.LogOptions{})
	if err != nil {
		fail(err)
	}
	if err := logs.SaveQueues(context.Background(), []queue.QueueMeta{{Name: "orders", Partitions: damagePartitions}}); err != nil {
		fail(err)
	}
	var parts []queue.Log
	for p := range damagePartitions {
		parts = append(parts, logs.Log(queue.PartitionID{Queue: "orders", Partition: p}, nil))
	}
	for r := range damageRounds {
		var wg sync.WaitGroup
		errs := make(chan error, damagePartitions*damagePerRound)
		for p, l := range parts {
			for k := range damagePerRound {
				off := uint64(r*damagePerRound + k)
				wg.Add(1)
				l.Append(1, &queue.Message{Offset: off, Payload: damagePayload(p, off)}, nil, true, func(err error) {
					if err != nil {
						errs <- err
					}
					wg.Done()
				})
			}
		}
		wg.Wait()
		if len(errs) > 0 {
			fail(<-errs)
		}
	}
	sh := st.Shard(0)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		synced, _, err := readWitness(shardDir(dir, 0))
		if err != nil {
			fail(err)
		}
		if synced == sh.synced.Load() {
			break
		}
		if time.Now().After(deadline) {
			fail(fmt.Errorf("SYNCED holds %d after 10 s, the shard's last synced commit is %d", synced, sh.synced.Load()))
		}
	}
	fmt.Println("written")
	select {} // until SIGKILL
}

// TestStoreRefusesDamage damages copies of the data directory of a
// process killed with SIGKILL after its writes were acknowledged, as a
// disk might, and opens them: damage in the middle of the newest memtable
// log or value log, and the end of the memtable log zeroed, are refused
// with errors naming the file or the shard; a write cut short at the end
// of the log is cut off, and what was acknowledged before it is there.
func TestStoreRefusesDamage(t *testing.T) {
	crashed := t.TempDir()
	killAfterWritten(t, "TestDamageChildProcess", damageDirEnv+"="+crashed)
	synced, _, err := readWitness(shardDir(crashed, 0))
	if err != nil || synced < damageRounds {
		t.Fatalf("the child's SYNCED holds %d, %v; want at least a commit per round", synced, err)
	}

	t.Run("undamaged", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		st := openTest(t, dir, damageOptions(nil))
		defer st.Close()
		checkDamageRounds(t, st, damageRounds, damageRounds)
	})

	t.Run("memtable log flipped in the middle", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		mem := newestLog(t, dir, memExt)
		at := usedEnd(t, mem) / 2
		changeBytes(t, mem, at, 64, func(b byte) byte { return ^b })
		for range 2 { // a refused Open changes nothing
			ce := openCorrupt(t, dir, mem)
			if ce.Offset < at-64 || ce.Offset >= at+64 {
				t.Fatalf("damage reported at offset %d, bytes %d to %d were flipped", ce.Offset, at, at+64)
			}
		}
		for _, dry := range []bool{true, false} {
			o := migrateOptions()
			o.DryRun = dry
			var ce *CorruptionError
			if _, err := Migrate(context.Background(), dir, 1, 2, o); !errors.As(err, &ce) || ce.File != mem {
				t.Fatalf("Migrate (dry run %v): %v; want the damage of %s", dry, err, mem)
			}
		}
	})

	t.Run("memtable log end zeroed", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		mem := newestLog(t, dir, memExt)
		end := usedEnd(t, mem)
		changeBytes(t, mem, end-64<<10, 64<<10, func(byte) byte { return 0 })
		for range 2 { // Badger cut the log, the refusal stays
			_, err := Open(dir, damageOptions(nil))
			var le *LostWritesError
			if !errors.As(err, &le) || !errors.Is(err, ErrDamaged) {
				t.Fatalf("Open: %v; want a LostWritesError", err)
			}
			if le.Dir != shardDir(dir, 0) || le.Synced != synced || le.Stored >= synced {
				t.Fatalf("LostWritesError %+v; want shard %s, synced %d, stored less", le, shardDir(dir, 0), synced)
			}
			t.Log(err)
			for _, s := range []string{shardDir(dir, 0), fmt.Sprint(le.Stored), fmt.Sprint(synced), "docs/RECOVERY.md"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the error does not say %q: %v", s, err)
				}
			}
		}
	})

	t.Run("write cut short", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		mem := newestLog(t, dir, memExt)
		b, err := os.ReadFile(mem)
		if err != nil {
			t.Fatal(err)
		}
		// The last entry is the end of the last commit: header (5 bytes),
		// key !badger!txn and version, value, checksum. The process
		// stopped while writing it: its second half is zeros.
		fin := bytes.LastIndex(b, []byte("!badger!txn")) - 5
		if fin < 0 || b[fin] != metaFinTxn {
			t.Fatalf("no transaction end found at %d", fin)
		}
		changeBytes(t, mem, int64(fin+12), usedEnd(t, mem)-int64(fin+12), func(byte) byte { return 0 })
		// That commit was never acknowledged, so SYNCED could not hold it.
		writeWitness(t, shardDir(dir, 0), synced-1)

		var logged bytes.Buffer
		st := openTest(t, dir, damageOptions(slog.New(slog.NewTextHandler(&logged, nil))))
		defer st.Close()
		if !strings.Contains(logged.String(), "cut off") || !strings.Contains(logged.String(), mem) {
			t.Errorf("no warning of the cut: %s", logged.String())
		}
		checkDamageRounds(t, st, damageRounds-1, damageRounds)
		if n := st.Shard(0).seq; n != synced-1 {
			t.Errorf("the shard holds commits up to %d after the cut, want %d", n, synced-1)
		}
	})

	t.Run("value log flipped in the middle", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		vlog := newestLog(t, dir, vlogExt)
		at := usedEnd(t, vlog) / 2
		changeBytes(t, vlog, at, 64, func(b byte) byte { return ^b })
		ce := openCorrupt(t, dir, vlog)
		if ce.Offset < at-damageEntry || ce.Offset >= at+64 {
			t.Fatalf("damage reported at offset %d, bytes %d to %d were flipped", ce.Offset, at, at+64)
		}
	})

	t.Run("value log end zeroed", func(t *testing.T) {
		dir := crashCopy(t, crashed)
		vlog := newestLog(t, dir, vlogExt)
		end := usedEnd(t, vlog)
		changeBytes(t, vlog, end-64<<10, 64<<10, func(byte) byte { return 0 })
		ce := openCorrupt(t, dir, vlog)
		// The value log ends where the entry holding the first zeroed byte starts.
		if ce.Offset < end-64<<10-damageEntry || ce.Offset >= end || !strings.Contains(ce.Cause, "points to a value") {
			t.Fatalf("damage reported at offset %d (%s); bytes %d to %d were zeroed", ce.Offset, ce.Cause, end-64<<10, end)
		}
	})
}

// checkDamageRounds checks that every partition of "orders" holds the
// messages of at least the first acked rounds, in order and unchanged, and
// of at most the first written rounds.
func checkDamageRounds(t *testing.T, st *Store, acked, written int) {
	t.Helper()
	sh := st.Shard(0)
	if qs, err := sh.Queues(); err != nil || len(qs) != 1 || qs[0].Name != "orders" {
		t.Fatalf("catalog: %+v, %v; want queue orders", qs, err)
	}
	total := 0
	for p := range damagePartitions {
		msgs, err := sh.Read("orders", p, 0, math.MaxUint64, math.MaxInt32)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) < acked*damagePerRound || len(msgs) > written*damagePerRound {
			t.Fatalf("orders/%d holds %d messages, want %d to %d", p, len(msgs), acked*damagePerRound, written*damagePerRound)
		}
		for i, m := range msgs {
			if m.Offset != uint64(i) || !bytes.Equal(m.Payload, damagePayload(p, m.Offset)) {
				t.Fatalf("orders/%d: message %d is offset %d, %q", p, i, m.Offset, m.Payload)
			}
		}
		total += len(msgs)
	}
	if acked < written && total == damagePartitions*written*damagePerRound {
		t.Fatal("every message written is there: the last commit was not cut")
	}
}

// openCorrupt opens dir and returns the *CorruptionError it must fail
// with, naming file.
func openCorrupt(t *testing.T, dir, file string) *CorruptionError {
	t.Helper()
	_, err := Open(dir, damageOptions(nil))
	var ce *CorruptionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrDamaged) {
		t.Fatalf("Open: %v; want a CorruptionError", err)
	}
	if ce.File != file {
		t.Fatalf("damage reported in %s, want %s: %v", ce.File, file, err)
	}
	t.Log(err)
	for _, s := range []string{file, fmt.Sprintf("offset %d", ce.Offset), "docs/RECOVERY.md"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error does not say %q: %v", s, err)
		}
	}
	return ce
}

// crashCopy copies the data directory of a killed process.
func crashCopy(t *testing.T, crashed string) string {
	t.Helper()
	dir := t.TempDir()
	copyDir(t, crashed, dir)
	return dir
}

// newestLog returns the path of the newest log file of shard 0 with the
// extension.
func newestLog(t *testing.T, dir, ext string) string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(shardDir(dir, 0), "*"+ext))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no %s file in %s: %v", ext, shardDir(dir, 0), err)
	}
	return slices.Max(paths) // the names are zero-padded file ids
}

// usedEnd returns the offset after the last nonzero byte of the file.
func usedEnd(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(bytes.TrimRight(b, "\x00")))
}

// changeBytes replaces the n bytes of the file from off with f of them.
func changeBytes(t *testing.T, path string, off, n int64, f func(byte) byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := off; i < off+n; i++ {
		b[i] = f(b[i])
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeWitness makes dir's SYNCED file hold synced.
func writeWitness(t *testing.T, dir string, synced uint64) {
	t.Helper()
	b := appendWitnessSlot(nil, 0, synced)
	b = appendWitnessSlot(b, 1, synced)
	if err := writeFileSynced(dir, syncedFile, b); err != nil {
		t.Fatal(err)
	}
}

// TestCheckShardLogs runs checkShardLogs on shard directories made of
// logs written to order: the newest memtable log may end with a write
// cut short, an older one only with AsyncWrites, and the memtable logs
// may point only within the value log.
func TestCheckShardLogs(t *testing.T) {
	whole := func() *logBuilder {
		l := newLogBuilder()
		l.txn(3, 40)
		return l
	}
	cutShort := func() *logBuilder {
		l := whole()
		offs := l.txn(3, 40)
		l.b = l.b[:offs[1]+7]
		return l
	}
	vlog := func(n int) *logBuilder { // n entries of 100 bytes
		l := newLogBuilder()
		for i := range n {
			l.entry(0, versioned(fmt.Sprintf("v%d", i), 1), bytes.Repeat([]byte{'v'}, 100-2-5-8-4))
		}
		return l
	}
	pointing := func(fid, length, offset uint32) *logBuilder {
		l := whole()
		l.pointerTxn(fid, length, offset)
		return l
	}
	cases := []struct {
		name   string
		async  bool
		files  map[string]*logBuilder
		damage string // the file named, "" for none
		cause  string
		cut    []string // files cut short
	}{
		{name: "newest log cut short", files: map[string]*logBuilder{"00001.mem": whole(), "00002.mem": cutShort()},
			cut: []string{"00002.mem"}},
		{name: "older log cut short", files: map[string]*logBuilder{"00001.mem": cutShort(), "00002.mem": whole()},
			damage: "00001.mem", cause: "the newer log 00002.mem follows"},
		{name: "older log cut short, async", async: true, files: map[string]*logBuilder{"00001.mem": cutShort(), "00002.mem": whole()},
			cut: []string{"00001.mem"}},
		{name: "pointer within the newest value log", files: map[string]*logBuilder{
			"00003.mem": pointing(2, 100, logHeaderSize+900), "000001.vlog": vlog(5), "000002.vlog": vlog(10)}},
		{name: "pointer past the newest value log", files: map[string]*logBuilder{
			"00003.mem": pointing(2, 100, logHeaderSize+1000), "000001.vlog": vlog(5), "000002.vlog": vlog(10)},
			damage: "000002.vlog", cause: "the value log ends there, but the entry at offset"},
		{name: "pointer past an older value log", files: map[string]*logBuilder{
			"00003.mem": pointing(1, 100, logHeaderSize+500), "000001.vlog": vlog(5), "000002.vlog": vlog(10)},
			damage: "000001.vlog", cause: "points to a value at offsets 520 to 620"},
		{name: "pointer into a value log collected", files: map[string]*logBuilder{
			"00003.mem": pointing(1, 100, logHeaderSize+500), "000002.vlog": vlog(10)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, l := range c.files {
				size := 1 << 16 // preallocated
				if strings.HasSuffix(name, vlogExt) && name != slices.Max(slices.Collect(maps.Keys(c.files))) {
					size = 0 // an older value-log file is cut to its end
				}
				if err := os.WriteFile(filepath.Join(dir, name), l.file(size), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var logged bytes.Buffer
			err := checkShardLogs(dir, c.async, slog.New(slog.NewTextHandler(&logged, nil)))
			if c.damage != "" {
				var ce *CorruptionError
				if !errors.As(err, &ce) || ce.File != filepath.Join(dir, c.damage) || !strings.Contains(ce.Cause, c.cause) {
					t.Fatalf("checkShardLogs: %v; want damage in %s: ...%s...", err, c.damage, c.cause)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range c.cut {
				fi, err := os.Stat(filepath.Join(dir, name))
				if err != nil || fi.Size() != int64(len(whole().b)) {
					t.Errorf("%s: %v, %v; want it cut to %d bytes", name, fi.Size(), err, len(whole().b))
				}
				if !strings.Contains(logged.String(), name) {
					t.Errorf("no warning of the cut of %s: %s", name, logged.String())
				}
			}
		})
	}
}

// TestStoreOpenRefusesLockedShard: an Open of a data directory in use
// fails before reading its logs, and changes nothing.
func TestStoreOpenRefusesLockedShard(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(1))
	defer st.Close()
	if _, err := Open(dir, testOptions(1)); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Open: %v, want ErrDataDirInUse", err)
	}
}

// BenchmarkCheckLog reads a 64 MiB memtable log of transactions like the
// committer's (8 entries pointing into the value log, the commit number,
// the transaction's end), preallocated at twice its size as Badger does.
func BenchmarkCheckLog(b *testing.B) {
	l := newLogBuilder()
	for len(l.b) < 64<<20 {
		l.ts++
		for p := range 8 {
			v := make([]byte, vptrLen)
			binary.NativeEndian.PutUint32(v, 1)
			l.entry(metaTxn|metaValuePointer, versioned(fmt.Sprintf("m\x00orders\x00%04d%016d", p, l.ts), l.ts), v)
		}
		l.entry(metaTxn, versioned("n\x00", l.ts), binary.BigEndian.AppendUint64(nil, l.ts))
		l.entry(metaFinTxn, versioned("!badger!txn", l.ts), []byte(strconv.FormatUint(l.ts, 10)))
	}
	path := filepath.Join(b.TempDir(), "00001.mem")
	f, err := os.Create(path)
	if err == nil {
		_, err = f.Write(l.b)
	}
	if err == nil {
		err = f.Truncate(128 << 20)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(l.b)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := checkLogFile(path)
		if err != nil || res.kept != int64(len(l.b)) || res.torn {
			b.Fatalf("kept %d, torn %v, %v; want %d", res.kept, res.torn, err, len(l.b))
		}
	}
}
