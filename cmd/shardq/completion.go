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
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh" && args[0] != "fish") {
		fmt.Fprint(stderr, "usage: shardq completion bash|zsh|fish\n\nPrints a completion script: add `source <(shardq completion bash)` to ~/.bashrc,\n`autoload -U +X bashcompinit && bashcompinit; source <(shardq completion zsh)` to ~/.zshrc,\nor `shardq completion fish | source` to ~/.config/fish/config.fish.\n")
		return 2
	}
	if args[0] == "fish" {
		fmt.Fprint(stdout, fishCompletion())
		return 0
	}
	var b strings.Builder
	if args[0] == "zsh" {
		b.WriteString("autoload -U +X bashcompinit && bashcompinit\n")
	}
	b.WriteString("# shardq completion: commands, subcommands and flags.\n_shardq() {\n")
	b.WriteString("  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} sub=${COMP_WORDS[2]}\n")
	fmt.Fprintf(&b, "  if [ \"$COMP_CWORD\" -eq 1 ]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi\n", strings.Join(commands, " "))
	b.WriteString("  if [ \"$COMP_CWORD\" -eq 2 ]; then\n    case \"$cmd\" in\n")
	for _, group := range completedGroups {
		subs := completedSubcommands(group)
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

// fishCompletion is the fish script: commands, subcommands, and the flags
// the command's own --help lists, read as the line is completed.
func fishCompletion() string {
	var b strings.Builder
	b.WriteString("# shardq completion for fish: commands, subcommands and flags.\n")
	b.WriteString("complete -c shardq -f\n")
	fmt.Fprintf(&b, "complete -c shardq -n __fish_use_subcommand -a %q\n", strings.Join(commands, " "))
	for _, group := range completedGroups {
		subs := completedSubcommands(group)
		fmt.Fprintf(&b, "complete -c shardq -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %q\n",
			group, strings.Join(subs, " "), strings.Join(subs, " "))
	}
	fmt.Fprintf(&b, "complete -c shardq -n '__fish_seen_subcommand_from help' -a %q\n", strings.Join(commands, " "))
	b.WriteString(`function __shardq_flags
    set -l words (commandline -opc)
    set -e words[1]
    set -l cmd $words[1]
    if test (count $words) -ge 2; and not string match -q -- '-*' $words[2]
        set cmd $words[1..2]
    end
    shardq $cmd --help 2>&1 | string match -r -- '^ +--?[a-z][a-z0-9-]*' | string replace -r -- '^ *-*' '--'
end
complete -c shardq -n 'string match -q -- "-*" (commandline -ct)' -a '(__shardq_flags)'
`)
	return b.String()
}

// completedGroups are the commands whose subcommands are completed.
var completedGroups = []string{"queue", "group", "dlq", "client", "cluster"}

// completedSubcommands are group's subcommands, sorted, with those run
// dispatches apart from the admin commands (cluster dev, queue list).
func completedSubcommands(group string) []string {
	subs := subcommands(group)
	switch group {
	case "cluster":
		subs = append(subs, "dev")
	case "queue":
		subs = append(subs, "list")
	}
	slices.Sort(subs)
	return subs
}
