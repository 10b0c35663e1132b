package netfault

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrUnavailable is wrapped by Available's answer: namespaces cannot
	// be made on this machine.
	ErrUnavailable = errors.New("netfault: network namespaces unavailable")
	// ErrUnknownName is a name that was not given to New.
	ErrUnknownName = errors.New("netfault: unknown name")
	// ErrClosed is a fault asked of a Net whose test has ended.
	ErrClosed = errors.New("netfault: network removed")
)

// CommandError is a failed run of ip, tc or nft.
type CommandError struct {
	// Args are the command and its arguments.
	Args []string
	// Output is what it printed, stdout and stderr.
	Output string
	// Err is how it ended.
	Err error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("netfault: %s: %v: %s", strings.Join(e.Args, " "), e.Err, strings.TrimSpace(e.Output))
}

func (e *CommandError) Unwrap() error { return e.Err }
