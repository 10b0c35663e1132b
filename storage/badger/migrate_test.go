package badger

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/shardq/shardq/queue"
)

// deliveryLog is a queue.Receiver that keeps its deliveries.
type deliveryLog struct {
	mu sync.Mutex
	ds []queue.Delivery
}

func (l *deliveryLog) Deliver(d queue.Delivery) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

// wait returns delivery i once it arrived.
func (l *deliveryLog) wait(t *testing.T, i int) queue.Delivery {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		if len(l.ds) > i {
			d := l.ds[i]
			l.mu.Unlock()
			return d
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("delivery %d did not arrive", i)
		}
		time.Sleep(time.Millisecond)
	}
}

// fillForMigration fills a new data directory of the given shard count
// through queue.Manager: three queues, one declared with 3 partitions,
// dedup-ids, a group that acked most of a queue out of offset order and
// nacked some, and a range delete. It returns how many messages are stored.
func fillForMigration(t *testing.T, dir string, shards int) int {
	t.Helper()
	st := openTest(t, dir, testOptions(shards))
	o := queue.DefaultManagerOptions()
	o.Store = st
	o.Tick = 5 * time.Millisecond
	o.RetainEvery = time.Hour // keep every settled message: the test counts them
	events := queue.DefaultOptions()
	events.Partitions = 3
	o.Declared = map[string]queue.Options{"events": events}
	m, err := queue.NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(q string, msg *queue.Message) {
		t.Helper()
		done := make(chan error, 1)
		m.Publish(context.Background(), q, msg, func(err error) { done <- err })
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("publish to %s: %v", q, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publish to %s did not complete", q)
		}
	}
	stored := 0
	for i := range 80 {
		publish("orders", &queue.Message{Key: fmt.Sprintf("k%d", i%11), Subject: "eu/created",
			Payload: fmt.Appendf(nil, "order %d", i)})
		stored++
	}
	for i := range 30 {
		publish("events", &queue.Message{Key: fmt.Sprintf("e%d", i%5), DedupID: fmt.Sprintf("ev-%d", i),
			Payload: fmt.Appendf(nil, "event %d", i)})
		stored++
	}
	publish("events", &queue.Message{Key: "e0", DedupID: "ev-0", Payload: []byte("duplicate")}) // stored once
	for i := range 24 {
		publish("a.b", &queue.Message{Key: fmt.Sprintf("x%d", i), Payload: make([]byte, 100*i)})
		stored++
	}

	log := &deliveryLog{}
	if _, err := m.Queue("orders").Subscribe("billing", log, queue.ConsumerOptions{}); err != nil {
		t.Fatal(err)
	}
	// The first delivery of a partition holding several keys is left
	// leased: the later acks of that partition are marks above its floor.
	keys := map[int]int{}
	for k := range 11 {
		keys[queue.PartitionFor(fmt.Sprintf("k%d", k), m.Queue("orders").Partitions())]++
	}
	target := 0
	for p, n := range keys {
		if n > keys[target] || n == keys[target] && p < target {
			target = p
		}
	}
	// At least 40 deliveries are settled, and more until one ack of the
	// target partition lies above the delivery left leased: which
	// partitions the first 40 come from depends on timing.
	left, above := false, false
	for i := 0; i < 40 || !above; i++ {
		d := log.wait(t, i)
		if !left && d.Partition == target {
			left = true
			continue
		}
		outcome := queue.Ack
		if i%10 == 9 {
			outcome = queue.Nack
		}
		if left && d.Partition == target && outcome == queue.Ack {
			above = true
		}
		if err := m.Settle(d.Lease, outcome); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A range delete, as retention writes them, leaves a low watermark.
	for p := range 8 {
		sh := st.Shard(queue.ShardOf("a.b", p, shards))
		if _, next, _ := sh.Bounds("a.b", p); next >= 2 {
			err := sh.Write(&queue.Batch{Deletes: []queue.RangeDelete{{Queue: "a.b", Partition: p, From: 0, To: 2}}}, true)
			if err != nil {
				t.Fatal(err)
			}
			stored -= 2
			break
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return stored
}

// partitionSnap is what a store holds of one partition.
type partitionSnap struct {
	First, Next uint64
	Messages    []*queue.Message
	Groups      []queue.GroupState
	Dedups      map[string]time.Time
}

// storeSnap is what a store holds, read through the queue's interfaces.
type storeSnap struct {
	Queues     []queue.QueueMeta
	Partitions map[string]partitionSnap // by queue/partition
}

func (s storeSnap) messages() int {
	n := 0
	for _, p := range s.Partitions {
		n += len(p.Messages)
	}
	return n
}

// snapshot reads every queue of st where the queue reads it: metadata
// from shard 0, each partition from its queue.ShardOf shard. A shard
// holding data of a partition it does not own fails the test.
func snapshot(t *testing.T, st *Store) storeSnap {
	t.Helper()
	shards := st.Shards()
	metas, err := shards[0].Queues()
	if err != nil {
		t.Fatal(err)
	}
	for i, sh := range shards[1:] {
		if other, err := sh.Queues(); err != nil || len(other) > 0 {
			t.Errorf("shard %d holds queue metadata %v, %v", i+1, other, err)
		}
	}
	snap := storeSnap{Queues: metas, Partitions: map[string]partitionSnap{}}
	for _, meta := range metas {
		for p := range meta.Partitions {
			home := queue.ShardOf(meta.Name, p, len(shards))
			for i, sh := range shards {
				first, next, err := sh.Bounds(meta.Name, p)
				if err != nil {
					t.Fatal(err)
				}
				groups, err := sh.Groups(meta.Name, p)
				if err != nil {
					t.Fatal(err)
				}
				dedups, err := sh.Dedups(meta.Name, p)
				if err != nil {
					t.Fatal(err)
				}
				if i != home {
					if next != 0 || len(groups) > 0 || len(dedups) > 0 {
						t.Errorf("shard %d holds data of %s/%d, whose shard is %d", i, meta.Name, p, home)
					}
					continue
				}
				msgs, err := sh.Read(meta.Name, p, 0, math.MaxUint64, math.MaxInt32)
				if err != nil {
					t.Fatal(err)
				}
				snap.Partitions[fmt.Sprintf("%s/%d", meta.Name, p)] = partitionSnap{first, next, msgs, groups, dedups}
			}
		}
	}
	return snap
}

// snapshotDir opens dir with the given shard count, recovers a
// queue.Manager on it, and returns its snapshot.
func snapshotDir(t *testing.T, dir string, shards int) storeSnap {
	t.Helper()
	st := openTest(t, dir, testOptions(shards))
	defer st.Close()
	o := queue.DefaultManagerOptions()
	o.Store = st
	o.RetainEvery = time.Hour
	m, err := queue.NewManager(o)
	if err != nil {
		t.Fatalf("queue.NewManager on %d shards: %v", shards, err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// After a recovery: the first one records the deliveries the fixture
	// left out as ended, and a recovery changes nothing after that.
	snap := snapshot(t, st)
	for _, meta := range snap.Queues {
		if q := m.Queue(meta.Name); q == nil || q.Options().Partitions != meta.Partitions {
			t.Errorf("the manager did not recover queue %s with %d partitions", meta.Name, meta.Partitions)
		}
	}
	return snap
}

// sameSnap fails the test where got differs from want.
func sameSnap(t *testing.T, got, want storeSnap) {
	t.Helper()
	if !reflect.DeepEqual(got.Queues, want.Queues) {
		t.Errorf("queues = %+v\nwant %+v", got.Queues, want.Queues)
	}
	if len(got.Partitions) != len(want.Partitions) {
		t.Errorf("%d partitions, want %d", len(got.Partitions), len(want.Partitions))
	}
	for k, w := range want.Partitions {
		if g := got.Partitions[k]; !reflect.DeepEqual(g, w) {
			t.Errorf("partition %s differs:\n got  first %d next %d, %d messages, groups %+v, dedups %v\n want first %d next %d, %d messages, groups %+v, dedups %v",
				k, g.First, g.Next, len(g.Messages), g.Groups, g.Dedups, w.First, w.Next, len(w.Messages), w.Groups, w.Dedups)
		}
	}
}

// checkFixture checks that a snapshot holds what fillForMigration stored.
func checkFixture(t *testing.T, snap storeSnap, stored int) {
	t.Helper()
	if n := snap.messages(); n != stored {
		t.Errorf("%d messages stored, want %d", n, stored)
	}
	var floors, settled, deliveries, dedups, watermarks int
	for _, p := range snap.Partitions {
		for _, g := range p.Groups {
			if g.Floor > 0 {
				floors++
			}
			settled += len(g.Settled)
			deliveries += len(g.Deliveries)
		}
		dedups += len(p.Dedups)
		if p.First > 0 {
			watermarks++
		}
	}
	if floors == 0 || settled == 0 || deliveries == 0 || dedups != 30 || watermarks != 1 {
		t.Errorf("fixture too thin: %d floors, %d settle marks, %d delivery marks, %d dedup-ids, %d watermarks",
			floors, settled, deliveries, dedups, watermarks)
	}
}

func migrateOptions() MigrateOptions {
	return MigrateOptions{Storage: testOptions(0)}
}

func mustMigrate(t *testing.T, dir string, from, to int, opts MigrateOptions) MigrateReport {
	t.Helper()
	rep, err := Migrate(context.Background(), dir, from, to, opts)
	if err != nil {
		t.Fatalf("Migrate %d -> %d: %v", from, to, err)
	}
	return rep
}

// leftoverDirs lists the migration's directories left in dir.
func leftoverDirs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{stagingPrefix + "*", retiredPrefix + "*"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range m {
			out = append(out, filepath.Base(p))
		}
	}
	return out
}

// copyDir copies the tree at src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// treeSums returns the SHA-256 of every file under dir, by path.
func treeSums(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		sums[path] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}

func TestMigrateKeepsEveryKey(t *testing.T) {
	dir := t.TempDir()
	stored := fillForMigration(t, dir, 2)
	want := snapshotDir(t, dir, 2)
	checkFixture(t, want, stored)

	for _, c := range []struct{ from, to int }{{2, 4}, {4, 1}, {1, 3}} {
		t.Run(fmt.Sprintf("from=%d,to=%d", c.from, c.to), func(t *testing.T) {
			var phases []MigratePhase
			opts := migrateOptions()
			opts.Progress = func(p MigrateProgress) {
				if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
					phases = append(phases, p.Phase)
				}
			}
			rep := mustMigrate(t, dir, c.from, c.to, opts)

			if n, err := ShardCount(dir); err != nil || n != c.to {
				t.Fatalf("ShardCount = %d, %v; want %d", n, err, c.to)
			}
			if _, err := Open(dir, testOptions(c.from)); !errors.Is(err, ErrShardCountChanged) {
				t.Fatalf("Open with the old count: %v, want ErrShardCountChanged", err)
			}
			got := snapshotDir(t, dir, c.to)
			sameSnap(t, got, want)
			checkFixture(t, got, stored)

			if left := leftoverDirs(t, dir); len(left) > 0 {
				t.Errorf("left behind %v", left)
			}
			for i := c.to; i < max(c.from, c.to)+1; i++ {
				if _, err := os.Stat(shardDir(dir, i)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after migrating to %d shards: %v", shardDir(dir, i), c.to, err)
				}
			}
			wantPhases := []MigratePhase{PhaseCopy, PhaseVerify, PhaseSwap, PhaseCleanup}
			if !reflect.DeepEqual(phases, wantPhases) {
				t.Errorf("progress phases %v, want %v", phases, wantPhases)
			}
			checkReport(t, rep, c.from, c.to)
			if rep.Queues != len(want.Queues) || rep.Partitions == 0 || rep.Recovery != "" {
				t.Errorf("report: %d queues (want %d), %d partitions, recovery %q", rep.Queues, len(want.Queues), rep.Partitions, rep.Recovery)
			}
		})
	}
}

// checkReport checks that the per-shard statistics of rep add up.
func checkReport(t *testing.T, rep MigrateReport, from, to int) {
	t.Helper()
	if rep.From != from || rep.To != to || len(rep.Sources) != from || len(rep.Targets) != to {
		t.Fatalf("report %d -> %d with %d sources and %d targets", rep.From, rep.To, len(rep.Sources), len(rep.Targets))
	}
	var src, dst ShardStats
	for _, s := range rep.Sources {
		src.Keys, src.Bytes, src.Checksum = src.Keys+s.Keys, src.Bytes+s.Bytes, src.Checksum+s.Checksum
	}
	for _, s := range rep.Targets {
		dst.Keys, dst.Bytes, dst.Checksum = dst.Keys+s.Keys, dst.Bytes+s.Bytes, dst.Checksum+s.Checksum
	}
	if src != dst || src.Keys != rep.Keys || src.Bytes != rep.Bytes || rep.Keys == 0 {
		t.Errorf("sources sum to %+v, targets to %+v, report says %d keys, %d bytes", src, dst, rep.Keys, rep.Bytes)
	}
}

func TestMigrateDryRunWritesNothing(t *testing.T) {
	dir := t.TempDir()
	fillForMigration(t, dir, 2)
	before := treeSums(t, dir)

	opts := migrateOptions()
	opts.DryRun = true
	var phases []MigratePhase
	opts.Progress = func(p MigrateProgress) { phases = append(phases, p.Phase) }
	rep := mustMigrate(t, dir, 2, 4, opts)

	if after := treeSums(t, dir); !reflect.DeepEqual(after, before) {
		t.Errorf("a dry run changed the data dir: %d files before, %d after", len(before), len(after))
	}
	if !rep.DryRun {
		t.Error("report does not say dry run")
	}
	for _, p := range phases {
		if p != PhaseScan {
			t.Errorf("a dry run reported phase %s", p)
		}
	}
	checkReport(t, rep, 2, 4)

	real := mustMigrate(t, dir, 2, 4, migrateOptions())
	if !reflect.DeepEqual(real.Targets, rep.Targets) || !reflect.DeepEqual(real.Sources, rep.Sources) {
		t.Errorf("the dry run predicted %+v, the migration wrote %+v", rep.Targets, real.Targets)
	}
}

// errInterrupted stops a migration in TestMigrateResumesAfterInterruption.
var errInterrupted = errors.New("interrupted")

func TestMigrateResumesAfterInterruption(t *testing.T) {
	template := t.TempDir()
	stored := fillForMigration(t, template, 2)
	want := snapshotDir(t, template, 2)
	checkFixture(t, want, stored)

	// started: how a node started now fares. oldCount: it starts with 2
	// shards and finds everything; newCount: with 4; refused: it refuses
	// both counts.
	const (
		oldCount = "old count"
		newCount = "new count"
		refused  = "refused"
	)
	cases := []struct {
		step    string
		started string
	}{
		{stepCopied, oldCount},
		{stepVerified, oldCount},
		{stepMarked, refused},
		{stepOldMoved, refused},
		{stepNewMoved, refused},
		{stepCommitted, newCount},
	}
	for _, c := range cases {
		t.Run("after="+c.step, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, template, dir)
			opts := migrateOptions()
			opts.interrupt = func(step string) error {
				if step == c.step {
					return errInterrupted
				}
				return nil
			}
			if _, err := Migrate(context.Background(), dir, 2, 4, opts); !errors.Is(err, errInterrupted) {
				t.Fatalf("Migrate stopped with %v, want the interruption", err)
			}

			switch c.started {
			case oldCount:
				sameSnap(t, snapshotDir(t, dir, 2), want)
				if _, err := Open(dir, testOptions(4)); !errors.Is(err, ErrShardCountChanged) {
					t.Errorf("Open with 4 shards: %v, want ErrShardCountChanged", err)
				}
			case newCount:
				sameSnap(t, snapshotDir(t, dir, 4), want)
			case refused:
				for _, n := range []int{2, 4} {
					_, err := Open(dir, testOptions(n))
					if !errors.Is(err, ErrBadDataDir) || !strings.Contains(err.Error(), "migrate-shards --data-dir") {
						t.Errorf("Open with %d shards mid-swap: %v, want ErrBadDataDir naming the command", n, err)
					}
				}
				if _, err := Migrate(context.Background(), dir, 2, 3, migrateOptions()); !errors.Is(err, ErrMigrationPending) {
					t.Errorf("another migration mid-swap: %v, want ErrMigrationPending", err)
				}
				dry := migrateOptions()
				dry.DryRun = true
				if _, err := Migrate(context.Background(), dir, 2, 4, dry); !errors.Is(err, ErrMigrationPending) {
					t.Errorf("a dry run mid-swap: %v, want ErrMigrationPending", err)
				}
			}

			rep := mustMigrate(t, dir, 2, 4, migrateOptions())
			if rep.Recovery == "" {
				t.Error("the rerun reports no recovery")
			}
			if n, err := ShardCount(dir); err != nil || n != 4 {
				t.Fatalf("ShardCount = %d, %v; want 4", n, err)
			}
			if left := leftoverDirs(t, dir); len(left) > 0 {
				t.Errorf("left behind %v", left)
			}
			sameSnap(t, snapshotDir(t, dir, 4), want)
		})
	}
}

func TestMigrateRemovesLeftoversOfACrash(t *testing.T) {
	dir := t.TempDir()
	fillForMigration(t, dir, 2)
	want := snapshotDir(t, dir, 2)
	// A copy that a crash cut short, and a finished migration's old shards.
	junk := filepath.Join(shardDir(filepath.Join(dir, stagingPrefix+"4"), 1), "000001.vlog")
	if err := os.MkdirAll(filepath.Dir(junk), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(junk, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(shardDir(filepath.Join(dir, retiredPrefix+"3"), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	rep := mustMigrate(t, dir, 2, 4, migrateOptions())
	if !strings.Contains(rep.Recovery, ".migrate-4") || !strings.Contains(rep.Recovery, ".old-3") {
		t.Errorf("recovery %q does not name the leftovers", rep.Recovery)
	}
	if left := leftoverDirs(t, dir); len(left) > 0 {
		t.Errorf("left behind %v", left)
	}
	sameSnap(t, snapshotDir(t, dir, 4), want)

	// Run again once done: nothing to do.
	rep = mustMigrate(t, dir, 2, 4, migrateOptions())
	if !strings.Contains(rep.Recovery, "already has 4 shards") || rep.Sources != nil {
		t.Errorf("rerun after success: %+v", rep)
	}
}

func TestMigrateRefusesDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	fillForMigration(t, dir, 2)
	st := openTest(t, dir, testOptions(2))
	defer st.Close()
	for _, dry := range []bool{false, true} {
		opts := migrateOptions()
		opts.DryRun = dry
		_, err := Migrate(context.Background(), dir, 2, 4, opts)
		if !errors.Is(err, ErrDataDirInUse) || !strings.Contains(err.Error(), "data dir is in use by a running shardq") {
			t.Errorf("dry run %v: Migrate on an open store: %v, want ErrDataDirInUse", dry, err)
		}
	}
	if left := leftoverDirs(t, dir); len(left) > 0 {
		t.Errorf("a refused migration created %v", left)
	}
	if n, err := ShardCount(dir); err != nil || n != 2 {
		t.Errorf("ShardCount = %d, %v; want 2", n, err)
	}
}

func TestMigrateRefusesBadRequests(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(2))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		dir      string
		from, to int
		want     error
	}{
		{"same count", dir, 2, 2, ErrInvalidOptions},
		{"zero", dir, 2, 0, ErrInvalidOptions},
		{"too many", dir, 2, MaxShards + 1, ErrInvalidOptions},
		{"wrong from", dir, 3, 4, ErrShardCountChanged},
		{"not a data dir", t.TempDir(), 2, 4, ErrBadDataDir},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Migrate(context.Background(), c.dir, c.from, c.to, migrateOptions()); !errors.Is(err, c.want) {
				t.Errorf("Migrate %d -> %d: %v, want %v", c.from, c.to, err, c.want)
			}
		})
	}
	if n, err := ShardCount(dir); err != nil || n != 2 {
		t.Errorf("ShardCount = %d, %v; want 2", n, err)
	}
}

