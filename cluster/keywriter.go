package cluster

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keyWriter writes keys of the cluster to etcd in the background: in the
// order they were first asked, the latest value of each key only, several
// in one transaction; a write etcd did not take is tried again every
// keyWriterRetry until the node closes. The retained messages
// (retained.go) and the persistent sessions (sessions.go) are written so.
type keyWriter struct {
	n    *Node
	what string // what it writes, for the log
	once sync.Once
	wake chan struct{}

	mu      sync.Mutex
	pending map[string]*pendingWrite // by key, the latest to write
	order   []string                 // keys pending, first come first
}

// pendingWrite is a key's value to write (nil: delete the key) and what
// waits for it: the writes of its key it replaced wait for it too. still,
// when set, is asked before each try: a write no longer wanted is
// dropped, as if written.
type pendingWrite struct {
	value   *string
	still   func() bool
	written chan struct{}
}

// Bounds of one write: etcd's default limits are 128 operations and
// 1.5 MiB per request.
const (
	keyWriterBatch      = 64
	keyWriterBatchBytes = 1 << 20
	keyWriterRetry      = 500 * time.Millisecond
)

func newKeyWriter(n *Node, what string) *keyWriter {
	return &keyWriter{n: n, what: what, wake: make(chan struct{}, 1), pending: map[string]*pendingWrite{}}
}

// put queues a write of key; the channel returned is closed once it, or
// a later write of the key, is in etcd.
func (w *keyWriter) put(key, value string) <-chan struct{} { return w.queue(key, &value, nil) }

// putWhile queues a write of key, as put, made only while still reports
// true when its turn comes (each try): a write that a try left in doubt
// and that is no longer this node's to make is not made again over a
// newer one of another node. still must not take w's lock.
func (w *keyWriter) putWhile(key, value string, still func() bool) <-chan struct{} {
	return w.queue(key, &value, still)
}

// del queues the deletion of key, as put.
func (w *keyWriter) del(key string) <-chan struct{} { return w.queue(key, nil, nil) }

func (w *keyWriter) queue(key string, value *string, still func() bool) <-chan struct{} {
	w.once.Do(func() { go w.run() })
	w.mu.Lock()
	p := w.pending[key]
	if p == nil {
		p = &pendingWrite{written: make(chan struct{})}
		w.pending[key] = p
		w.order = append(w.order, key)
	}
	p.value, p.still = value, still
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return p.written
}

// run writes what is pending until the node closes.
func (w *keyWriter) run() {
	// The retry timer runs only while a write failed.
	retry := time.NewTimer(keyWriterRetry)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-w.n.ctx.Done():
			return
		case <-w.wake:
		case <-retry.C:
		}
		for {
			keys, values := w.next()
			if len(keys) == 0 {
				break
			}
			if !w.write(keys, values) {
				retry.Reset(keyWriterRetry) // tried again then
				break
			}
			w.mu.Lock()
			w.order = w.order[len(keys):] // the batch is the first of them
			for i, key := range keys {
				p := w.pending[key]
				if p.value == values[i] {
					delete(w.pending, key)
					close(p.written)
				} else {
					w.order = append(w.order, key) // a newer one came meanwhile
				}
			}
			w.mu.Unlock()
		}
	}
}

// next returns the keys to write next, the oldest first, within the
// bounds of one write, and their values.
func (w *keyWriter) next() ([]string, []*string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The writes no longer wanted are done with, unwritten.
	kept := w.order[:0]
	for _, key := range w.order {
		if p := w.pending[key]; p.still != nil && !p.still() {
			delete(w.pending, key)
			close(p.written)
			continue
		}
		kept = append(kept, key)
	}
	w.order = kept
	var keys []string
	var values []*string
	size := 0
	for _, key := range w.order {
		v := w.pending[key].value
		n := len(key)
		if v != nil {
			n += len(*v)
		}
		if len(keys) == keyWriterBatch || len(keys) > 0 && size+n > keyWriterBatchBytes {
			break
		}
		keys, values = append(keys, key), append(values, v)
		size += n
	}
	return keys, values
}

// write writes the batch in one transaction; false when etcd did not
// take it.
func (w *keyWriter) write(keys []string, values []*string) bool {
	ops := make([]clientv3.Op, len(keys))
	for i, key := range keys {
		if values[i] == nil {
			ops[i] = clientv3.OpDelete(key)
		} else {
			ops[i] = clientv3.OpPut(key, *values[i])
		}
	}
	ctx, cancel := context.WithTimeout(w.n.ctx, 5*time.Second)
	defer cancel()
	if _, err := w.n.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
		w.n.log.Debug("writing to etcd", "what", w.what, "keys", len(keys), "err", err)
		return false
	}
	return true
}
