package broker

import "syscall"

// freeSpace returns the bytes of dir's file system available to the
// process (what an unprivileged writer may still use).
func freeSpace(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
