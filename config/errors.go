package config

import (
	"strconv"
	"strings"
)

// Error is an invalid setting: which one, where its value came from, and
// what is wrong with it. Every error that Load and Validate return is an
// *Error, or several joined with errors.Join.
//
// Its message reads, depending on what is known:
//
//	config: shardq.yaml:7: queues.declared.orders.ack_timeout: must be at least 100ms, got 10ms
//	config: listen.mqtt: must be host:port, got "1883" (from --mqtt)
//	config: storage.shards: must be between 1 and 64, got 0
type Error struct {
	// File and Line locate the value in the config file; File is "" when
	// the value did not come from a file, Line is 0 when it is not known.
	File string
	Line int
	// Field is the setting's YAML path ("queues.declared.orders.ack_timeout")
	// or, for a command-line error, the flag ("--mqtt"). It is "" when the
	// error is about no single setting, such as a YAML syntax error.
	Field string
	// Source names the flag or environment variable the value came from
	// ("--mqtt", "SHARDQ_MQTT"); "" for the file and built-in defaults.
	Source string
	// Reason says what is wrong, in words.
	Reason string
	// Err is the underlying error, if any: a *queue.FieldError, an
	// *fs.PathError, a *yaml.TypeError.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	if e.Source != "" {
		b.WriteString(" (from ")
		b.WriteString(e.Source)
		b.WriteByte(')')
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }
