// Command shardq runs an MQTT broker with durable, partitioned $queue/ topics.
//
//	shardq serve [--config FILE] [--data-dir DIR] [--mqtt ADDR] [--ws ADDR] [--http ADDR] [--node-id ID] [--log-level LEVEL]
//	shardq version
//	shardq health [--server URL] [--ready]
//	shardq queues | queue ... | group delete ... | dlq replay ...
//	shardq cluster status [--json] [--server URL]
//	shardq cluster drain NODE | undrain NODE
//	shardq cluster placement [set QUEUES=NODE[,NODE...] ... | clear]
//	shardq cluster dev [--nodes N] [--dir DIR]
//	shardq passwd USER [--cost N]
//	shardq migrate-shards --data-dir DIR --from N --to M [--dry-run]
//	shardq bench SCENARIO --broker HOST:PORT [...]
//
// shardq help COMMAND, shardq COMMAND --help and shardq COMMAND -h print a
// command's usage and flags.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardq/shardq/bench"
)

const usage = `usage: shardq <command> [flags]

commands:
  serve              run a node
  version            print the version, the commit and the Go version
  health             check that a node answers (exit 0) or not (exit 1)
  pub                publish over MQTT and print the broker's answers
  sub                subscribe over MQTT, print what comes, ack, nack, reject or release it
  queues             list a node's queues
  queue              show, peek, purge, declare or delete a queue
  group              list, seek or delete consumer groups
  dlq replay         publish dead letters into their queue again
  clients            the connected clients, with what they subscribe to and consume
  client disconnect  disconnect a client
  cluster status     the nodes of a cluster and the owner of each partition
  cluster drain      move every partition off a node, before stopping it
  cluster undrain    let a drained node hold partitions again
  cluster placement  show or change which nodes hold which queues
  cluster dev        run an embedded etcd and N nodes in this process, to try a cluster
  passwd             print a users file line (USER:BCRYPT-HASH) for a user
  migrate-shards     rewrite a stopped node's data directory to another storage.shards
  bench              run a load scenario against any MQTT broker
  completion         print a bash, zsh or fish completion script

Run "shardq help <command>" (or "shardq <command> --help") for its flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command of args and returns the exit code: 0 on success, 1
// when the command failed, 2 on bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd, rest := args[0], args[1:]
	// "shardq serve help" and the like, where "help" cannot be an argument.
	if len(rest) == 1 && rest[0] == "help" && cmd != "bench" {
		rest = []string{"--help"}
	}
	switch cmd {
	case "serve":
		return serve(ctx, rest, stdout, stderr)
	case "version":
		return versionCommand(rest, stdout, stderr)
	case "--version", "-version", "-v":
		return versionCommand(nil, stdout, stderr)
	case "health":
		return healthCommand(ctx, rest, stdout, stderr, os.Getenv)
	case "pub":
		return pubCommand(ctx, rest, stdout, stderr, os.Getenv)
	case "sub":
		return subCommand(ctx, rest, stdout, stderr, os.Getenv)
	case "queues", "queue", "group", "dlq", "clients", "client":
		return adminCommand(ctx, append([]string{cmd}, rest...), stdout, stderr, os.Getenv)
	case "cluster":
		return clusterCommand(ctx, rest, stdout, stderr, os.Getenv)
	case "passwd":
		return passwdCommand(rest, os.Stdin, stdinTerminal(), stdout, stderr)
	case "migrate-shards":
		return migrateShards(ctx, rest, stdout, stderr)
	case "bench":
		return bench.Main(ctx, rest, stdout, stderr)
	case "completion":
		return completionCommand(rest, stdout, stderr)
	case "help", "-h", "--help":
		return help(rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "shardq: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}

// help runs "shardq help [COMMAND [SUBCOMMAND]]": the usage of shardq, or
// of the command, as its --help prints it.
func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return 0
	}
	switch args[0] {
	case "serve", "version", "health", "pub", "sub", "queues", "queue", "group", "dlq", "clients", "client", "cluster", "passwd", "migrate-shards", "bench", "completion":
		return run(append(args[:len(args):len(args)], "--help"), stdout, stderr)
	}
	fmt.Fprintf(stderr, "shardq help: unknown command %q\n\n%s", args[0], usage)
	return 2
}
