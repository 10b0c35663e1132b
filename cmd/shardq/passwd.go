package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/shardq/shardq/auth"
)

const passwdUsage = `usage: shardq passwd USER [--cost N]

Prints the line of USER for a users file (auth.users_file):
USER:BCRYPT-HASH. The password is read from standard input: on a
terminal it is asked for twice, without echo; otherwise the first line
of standard input is the password. Append the line to the users file and
send the node SIGHUP (or restart it):

  shardq passwd alice >> /etc/shardq/users
  printf '%s\n' "$PASSWORD" | shardq passwd alice >> /etc/shardq/users

Each check of a password takes the time of its bcrypt cost: every step
of --cost doubles it (10, the default, takes tens of milliseconds a
check; every CONNECT with a password pays it once).
`

// terminal is standard input when it is a terminal: the prompts go to
// prompt and the password is read without echo.
type terminal struct {
	fd     int
	prompt io.Writer
}

// passwdCommand runs shardq passwd. term is nil when standard input is
// not a terminal.
func passwdCommand(args []string, stdin io.Reader, tty *terminal, stdout, stderr io.Writer) int {
	c := newCommand("passwd", passwdUsage)
	cost := c.flags.Int("cost", auth.DefaultCost, fmt.Sprintf("the bcrypt cost, %d to %d", auth.MinCost, auth.MaxCost))
	pos, err := c.parse(args, func(string) string { return "" })
	if errors.Is(err, flag.ErrHelp) {
		c.usage(stdout)
		return 0
	}
	switch {
	case err != nil:
		return c.fail(stderr, "%v", err)
	case len(pos) != 1:
		return c.fail(stderr, "want one argument, the user's name")
	case *cost < auth.MinCost || *cost > auth.MaxCost:
		return c.fail(stderr, "--cost must be from %d to %d, got %d", auth.MinCost, auth.MaxCost, *cost)
	}
	user := pos[0]
	if err := auth.ValidUsername(user); err != nil {
		return c.fail(stderr, "%s", strings.TrimPrefix(err.Error(), "auth: "))
	}
	password, err := readPassword(stdin, tty)
	if err != nil {
		fmt.Fprintf(stderr, "shardq passwd: %v\n", err)
		return 1
	}
	hash, err := auth.HashPassword(password, *cost)
	if err != nil {
		fmt.Fprintf(stderr, "shardq passwd: %s\n", strings.TrimPrefix(err.Error(), "auth: "))
		return 1
	}
	fmt.Fprintln(stdout, auth.Line(user, hash))
	return 0
}

// readPassword reads the password: twice, without echo, from a terminal;
// else the first line of stdin (without its line ending).
func readPassword(stdin io.Reader, tty *terminal) (string, error) {
	if tty == nil {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && (!errors.Is(err, io.EOF) || line == "") {
			return "", fmt.Errorf("reading the password from standard input: %w", err)
		}
		return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
	}
	ask := func(prompt string) (string, error) {
		fmt.Fprint(tty.prompt, prompt)
		b, err := term.ReadPassword(tty.fd)
		fmt.Fprintln(tty.prompt)
		return string(b), err
	}
	first, err := ask("Password: ")
	if err != nil {
		return "", err
	}
	again, err := ask("Password again: ")
	if err != nil {
		return "", err
	}
	if first != again {
		return "", errors.New("the passwords differ")
	}
	return first, nil
}

// stdinTerminal returns standard input as a terminal, or nil when it is
// not one.
func stdinTerminal() *terminal {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil
	}
	return &terminal{fd: fd, prompt: os.Stderr}
}
