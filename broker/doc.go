// Package broker is shardq's composition root: it builds a node from a
// config.Config (storage, the queue manager, the mochi server with the
// access hook and the queue hook, the MQTT listeners over TCP, TLS,
// WebSocket and WebSocket over TLS, HTTP or HTTPS with metrics, health and
// the admin API) and runs it.
//
//	b, err := broker.New(cfg, logger)
//	if err != nil {
//		return err
//	}
//	go func() { <-sigterm; b.Shutdown(ctx) }()
//	go func() { <-sighup; b.Reload(loadConfig) }()
//	return b.Serve() // returns once shut down
//
// # Access
//
// The access hook (access.go) authenticates each CONNECT against the users
// file or a client certificate, checks publishes, subscriptions and wills
// against the ACL (package auth) and enforces max_connections; the queue
// hook asks it about queue publishes. The limits of the queues
// (max_queues, max_delay) sit in front of the manager (limits.go). The
// admin API and the profiles need the admin token, or a user with the
// ACL's admin permission (adminauth.go). Reload swaps the users, the ACL,
// the token and the certificates whole, each behind an atomic pointer read
// once per check: a check sees either the old set or the new one.
//
// # Concurrency
//
// Serve starts mochi (an accept goroutine per listener and, per client,
// mochi's read goroutine plus the queue hook's writer) and the HTTP server
// on their own goroutines, and waits for Shutdown. Shutdown runs once:
// it marks the node not ready, stops HTTP, closes the MQTT listener, sends
// every client a DISCONNECT, closes the connections still open after a
// grace period, calls mochi's Close, then closes the queue manager (which
// flushes settlements and finishes every pending commit) and the storage,
// in that order, so that nothing is written to a closed store. An MQTT 5
// client's connection is closed by the access hook's OnDisconnect, after
// the DISCONNECT of a malformed packet if there was one (listener.go). Metrics are
// collected at scrape time from the manager's snapshots (metrics.go): a
// scrape takes each queue's locks briefly, never a storage lock.
package broker
