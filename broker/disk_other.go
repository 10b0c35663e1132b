//go:build !linux

package broker

// freeSpace cannot read the free space here: the watermark is not enforced.
func freeSpace(dir string) (uint64, error) { return 0, errFreeUnknown }
