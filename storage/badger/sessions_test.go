package badger

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
)

func TestSessionKeyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		rec         SessionRecord
		owner, name string
	}{
		{SessionClient, "dev-1", ""},
		{SessionSubscription, "dev-1", "$queue/orders"},
		{SessionSubscription, "dev-1", "a/+/#"},
		{SessionInflight, "dev-1", "\x00\x07"}, // a packet ID may hold 0x00
		{SessionRetained, "sensors/1/temp", ""},
		{SessionClient, "", ""},
	} {
		k := sessionKey(c.rec, c.owner, c.name)
		rec, owner, name, ok := splitSessionKey(k)
		if !ok || rec != c.rec || owner != c.owner || name != c.name {
			t.Errorf("splitSessionKey(%q) = %c %q %q %v, want %c %q %q", k, rec, owner, name, ok, c.rec, c.owner, c.name)
		}
		if !validSessionKey(k) {
			t.Errorf("validSessionKey(%q) = false", k)
		}
		if from, to, err := newRouter(3, 5).route(k); err != nil || from != 0 || to != 0 {
			t.Errorf("route(%q) = %d, %d, %v; want shard 0", k, from, to, err)
		}
	}
	for _, k := range [][]byte{{kindSession}, {kindSession, sep, 'C'}, {kindSession, sep, 'X', 'a', sep}, []byte("c\x00Cnosep")} {
		if validSessionKey(k) {
			t.Errorf("validSessionKey(%q) = true", k)
		}
	}
}

type sessionRow struct{ owner, name, value string }

func scanSessions(t *testing.T, ss *Sessions, rec SessionRecord) []sessionRow {
	t.Helper()
	var out []sessionRow
	if err := ss.Scan(rec, func(owner, name string, v []byte) error {
		out = append(out, sessionRow{owner, name, string(v)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSessionsWriteScanReopen(t *testing.T) {
	dir := t.TempDir()
	st := openTest(t, dir, testOptions(2))
	ss := st.Sessions()
	must := func(ws ...SessionWrite) {
		t.Helper()
		if err := ss.Write(ws...); err != nil {
			t.Fatal(err)
		}
	}
	must(SessionWrite{Record: SessionClient, Owner: "a", Value: []byte("A")},
		SessionWrite{Record: SessionClient, Owner: "b", Value: []byte("B")},
		SessionWrite{Record: SessionSubscription, Owner: "a", Name: "x/#", Value: []byte("1")},
		SessionWrite{Record: SessionSubscription, Owner: "a", Name: "$queue/q", Value: []byte("2")},
		SessionWrite{Record: SessionSubscription, Owner: "ab", Name: "y", Value: []byte("3")},
		SessionWrite{Record: SessionInflight, Owner: "a", Name: "\x00\x01", Value: []byte("m1")},
		SessionWrite{Record: SessionRetained, Owner: "t/1", Value: []byte("r1")})
	// Removing a's subscriptions leaves those of ab, whose ID a prefixes.
	must(SessionWrite{Record: SessionSubscription, Owner: "a", DeleteOwner: true},
		SessionWrite{Record: SessionClient, Owner: "b", Delete: true})
	if err := ss.Write(SessionWrite{Record: SessionClient, Owner: "bad\x00id"}); !errors.Is(err, ErrInvalidWrite) {
		t.Errorf("owner with 0x00: %v, want ErrInvalidWrite", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openTest(t, dir, testOptions(2))
	defer st.Close()
	ss = st.Sessions()
	for rec, want := range map[SessionRecord][]sessionRow{
		SessionClient:       {{"a", "", "A"}},
		SessionSubscription: {{"ab", "y", "3"}},
		SessionInflight:     {{"a", "\x00\x01", "m1"}},
		SessionRetained:     {{"t/1", "", "r1"}},
	} {
		if got := scanSessions(t, ss, rec); !reflect.DeepEqual(got, want) {
			t.Errorf("records %c after reopening: %q, want %q", rec, got, want)
		}
	}
}

func TestSessionsAsyncWritesAreSynced(t *testing.T) {
	o := testOptions(1)
	o.AsyncWrites = true
	st := openTest(t, t.TempDir(), o)
	defer st.Close()
	if err := st.Sessions().Write(SessionWrite{Record: SessionRetained, Owner: "t", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if got := scanSessions(t, st.Sessions(), SessionRetained); len(got) != 1 {
		t.Errorf("retained records: %q", got)
	}
}

func TestMigrateKeepsSessionsInShardZero(t *testing.T) {
	dir := t.TempDir()
	fillForMigration(t, dir, 2)
	st := openTest(t, dir, testOptions(2))
	if err := st.Sessions().Write(
		SessionWrite{Record: SessionClient, Owner: "dev", Value: []byte("c")},
		SessionWrite{Record: SessionSubscription, Owner: "dev", Name: "$share/g/$queue/events", Value: []byte("s")},
		SessionWrite{Record: SessionInflight, Owner: "dev", Name: "\x00\x09", Value: []byte("i")},
		SessionWrite{Record: SessionRetained, Owner: "a/b", Value: []byte("r")},
	); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	mustMigrate(t, dir, 2, 3, migrateOptions())
	st = openTest(t, dir, testOptions(3))
	defer st.Close()
	for rec, want := range map[SessionRecord][]sessionRow{
		SessionClient:       {{"dev", "", "c"}},
		SessionSubscription: {{"dev", "$share/g/$queue/events", "s"}},
		SessionInflight:     {{"dev", "\x00\x09", "i"}},
		SessionRetained:     {{"a/b", "", "r"}},
	} {
		if got := scanSessions(t, st.Sessions(), rec); !reflect.DeepEqual(got, want) {
			t.Errorf("records %c after migrating to 3 shards: %q, want %q", rec, got, want)
		}
	}
}

// Writes and submissions from many goroutines are group-committed, each
// goroutine's in its order.
func TestSessionsGroupCommit(t *testing.T) {
	st := openTest(t, t.TempDir(), testOptions(1))
	defer st.Close()
	ss := st.Sessions()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			owner := fmt.Sprintf("c%d", g)
			for i := range 50 {
				name := fmt.Sprintf("%03d", i)
				ss.Submit([]SessionWrite{{Record: SessionInflight, Owner: owner, Name: name, Value: []byte("v")}}, nil)
				if i%2 == 0 {
					ss.Submit([]SessionWrite{{Record: SessionInflight, Owner: owner, Name: name, Delete: true}}, nil)
				}
			}
			if err := ss.Write(SessionWrite{Record: SessionClient, Owner: owner, Value: []byte("c")}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(scanSessions(t, ss, SessionClient)); n != 8 {
		t.Errorf("%d clients, want 8", n)
	}
	// A Write returns after everything submitted before it is committed.
	if n := len(scanSessions(t, ss, SessionInflight)); n != 8*25 {
		t.Errorf("%d inflight records, want %d", n, 8*25)
	}
	ss.Submit([]SessionWrite{{Record: SessionRetained, Owner: "t", Value: []byte("r")}}, nil)
	if err := ss.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(scanSessions(t, ss, SessionRetained)); n != 1 {
		t.Errorf("%d retained records after Flush, want 1", n)
	}
	var got error
	ss.Submit([]SessionWrite{{Record: SessionClient, Owner: "a\x00b"}}, func(err error) { got = err })
	if !errors.Is(got, ErrInvalidWrite) {
		t.Errorf("Submit of a bad owner: %v", got)
	}
}
