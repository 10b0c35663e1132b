package badger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardq/shardq/queue"
)

// TestWitnessSlots writes the SYNCED file's slots in turn and reads it
// back whole, with one slot spoiled, with both, and cut short.
func TestWitnessSlots(t *testing.T) {
	dir := t.TempDir()
	if n, _, err := readWitness(dir); err != nil || n != 0 {
		t.Fatalf("no SYNCED file: %d, %v; want 0", n, err)
	}
	w, err := openWitness(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{5, 9, 9, 3, 12} { // never lowered
		if err := w.record(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, syncedFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n, next, err := readWitness(dir); err != nil || n != 12 || next != 1 {
		t.Fatalf("readWitness: %d, slot %d, %v; want 12, slot 1", n, next, err)
	}

	cases := []struct {
		name  string
		spoil func(b []byte) []byte
		want  uint64 // 0: damage
	}{
		{"newer slot torn", func(b []byte) []byte { b[3] ^= 1; return b }, 9},
		{"older slot torn", func(b []byte) []byte { b[witnessSlot+9] ^= 1; return b }, 12},
		{"both torn", func(b []byte) []byte { b[3] ^= 1; b[witnessSlot+3] ^= 1; return b }, 0},
		{"cut short", func(b []byte) []byte { return b[:witnessSlot] }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(path, c.spoil(append([]byte(nil), b...)), 0o644); err != nil {
				t.Fatal(err)
			}
			n, _, err := readWitness(dir)
			var ce *CorruptionError
			switch {
			case c.want == 0 && (!errors.As(err, &ce) || ce.File != path):
				t.Fatalf("readWitness: %d, %v; want the damage of %s", n, err, path)
			case c.want != 0 && (err != nil || n != c.want):
				t.Fatalf("readWitness: %d, %v; want %d", n, err, c.want)
			}
		})
	}
}

// TestStoreCommitNumbers follows a shard's commit number and the last
// commit known synced through writes, a batch committed in parts, a
// reopen, and writes without a sync.
func TestStoreCommitNumbers(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(1)
	o.MemTableSize = 1 << 20 // transactions of about 150 KiB
	st := openTest(t, dir, o)
	sh := st.Shard(0)
	for off := range uint64(3) {
		mustWrite(t, sh, &queue.Batch{Appends: appendsAt("q", 0, 0, off)})
	}
	if sh.seq != 3 || sh.synced.Load() != 3 {
		t.Fatalf("after 3 writes: commit %d, synced %d; want 3, 3", sh.seq, sh.synced.Load())
	}
	big := &queue.Batch{}
	for i := range uint64(20000) {
		big.Appends = append(big.Appends, queue.Append{Queue: "big", Partition: 1, Message: &queue.Message{
			Offset: 2 * i, Payload: fmt.Appendf(nil, "%064d", i)}})
	}
	mustWrite(t, sh, big)
	parts := sh.splits.Load() + 1
	if parts < 2 || sh.seq != 3+uint64(parts) {
		t.Fatalf("a batch in %d parts: commit %d, want %d", parts, sh.seq, 3+parts)
	}
	waitWitness(t, dir, sh.seq)
	last := sh.seq
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	o.AsyncWrites = true
	st = openTest(t, dir, o)
	defer st.Close()
	sh = st.Shard(0)
	if sh.seq != last || sh.synced.Load() != last {
		t.Fatalf("reopened: commit %d, synced %d; want %d, %d", sh.seq, sh.synced.Load(), last, last)
	}
	if err := sh.Write(&queue.Batch{Appends: appendsAt("q", 0, 0, 3)}, false); err != nil {
		t.Fatal(err)
	}
	if sh.seq != last+1 || sh.synced.Load() != last {
		t.Fatalf("a write without a sync: commit %d, synced %d; want %d, %d", sh.seq, sh.synced.Load(), last+1, last)
	}
	if err := sh.Sync(); err != nil {
		t.Fatal(err)
	}
	if sh.synced.Load() != last+1 {
		t.Fatalf("after Sync: synced %d, want %d", sh.synced.Load(), last+1)
	}
	waitWitness(t, dir, last+1)
}

// waitWitness waits until shard 0's SYNCED file in dir holds n.
func waitWitness(t *testing.T, dir string, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, _, err := readWitness(shardDir(dir, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("SYNCED holds %d after 5 s, want %d", got, n)
		}
	}
}
