package broker

import (
	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/storage/raftlog"
)

// raftStore gives the cluster the node's raft log store.
type raftStore struct{ s *raftlog.Store }

var _ cluster.RaftStore = raftStore{}

func (r raftStore) Load(group string) (cluster.RaftState, error) {
	st, err := r.s.Load(group)
	return cluster.RaftState(st), err
}

func (r raftStore) Save(ws []cluster.RaftWrite, sync bool) error {
	out := make([]raftlog.Write, len(ws))
	for i, w := range ws {
		out[i] = raftlog.Write(w)
	}
	return r.s.Save(out, sync)
}

func (r raftStore) Compact(group string, index, term uint64) error {
	return r.s.Compact(group, index, term)
}

func (r raftStore) Drop(group string) error { return r.s.Drop(group) }

func (r raftStore) Recovering() bool { return r.s.Recovering() }
func (r raftStore) Recovered() error { return r.s.Recovered() }

func (r raftStore) MarkRecovering(why string) error { return r.s.MarkRecovering(why) }
func (r raftStore) Groups() ([]string, error)      { return r.s.Groups() }
