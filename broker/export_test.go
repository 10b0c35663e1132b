package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/shardq/shardq/queue"
)

// AddHookForTest adds h to the node's MQTT server the way New adds its own
// hooks (guarded against panics).
func (b *Broker) AddHookForTest(h mqtt.Hook) error { return b.addHook(h) }

// ObserveCommitForTest tells the node's health about a storage commit, as
// the committers do.
func (b *Broker) ObserveCommitForTest(s queue.CommitStats) { b.health.commit(s) }

// SetDiskFreeForTest replaces how the node reads the free space of its data
// directory (a fault seam: no disk is filled) and checks it at once.
func (b *Broker) SetDiskFreeForTest(f func(dir string) (uint64, error)) { b.disk.setFree(f) }
