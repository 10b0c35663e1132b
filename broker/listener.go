package broker

import (
	"net"
	"time"
)

// connectTimeout bounds how long a new connection may take to send its
// CONNECT packet. mochi reads CONNECT without a deadline: a client that
// opens a socket and says nothing would otherwise hold a goroutine forever
// and stall a graceful shutdown. Once connected, mochi sets the connection's
// deadline from its keep-alive before every packet.
const connectTimeout = 10 * time.Second

type deadlineListener struct {
	net.Listener
	timeout time.Duration
}

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(l.timeout))
	return c, nil
}
