package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// commands are shardq's commands, as run dispatches them.
var commands = []string{"serve", "version", "health", "pub", "sub", "queues", "queue", "group", "dlq", "clients", "client",
	"cluster", "passwd", "migrate-shards", "bench", "help", "completion"}

// completionCommand prints a shell completion script: shardq completion
// bash (zsh loads it with bashcompinit). It completes commands and
// subcommands; flags are completed from each command's --help.
func completionCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprint(stderr, "usage: shardq completion bash|zsh\n\nPrints a completion script: add `source <(shardq completion bash)` to ~/.bashrc,\nor `autoload -U +X bashcompinit && bashcompinit; source <(shardq completion zsh)` to ~/.zshrc.\n")
		return 2
	}
	var b strings.Builder
	if args[0] == "zsh" {
		b.WriteString("autoload -U +X bashcompinit && bashcompinit\n")
	}
	b.WriteString("# shardq completion: commands, subcommands and flags.\n_shardq() {\n")
	b.WriteString("  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} sub=${COMP_WORDS[2]}\n")
	fmt.Fprintf(&b, "  if [ \"$COMP_CWORD\" -eq 1 ]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi\n", strings.Join(commands, " "))
	b.WriteString("  if [ \"$COMP_CWORD\" -eq 2 ]; then\n    case \"$cmd\" in\n")
	for _, group := range []string{"queue", "group", "dlq", "client", "cluster"} {
		subs := subcommands(group)
		if group == "cluster" {
			subs = append(subs, "dev")
		}
		if group == "queue" {
			subs = append(subs, "list")
		}
		slices.Sort(subs)
		fmt.Fprintf(&b, "      %s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return;;\n", group, strings.Join(subs, " "))
	}
	fmt.Fprintf(&b, "      help) COMPREPLY=($(compgen -W %q -- \"$cur\")); return;;\n", strings.Join(commands, " "))
	b.WriteString("    esac\n  fi\n")
	// Flags: those the command's own --help lists.
	b.WriteString("  if [[ $cur == -* ]]; then\n")
	b.WriteString("    local words=(\"$cmd\"); [[ $sub != -* && -n $sub && $COMP_CWORD -gt 2 ]] && words+=(\"$sub\")\n")
	b.WriteString("    COMPREPLY=($(compgen -W \"$(shardq \"${words[@]}\" --help 2>&1 | grep -oE -- '^ +--?[a-z][a-z0-9-]*' | sed 's/^ *-*/--/')\" -- \"$cur\"))\n")
	b.WriteString("  fi\n}\ncomplete -o default -F _shardq shardq\n")
	fmt.Fprint(stdout, b.String())
	return 0
}
