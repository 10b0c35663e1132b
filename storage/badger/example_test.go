package badger_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/shardq/shardq/queue"
	"github.com/shardq/shardq/storage/badger"
)

func ExampleOpen() {
	dir, err := os.MkdirTemp("", "shardq-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	opts := badger.DefaultOptions()
	opts.Shards = 2
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := badger.Open(dir, opts)
	if err != nil {
		panic(err)
	}
	defer st.Close()

	shard := st.Shards()[1]
	err = shard.Write(&queue.Batch{Appends: []queue.Append{
		{Queue: "orders", Partition: 3, Message: &queue.Message{Offset: 0, Payload: []byte("hello")}},
		{Queue: "orders", Partition: 3, Message: &queue.Message{Offset: 1, Payload: []byte("world")}},
	}}, true)
	if err != nil {
		panic(err)
	}
	first, next, _ := shard.Bounds("orders", 3)
	fmt.Println("bounds", first, next)
	msgs, _ := shard.Read("orders", 3, first, next, 10)
	for _, m := range msgs {
		fmt.Println(m.Offset, string(m.Payload))
	}
	// Output:
	// bounds 0 2
	// 0 hello
	// 1 world
}
