package raftlog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// ents returns entries lo to hi of the term, with data naming both.
func ents(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &raftpb.Entry{
			Index: proto.Uint64(i),
			Term:  proto.Uint64(term),
			Type:  raftpb.EntryNormal.Enum(),
			Data:  fmt.Appendf(nil, "e%d-t%d", i, term),
		})
	}
	return out
}

func hs(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

func load(t *testing.T, s *Store, group string) State {
	t.Helper()
	st, err := s.Load(group)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkEntries fails unless got are entries of the wanted index and term.
func checkEntries(t *testing.T, got []*raftpb.Entry, want ...[]*raftpb.Entry) {
	t.Helper()
	w := slices.Concat(want...)
	if len(got) != len(w) {
		t.Fatalf("got %d entries (%v), want %d", len(got), indexes(got), len(w))
	}
	for i := range w {
		if !proto.Equal(got[i], w[i]) {
			t.Fatalf("entry %d = %v, want %v", i, got[i], w[i])
		}
	}
}

func indexes(es []*raftpb.Entry) []uint64 {
	var out []uint64
	for _, e := range es {
		out = append(out, e.GetIndex())
	}
	return out
}

func save(t *testing.T, s *Store, ws ...Write) {
	t.Helper()
	if err := s.Save(ws, true); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	s := open(t, t.TempDir())
	if st := load(t, s, "none"); st.HardState != nil || st.ConfState != nil || st.Snapshot != nil ||
		st.Entries != nil || st.Applied != 0 || st.Meta != nil {
		t.Fatalf("Load of an unknown group = %+v, want zero", st)
	}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	save(t, s,
		Write{Group: "orders/3", HardState: hs(2, 1, 4), ConfState: cs, Entries: ents(1, 5, 2), Applied: 3, Meta: []byte("replicas 1,2,3")},
		Write{Group: "orders/30", Entries: ents(1, 2, 1)},
		Write{Group: "audit/0", HardState: hs(1, 0, 0)},
		Write{Group: "empty"}, // changes nothing: not stored
	)
	st := load(t, s, "orders/3")
	if !proto.Equal(st.HardState, hs(2, 1, 4)) || !proto.Equal(st.ConfState, cs) || st.Snapshot != nil ||
		st.Applied != 3 || string(st.Meta) != "replicas 1,2,3" {
		t.Fatalf("orders/3 = %+v", st)
	}
	checkEntries(t, st.Entries, ents(1, 5, 2))
	st = load(t, s, "orders/30")
	if st.HardState != nil || st.ConfState != nil || st.Applied != 0 || st.Meta != nil {
		t.Fatalf("orders/30 = %+v", st)
	}
	checkEntries(t, st.Entries, ents(1, 2, 1))
	checkEntries(t, load(t, s, "audit/0").Entries)

	groups, err := s.Groups()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"audit/0", "orders/3", "orders/30"}; !slices.Equal(groups, want) {
		t.Fatalf("Groups = %q, want %q", groups, want)
	}

	// nil and zero fields leave the stored values unchanged; Meta may be
	// emptied.
	save(t, s, Write{Group: "orders/3", Entries: ents(6, 6, 2), Meta: []byte{}})
	st = load(t, s, "orders/3")
	if !proto.Equal(st.HardState, hs(2, 1, 4)) || !proto.Equal(st.ConfState, cs) || st.Applied != 3 ||
		st.Meta == nil || len(st.Meta) != 0 {
		t.Fatalf("orders/3 after an append = %+v", st)
	}
	checkEntries(t, st.Entries, ents(1, 6, 2))
}

func TestSaveRefuses(t *testing.T) {
	s := open(t, t.TempDir())
	for name, w := range map[string]Write{
		"0x00 in name":       {Group: "a\x00b", Entries: ents(1, 1, 1)},
		"empty name":         {Group: "", Entries: ents(1, 1, 1)},
		"nil entry":          {Group: "g", Entries: []*raftpb.Entry{nil}},
		"index 0":            {Group: "g", Entries: ents(0, 1, 1)},
		"decreasing indexes": {Group: "g", Entries: append(ents(3, 4, 1), ents(2, 2, 1)...)},
	} {
		if err := s.Save([]Write{{Group: "ok", Entries: ents(1, 1, 1)}, w}, true); err == nil {
			t.Errorf("%s: Save succeeded", name)
		}
	}
	if _, err := s.Load("a\x00b"); err == nil {
		t.Error("Load of a name with 0x00 succeeded")
	}
	if groups, err := s.Groups(); err != nil || len(groups) != 0 {
		t.Fatalf("Groups = %q, %v after refused Saves, want none", groups, err)
	}
}

func TestTruncation(t *testing.T) {
	s := open(t, t.TempDir())
	save(t, s, Write{Group: "g", Entries: ents(1, 10, 1)}, Write{Group: "h", Entries: ents(1, 3, 1)})

	// A shorter overwrite from index 5 deletes 5 to 10 and writes 5 to 7.
	save(t, s, Write{Group: "g", Entries: ents(5, 7, 2)})
	checkEntries(t, load(t, s, "g").Entries, ents(1, 4, 1), ents(5, 7, 2))
	checkEntries(t, load(t, s, "h").Entries, ents(1, 3, 1))

	// A longer one, and after it an append.
	save(t, s, Write{Group: "g", Entries: ents(3, 9, 3)})
	save(t, s, Write{Group: "g", Entries: ents(10, 11, 3)})
	checkEntries(t, load(t, s, "g").Entries, ents(1, 2, 1), ents(3, 11, 3))

	// Two writes of one group in one Save apply in order.
	save(t, s,
		Write{Group: "g", Entries: ents(12, 15, 3), HardState: hs(3, 1, 10)},
		Write{Group: "h", Entries: ents(4, 4, 1)},
		Write{Group: "g", Entries: ents(14, 14, 4), HardState: hs(4, 2, 12)},
	)
	st := load(t, s, "g")
	checkEntries(t, st.Entries, ents(1, 2, 1), ents(3, 13, 3), ents(14, 14, 4))
	if !proto.Equal(st.HardState, hs(4, 2, 12)) {
		t.Fatalf("HardState = %v", st.HardState)
	}

	// A reopened store, which knows nothing of the stored indexes yet,
	// truncates the same way.
	dir := t.TempDir()
	s2 := open(t, dir)
	save(t, s2, Write{Group: "g", Entries: ents(1, 6, 1)})
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	s2 = open(t, dir)
	save(t, s2, Write{Group: "g", Entries: ents(2, 3, 2)})
	checkEntries(t, load(t, s2, "g").Entries, ents(1, 1, 1), ents(2, 3, 2))
}

func TestCompact(t *testing.T) {
	s := open(t, t.TempDir())
	save(t, s, Write{Group: "g", Entries: ents(1, 20, 2)}, Write{Group: "h", Entries: ents(1, 5, 1)})
	if err := s.Compact("g", 12, 2); err != nil {
		t.Fatal(err)
	}
	st := load(t, s, "g")
	if st.Snapshot.GetIndex() != 12 || st.Snapshot.GetTerm() != 2 {
		t.Fatalf("Snapshot = %v, want index 12 term 2", st.Snapshot)
	}
	checkEntries(t, st.Entries, ents(13, 20, 2))
	checkEntries(t, load(t, s, "h").Entries, ents(1, 5, 1))
	if load(t, s, "h").Snapshot != nil {
		t.Fatal("h has a snapshot point")
	}

	// Compacting to an earlier point changes nothing.
	if err := s.Compact("g", 10, 2); err != nil {
		t.Fatal(err)
	}
	if st := load(t, s, "g"); st.Snapshot.GetIndex() != 12 || len(st.Entries) != 8 {
		t.Fatalf("after Compact to 10: snapshot %v, %d entries", st.Snapshot, len(st.Entries))
	}

	// Past the last entry, as after a snapshot from the leader; the log
	// goes on after it.
	if err := s.Compact("g", 30, 3); err != nil {
		t.Fatal(err)
	}
	checkEntries(t, load(t, s, "g").Entries)
	save(t, s, Write{Group: "g", Entries: ents(31, 32, 3)})
	st = load(t, s, "g")
	checkEntries(t, st.Entries, ents(31, 32, 3))
	if st.Snapshot.GetIndex() != 30 || st.Snapshot.GetTerm() != 3 {
		t.Fatalf("Snapshot = %v, want index 30 term 3", st.Snapshot)
	}

	// A group with nothing else stored is listed once compacted.
	if err := s.Compact("new", 5, 1); err != nil {
		t.Fatal(err)
	}
	if groups, _ := s.Groups(); !slices.Equal(groups, []string{"g", "h", "new"}) {
		t.Fatalf("Groups = %q", groups)
	}
}

// TestTornTail: a write cut short by a crash is cut off at the next open;
// everything before it stays.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	save(t, s, Write{Group: "g", HardState: hs(1, 1, 5), Entries: ents(1, 5, 1)})
	save(t, s, Write{Group: "g", HardState: hs(1, 1, 9), Entries: ents(6, 9, 1)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	st, err := os.Stat(segs[len(segs)-1])
	if err != nil {
		t.Fatal(err)
	}
	// Lose the last 10 bytes, as a crash in the middle of the write would.
	if err := os.Truncate(segs[len(segs)-1], st.Size()-10); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	// The unfinished write goes whole: it was never synced.
	got := load(t, s, "g")
	checkEntries(t, got.Entries, ents(1, 5, 1))
	if got.HardState.GetCommit() != 5 {
		t.Fatalf("hard state %v: want the one of the last complete write", got.HardState)
	}
	// Writes go on after the cut.
	save(t, s, Write{Group: "g", HardState: hs(1, 1, 6), Entries: ents(6, 6, 1)})
	_ = s.Close()
	checkEntries(t, load(t, open(t, dir), "g").Entries, ents(1, 6, 1))
}

// TestSegments: past its size a new segment starts; the old ones go once
// every group compacted what they hold, and a reopened store finds it all.
func TestSegments(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SegmentSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 200; i++ {
		save(t, s, Write{Group: "g", HardState: hs(1, 1, i), Entries: ents(i, i, 1)}, Write{Group: "idle", Applied: i})
		if i%20 == 0 {
			if err := s.Compact("g", i-5, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) > 4 {
		t.Fatalf("%d segments left: compacted ones should go", len(segs))
	}
	_ = s.Close()
	s = open(t, dir)
	st := load(t, s, "g")
	checkEntries(t, st.Entries, ents(196, 200, 1))
	if st.Snapshot.GetIndex() != 195 || st.HardState.GetCommit() != 200 || load(t, s, "idle").Applied != 200 {
		t.Fatalf("after reopening: snapshot %v, hard state %v", st.Snapshot, st.HardState)
	}
}

// TestUnsyncedSaves: a Save without sync (a commit index moving) is read
// back like any other, across segments, after a Close.
func TestUnsyncedSaves(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SegmentSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 100; i++ {
		save(t, s, Write{Group: "g", HardState: hs(1, 1, i-1), Entries: ents(i, i, 1)})
		if err := s.Save([]Write{{Group: "g", HardState: hs(1, 1, i)}}, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	st := load(t, s, "g")
	if st.HardState.GetCommit() != 100 {
		t.Fatalf("commit %d after reopening, want 100", st.HardState.GetCommit())
	}
	checkEntries(t, st.Entries, ents(1, 100, 1))
}

func TestDrop(t *testing.T) {
	s := open(t, t.TempDir())
	save(t, s,
		Write{Group: "g", HardState: hs(1, 1, 1), ConfState: &raftpb.ConfState{Voters: []uint64{1}}, Entries: ents(1, 50, 1), Applied: 1, Meta: []byte("m")},
		Write{Group: "g2", Entries: ents(1, 3, 1)},
	)
	if err := s.Compact("g", 10, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Drop("g"); err != nil {
		t.Fatal(err)
	}
	if st := load(t, s, "g"); st.HardState != nil || st.ConfState != nil || st.Snapshot != nil ||
		st.Entries != nil || st.Applied != 0 || st.Meta != nil {
		t.Fatalf("Load after Drop = %+v, want zero", st)
	}
	checkEntries(t, load(t, s, "g2").Entries, ents(1, 3, 1))
	if groups, _ := s.Groups(); !slices.Equal(groups, []string{"g2"}) {
		t.Fatalf("Groups = %q, want [g2]", groups)
	}
	if err := s.Drop("never"); err != nil {
		t.Fatalf("Drop of an unknown group: %v", err)
	}

	// The group can start again.
	save(t, s, Write{Group: "g", Entries: ents(1, 2, 5)})
	checkEntries(t, load(t, s, "g").Entries, ents(1, 2, 5))
	if groups, _ := s.Groups(); !slices.Equal(groups, []string{"g", "g2"}) {
		t.Fatalf("Groups = %q, want [g g2]", groups)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	cs := &raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}
	save(t, s,
		Write{Group: "a", HardState: hs(3, 2, 7), ConfState: cs, Entries: ents(1, 9, 3), Applied: 7, Meta: []byte{0, 1, 2}},
		Write{Group: "b", Entries: ents(1, 4, 1)},
		Write{Group: "c", Entries: ents(1, 4, 1)},
	)
	if err := s.Compact("a", 4, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Drop("c"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Load("a"); err == nil {
		t.Fatal("Load after Close succeeded")
	}
	if err := s.Save([]Write{{Group: "a", Applied: 8}}, true); err == nil {
		t.Fatal("Save after Close succeeded")
	}

	s = open(t, dir)
	if groups, _ := s.Groups(); !slices.Equal(groups, []string{"a", "b"}) {
		t.Fatalf("Groups = %q, want [a b]", groups)
	}
	st := load(t, s, "a")
	if !proto.Equal(st.HardState, hs(3, 2, 7)) || !proto.Equal(st.ConfState, cs) || st.Applied != 7 ||
		!bytes.Equal(st.Meta, []byte{0, 1, 2}) || st.Snapshot.GetIndex() != 4 || st.Snapshot.GetTerm() != 3 {
		t.Fatalf("a after reopening = %+v", st)
	}
	checkEntries(t, st.Entries, ents(5, 9, 3))
	checkEntries(t, load(t, s, "b").Entries, ents(1, 4, 1))
}

func TestLargeSave(t *testing.T) {
	const groups, perGroup = 50, 400 // 20k entries of 1 KiB
	dir := t.TempDir()
	s := open(t, dir)
	data := bytes.Repeat([]byte{'x'}, 1<<10)
	ws := make([]Write, groups)
	for g := range ws {
		ws[g] = Write{Group: fmt.Sprintf("q/%d", g), HardState: hs(1, 1, perGroup)}
		for i := uint64(1); i <= perGroup; i++ {
			ws[g].Entries = append(ws[g].Entries, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Data: data})
		}
	}
	save(t, s, ws...)
	check := func(s *Store) {
		t.Helper()
		names, err := s.Groups()
		if err != nil || len(names) != groups {
			t.Fatalf("Groups: %d, %v; want %d", len(names), err, groups)
		}
		for _, w := range ws {
			st := load(t, s, w.Group)
			if len(st.Entries) != perGroup || !proto.Equal(st.HardState, w.HardState) {
				t.Fatalf("%s: %d entries, HardState %v", w.Group, len(st.Entries), st.HardState)
			}
			for i, e := range st.Entries {
				if e.GetIndex() != uint64(i+1) || !bytes.Equal(e.GetData(), data) {
					t.Fatalf("%s: entry %d has index %d, %d bytes", w.Group, i, e.GetIndex(), len(e.GetData()))
				}
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(open(t, dir))
}

func TestConcurrentUse(t *testing.T) {
	s := open(t, t.TempDir())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			g := fmt.Sprintf("g%d", w)
			for i := uint64(1); i <= 20; i++ {
				if err := s.Save([]Write{{Group: g, Entries: ents(i, i, 1), HardState: hs(1, 1, i)}}, true); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.Load(g); err != nil {
					t.Error(err)
					return
				}
				if i%5 == 0 {
					if err := s.Compact(g, i-2, 1); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := s.Groups(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	for w := range 4 {
		checkEntries(t, load(t, s, fmt.Sprintf("g%d", w)).Entries, ents(19, 20, 1))
	}
}
