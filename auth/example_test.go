package auth_test

import (
	"fmt"
	"strings"

	"github.com/shardq/shardq/auth"
)

func ExampleCompile() {
	acl, err := auth.Compile([]auth.Rule{
		{User: "*", Action: auth.Publish, Pattern: "devices/%u/#", Permission: auth.Allow},
		{User: "billing", Action: auth.Consume, Pattern: "orders", Group: "billing", Permission: auth.Allow},
		{User: "*", Action: auth.Produce, Pattern: "orders", Permission: auth.Allow},
	})
	if err != nil {
		panic(err)
	}
	alice := auth.Client{User: "alice", ClientID: "sensor-1"}
	billing := auth.Client{User: "billing", ClientID: "worker-1"}
	fmt.Println(acl.Allowed(alice, auth.Publish, "devices/alice/temp", ""))
	fmt.Println(acl.Allowed(alice, auth.Publish, "devices/bob/temp", ""))
	fmt.Println(acl.Allowed(alice, auth.Produce, "orders", ""))
	fmt.Println(acl.Allowed(alice, auth.Produce, "orders/$dlq", ""))
	fmt.Println(acl.Allowed(billing, auth.Consume, "orders", "billing"))
	fmt.Println(acl.Allowed(alice, auth.Consume, "orders", "billing"))
	// Output:
	// true
	// false
	// true
	// false
	// true
	// false
}

func ExampleParseUsers() {
	hash, err := auth.HashPassword("s3cret", auth.MinCost)
	if err != nil {
		panic(err)
	}
	users, err := auth.ParseUsers(strings.NewReader("# USER:BCRYPT-HASH\n" + auth.Line("alice", hash) + "\n"))
	if err != nil {
		panic(err)
	}
	fmt.Println(users.Authenticate("alice", "s3cret"), users.Authenticate("alice", "guess"))
	_, err = auth.ParseUsers(strings.NewReader("alice:not-a-hash\n"))
	fmt.Println(err)
	// Output:
	// true false
	// line 1: the hash of "alice" is not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)
}
