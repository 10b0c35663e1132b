package config_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardq/shardq/config"
)

func ExampleLoad() {
	dir, err := os.MkdirTemp("", "shardq-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "shardq.yaml")
	err = os.WriteFile(file, []byte(`
node_id: node-a
listen:
  mqtt: ":1884"        # every address: clients of other machines connect
mqtt:
  allow_anonymous: true  # without credentials (or set auth.users_file)
queues:
  defaults:
    max_deliveries: 3
  declared:
    orders:
      partitions: 16
      ack_timeout: 10s
`), 0o600)
	if err != nil {
		fmt.Println(err)
		return
	}
	env := map[string]string{
		"SHARDQ_CONFIG":   file,
		"SHARDQ_DATA_DIR": "/var/lib/shardq", // the file does not set data_dir
		"SHARDQ_MQTT":     ":1883",           // the file sets listen.mqtt
	}

	// As in: SHARDQ_CONFIG=shardq.yaml ... shardq serve --ws ""
	c, err := config.Load([]string{"--ws", ""}, func(k string) string { return env[k] })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("node %s, data in %s, MQTT on %s, WebSocket on %q\n", c.NodeID, c.DataDir, c.MQTT, c.WS)
	orders, declared := c.QueueOptions("orders")
	fmt.Println("orders:", declared, orders.Partitions, orders.AckTimeout, orders.MaxDeliveries)
	other, declared := c.QueueOptions("sensors")
	fmt.Println("sensors:", declared, other.Partitions, other.AckTimeout, other.MaxDeliveries)

	// Output:
	// node node-a, data in /var/lib/shardq, MQTT on :1884, WebSocket on ""
	// orders: true 16 10s 3
	// sensors: false 8 30s 3
}

func ExampleConfig_Validate() {
	c := config.Default()
	c.Storage.Shards = -1
	o := c.Queues.Defaults
	o.Ordering = "fifo"
	c.Queues.Declared["orders"] = o
	fmt.Println(c.Validate())

	// Output:
	// config: storage.shards: must be between 1 and 64 (0: the data directory's), got -1
	// config: queues.declared.orders.ordering: must be key, partition or none, got "fifo"
}
