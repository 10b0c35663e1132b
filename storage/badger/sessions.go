package badger

import (
	"bytes"
	"fmt"
	"strings"

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

// Sessions stores session records in shard 0 of a store.
type Sessions struct{ sh *Shard }

// Sessions returns the store's session records.
func (s *Store) Sessions() *Sessions { return &Sessions{sh: s.shards[0]} }

// Write applies ws in one transaction, durable when Write returns nil
// (fsynced, also under AsyncWrites).
func (ss *Sessions) Write(ws ...SessionWrite) error {
	if len(ws) == 0 {
		return nil
	}
	for _, w := range ws {
		if strings.IndexByte(w.Owner, sep) >= 0 {
			return fmt.Errorf("%w: session owner %q", ErrInvalidWrite, w.Owner)
		}
	}
	s := ss.sh
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	err := s.db.Update(func(txn *bdg.Txn) error {
		for _, w := range ws {
			var err error
			switch {
			case w.DeleteOwner:
				err = deleteSessionPrefix(txn, sessionPrefix(w.Record, w.Owner, true))
			case w.Delete:
				err = txn.Delete(sessionKey(w.Record, w.Owner, w.Name))
			default:
				err = txn.Set(sessionKey(w.Record, w.Owner, w.Name), w.Value)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && s.async {
		err = s.syncLocked()
	}
	if err != nil {
		return fmt.Errorf("storage: sessions: %w", err)
	}
	return nil
}

func deleteSessionPrefix(txn *bdg.Txn, prefix []byte) error {
	var keys [][]byte
	err := scan(txn, prefix, false, func(k, _ []byte) error {
		keys = append(keys, bytes.Clone(k))
		return nil
	})
	for _, k := range keys {
		if err == nil {
			err = txn.Delete(k)
		}
	}
	return err
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
