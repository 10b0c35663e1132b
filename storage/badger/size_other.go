//go:build !unix

package badger

import "io/fs"

// allocated is the space fi's file takes on disk; here its size.
func allocated(fi fs.FileInfo) int64 { return fi.Size() }
