package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	bdg "github.com/dgraph-io/badger/v4"
)

// syncedFile names the file in each shard directory that records the
// number of the shard's last commit known synced.
//
// Every transaction a shard commits sets commitKey to its number, one
// more than the last (txnWriter), so the shard holds the number of the
// last commit it kept. A commit is known synced once Badger returned
// from it with SyncWrites, or once a sync followed it (AsyncWrites). Every
// WitnessInterval, a shard whose known-synced number grew writes it to
// this file with an fsync of its own: no commit waits for it. Open refuses
// a shard holding a lower number than the file (*LostWritesError): synced
// commits were lost, though every log read back.
//
// The file is two slots of witnessSlot bytes, written in turn, each the
// number (u64 BE) and a CRC-32C of the slot's index and the number: a
// write torn by a crash spoils one slot, and the other still holds the
// number before.
const syncedFile = "SYNCED"

const (
	witnessSlot = 16
	witnessSize = 2 * witnessSlot
)

// witness is a shard's SYNCED file, open for writing.
type witness struct {
	mu      sync.Mutex
	f       *os.File
	next    int    // the slot the next record goes to
	written uint64 // the number the file holds
}

// readWitness returns the number dir's SYNCED file holds, 0 when there is
// none, and the slot to write next.
func readWitness(dir string) (synced uint64, next int, err error) {
	path := filepath.Join(dir, syncedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("storage: reading %s: %w", path, err)
	}
	if len(b) != witnessSize {
		return 0, 0, &CorruptionError{File: path, Offset: 0,
			Cause: fmt.Sprintf("the file is %d bytes, not %d", len(b), witnessSize)}
	}
	n0, ok0 := decodeWitnessSlot(0, b)
	n1, ok1 := decodeWitnessSlot(1, b[witnessSlot:])
	switch {
	case ok1 && (!ok0 || n1 > n0):
		return n1, 0, nil
	case ok0:
		return n0, 1, nil
	}
	return 0, 0, &CorruptionError{File: path, Offset: 0,
		Cause: "neither slot holding the last synced commit number matches its checksum"}
}

// openWitness opens dir's SYNCED file, creating it when there is none.
func openWitness(dir string) (*witness, error) {
	synced, next, err := readWitness(dir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, syncedFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		b := make([]byte, 0, witnessSize)
		b = appendWitnessSlot(b, 0, 0)
		b = appendWitnessSlot(b, 1, 0)
		if err := writeFileSynced(dir, syncedFile, b); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("storage: opening %s: %w", path, err)
	}
	return &witness{f: f, next: next, written: synced}, nil
}

// record writes synced to the file and syncs it, unless the file holds as
// much already.
func (w *witness) record(synced uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil || synced <= w.written {
		return nil
	}
	slot := appendWitnessSlot(make([]byte, 0, witnessSlot), w.next, synced)
	_, err := w.f.WriteAt(slot, int64(w.next*witnessSlot))
	if err == nil {
		err = datasync(w.f)
	}
	if err != nil {
		return fmt.Errorf("storage: writing %s: %w", w.f.Name(), err)
	}
	w.next = 1 - w.next
	w.written = synced
	return nil
}

func (w *witness) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

func appendWitnessSlot(dst []byte, i int, n uint64) []byte {
	dst = binary.BigEndian.AppendUint64(dst, n)
	dst = binary.BigEndian.AppendUint32(dst, witnessSum(i, n))
	return append(dst, 0, 0, 0, 0)
}

func decodeWitnessSlot(i int, b []byte) (uint64, bool) {
	n := binary.BigEndian.Uint64(b)
	return n, binary.BigEndian.Uint32(b[8:]) == witnessSum(i, n)
}

func witnessSum(i int, n uint64) uint32 {
	var b [9]byte
	b[0] = byte(i)
	binary.BigEndian.PutUint64(b[1:], n)
	return crc32.Checksum(b[:], castagnoli)
}

// commitNumber returns the number of the last commit db holds, 0 for none.
func commitNumber(db *bdg.DB) (uint64, error) {
	var n uint64
	err := db.View(func(txn *bdg.Txn) (err error) {
		n, _, err = getUint64(txn, commitKey)
		return err
	})
	return n, err
}

// checkSynced returns the number of the last commit db, the shard in dir,
// holds, or a *LostWritesError when it holds less than synced.
func checkSynced(db *bdg.DB, dir string, synced uint64) (uint64, error) {
	n, err := commitNumber(db)
	if err != nil {
		return 0, fmt.Errorf("storage: reading the commit number of %s: %w", dir, err)
	}
	if n < synced {
		return 0, &LostWritesError{Dir: dir, Stored: n, Synced: synced}
	}
	return n, nil
}

// recordSynced writes the number of the shard's last commit known synced
// to its SYNCED file when it grew.
func (s *Shard) recordSynced() {
	if err := s.witness.record(s.synced.Load()); err != nil {
		s.log.Warn("recording the last synced commit failed", "err", err)
	}
}
