//go:build !linux

package badger

import "os"

// dataFrom has every byte of f read: holes are skipped on Linux only.
func dataFrom(*os.File, int64) func(off int64) (int64, error) { return nil }

// lockDir takes no lock: on Linux it takes Badger's directory lock while
// the logs are checked.
func lockDir(string) (unlock func(), err error) { return func() {}, nil }

// datasync flushes f.
func datasync(f *os.File) error { return f.Sync() }

// releaseLogPages keeps every page: only Linux has MADV_PAGEOUT.
func releaseLogPages(string, int64, residentTops) int64 { return 0 }

// residentTops is kept between the passes of releaseLogPages on Linux.
type residentTops struct{}