func TestMigrateRefusesMisplacedKeys(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(2))
	p := 0
	for queue.ShardOf("x", p, 2) != 0 {
		p++
	}
	// Shard 1 holds a message of a partition of shard 0.
	err := st.Shard(1).Write(&queue.Batch{Appends: []queue.Append{{Queue: "x", Partition: p, Message: &queue.Message{Payload: []byte("lost")}}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		opts := migrateOptions()
		opts.DryRun = dry
		if _, err := Migrate(context.Background(), dir, 2, 4, opts); !errors.Is(err, ErrBadDataDir) {
			t.Errorf("dry run %v: Migrate over a misplaced key: %v, want ErrBadDataDir", dry, err)
		}
	}
	if n, err := ShardCount(dir); err != nil || n != 2 {
		t.Errorf("ShardCount = %d, %v; want 2", n, err)
	}
}

// TestMigrateVerifyCatchesDamage changes the new shards between the copy
// and the verification: the migration must stop before the swap.
func TestMigrateVerifyCatchesDamage(t *testing.T) {
	template := t.TempDir()
	fillForMigration(t, template, 2)
	// keyOfShard returns an entry key of queue "orders" whose partition
	// is in shard j of 4.
	keyOfShard := func(j int) []byte {
		p := 0
		for queue.ShardOf("orders", p, 4) != j {
			p++
		}
		return entryKey("orders", uint32(p), 1_000_000, 1_000_000)
	}
	cases := []struct {
		name   string
		damage func(txn *bdg.Txn) error
	}{
		{"extra key", func(txn *bdg.Txn) error { return txn.Set(keyOfShard(1), []byte("x")) }},
		{"misplaced key", func(txn *bdg.Txn) error {
			if err := txn.Delete(firstKey(t, txn)); err != nil {
				return err
			}
			return txn.Set(keyOfShard(2), []byte("x"))
		}},
		{"changed value", func(txn *bdg.Txn) error { return txn.Set(firstKey(t, txn), []byte("changed")) }},
		{"lost key", func(txn *bdg.Txn) error { return txn.Delete(firstKey(t, txn)) }},
	}
	for _, c := range cases {
		for _, mode := range []VerifyMode{VerifyFull, VerifyChecksums} {
			t.Run(fmt.Sprintf("%s,verify=%d", c.name, mode), func(t *testing.T) {
				dir := t.TempDir()
				copyDir(t, template, dir)
				opts := migrateOptions()
				opts.Verify = mode
				opts.interrupt = func(step string) error {
					if step != stepCopied {
						return nil
					}
					sd := shardDir(filepath.Join(dir, stagingPrefix+"4"), 1)
					db, err := bdg.Open(badgerOptions(sd, testOptions(0).withDefaults(), testOptions(0).Logger))
					if err != nil {
						return err
					}
					err = db.Update(c.damage)
					if cerr := db.Close(); err == nil {
						err = cerr
					}
					return err
				}
				if _, err := Migrate(context.Background(), dir, 2, 4, opts); !errors.Is(err, ErrMigrationVerify) {
					t.Fatalf("Migrate over damaged new shards: %v, want ErrMigrationVerify", err)
				}
				if n, err := ShardCount(dir); err != nil || n != 2 {
					t.Errorf("ShardCount = %d, %v; want 2", n, err)
				}
			})
		}
	}
}

// firstKey returns the smallest key txn sees.
func firstKey(t *testing.T, txn *bdg.Txn) []byte {
	t.Helper()
	it := txn.NewIterator(bdg.IteratorOptions{})
	defer it.Close()
	it.Rewind()
	if !it.Valid() {
		t.Fatal("empty shard")
	}
	return it.Item().KeyCopy(nil)
}

// crashDirEnv names the data directory TestMigrateChildProcess writes to.
const crashDirEnv = "SHARDQ_MIGRATE_CRASH_DIR"

// crashBatches are what TestMigrateChildProcess writes, by shard of 2:
// the metadata of queue "orders" and 200 messages on each of its 4
// partitions.
func crashBatches() map[int]*queue.Batch {
	out := map[int]*queue.Batch{0: {Queues: []queue.QueueMeta{{Name: "orders", Partitions: 4}}}}
	for p := range 4 {
		sh := queue.ShardOf("orders", p, 2)
		if out[sh] == nil {
			out[sh] = &queue.Batch{}
		}
		for off := range uint64(200) {
			out[sh].Appends = append(out[sh].Appends, queue.Append{Queue: "orders", Partition: p,
				Message: &queue.Message{Offset: off, Payload: fmt.Appendf(nil, "%d/%d", p, off)}})
		}
	}
	return out
}

// TestMigrateChildProcess is not a test: TestMigrateAfterCrash runs it in
// a child process, which writes crashBatches, says so, and waits to be
// killed.
func TestMigrateChildProcess(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestMigrateAfterCrash")
	}
	st, err := Open(dir, testOptions(2))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	for sh, b := range crashBatches() {
		if err := st.Shard(sh).Write(b, true); err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
	}
	fmt.Println("written")
	select {} // until SIGKILL
}

