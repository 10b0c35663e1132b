package badger

import (
	"fmt"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
	"github.com/shardq/shardq/queue"
)

// kindDedup keys record producers' dedup-ids:
// d 0 queue 0 partition dedup-id -> when the message was stored (unix ms, u64).
// They live with the partition whose message they stand for, so they move
// with it and are written in the same transaction as its append.
const kindDedup byte = 'd'

func dedupKey(q string, p uint32, id string) []byte {
	return append(partitionPrefix(kindDedup, q, p), id...)
}

func applyDedups(w *txnWriter, marks []queue.DedupMark) error {
	for _, m := range marks {
		k := dedupKey(m.Queue, uint32(m.Partition), m.ID)
		var err error
		if m.At.IsZero() {
			err = w.del(k)
		} else {
			err = w.set(k, putU64(uint64(m.At.UnixMilli())))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func validateDedups(marks []queue.DedupMark) error {
	for _, m := range marks {
		if _, err := checkRef(m.Queue, "", m.Partition); err != nil {
			return err
		}
		if m.ID == "" {
			return fmt.Errorf("%w: empty dedup-id for %s/%d", ErrInvalidWrite, m.Queue, m.Partition)
		}
	}
	return nil
}

// Dedups returns the dedup-ids recorded on the partition and when.
func (s *Shard) Dedups(q string, partition int) (map[string]time.Time, error) {
	p, err := checkRef(q, "", partition)
	if err != nil {
		return nil, err
	}
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	out := map[string]time.Time{}
	err = s.db.View(func(txn *bdg.Txn) error {
		prefix := partitionPrefix(kindDedup, q, p)
		return scan(txn, prefix, true, func(k, v []byte) error {
			ms, err := getU64(v)
			out[string(k[len(prefix):])] = time.UnixMilli(int64(ms)).UTC()
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: shard %d: dedup-ids of %s/%d: %w", s.id, q, p, err)
	}
	return out, nil
}
