package queue

import (
	"cmp"
	"container/heap"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// Sharding is a consumer's share of its group's messages (subscription
// properties shard-by, shard-count and shards): it takes only the messages
// whose shard, MessageShard of the By properties mod Count, is one of
// Shards. The group's consumers share the work when their shards together
// cover 0 to Count-1; a message whose shard no consumer of the group holds
// waits for one (set aside by each cursor, up to maxParked). A consumer
// without sharding takes every shard. Every sharded consumer of a group
// uses the same By and Count while any of them is connected.
type Sharding struct {
	// By names the message user properties whose values decide the
	// shard; "key" is the message's key. Default: key.
	By []string
	// Count is the number of shards, 1 to MaxShards.
	Count int
	// Shards are the shards this consumer takes, each below Count.
	Shards []int
}

// MaxShards bounds a group's shard count.
const MaxShards = 4096

// ShardByKey is the shard-by of a sharding that names none.
const ShardByKey = "key"

// Check reports what is wrong with s, in words a subscriber can act on.
func (s *Sharding) Check() error {
	if s.Count < 1 || s.Count > MaxShards {
		return fmt.Errorf("%w: shard-count %d is not from 1 to %d", ErrBadSharding, s.Count, MaxShards)
	}
	if len(s.Shards) == 0 {
		return fmt.Errorf("%w: shards names none of the %d shards (give shards=0,1,... below shard-count)", ErrBadSharding, s.Count)
	}
	for _, id := range s.Shards {
		if id < 0 || id >= s.Count {
			return fmt.Errorf("%w: shard %d is not below shard-count %d", ErrBadSharding, id, s.Count)
		}
	}
	for _, name := range s.By {
		if name == "" {
			return fmt.Errorf("%w: shard-by names an empty property", ErrBadSharding)
		}
	}
	return nil
}

// by returns the properties the shard is computed over.
func (s *Sharding) by() []string {
	if len(s.By) == 0 {
		return []string{ShardByKey}
	}
	return s.By
}

// scheme names how a sharding splits messages, for messages that say so.
func (s *Sharding) scheme() string {
	return fmt.Sprintf("%s into %d shards", strings.Join(s.by(), ","), s.Count)
}

// MessageShard returns m's shard among count: FNV-1a-64 of the values of
// the properties by (the message's key for "key", else its first user
// property of that name, "" when it has none), joined by a 0x00 byte, mod
// count.
func MessageShard(m *Message, by []string, count int) int {
	h := fnv.New64a()
	for i, name := range by {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(propertyValue(m, name)))
	}
	return int(h.Sum64() % uint64(count))
}

