// Package raftstore gives cluster/multiraft the raft log of
// storage/raftlog: the two packages may not know each other, and their
// types have the same fields.
package raftstore

import (
	"github.com/shardq/shardq/cluster/multiraft"
	"github.com/shardq/shardq/storage/raftlog"
)

// Store is a raftlog.Store as a multiraft.Store.
type Store struct{ S *raftlog.Store }

var _ multiraft.Store = Store{}

func (r Store) Load(group string) (multiraft.State, error) {
	st, err := r.S.Load(group)
	return multiraft.State(st), err
}

func (r Store) Save(ws []multiraft.Write, sync bool) error {
	out := make([]raftlog.Write, len(ws))
	for i, w := range ws {
		out[i] = raftlog.Write(w)
	}
	return r.S.Save(out, sync)
}

func (r Store) Compact(group string, index, term uint64) error {
	return r.S.Compact(group, index, term)
}

func (r Store) Drop(group string) error         { return r.S.Drop(group) }
func (r Store) Recovering() bool                { return r.S.Recovering() }
func (r Store) Recovered() error                { return r.S.Recovered() }
func (r Store) MarkRecovering(why string) error { return r.S.MarkRecovering(why) }
func (r Store) Groups() ([]string, error)       { return r.S.Groups() }
