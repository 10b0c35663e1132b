//go:build unix

package badger

import (
	"io/fs"
	"syscall"
)

// allocated is the space fi's file takes on disk: its allocated blocks.
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
