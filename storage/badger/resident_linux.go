package badger

import (
	"bufio"
	"bytes"
	"maps"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// releaseLogPages hands back to the kernel the pages this process has
// mapped of the Badger files under dir (an absolute path) that it no
// longer needs resident, and returns how many bytes it asked to page out.
//
// Badger writes its value logs, memtable logs and LSM tables through
// shared mappings, and every page written stays resident, charged to the
// process and its cgroup, until the file is deleted: a node's memory grew
// with what it wrote and with every message of a backlog. Consumers that
// keep up read the newest messages from memory, and a backlog is read
// once, in order. So of each value log and memtable log only the newest
// logKeep bytes stay, and of each table only its end, which holds the
// index and bloom filter every lookup reads.
//
// It uses madvise(MADV_PAGEOUT), which never discards data: a dirty page
// is only unmapped and stays in the page cache until Badger's sync writes
// it, a clean one is dropped and read from disk again when needed. So a
// mapping that changed between reading /proc/self/maps and the call (a
// file removed, its range reused by another mapping) costs at most pages
// read in again, never data.
//
// tops holds the top found of each mapping (residentTop) from one pass to
// the next: the search starts there.
func releaseLogPages(dir string, logKeep int64, tops residentTops) int64 {
	listing, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0
	}
	prefix := dir + string(os.PathSeparator)
	page := uintptr(os.Getpagesize())
	var released int64
	seen := make(residentTops, len(tops))
	sc := bufio.NewScanner(bytes.NewReader(listing))
	for sc.Scan() {
		m, ok := parseMapping(sc.Text())
		if !ok || !strings.HasPrefix(m.path, prefix) {
			continue
		}
		keep, ok := keepOf(m.path, logKeep)
		if !ok {
			continue
		}
		top := residentTopFrom(m.start, m.end, tops[m], page)
		seen[m] = top
		if top <= m.start || int64(top-m.start) <= keep {
			continue
		}
		end := (top - uintptr(keep)) &^ (page - 1)
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, m.start, end-m.start, unix.MADV_PAGEOUT)
		if errno == 0 {
			released += int64(end - m.start)
		}
	}
	clear(tops)
	maps.Copy(tops, seen)
	return released
}

// residentTops is the top (residentTop) found of each mapping of a
// Badger file in the last pass of releaseLogPages.
type residentTops map[mapping]uintptr

// topWindow is how much of a mapping residentTopFrom looks at in one
// mincore call.
const topWindow = 4 << 20

// residentTopFrom is residentTop of [start, end), searched upward from
// from, the top found in the last pass. A log is written upward from
// there and a table not at all, and the pages below the top stay
// resident (logKeep of them, or a table's end), so the page below it is
// still resident and the top is at or above it: a few MiB are looked at
// instead of the whole mapping, which for a value log is twice its
// size (512 MiB by default). With no top from the last pass, or when the
// page below it is gone (the kernel dropped it), the whole mapping is.
func residentTopFrom(start, end, from, page uintptr) uintptr {
	if from <= start || from > end {
		return residentTop(start, end, page)
	}
	top := uintptr(0)
	for lo := from - page; lo < end; {
		hi := min(lo+topWindow, end)
		t := residentTop(lo, hi, page)
		if t == lo {
			break // nothing resident from lo: the top is below
		}
		top = t
		if t < hi {
			break // a log's top: nothing above it was written
		}
		lo = hi
	}
	if top == 0 {
		return residentTop(start, end, page)
	}
	return top
}

// tableKeep is how much of the end of each LSM table stays resident: its
// index and bloom filter, which Badger reads in place for every lookup,
// are there (about 100 KiB for a 4 MiB table).
const tableKeep = 256 << 10

// keepOf returns how many of the newest bytes of a Badger file stay
// resident, and false for a file left alone (the manifest, the discard
// stats).
func keepOf(path string, logKeep int64) (int64, bool) {
	switch {
	case strings.HasSuffix(path, ".vlog"), strings.HasSuffix(path, ".mem"):
		return logKeep, true
	case strings.HasSuffix(path, ".sst"):
		return tableKeep, true
	}
	return 0, false
}

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uintptr
	path       string
}

// parseMapping parses "start-end perms offset dev inode path"; the path,
// which may hold spaces, is the rest of the line.
func parseMapping(line string) (mapping, bool) {
	var f [5]string
	rest := line
	for i := range f {
		var ok bool
		if f[i], rest, ok = strings.Cut(strings.TrimLeft(rest, " "), " "); !ok {
			return mapping{}, false
		}
	}
	path := strings.TrimLeft(rest, " ")
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok || path == "" {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end <= start {
		return mapping{}, false
	}
	return mapping{start: uintptr(start), end: uintptr(end), path: path}, true
}

// residentTop returns the end of the highest page of [start, end) that is
// in the page cache (mincore), or start when none is. A log is written
// from its start and its mapping reaches past its end, so that is where
// its writes reached; a table is written whole, so that is its end.
func residentTop(start, end, page uintptr) uintptr {
	n := (end - start + page - 1) / page
	vec := make([]byte, n)
	_, _, errno := syscall.Syscall(syscall.SYS_MINCORE, start, end-start, uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return start
	}
	for i := len(vec) - 1; i >= 0; i-- {
		if vec[i]&1 != 0 {
			return start + uintptr(i+1)*page
		}
	}
	return start
}
