package badger

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
)

func TestKeysSortByPartitionThenOffset(t *testing.T) {
	offsets := []uint64{0, 1, 9, 10, 255, 256, 65535, 1 << 32, math.MaxUint64}
	parts := []uint32{0, 1, 2, 10, 256, math.MaxUint32}
	var keys [][]byte
	for _, p := range parts {
		// Entries that do not overlap, by first offset: [0,0] [1,8] [9,9]
		// [10,254] ... [MaxUint64,MaxUint64].
		for i, first := range offsets {
			last := first
			if i+1 < len(offsets) {
				last = offsets[i+1] - 1
			}
			keys = append(keys, entryKey("q", p, first, last))
		}
	}
	if !slices.IsSortedFunc(keys, bytes.Compare) {
		t.Fatal("entry keys do not sort by partition, then offset")
	}
	n := partitionPrefixLen("q")
	for _, k := range keys {
		first, last, ok := entrySpan(k, n)
		if !ok || !slices.Contains(offsets, first) || last < first {
			t.Fatalf("entrySpan(%q) = %d, %d, %v", k, first, last, ok)
		}
	}
	for _, bad := range [][]byte{entryKey("q", 0, 5, 4), entryKey("q", 0, 1, 2)[:n+8], append(entryKey("q", 0, 1, 2), 0)} {
		if _, _, ok := entrySpan(bad, n); ok {
			t.Errorf("entrySpan accepted %q", bad)
		}
	}
}

func TestKeysPrefixesAreUnambiguous(t *testing.T) {
	type ref struct {
		q string
		p uint32
	}
	refs := []ref{{"a", 0}, {"a", 1}, {"a", 10}, {"a.b", 0}, {"a/$dlq", 1}, {"ab", 1}, {"a", 0x2e620000}}
	for _, x := range refs {
		for _, y := range refs {
			if x == y {
				continue
			}
			for _, kind := range []byte{kindMessage, kindLow, kindTrim, kindFloor, kindSettled, kindDelivery} {
				px := partitionPrefix(kind, x.q, x.p)
				for _, k := range [][]byte{
					entryKey(y.q, y.p, 7, 9), lowKey(y.q, y.p), trimKey(y.q, y.p), floorKey(y.q, y.p, "g"),
					markKey(kindSettled, y.q, y.p, "g", 7), markKey(kindDelivery, y.q, y.p, "g", 7),
				} {
					if bytes.HasPrefix(k, px) {
						t.Fatalf("key %q of %v starts with the %c prefix of %v", k, y, kind, x)
					}
				}
			}
		}
	}
	// Groups: the marks of one group never start with another's prefix.
	groups := []string{"g", "g1", "g\x01", "grüppe", ""}
	for _, g := range groups {
		pre := markPrefix(kindSettled, "q", 0, g)
		rest := len(partitionPrefix(kindSettled, "q", 0))
		for _, h := range groups {
			k := markKey(kindSettled, "q", 0, h, 300)
			if (g == h) != bytes.HasPrefix(k, pre) {
				t.Fatalf("mark of group %q vs prefix of group %q", h, g)
			}
			name, off, ok := splitMarkKey(k[rest:])
			if !ok || name != h || off != 300 {
				t.Fatalf("splitMarkKey(%q) = %q, %d, %v", k, name, off, ok)
			}
		}
	}
	// Queue meta keys end with the name: they are read by exact key or by
	// scanning all of them, never by one queue's prefix.
	if k := queueKey("a.b"); !bytes.HasPrefix(k, queuePrefix) || string(k[len(queuePrefix):]) != "a.b" {
		t.Fatalf("queueKey(a.b) = %q", k)
	}
}

func TestKeysRefuseWhatTheyCannotHold(t *testing.T) {
	for _, c := range []struct {
		q, g string
		p    int
	}{{"", "", 0}, {"a\x00", "", 0}, {"a", "g\x00", 0}, {"a", "", -1}, {"a", "", math.MaxUint32 + 1}} {
		if _, err := checkRef(c.q, c.g, c.p); !errors.Is(err, ErrInvalidWrite) {
			t.Errorf("checkRef(%q, %q, %d) = %v", c.q, c.g, c.p, err)
		}
	}
	if p, err := checkRef("a/$dlq", "grüppe 1", math.MaxUint32); err != nil || p != math.MaxUint32 {
		t.Errorf("checkRef of valid names = %d, %v", p, err)
	}
}
