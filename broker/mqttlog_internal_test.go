package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// mochi's line for a connection's end: a normal end goes to DEBUG, any
// other gets a message and stays a warning.
func TestMQTTLogNamesConnectionEnds(t *testing.T) {
	cases := []struct {
		err  error
		want string // "" when nothing is written at INFO
	}{
		{io.EOF, ""},
		{fmt.Errorf("read connection: %w", io.EOF), ""},
		{errors.New("read tcp 127.0.0.1:1883->127.0.0.1:5000: i/o timeout"), `level=WARN msg="connection ended with an error" component=mqtt listener=mqtt error="read tcp`},
	}
	for _, c := range cases {
		var b bytes.Buffer
		log := slog.New(mqttLog{slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})}).With("component", "mqtt")
		log.Warn("", "listener", "mqtt", "error", c.err)
		log.Warn("client keepalive is below minimum recommended value") // other lines pass as they are
		got := b.String()
		if !strings.Contains(got, "msg=\"client keepalive") {
			t.Fatalf("%v: another warning was lost: %q", c.err, got)
		}
		if c.want == "" && strings.Contains(got, "listener=mqtt") || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%v: logged %q, want %q", c.err, got, c.want)
		}
		if strings.Contains(got, `msg=""`) {
			t.Errorf("%v: a line without a message: %q", c.err, got)
		}
	}
}
