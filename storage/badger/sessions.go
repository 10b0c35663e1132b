package badger

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	bdg "github.com/dgraph-io/badger/v4"
)

// kindSession keys hold the MQTT state that outlives a connection: the
// sessions of clients that asked for one, their subscriptions and
// undelivered messages, and the retained messages. They all live in shard
// 0 and belong to no partition:
//
//	c 0 record owner 0 name -> value (opaque to the store)
//
// record is one of the Session* bytes; owner is a client ID (a topic name
// for retained messages) and never holds 0x00; name, which may, is what
// tells the owner's records of one kind apart (a filter, a packet ID).
const kindSession byte = 'c'

// SessionRecord is the kind of a session record.
type SessionRecord byte

// Session record kinds.
const (
	SessionClient       SessionRecord = 'C' // owner: client ID; name: empty
	SessionSubscription SessionRecord = 'S' // owner: client ID; name: filter
	SessionInflight     SessionRecord = 'I' // owner: client ID; name: packet ID
	SessionRetained     SessionRecord = 'R' // owner: topic name; name: empty
)

// sessionKey is c 0 record owner 0 name.
func sessionKey(rec SessionRecord, owner, name string) []byte {
	k := make([]byte, 0, 4+len(owner)+len(name))
	k = append(k, kindSession, sep, byte(rec))
	k = append(k, owner...)
	k = append(k, sep)
	return append(k, name...)
}

// sessionPrefix is the prefix of every record of the kind; with an owner,
// of that owner's records of the kind.
func sessionPrefix(rec SessionRecord, owner string, ofOwner bool) []byte {
	k := []byte{kindSession, sep, byte(rec)}
	if ofOwner {
		k = append(k, owner...)
		k = append(k, sep)
	}
	return k
}

// splitSessionKey returns the record kind, owner and name of a session key.
func splitSessionKey(k []byte) (rec SessionRecord, owner, name string, ok bool) {
	if len(k) < 4 || k[0] != kindSession || k[1] != sep {
		return 0, "", "", false
	}
	rest := k[3:]
	i := bytes.IndexByte(rest, sep)
	if i < 0 {
		return 0, "", "", false
	}
	return SessionRecord(k[2]), string(rest[:i]), string(rest[i+1:]), true
}

// validSessionKey reports whether k, a key of kindSession, has the form
// sessionKey writes.
func validSessionKey(k []byte) bool {
	rec, _, _, ok := splitSessionKey(k)
	switch rec {
	case SessionClient, SessionSubscription, SessionInflight, SessionRetained:
		return ok
	}
	return false
}

// SessionWrite is one change of Sessions.Write: Value stored under
// (Record, Owner, Name), or, with Delete, that record removed; with
// DeleteOwner, every record of the kind of Owner removed.
type SessionWrite struct {
	Record      SessionRecord
	Owner, Name string
	Value       []byte
	Delete      bool
	DeleteOwner bool
}

// Sessions stores session records in shard 0 of a store. Writes are
// group-committed: whatever is submitted while a commit runs goes into the
// next one, one Badger transaction and one fsync for all of it.
type Sessions struct {
	sh *Shard

	mu       sync.Mutex
	pending  []sessionReq
	draining bool // a drain goroutine is running
}

type sessionReq struct {
	ws   []SessionWrite
	done func(error)
}

// Sessions returns the store's session records. Call it once: each
// Sessions group-commits its own writes.
func (s *Store) Sessions() *Sessions { return &Sessions{sh: s.shards[0]} }

// Write applies ws, durable when Write returns nil (fsynced, also under
// AsyncWrites), in the order of the calls to Write and Submit.
func (ss *Sessions) Write(ws ...SessionWrite) error {
	errc := make(chan error, 1)
	ss.Submit(ws, func(err error) { errc <- err })
	return <-errc
}

// Submit queues ws for the next commit and returns at once; done, when not
// nil, is called with the commit's outcome once ws is durable or failed.
func (ss *Sessions) Submit(ws []SessionWrite, done func(error)) {
	for _, w := range ws {
		if strings.IndexByte(w.Owner, sep) >= 0 {
			if done != nil {
				done(fmt.Errorf("%w: session owner %q", ErrInvalidWrite, w.Owner))
			}
			return
		}
	}
	if len(ws) == 0 {
		if done != nil {
			done(nil)
		}
		return
	}
	ss.mu.Lock()
	ss.pending = append(ss.pending, sessionReq{ws: ws, done: done})
	if !ss.draining {
		ss.draining = true
		go ss.drain()
	}
	ss.mu.Unlock()
}

// Flush returns once everything submitted before it is committed (or
// failed); its error is that of the last of those commits.
func (ss *Sessions) Flush() error {
	errc := make(chan error, 1)
	ss.mu.Lock()
	ss.pending = append(ss.pending, sessionReq{done: func(err error) { errc <- err }})
	if !ss.draining {
		ss.draining = true
		go ss.drain()
	}
	ss.mu.Unlock()
	return <-errc
}

// drain commits what is pending until nothing is.
func (ss *Sessions) drain() {
	for {
		ss.mu.Lock()
		batch := ss.pending
		ss.pending = nil
		if len(batch) == 0 {
			ss.draining = false
			ss.mu.Unlock()
			return
		}
		ss.mu.Unlock()
		err := ss.commit(batch)
		for _, r := range batch {
			if r.done != nil {
				r.done(err)
			}
		}
	}
}

// commit writes the batch in one transaction (several if it is larger
// than Badger allows) and syncs.
func (ss *Sessions) commit(batch []sessionReq) error {
	s := ss.sh
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	w, err := s.newWriter()
	defer w.discard()
	for _, r := range batch {
		for _, sw := range r.ws {
			if err != nil {
				break
			}
			switch {
			case sw.DeleteOwner:
				var keys [][]byte
				err = scan(w.txn, sessionPrefix(sw.Record, sw.Owner, true), false, func(k, _ []byte) error {
					keys = append(keys, bytes.Clone(k))
					return nil
				})
				for _, k := range keys {
					if err == nil {
						err = w.del(k)
					}
				}
			case sw.Delete:
				err = w.del(sessionKey(sw.Record, sw.Owner, sw.Name))
			default:
				err = w.set(sessionKey(sw.Record, sw.Owner, sw.Name), sw.Value)
			}
		}
	}
	if err := s.finish(w, err, true); err != nil {
		return fmt.Errorf("storage: sessions: %w", err)
	}
	return nil
}

// Scan calls fn for every record of the kind, in key order. The value is
// valid only during the call.
func (ss *Sessions) Scan(rec SessionRecord, fn func(owner, name string, value []byte) error) error {
	s := ss.sh
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return s.db.View(func(txn *bdg.Txn) error {
		return scan(txn, sessionPrefix(rec, "", false), true, func(k, v []byte) error {
			_, owner, name, ok := splitSessionKey(k)
			if !ok {
				return fmt.Errorf("%w: session key %q", ErrCorruptRecord, k)
			}
			return fn(owner, name, v)
		})
	})
}
