package badger

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/shardq/shardq/queue"
)

// residentFiles sums the resident bytes (Rss in /proc/self/smaps) of this
// process's mappings of files under dir, by file.
func residentFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := regexp.MustCompile(`^[0-9a-f]+-[0-9a-f]+ `)
	out := map[string]int64{}
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if head.MatchString(line) {
			cur = ""
			if fs := strings.Fields(line); len(fs) >= 6 && strings.HasPrefix(fs[5], dir+"/") {
				cur = fs[5]
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && cur != "" {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			out[cur] += kb << 10
		}
	}
	return out
}

// bigPayload is message off's payload: 2 KiB, so that entries of many
// go to the value log, and each one tells its offset.
func bigPayload(off uint64) []byte {
	head := fmt.Appendf(nil, "message %d;", off)
	return append(head, bytes.Repeat([]byte{byte(off)}, 2048-len(head))...)
}

func writeBig(t *testing.T, sh *Shard, from, to uint64) {
	t.Helper()
	for off := from; off < to; off += 64 {
		b := &queue.Batch{}
		for o := off; o < min(off+64, to); o++ {
			b.Appends = append(b.Appends, queue.Append{Queue: "q", Partition: 0, Message: &queue.Message{Offset: o, Payload: bigPayload(o)}})
		}
		mustWrite(t, sh, b)
	}
}

func readBig(t *testing.T, sh *Shard, to uint64) {
	t.Helper()
	var next uint64
	for next < to {
		msgs, err := sh.Read("q", 0, next, math.MaxUint64, 1024)
		if err != nil || len(msgs) == 0 {
			t.Fatalf("Read from %d: %d messages, %v", next, len(msgs), err)
		}
		for _, m := range msgs {
			if m.Offset != next || !bytes.Equal(m.Payload, bigPayload(next)) {
				t.Fatalf("offset %d: read offset %d, payload %.20q", next, m.Offset, m.Payload)
			}
			next++
		}
	}
}

// A node's resident memory does not grow with what it wrote: of a value
// log only the newest LogResident bytes stay mapped, of a table its index,
// and every message reads back whole, before and after a restart.
func TestStoreHandsBackWrittenPages(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(1)
	o.LogResident = -1 // released by hand below, not by the store's loop
	st := openTest(t, dir, o)
	const keep, n = 1 << 20, 12 << 10 // 24 MiB of payloads
	writeBig(t, st.Shard(0), 0, n)

	kinds := func(files map[string]int64) (vlog, tables int64, mapped int) {
		for path, rss := range files {
			switch filepath.Ext(path) {
			case ".vlog", ".mem":
				vlog += rss
				mapped++
			case ".sst":
				tables = max(tables, rss)
			}
		}
		return vlog, tables, mapped
	}
	if vlog, _, _ := kinds(residentFiles(t, dir)); vlog < 16<<20 {
		t.Fatalf("before: %d bytes of logs resident after writing %d MiB; the test measures nothing", vlog, n*2048>>20)
	}
	tops := residentTops{}
	if released := releaseLogPages(dir, keep, tops); released < 16<<20 {
		t.Errorf("released %d bytes, want most of %d MiB", released, n*2048>>20)
	}
	handedBack := func(when string) {
		t.Helper()
		files := residentFiles(t, dir)
		vlog, table, mapped := kinds(files)
		if slack := int64(256 << 10); vlog > int64(mapped)*keep+slack {
			t.Errorf("%s: %d bytes of %d logs resident, want at most %d each: %v", when, vlog, mapped, keep, files)
		}
		if table > tableKeep+256<<10 {
			t.Errorf("%s: a table has %d bytes resident, want its last %d: %v", when, table, tableKeep, files)
		}
	}
	handedBack("after")

	// The next pass searches each top from the last one's: it finds
	// the logs' new ends, 16 MiB further.
	writeBig(t, st.Shard(0), n, n+8192)
	if released := releaseLogPages(dir, keep, tops); released < 12<<20 {
		t.Errorf("the second pass released %d bytes, want most of 16 MiB", released)
	}
	handedBack("after the second pass")
	page := uintptr(os.Getpagesize())
	for m, top := range tops {
		if full := residentTop(m.start, m.end, page); top != full {
			t.Errorf("%s: the pass found its top at %d, a scan of the whole mapping at %d", m.path, top-m.start, full-m.start)
		}
	}

	readBig(t, st.Shard(0), n+8192)
	writeBig(t, st.Shard(0), n+8192, n+9216) // into pages handed back
	releaseLogPages(dir, keep, tops)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openTest(t, dir, o)
	defer st.Close()
	readBig(t, st.Shard(0), n+9216)
}

func TestParseMapping(t *testing.T) {
	for _, tc := range []struct {
		line string
		want mapping
		ok   bool
	}{
		{"7f00a000-7f00c000 rw-s 00000000 08:01 1234                       /data/shard-00/000001.vlog",
			mapping{0x7f00a000, 0x7f00c000, "/data/shard-00/000001.vlog"}, true},
		{"7f00a000-7f00c000 rw-s 00000000 08:01 1234 /my data/shard-00/00001.mem",
			mapping{0x7f00a000, 0x7f00c000, "/my data/shard-00/00001.mem"}, true},
		{"7f00a000-7f00c000 rw-p 00000000 00:00 0 ", mapping{}, false}, // anonymous
		{"7f00c000-7f00a000 rw-s 00000000 08:01 1234 /x.vlog", mapping{}, false},
		{"garbage", mapping{}, false},
	} {
		got, ok := parseMapping(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseMapping(%q) = %+v, %t; want %+v, %t", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
