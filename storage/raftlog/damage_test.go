package raftlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// fill writes 100 synced writes of 10 entries each to group g (commit
// following) and returns the offsets where each write ended, then closes
// the store as a crash after the last answer would leave it.
func fill(t *testing.T, dir string, o Options) []int64 {
	t.Helper()
	o.Dir = dir
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for i := uint64(0); i < 100; i++ {
		save(t, s, Write{Group: "g", HardState: hs(1, 1, i*10+10), Entries: ents(i*10+1, i*10+10, 1)})
		ends = append(ends, s.size)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return ends
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) == 0 {
		t.Fatal("no segment")
	}
	return segs[len(segs)-1]
}

// damage applies f to the bytes of the file.
func damage(t *testing.T, path string, f func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, f(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

func flip(from, n int64) func([]byte) []byte {
	return func(b []byte) []byte {
		for i := from; i < from+n && i < int64(len(b)); i++ {
			b[i] ^= 0x5a
		}
		return b
	}
}

// TestDamageRefused: synced data that does not read back is never cut off
// as if it were the end of an unfinished write: Open names the file and
// the offset.
func TestDamageRefused(t *testing.T) {
	cases := []struct {
		name string
		// at returns where the damage starts, given the ends of the writes.
		at     func(ends []int64) int64
		damage func(at int64) func([]byte) []byte
	}{
		{"64 bytes flipped in the middle", func(e []int64) int64 { return e[49] + 20 },
			func(at int64) func([]byte) []byte { return flip(at, 64) }},
		{"one byte of the last write", func(e []int64) int64 { return e[99] - 30 },
			func(at int64) func([]byte) []byte { return flip(at, 1) }},
		{"the last write's batch record made to run past the end", func(e []int64) int64 { return e[98] },
			func(at int64) func([]byte) []byte { return flip(at+1, 1) }},
		{"zeros over the last writes, the file as long", func(e []int64) int64 { return e[90] },
			func(at int64) func([]byte) []byte {
				return func(b []byte) []byte { clear(b[at:]); b[len(b)-1] = 1; return b }
			}},
		{"zeros in the middle", func(e []int64) int64 { return e[10] },
			func(at int64) func([]byte) []byte {
				return func(b []byte) []byte { clear(b[at : at+4096]); return b }
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ends := fill(t, dir, Options{})
			at := c.at(ends)
			seg := lastSegment(t, dir)
			damage(t, seg, c.damage(at))
			_, err := Open(Options{Dir: dir})
			var d *DamageError
			if !errors.As(err, &d) {
				t.Fatalf("Open: %v, want a *DamageError", err)
			}
			if d.File != seg || d.Offset < at-2048 || d.Offset > at+64 {
				t.Fatalf("damage reported in %s at %d, done to %s at %d", d.File, d.Offset, seg, at)
			}
			// Nothing was cut by the refusal.
			if st, _ := os.Stat(seg); st.Size() != ends[99] {
				t.Fatalf("segment of %d bytes after a refused open, want %d", st.Size(), ends[99])
			}
		})
	}
}

// TestDamageInAnOlderSegment: damage anywhere but the end of the newest
// segment is refused too.
func TestDamageInAnOlderSegment(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, Options{SegmentSize: 8 << 10})
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) < 3 {
		t.Fatalf("%d segments, want several", len(segs))
	}
	damage(t, segs[0], flip(2000, 8))
	_, err := Open(Options{Dir: dir, SegmentSize: 8 << 10})
	var d *DamageError
	if !errors.As(err, &d) || d.File != segs[0] {
		t.Fatalf("Open: %v, want a *DamageError in %s", err, segs[0])
	}
}

// TestUnfinishedWrites: what a process stopped in the middle of a write
// leaves is cut off, the complete writes kept.
func TestUnfinishedWrites(t *testing.T) {
	cases := []struct {
		name string
		cut  func(b []byte, ends []int64) []byte
		want uint64 // last entry kept
	}{
		{"the last write cut short", func(b []byte, e []int64) []byte { return b[:e[99]-7] }, 990},
		{"only its batch record's head", func(b []byte, e []int64) []byte { return b[:e[98]+5] }, 990},
		{"zeros after the last write", func(b []byte, e []int64) []byte { return append(b, make([]byte, 8192)...) }, 1000},
		{"zeros where the last write was", func(b []byte, e []int64) []byte { clear(b[e[98]:]); return b }, 990},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ends := fill(t, dir, Options{})
			damage(t, lastSegment(t, dir), func(b []byte) []byte { return c.cut(b, ends) })
			s := open(t, dir)
			st := load(t, s, "g")
			checkEntries(t, st.Entries, ents(1, c.want, 1))
			if st.HardState.GetCommit() != c.want || s.Recovering() {
				t.Fatalf("commit %d, recovering %v: want %d, false", st.HardState.GetCommit(), s.Recovering(), c.want)
			}
			save(t, s, Write{Group: "g", Entries: ents(c.want+1, c.want+1, 1)})
			_ = s.Close()
			checkEntries(t, load(t, open(t, dir), "g").Entries, ents(1, c.want+1, 1))
		})
	}
}

