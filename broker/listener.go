package broker

import (
	"net"
	"sync"
	"time"
)

// connectTimeout bounds how long a new connection may take to send its
// CONNECT packet. mochi reads CONNECT without a deadline: a client that
// opens a socket and says nothing would otherwise hold a goroutine forever
// and stall a graceful shutdown. Once connected, mochi sets the connection's
// deadline from its keep-alive before every packet.
const connectTimeout = 10 * time.Second

// trackingListener sets the CONNECT deadline on accepted connections and
// keeps them, so that Shutdown can close the ones that outlive its grace
// period (mochi waits for a client to close after a server DISCONNECT).
type trackingListener struct {
	net.Listener
	timeout time.Duration

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newTrackingListener(l net.Listener, timeout time.Duration) *trackingListener {
	return &trackingListener{Listener: l, timeout: timeout, conns: map[*trackedConn]struct{}{}}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(l.timeout))
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// closeAll closes every connection still open.
func (l *trackingListener) closeAll() {
	l.mu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