func propertyValue(m *Message, name string) string {
	if name == ShardByKey {
		return m.Key
	}
	for _, p := range m.Headers.User {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// groupSharding is a group's sharding while sharded consumers are
// connected: the scheme they share and how many of them hold each shard.
// Guarded by every lock of the queue for writes; read under any
// partition's lock.
type groupSharding struct {
	by      []string
	count   int
	members int   // sharded consumers connected
	holders []int // holders[s]: sharded consumers that take shard s
}

// shardOf returns m's shard under the group's sharding.
func (g *group) shardOf(m *Message) int {
	return MessageShard(m, g.sharding.by, g.sharding.count)
}

// checkShardingLocked reports whether a consumer with sharding s (nil:
// none) may join g (nil: a new group) of a queue ordered by ordering.
func checkShardingLocked(q string, g *group, name string, ordering Ordering, s *Sharding) error {
	if s == nil {
		return nil
	}
	if err := s.Check(); err != nil {
		return err
	}
	if ordering == OrderPartition {
		return fmt.Errorf("%w: queue %s gives each partition to one consumer (ordering partition); subscribe without shards, or claim partitions", ErrBadSharding, q)
	}
	if g == nil || g.sharding.members == 0 {
		return nil
	}
	if gs := g.sharding; !slices.Equal(gs.by, s.by()) || gs.count != s.Count {
		have := Sharding{By: gs.by, Count: gs.count}
		return fmt.Errorf("%w: group %s of queue %s is sharded by %s; this subscription asks for %s: use the group's shard-by and shard-count, or another group",
			ErrShardingMismatch, name, q, have.scheme(), s.scheme())
	}
	return nil
}

// joinSharding counts c, a consumer with sharding s, in the group's
// sharding, which it sets when c is the first. Every lock of the queue
// must be held.
func (g *group) joinSharding(c *Consumer, s *Sharding) {
	if s == nil {
		return
	}
	gs := &g.sharding
	if gs.members == 0 {
		gs.by, gs.count, gs.holders = slices.Clone(s.by()), s.Count, make([]int, s.Count)
	}
	gs.members++
	c.shards = make([]bool, s.Count)
	for _, id := range s.Shards {
		if !c.shards[id] {
			c.shards[id] = true
			gs.holders[id]++
		}
	}
}

// leaveSharding takes c out of the group's sharding. When it was the last
// sharded consumer, the messages set aside for a shard go back to the
// ready ones: the group is no longer sharded. Every lock of the queue must
// be held.
func (g *group) leaveSharding(c *Consumer) {
	if c.shards == nil {
		return
	}
	gs := &g.sharding
	for id, held := range c.shards {
		if held {
			gs.holders[id]--
		}
	}
	if gs.members--; gs.members > 0 {
		return
	}
	*gs = groupSharding{}
	for _, cur := range g.cursors {
		cur.unsetAsideLocked()
	}
}

// accepts reports whether c takes m: c is not sharded, or m's shard is
// one of c's.
func (c *Consumer) accepts(m *Message) bool {
	return c.shards == nil || c.shards[c.g.shardOf(m)]
}

// heldShard reports whether a consumer of the group takes shard s: one without
// sharding takes every shard.
func (g *group) heldShard(s int) bool {
	return g.sharding.holders[s] > 0 || len(g.consumers) > g.sharding.members
}

// takerLocked returns the consumer m goes to when cons does not take its
// shard: another consumer of the group that takes it, may take the
// partition, and had a credit to give (taken); nil when none has. The
// partition's lock must be held.
func (c *cursor) takerLocked(m *Message, cons *Consumer, uniform bool) *Consumer {
	cs := c.g.consumers
	for i := range cs {
		o := cs[(c.rr+i)%len(cs)]
		if o == cons || o.closed || !o.accepts(m) || !uniform && !c.g.takes(o, c.p.index) {
			continue
		}
		if o.take(c.g) {
			return o
		}
	}
	return nil
}

// setAsideLocked keeps pd, whose shard no consumer could take now, until
// one can, in offset order within its shard. The partition's lock must be
// held.
func (c *cursor) setAsideLocked(pd *pending) {
	if c.aside == nil {
		c.aside = map[int][]*pending{}
	}
	s := c.g.shardOf(pd.m)
	list := c.aside[s]
	i, _ := slices.BinarySearchFunc(list, pd.m.Offset, func(w *pending, off uint64) int { return cmp.Compare(w.m.Offset, off) })
	c.aside[s] = slices.Insert(list, i, pd)
	c.asideN++
	c.asideBytes += int64(len(pd.m.Payload))
}

// takeAsideLocked returns the first message set aside that cons, or
// another consumer with credit, takes, and that consumer; nil when there
// is none. The partition's lock must be held.
func (c *cursor) takeAsideLocked(cons *Consumer, uniform bool) (*pending, *Consumer) {
	for s, list := range c.aside {
		pd := list[0]
		to := cons
		if !cons.accepts(pd.m) {
			if to = c.takerLocked(pd.m, cons, uniform); to == nil {
				continue
			}
		}
		if len(list) == 1 {
			delete(c.aside, s)
		} else {
			list[0] = nil
			c.aside[s] = list[1:]
		}
		c.asideN--
		c.asideBytes -= int64(len(pd.m.Payload))
		return pd, to
	}
	return nil, nil
}

// waitsForHolder reports whether a message set aside has a consumer that
// takes its shard (it waits for that consumer's credit, not for a new
// consumer). The partition's lock must be held.
func (c *cursor) waitsForHolder() bool {
	for s := range c.aside {
		if c.g.heldShard(s) {
			return true
		}
	}
	return false
}

// unsetAsideLocked makes every message set aside ready again (each was
// due when it was set aside). The partition's lock must be held.
func (c *cursor) unsetAsideLocked() {
	for _, list := range c.aside {
		for _, pd := range list {
			heap.Push(&c.ready, pd)
		}
	}
	c.aside, c.asideN, c.asideBytes = nil, 0, 0
}