// TestSalvage: a salvaging Open cuts the log at the damaged write, sets
// what followed aside and stays recovering, across reopening, until told
// otherwise; groups keep their recovering flags.
func TestSalvage(t *testing.T) {
	dir := t.TempDir()
	ends := fill(t, dir, Options{})
	seg := lastSegment(t, dir)
	damage(t, seg, flip(ends[49]+20, 64))
	s, err := Open(Options{Dir: dir, Salvage: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Salvaged(); d == nil || d.Cut != ends[49] {
		t.Fatalf("salvaged %v, want the cut at %d, where the damaged write starts", d, ends[49])
	}
	checkEntries(t, load(t, s, "g").Entries, ents(1, 500, 1))
	if !s.Recovering() {
		t.Fatal("a salvaged store is not recovering")
	}
	aside, _ := filepath.Glob(seg + ".*.damaged")
	if st, err := os.Stat(aside[0]); len(aside) != 1 || err != nil || st.Size() != ends[99]-ends[49] {
		t.Fatalf("set aside: %v", aside)
	}
	yes, no := true, false
	save(t, s, Write{Group: "g", Recovering: &yes, Entries: ents(501, 501, 1)}, Write{Group: "h", Recovering: &yes})
	save(t, s, Write{Group: "h", Recovering: &no})
	_ = s.Close()

	// Across a new segment's checkpoint too.
	s, err = Open(Options{Dir: dir, SegmentSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	save(t, s, Write{Group: "x", Applied: 1})
	_ = s.Close()
	s = open(t, dir)
	if !s.Recovering() || !load(t, s, "g").Recovering || load(t, s, "h").Recovering {
		t.Fatalf("after reopening: store recovering %v, g %v, h %v; want true, true, false",
			s.Recovering(), load(t, s, "g").Recovering, load(t, s, "h").Recovering)
	}
	checkEntries(t, load(t, s, "g").Entries, ents(1, 501, 1))
	if err := s.Recovered(); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if open(t, dir).Recovering() {
		t.Fatal("still recovering after Recovered")
	}
}

// TestMarkRecovering: a store marked recovering stays so across reopening
// until Recovered.
func TestMarkRecovering(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if s.Recovering() {
		t.Fatal("a new store is recovering")
	}
	if err := s.MarkRecovering("its log was removed"); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s = open(t, dir)
	if !s.Recovering() {
		t.Fatal("not recovering after reopening")
	}
	if err := s.Recovered(); err != nil {
		t.Fatal(err)
	}
}

// TestLostUnsyncedWrites: a crash of the machine loses every write not
// yet synced (here: the segment is cut back to its size at the last
// sync, or a part of the write after it is kept). Every synced Save is
// found again, and the store opens without a damage error.
func TestLostUnsyncedWrites(t *testing.T) {
	for _, keep := range []int64{0, 5, 40} {
		t.Run(fmt.Sprintf("keep %d bytes of the lost writes", keep), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			var synced int64
			var last uint64
			for i := uint64(1); i <= 50; i++ {
				sync := i%3 != 0
				if err := s.Save([]Write{{Group: "g", HardState: hs(1, 1, i), Entries: ents(i, i, 1)}}, sync); err != nil {
					t.Fatal(err)
				}
				if sync {
					synced, last = s.size, i
				}
			}
			seg := lastSegment(t, dir)
			_ = s.Close()
			st, _ := os.Stat(seg)
			if err := os.Truncate(seg, min(st.Size(), synced+keep)); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(Options{Dir: dir})
			if err != nil {
				t.Fatalf("Open after losing unsynced writes: %v", err)
			}
			defer s2.Close()
			got := load(t, s2, "g")
			if n := len(got.Entries); uint64(n) < last || got.HardState.GetCommit() < last {
				t.Fatalf("%d entries, commit %d: want at least the %d synced", n, got.HardState.GetCommit(), last)
			}
		})
	}
}
