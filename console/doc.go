// Package console is shardq's web console: a few static pages, embedded in
// the binary, that a node's HTTP listener serves under /ui/. The pages are
// plain HTML, CSS and JavaScript with no build step; everything they show
// comes from the admin API (/api/v1/, broker/admin.go) which the browser
// calls directly, so the console has no data of its own and no server-side
// rendering.
//
//	mux.Handle(console.Prefix, console.New(console.Options{Token: token}))
//
// What the pages show: the node and its queues (depth, rates computed in
// the browser from successive polls of the counters, groups with lag and
// consumers, dead letters waiting), a queue's partitions, groups and
// leases, a dead-letter browser with replay and purge, and the cluster map
// (nodes with their state, replicas and leaderships, and a button to drain
// or undrain each; partitions with their replicas and learners) when
// /api/v1/cluster says the node is part of a cluster, a panel of the node
// itself otherwise. They poll every two seconds. Forms declare a queue or
// change its settings, publish a message and find messages by key or
// msg-id; the forms are drawn when opened and left alone by the polls, so
// that what is typed stays.
//
// # Security
//
// With Options.Token set (http.admin_token), the pages ask for the token,
// keep it in the tab's sessionStorage and send it as a bearer token; the
// admin API, not the console, refuses changes without it. GET /ui/auth
// tells the pages whether a token is needed and, given an Authorization
// header, whether it is the right one, so that a wrong token is reported
// at login rather than at the first change. The pages build every element
// with DOM calls and set text with textContent, never innerHTML, so a
// queue's message cannot inject markup; a Content-Security-Policy that
// allows only the console's own scripts and styles backs that up.
//
// # Concurrency
//
// A Console holds no mutable state; ServeHTTP may be called concurrently.
package console
