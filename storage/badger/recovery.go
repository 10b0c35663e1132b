package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	memExt  = ".mem"
	vlogExt = ".vlog"
)

// checkShardLogs checks, before Badger opens the shard directory dir, the
// logs Badger replays and cuts at open: every memtable log and the newest
// value-log file (see logcheck.go). It returns a *CorruptionError for the
// first damage found, and for a memtable log cut short that a newer one
// follows, unless async: with SyncWrites, a log was synced whole before
// Badger wrote to the next one. Writes cut short at the end of the logs
// are cut off here, with a warning, and every log checked is synced, so
// that what Badger replays is on disk before the shard counts it synced.
// Nothing is checked while another process holds the directory
// (errDirLocked).
func checkShardLogs(dir string, async bool, log *slog.Logger) error {
	unlock, err := lockDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // a new shard
	case errors.Is(err, errDirLocked):
		return err
	case err != nil:
		return fmt.Errorf("storage: locking %s: %w", dir, err)
	}
	defer unlock()
	mems, vlogs, err := listLogs(dir)
	if err != nil {
		return err
	}

	type checked struct {
		path string
		logCheck
	}
	var logs []checked
	// ends holds the end of each value-log file the memtable logs point
	// into: the newest as checkLog reads it, the others as they are.
	ends := map[uint32]int64{}
	if len(vlogs) > 0 {
		fid := vlogs[len(vlogs)-1]
		path := filepath.Join(dir, vlogName(fid))
		res, err := checkLogFile(path)
		if err != nil {
			return err
		}
		ends[fid] = res.kept
		logs = append(logs, checked{path, res})
	}
	for i, fid := range mems {
		path := filepath.Join(dir, memName(fid))
		res, err := checkLogFile(path)
		if err != nil {
			return err
		}
		if res.torn && i < len(mems)-1 && !async {
			return &CorruptionError{File: path, Offset: res.kept, Cause: fmt.Sprintf(
				"the log ends with a write cut short, but the newer log %s follows, so that write had been synced",
				memName(mems[len(mems)-1]))}
		}
		for _, fid := range slices.Sorted(maps.Keys(res.vptrs)) {
			if err := checkPointer(dir, path, res.vptrs[fid], vlogs, ends); err != nil {
				return err
			}
		}
		logs = append(logs, checked{path, res})
	}

	for _, l := range logs {
		if l.torn {
			log.Warn("a log ends with a write cut short, which was never synced: cut off",
				"file", l.path, "offset", l.kept)
		}
		if err := syncLog(l.path, l.torn, l.kept); err != nil {
			return err
		}
	}
	return nil
}

// checkPointer checks that the value p, held by an entry of the memtable
// log at path, is within its value-log file.
func checkPointer(dir, path string, p vptr, vlogs []uint32, ends map[uint32]int64) error {
	if _, ok := slices.BinarySearch(vlogs, p.fid); !ok {
		return nil // deleted by value-log GC after it moved the value
	}
	vpath := filepath.Join(dir, vlogName(p.fid))
	end, ok := ends[p.fid]
	if !ok {
		fi, err := os.Stat(vpath)
		if err != nil {
			return fmt.Errorf("storage: %w", err)
		}
		end = fi.Size()
		ends[p.fid] = end
	}
	if p.end() <= end {
		return nil
	}
	return &CorruptionError{File: vpath, Offset: end, Cause: fmt.Sprintf(
		"the value log ends there, but the entry at offset %d of %s points to a value at offsets %d to %d",
		p.from, path, p.offset, p.end())}
}

// checkLogFile runs checkLog on the file at path.
func checkLogFile(path string) (logCheck, error) {
	f, err := os.Open(path)
	if err != nil {
		return logCheck{}, fmt.Errorf("storage: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return logCheck{}, fmt.Errorf("storage: %w", err)
	}
	r := &logReader{r: f, size: fi.Size(), data: dataFrom(f, fi.Size())}
	res, dmg, err := checkLog(r)
	if err != nil {
		return logCheck{}, fmt.Errorf("storage: reading %s: %w", path, err)
	}
	if dmg != nil {
		return logCheck{}, &CorruptionError{File: path, Offset: dmg.offset, Cause: dmg.cause}
	}
	return res, nil
}

// syncLog syncs the log at path, first cutting it at kept when cut is set.
func syncLog(path string, cut bool, kept int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	if cut {
		err = f.Truncate(kept)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storage: syncing %s: %w", path, err)
	}
	return nil
}

// listLogs returns the file ids of the memtable logs and value-log files
// in dir, each sorted.
func listLogs(dir string) (mems, vlogs []uint32, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("storage: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		for _, kind := range []struct {
			ext  string
			fids *[]uint32
		}{{memExt, &mems}, {vlogExt, &vlogs}} {
			if !strings.HasSuffix(name, kind.ext) {
				continue
			}
			// Badger refuses names it cannot parse: it says so itself.
			if fid, err := strconv.ParseUint(strings.TrimSuffix(name, kind.ext), 10, 32); err == nil {
				*kind.fids = append(*kind.fids, uint32(fid))
			}
		}
	}
	slices.Sort(mems)
	slices.Sort(vlogs)
	return mems, vlogs, nil
}

func vlogName(fid uint32) string { return fmt.Sprintf("%06d%s", fid, vlogExt) }

func memName(fid uint32) string { return fmt.Sprintf("%05d%s", fid, memExt) }
