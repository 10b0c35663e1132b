// Package auth holds who may connect to a shardq node and what each client
// may do: the users file (names and bcrypt hashes) and the ACL (a list of
// rules). It knows no MQTT packets and no config file: the broker reads the
// files named in the config, checks each CONNECT against Users and each
// publish, subscription and admin call against the ACL.
//
// # Users
//
// A users file holds one USER:BCRYPT-HASH line per user, the line that
// `shardq passwd USER` prints (HashPassword, Line); # starts a comment.
//
//	users, err := auth.LoadUsers("/etc/shardq/users")
//	ok := users.Authenticate("alice", password)
//
// # Rules
//
// A rule names a user (or "*" for every client, anonymous ones included),
// an action, a pattern, for consume optionally a group, and a permission.
// The first rule that applies to a request decides it; once there is any
// rule, a request no rule applies to is denied.
//
//	publish, subscribe  pattern: an MQTT topic filter of plain topics
//	produce, consume    pattern: a glob of queue names (* and ?); the
//	                    dead-letter queue of q is the queue q/$dlq
//	admin               pattern: a glob of queue names; "*" also grants
//	                    the calls on no single queue
//
// A subscription is allowed by a rule whose filter covers every topic the
// subscription's filter matches (sensors/# allows sensors/+/temp, not the
// other way round), and denied by a deny rule that has any topic in common
// with it, so that # is refused while any deny rule comes first. * in a
// glob never matches /: orders* does not reach orders/$dlq.
//
// Patterns and groups may hold %u (the username) and %c (the client ID);
// %% is a literal %. A placeholder whose value could widen the pattern (an
// empty username, one holding a wildcard, a level separator, or, in a
// topic, starting with $) makes an allow rule pass over the request and a
// deny rule deny it.
//
//	acl, err := auth.Compile([]auth.Rule{
//		{User: "*", Action: auth.Publish, Pattern: "devices/%u/#", Permission: auth.Allow},
//		{User: "billing", Action: auth.Consume, Pattern: "orders", Group: "billing", Permission: auth.Allow},
//	})
//	ok := acl.Allowed(auth.Client{User: "billing", ClientID: "w1"}, auth.Consume, "orders", "billing")
//
// # Errors
//
// ParseUsers reports every bad line as a *LineError; Compile every bad
// field as a *RuleError; both joined with errors.Join.
//
// # Concurrency
//
// Users and ACL values are read-only once built: any number of goroutines
// may use one. To change them, build new ones and swap the pointer.
package auth
