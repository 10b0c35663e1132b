package broker_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/shardq/shardq/auth"
	"github.com/shardq/shardq/config"
)

// TestSecurityAdminCredentials checks what the admin token guards: every
// /api/v1/ call and /debug/pprof/, not /metrics, /healthz and /readyz;
// and users of the users file with the ACL's admin permission.
func TestSecurityAdminCredentials(t *testing.T) {
	users := writeUsers(t, t.TempDir(), "ops", "lead", "alice")
	b := startBroker(t, t.TempDir(), func(c *config.Config) {
		c.Admin.Token = adminToken
		c.Auth.UsersFile = users
		c.Auth.ACL = []auth.Rule{
			{User: "ops", Action: auth.Admin, Pattern: "*", Permission: auth.Allow},
			{User: "lead", Action: auth.Admin, Pattern: "orders*", Permission: auth.Allow},
			{User: "*", Action: auth.Produce, Pattern: "*", Permission: auth.Allow},
		}
	})
	c := dialAs(t, b.MQTTAddr(), "p", "alice")
	for _, q := range []string{"orders", "jobs"} {
		if rc := c.publish("$queue/"+q, []byte("x")); rc != 0 {
			t.Fatalf("publish to %s: %#x", q, rc)
		}
	}

	type login struct{ bearer, user, pass string }
	token, none := login{bearer: adminToken}, login{}
	basic := func(u string) login { return login{user: u, pass: password(u)} }
	tests := []struct {
		method, path string
		as           login
		want         int
	}{
		{"GET", "/healthz", none, 200},
		{"GET", "/readyz", none, 200},
		{"GET", "/metrics", none, 200},
		{"GET", "/api/v1/queues", none, 401},
		{"GET", "/api/v1/queues", login{bearer: "wrong"}, 401},
		{"GET", "/api/v1/queues", token, 200},
		{"GET", "/api/v1/queues/orders/messages", none, 401},
		{"GET", "/api/v1/nothing", none, 401},
		{"GET", "/debug/pprof/", none, 401},
		{"GET", "/debug/pprof/", token, 200},
		{"GET", "/api/v1/queues", basic("ops"), 200},
		{"GET", "/debug/pprof/", basic("ops"), 200},
		{"GET", "/api/v1/queues", login{user: "ops", pass: "nope"}, 401},
		{"GET", "/api/v1/queues", basic("lead"), 403},
		{"GET", "/debug/pprof/", basic("lead"), 403},
		{"GET", "/api/v1/queues/orders", basic("lead"), 200},
		{"GET", "/api/v1/queues/jobs", basic("lead"), 403},
		{"GET", "/api/v1/queues/orders/dlq", basic("lead"), 403},
		{"POST", "/api/v1/queues/orders/purge", basic("lead"), 200},
		{"POST", "/api/v1/queues/jobs/purge", basic("lead"), 403},
		{"POST", "/api/v1/queues/jobs/purge", basic("alice"), 403},
		{"POST", "/api/v1/queues/jobs/purge", basic("ops"), 200},
		// Deleting a queue takes its dead-letter queue: admin on both
		// (the pattern "*" does not name jobs/$dlq).
		{"DELETE", "/api/v1/queues/orders", basic("lead"), 403},
		{"DELETE", "/api/v1/queues/jobs", basic("ops"), 403},
		{"DELETE", "/api/v1/queues/jobs", token, 200},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://"+b.HTTPAddr()+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.as.bearer != "":
				req.Header.Set("Authorization", "Bearer "+tc.as.bearer)
			case tc.as.user != "":
				req.SetBasicAuth(tc.as.user, tc.as.pass)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tc.want)
			}
			if tc.want == 401 && len(resp.Header.Values("WWW-Authenticate")) == 0 {
				t.Error("401 without a WWW-Authenticate challenge")
			}
		})
	}
	if n := counter(t, b, "shardq_acl_denials_total", "action", "admin"); n != 8 {
		t.Errorf("admin denials %v, want 8", n)
	}

	// A script (the web console) is not offered Basic: a browser would
	// open its own login dialog over the page.
	req, _ := http.NewRequest("GET", "http://"+b.HTTPAddr()+"/api/v1/queues", nil)
	req.Header.Set("X-Requested-With", "XMLHttpRequest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Values("WWW-Authenticate"); resp.StatusCode != 401 || len(got) != 1 || !strings.HasPrefix(got[0], "Bearer") {
		t.Errorf("a script's unauthenticated read: %d with challenges %q, want 401 with Bearer only", resp.StatusCode, got)
	}
}
