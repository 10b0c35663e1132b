package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
)

// mqttLog is the handler of mochi's logger. mochi's listeners log the error
// that ended each connection at WARN with no message, a client that
// closed its socket without DISCONNECT (io.EOF) included: such a line
// reads as a problem when it is none. It gets a message, and the ends
// that are normal (the client closed or reset the connection, or the
// node closed it) go to DEBUG.
type mqttLog struct{ slog.Handler }

func (h mqttLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != "" || r.Level != slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok && a.Key == "error" {
			err = e
		}
		return true
	})
	out := slog.NewRecord(r.Time, slog.LevelWarn, "connection ended with an error", r.PC)
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
		out.Level, out.Message = slog.LevelDebug, "connection ended"
	}
	if !h.Handler.Enabled(ctx, out.Level) {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h mqttLog) WithAttrs(as []slog.Attr) slog.Handler { return mqttLog{h.Handler.WithAttrs(as)} }
func (h mqttLog) WithGroup(name string) slog.Handler    { return mqttLog{h.Handler.WithGroup(name)} }
