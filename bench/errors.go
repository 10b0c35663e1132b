package bench

import "errors"

var (
	// ErrInvalidConfig is wrapped by every Config.Validate failure; the
	// message names the field and the reason.
	ErrInvalidConfig = errors.New("bench: invalid config")

	// ErrShortPayload: a received payload is shorter than HeaderSize, so it
	// was not written by a producer of this package. Such messages are
	// counted as foreign, never as errors of the broker.
	ErrShortPayload = errors.New("bench: payload shorter than header")

	// ErrConnectionLost: a producer or consumer connection ended during a
	// run. The run stops; the broker dropped a client it should have kept.
	ErrConnectionLost = errors.New("bench: connection lost")

	// ErrSubscribeRefused: the broker answered a SUBSCRIBE with a failure
	// reason code.
	ErrSubscribeRefused = errors.New("bench: subscribe refused")
)
