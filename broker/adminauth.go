package broker

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/shardq/shardq/auth"
)

// Credentials of the admin API and /debug/pprof/.
//
// Without http.admin_token every call is open: the node then listens for
// HTTP on a loopback address only (config refuses another). With the
// token, every call needs one of:
//   - Authorization: Bearer TOKEN: the token is the node's administrator,
//     allowed everything;
//   - Authorization: Basic (a user of auth.users_file and its password):
//     allowed the calls on the queues an ACL rule grants it admin on
//     (action admin, pattern a glob of queue names); the calls on no
//     single queue (listing queues, profiles) need the pattern "*", those
//     on a dead-letter queue admin on {queue}/$dlq, a replay and a queue's
//     deletion (which takes its dead-letter queue too) both. With
//     no ACL rule at all, every user is allowed everything, as over MQTT.
//
// Missing or wrong credentials: 401 with a WWW-Authenticate challenge; a
// user the ACL does not allow: 403. The token is compared in constant time.

// guard requires the credentials of the admin API before h.
func (a *adminAPI) guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		pol := a.b.policy.Load()
		if pol.token == "" {
			h(w, r)
			return
		}
		header := r.Header.Get("Authorization")
		scheme, cred, _ := strings.Cut(header, " ")
		switch {
		case header == "":
			a.unauthorized(w, r, "missing bearer token (Authorization: Bearer TOKEN, the node's http.admin_token) or user credentials (Basic)")
		case strings.EqualFold(scheme, "Bearer"):
			if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(cred)), []byte(pol.token)) != 1 {
				a.unauthorized(w, r, "wrong bearer token")
				return
			}
			h(w, r)
		case strings.EqualFold(scheme, "Basic"):
			user, password, ok := r.BasicAuth()
			if !ok || pol.users == nil || !pol.users.Authenticate(user, password) {
				a.b.sec.authFailure(authBadCredentials)
				a.unauthorized(w, r, "bad user name or password")
				return
			}
			for _, q := range adminResources(r) {
				if !pol.acl.Allowed(auth.Client{User: user}, auth.Admin, q, "") {
					a.b.sec.denied(auth.Admin)
					what := "on every queue (an admin rule with the pattern \"*\")"
					if q != "" {
						what = "on " + q
					}
					a.fail(w, r, http.StatusForbidden, fmt.Errorf("user %s is not allowed admin %s", user, what))
					return
				}
			}
			h(w, r)
		default:
			a.unauthorized(w, r, "want Authorization: Bearer or Basic")
		}
	}
}

// adminResources returns the queues an admin call acts on, as ACL rules
// name them: "" for a call on no single queue.
func adminResources(r *http.Request) []string {
	q := r.PathValue("queue")
	if q == "" {
		return []string{""}
	}
	rest := strings.TrimPrefix(r.URL.Path, "/api/v1/queues/"+q)
	switch {
	case rest == "/dlq/replay", rest == "" && r.Method == http.MethodDelete:
		return []string{q + "/$dlq", q}
	case strings.HasPrefix(rest, "/dlq"):
		return []string{q + "/$dlq"}
	}
	return []string{q}
}

// unauthorized answers 401 with the challenges of both schemes; a script
// (X-Requested-With: XMLHttpRequest, as the web console sends) gets no
// Basic challenge, which would make a browser open its own login dialog.
func (a *adminAPI) unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	w.Header().Add("WWW-Authenticate", `Bearer realm="shardq"`)
	if r.Header.Get("X-Requested-With") != "XMLHttpRequest" {
		w.Header().Add("WWW-Authenticate", `Basic realm="shardq", charset="UTF-8"`)
	}
	a.fail(w, r, http.StatusUnauthorized, errors.New(msg))
}
