package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// command is the flag set of one shardq command, with its usage text and
// the environment variables that stand in for some of its flags.
type command struct {
	name  string // "queue peek"
	head  string // the usage text before the flags
	flags *flag.FlagSet
	env   map[string]string // flag name -> environment variable
}

func newCommand(name, head string) *command {
	fs := flag.NewFlagSet("shardq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &command{name: name, head: head, flags: fs, env: map[string]string{}}
}

// parse parses args, flags and arguments in any order, then sets each
// flag that args leave unset from its environment variable, if that is
// set. It returns the arguments that are not flags. For -h and --help it
// returns flag.ErrHelp; other errors name the flag.
func (c *command) parse(args []string, getenv func(string) string) ([]string, error) {
	var pos []string
	for {
		if err := c.flags.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, flagError(err)
		}
		if c.flags.NArg() == 0 {
			break
		}
		pos = append(pos, c.flags.Arg(0))
		args = c.flags.Args()[1:]
	}
	set := map[string]bool{}
	c.flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, env := range c.env {
		if v := getenv(env); v != "" && !set[name] {
			if err := c.flags.Set(name, v); err != nil {
				return nil, fmt.Errorf("%s=%q: %v", env, v, err)
			}
		}
	}
	return pos, nil
}

// flagError rewords an error of the flag package with the flag as users
// write it: --limit rather than -limit.
func flagError(err error) error {
	msg := err.Error()
	for _, r := range [][2]string{{"defined: -", "defined: --"}, {"argument: -", "argument: --"}, {"flag -", "flag --"}, {"for -", "for --"}} {
		msg = strings.Replace(msg, r[0], r[1], 1)
	}
	return errors.New(msg)
}

// usage writes the command's usage: its text, then each flag with the
// name of its value, its meaning, its default and its variable.
func (c *command) usage(w io.Writer) {
	var b strings.Builder
	b.WriteString(c.head)
	first := true
	c.flags.VisitAll(func(f *flag.Flag) {
		if first {
			b.WriteString("\nflags:\n")
			first = false
		}
		value, meaning := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", f.Name)
		if value != "" {
			fmt.Fprintf(&b, " %s", value)
		}
		fmt.Fprintf(&b, "\n        %s", meaning)
		var notes []string
		if value != "" && f.DefValue != "" && !strings.Contains(meaning, "(default") {
			notes = append(notes, "default "+f.DefValue)
		}
		if env := c.env[f.Name]; env != "" {
			notes = append(notes, "env "+env)
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(notes, "; "))
		}
		b.WriteByte('\n')
	})
	_, _ = io.WriteString(w, b.String())
}

// fail reports a usage error: the error, then the command's usage, on
// stderr. It returns the exit code of bad usage, 2.
// parseNoArgs parses the flags of a command that takes no argument. It
// returns the exit code to end with (0 after printing the help, 2 after a
// usage error), or -1 to go on.
func (c *command) parseNoArgs(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	_, code := c.parseOne(args, "", getenv, stdout, stderr)
	return code
}

// parseOne parses the flags of a command that takes one argument, named
// what in the usage error, or none when what is "". It returns the
// arguments, and the exit code to end with (as parseNoArgs) or -1 to go on.
func (c *command) parseOne(args []string, what string, getenv func(string) string, stdout, stderr io.Writer) ([]string, int) {
	pos, err := c.parse(args, getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.usage(stdout)
		return nil, 0
	case err != nil:
		return nil, c.fail(stderr, "%v", err)
	case what == "" && len(pos) > 0:
		return nil, c.fail(stderr, "unexpected argument %q", pos[0])
	case what != "" && len(pos) != 1:
		return nil, c.fail(stderr, "want one %s, got %d arguments", what, len(pos))
	}
	return pos, -1
}

func (c *command) fail(stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "shardq %s: %s\n\n", c.name, fmt.Sprintf(format, a...))
	c.usage(stderr)
	return 2
}

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
