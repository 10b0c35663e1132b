//go:build !linux

package main

import "os"

// datasync flushes f; without fdatasync, a full fsync.
func datasync(f *os.File) error { return f.Sync() }
