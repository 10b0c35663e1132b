package broker

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// connectTimeout bounds how long a new connection may take to send its
// CONNECT packet (and, on a TLS listener, to finish its handshake). mochi
// reads CONNECT without a deadline: a client that opens a socket and says
// nothing would otherwise hold a goroutine forever and stall a graceful
// shutdown. Once connected, mochi sets the connection's deadline from its
// keep-alive before every packet.
const connectTimeout = 10 * time.Second

// releaseAfter bounds how long a held connection stays open after mochi
// closed it, should the access hook never release it.
const releaseAfter = 2 * time.Second

// trackingListener sets the CONNECT deadline on accepted connections and
// keeps them, so that Shutdown can close the ones that outlive its grace
// period (mochi waits for a client to close after a server DISCONNECT). It
// counts the connections the access hook admitted (limits.max_connections).
// Every MQTT listener of a node, TCP, TLS and WebSocket, is one.
type trackingListener struct {
	net.Listener
	timeout time.Duration
	// admitted counts the admitted connections of every listener of the
	// node (shared).
	admitted *atomic.Int64

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newTrackingListener(l net.Listener, timeout time.Duration, admitted *atomic.Int64) *trackingListener {
	return &trackingListener{Listener: l, timeout: timeout, admitted: admitted, conns: map[*trackedConn]struct{}{}}
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

// closeAll closes every connection still open, held ones included.
func (l *trackingListener) closeAll() {
	l.mu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		_ = c.release()
	}
}

// trackedConn is an accepted connection. It carries what the access hook
// (access.go) knows of its client, and it can be held: once an MQTT 5
// client's session is established, mochi's Close only stops its reads and
// writes within a second, and the access hook releases it after
// OnDisconnect, which may first write a DISCONNECT with the reason of a
// malformed packet (mochi closes such a connection without one).
type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once

	// user is the client's authenticated username ("" anonymous), set in
	// OnConnect before anything else runs for the client.
	user string
	// tenant is the client's tenant, set with user when the config has
	// tenants; left, when set, runs once as the connection is released.
	tenant *tenant
	left   atomic.Pointer[func()]
	// admitted: counted in l.admitted until released.
	admitted atomic.Bool
	// held: Close stops reading and release closes.
	held    atomic.Bool
	closing atomic.Bool
	// sentDisconnect: mochi wrote a DISCONNECT already.
	sentDisconnect atomic.Bool

	// writeSince is when the write under way started (Unix nanoseconds),
	// 0 when none is: see stalled.
	writeSince atomic.Int64

	mu sync.Mutex
	// subacks holds, by SUBSCRIBE packet ID, the reason codes the access
	// hook gives to the filters it refused (see OnPacketEncode).
	subacks map[uint16][]subRefusal
}

// Write records how long it blocks: see stalled.
func (c *trackedConn) Write(b []byte) (int, error) {
	c.writeSince.Store(time.Now().UnixNano())
	n, err := c.Conn.Write(b)
	c.writeSince.Store(0)
	return n, err
}

// stallAfter is how long a write to a client may block before the client
// counts as stalled: it does not read what it is sent.
const stallAfter = time.Second

// stalled reports whether a write to the client has been blocked for
// stallAfter or more at now. mochi holds the client's lock while it
// writes, and takes it for every QoS 1 or 2 message it routes to the
// client: plain messages for a stalled client are dropped rather than
// routed (plainHook.OnSelectSubscribers), so that its publishers never
// wait for it.
func (c *trackedConn) stalled(now time.Time) bool {
	since := c.writeSince.Load()
	return since != 0 && now.UnixNano()-since >= int64(stallAfter)
}

// cutStuck closes the connections whose write has been blocked for
// timeout at now: their clients do not read. The blocked write returns at
// once, giving back the client's lock that publishers to it wait for, and
// mochi ends the session as for any broken connection. It returns the
// remote addresses of those it closed.
func (l *trackingListener) cutStuck(now time.Time, timeout time.Duration) []string {
	l.mu.Lock()
	var stuck []*trackedConn
	for c := range l.conns {
		if since := c.writeSince.Load(); since != 0 && now.UnixNano()-since >= int64(timeout) {
			stuck = append(stuck, c)
		}
	}
	l.mu.Unlock()
	remotes := make([]string, 0, len(stuck))
	for _, c := range stuck {
		remotes = append(remotes, c.RemoteAddr().String())
		_ = c.release()
	}
	return remotes
}

// admit counts the connection toward max (0: no limit); false when the
// node already holds max.
func (c *trackedConn) admit(max int64) bool {
	for {
		n := c.l.admitted.Load()
		if max > 0 && n >= max {
			return false
		}
		if c.l.admitted.CompareAndSwap(n, n+1) {
			c.admitted.Store(true)
			return true
		}
	}
}

// Close closes the connection, or, while it is held, stops its reads at
// once and its writes within a second (so that a write blocked on a client
// that does not read gives back the client's lock) and leaves the closing
// to release.
func (c *trackedConn) Close() error {
	if !c.held.Load() {
		return c.release()
	}
	if c.closing.CompareAndSwap(false, true) {
		_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
		_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		time.AfterFunc(releaseAfter, func() { _ = c.release() })
	}
	return nil
}

// release closes the connection for good.
func (c *trackedConn) release() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		if c.admitted.Swap(false) {
			c.l.admitted.Add(-1)
		}
		if left := c.left.Load(); left != nil {
			(*left)()
		}
		err = c.Conn.Close()
	})
	return err
}

// tlsState returns the TLS state of the connection, if it is one.
func (c *trackedConn) tlsState() (tls.ConnectionState, bool) {
	if s, ok := c.Conn.(interface{ ConnectionState() tls.ConnectionState }); ok {
		return s.ConnectionState(), true
	}
	return tls.ConnectionState{}, false
}