// TestMigrateAfterCrash migrates the shards of a process killed with
// SIGKILL: Badger cannot open them read-only before it replays their logs,
// so even a dry run opens them read-write.
func TestMigrateAfterCrash(t *testing.T) {
	dir := t.TempDir()
	killAfterWritten(t, "TestMigrateChildProcess", crashDirEnv+"="+dir)

	const keys = 1 + 4 // the queue's metadata and an entry per partition
	dry := migrateOptions()
	dry.DryRun = true
	if rep, err := Migrate(context.Background(), dir, 2, 4, dry); err != nil || rep.Keys != keys {
		t.Fatalf("dry run after a crash: %d keys, %v; want %d", rep.Keys, err, keys)
	}
	if rep := mustMigrate(t, dir, 2, 4, migrateOptions()); rep.Keys != keys {
		t.Fatalf("migrated %d keys, want %d", rep.Keys, keys)
	}
	st := openTest(t, dir, testOptions(4))
	defer st.Close()
	snap := snapshot(t, st)
	for p := range 4 {
		msgs := snap.Partitions[fmt.Sprintf("orders/%d", p)].Messages
		if len(msgs) != 200 || string(msgs[199].Payload) != fmt.Sprintf("%d/199", p) {
			t.Errorf("orders/%d has %d messages after the migration, want 200", p, len(msgs))
		}
	}
}

