package auth

import (
	"errors"
	"fmt"
)

var (
	// ErrBadUsername: a username is empty, holds ':' or a control
	// character, or starts or ends with a space.
	ErrBadUsername = errors.New("auth: invalid username")
	// ErrBadPassword: a password is empty or longer than bcrypt takes (72
	// bytes).
	ErrBadPassword = errors.New("auth: invalid password")
)

// LineError is an invalid line of a users file.
type LineError struct {
	Line   int // 1-based
	Reason string
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// RuleError is an invalid field of an ACL rule.
type RuleError struct {
	Index  int    // the rule's position in the list, from 0
	Field  string // its YAML name: user, action, pattern, group or permission
	Reason string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("auth: rule %d: %s: %s", e.Index, e.Field, e.Reason)
}
