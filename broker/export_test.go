package broker

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/shardq/shardq/queue"
)

// AddHookForTest adds h to the node's MQTT server the way New adds its own
// hooks (guarded against panics).
func (b *Broker) AddHookForTest(h mqtt.Hook) error { return b.addHook(h) }

// ObserveCommitForTest tells the node's health about a storage commit, as
// the committers do.
func (b *Broker) ObserveCommitForTest(s queue.CommitStats) { b.health.commit(s) }

// SampleHistoryForTest takes the sample of every queue the node takes
// every 5 s, as at now.
func (b *Broker) SampleHistoryForTest(now time.Time) {
	b.history.record(now, b.manager.Queues(), func(q *queue.Queue) uint64 { return q.Info().Depth() })
}

// SetDiskFreeForTest replaces how the node reads the free space of its data
// directory (a fault seam: no disk is filled) and checks it at once.
func (b *Broker) SetDiskFreeForTest(f func(dir string) (uint64, error)) { b.disk.setFree(f) }