func TestMigrateMarker(t *testing.T) {
	for _, c := range []struct{ from, to int }{{1, 2}, {12, 99}} {
		m := marker("/data dir", c.from, c.to)
		from, to, ok := parseMarker(m)
		if !ok || from != c.from || to != c.to {
			t.Errorf("parseMarker(%q) = %d, %d, %v", m, from, to, ok)
		}
		// Open must refuse it: a node never starts mid-swap.
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, shardsFile), m, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ShardCount(dir); !errors.Is(err, ErrBadDataDir) {
			t.Errorf("ShardCount of a marker: %v, want ErrBadDataDir", err)
		}
	}
	for _, s := range []string{"2\n", "migrating from 2 to\n", "migrating from 0 to 4 shards", "migrating from 02 to 4 shards"} {
		if _, _, ok := parseMarker([]byte(s)); ok {
			t.Errorf("parseMarker(%q) accepted it", s)
		}
	}
}

func ExampleMigrate() {
	dir, err := os.MkdirTemp("", "shardq-migrate-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// A node with 2 shards stored a queue and 3 messages, one entry, then
	// stopped.
	opts := DefaultOptions()
	opts.Shards = 2
	opts.Logger = slog.New(slog.DiscardHandler)
	st, err := Open(dir, opts)
	if err != nil {
		panic(err)
	}
	// Queue metadata lives in shard 0, a partition in the shard of
	// queue.ShardOf.
	meta := &queue.Batch{Queues: []queue.QueueMeta{{Name: "orders", Partitions: 1}}}
	if err := st.Shard(0).Write(meta, true); err != nil {
		panic(err)
	}
	msgs := &queue.Batch{}
	for off := range uint64(3) {
		msgs.Appends = append(msgs.Appends, queue.Append{Queue: "orders", Partition: 0, Message: &queue.Message{Offset: off}})
	}
	if err := st.Shard(queue.ShardOf("orders", 0, 2)).Write(msgs, true); err != nil {
		panic(err)
	}
	if err := st.Close(); err != nil {
		panic(err)
	}

	// Move it to 4 shards; it can then be opened with 4 and only 4.
	rep, err := Migrate(context.Background(), dir, 2, 4, MigrateOptions{Storage: Options{Logger: opts.Logger}})
	if err != nil {
		panic(err)
	}
	n, _ := ShardCount(dir)
	fmt.Printf("%d keys copied; the data dir has %d shards\n", rep.Keys, n)
	// Output: 2 keys copied; the data dir has 4 shards
}
