// Package broker is shardq's composition root: it builds a node from a
// config.Config (storage, the queue manager, the mochi server with the
// queue hook, listeners, HTTP with metrics, health and the admin API) and
// runs it.
//
//	b, err := broker.New(cfg, logger)
//	if err != nil {
//		return err
//	}
//	go func() { <-sigterm; b.Shutdown(ctx) }()
//	return b.Serve() // returns once shut down
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
// in that order, so that nothing is written to a closed store. Metrics are
// collected at scrape time from the manager's snapshots (metrics.go): a
// scrape takes each queue's locks briefly, never a storage lock.
package broker
