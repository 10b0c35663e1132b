package badger

import (
	"errors"
	"os"
	"syscall"
)

// seekData is lseek's SEEK_DATA: the next offset holding data.
const seekData = 3

// dataFrom returns a logReader's data function for f, of size bytes: it
// skips the holes of a sparse file. A file system that cannot tell holes
// has the file read whole.
func dataFrom(f *os.File, size int64) func(off int64) (int64, error) {
	return func(off int64) (int64, error) {
		d, err := f.Seek(off, seekData)
		switch {
		case errors.Is(err, syscall.ENXIO):
			return size, nil
		case err != nil:
			return off, nil
		}
		return d, nil
	}
}

// lockDir takes the lock Badger takes on a database directory (flock on
// the directory), so that no shardq process reads or cuts logs that
// another one writes. It fails with errDirLocked while another holds it.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errDirLocked
		}
		return nil, err
	}
	return func() { f.Close() }, nil // closing the last descriptor releases the lock
}

// datasync flushes f's data (fdatasync): its size does not change.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
