package broker

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// wsListener serves MQTT over WebSocket (subprotocol mqtt, binary
// messages) on a TCP or TLS listener, and hands the upgraded connections
// out through Accept, as a net.Listener: so WebSocket clients go through
// the same tracking, limits and TLS identity as the others. It replaces
// mochi's WebSocket listener, whose connections hide their TLS state.
type wsListener struct {
	ln    net.Listener
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	up    websocket.Upgrader
}

func newWSListener(ln net.Listener, log *slog.Logger) *wsListener {
	l := &wsListener{
		ln:    ln,
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
		up: websocket.Upgrader{
			Subprotocols: []string{"mqtt"},
			// As mochi's: MQTT clients authenticate in CONNECT, whatever
			// page they run in.
			CheckOrigin: func(*http.Request) bool { return true },
		},
	}
	l.srv = &http.Server{Handler: http.HandlerFunc(l.upgrade), ReadHeaderTimeout: connectTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() { _ = l.srv.Serve(ln) }()
	return l
}

func (l *wsListener) upgrade(w http.ResponseWriter, r *http.Request) {
	c, err := l.up.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade answered the request
	}
	wc := &wsConn{Conn: c.UnderlyingConn(), c: c, state: r.TLS}
	select {
	case l.conns <- wc:
	case <-l.done:
		_ = c.Close()
	}
}

// Accept returns the next upgraded connection.
func (l *wsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; upgraded connections stay open.
func (l *wsListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		_ = l.srv.Close()
	})
	return nil
}

func (l *wsListener) Addr() net.Addr { return l.ln.Addr() }

// errNotBinary: a WebSocket message of another kind than binary.
var errNotBinary = errors.New("broker: websocket message is not binary")

// wsConn is an MQTT connection over WebSocket: reads span the binary
// messages, each write is one message.
type wsConn struct {
	net.Conn
	c     *websocket.Conn
	r     io.Reader // the message being read, or nil
	state *tls.ConnectionState
}

func (ws *wsConn) Read(p []byte) (int, error) {
	for {
		if ws.r == nil {
			op, r, err := ws.c.NextReader()
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				return 0, errNotBinary
			}
			ws.r = r
		}
		n, err := ws.r.Read(p)
		if errors.Is(err, io.EOF) {
			ws.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (ws *wsConn) Write(p []byte) (int, error) {
	if err := ws.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (ws *wsConn) Close() error { return ws.c.Close() }

// SetDeadline and SetWriteDeadline reach the connection beneath (for a
// write blocked now) and the WebSocket (which sets its own before every
// write).
func (ws *wsConn) SetDeadline(t time.Time) error {
	_ = ws.c.SetWriteDeadline(t)
	return ws.Conn.SetDeadline(t)
}

func (ws *wsConn) SetWriteDeadline(t time.Time) error {
	_ = ws.c.SetWriteDeadline(t)
	return ws.Conn.SetWriteDeadline(t)
}

// ConnectionState returns the TLS state of a wss connection; the zero
// state for ws.
func (ws *wsConn) ConnectionState() tls.ConnectionState {
	if ws.state == nil {
		return tls.ConnectionState{}
	}
	return *ws.state
}
