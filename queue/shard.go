package queue

import (
	"hash/fnv"
	"strconv"
)

// ShardOf returns the shard that holds a partition in a store of shards
// shards: FNV-1a-32 of "queue/partition" (the partition in decimal) mod
// shards. The partition's messages, watermark and the state of every group
// on it live in that shard; queue metadata lives in shard 0. The rule fixes
// the shard count of a data directory: changing it moves data (storage
// migration), never just a restart. shards must be at least 1.
func ShardOf(queue string, partition, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(queue))
	h.Write([]byte{'/'})
	h.Write([]byte(strconv.Itoa(partition)))
	return int(h.Sum32() % uint32(shards))
}
