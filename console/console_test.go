package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/shardq/shardq/console"
)

func serve(t *testing.T, c *console.Console, method, path, auth string) *http.Response {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	return w.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConsoleAssets(t *testing.T) {
	c := console.New(console.Options{})
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/ui/", "text/html", `<script src="console.js"`},
		{"/ui/console.js", "javascript", "function h(tag"},
		{"/ui/console.css", "text/css", "dialog"},
		{"/ui/favicon.svg", "image/svg+xml", "<svg"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res := serve(t, c, "GET", tc.path, "")
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			if ct := res.Header.Get("Content-Type"); !strings.Contains(ct, tc.contentType) {
				t.Errorf("Content-Type %q, want %q", ct, tc.contentType)
			}
			csp := res.Header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			if res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Error("no X-Content-Type-Options: nosniff")
			}
			if b := body(t, res); !strings.Contains(b, tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
		})
	}
	if res := serve(t, c, "GET", "/ui/nothing.js", ""); res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown asset: status %d, want 404", res.StatusCode)
	}
	if res := serve(t, c, "POST", "/ui/", ""); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: status %d, want 405", res.StatusCode)
	}
}

// The pages set text only through text nodes: none of the calls that parse
// a string as HTML or code appears in the script.
func TestConsoleScriptBuildsNoHTML(t *testing.T) {
	js := body(t, serve(t, console.New(console.Options{}), "GET", "/ui/console.js", ""))
	forbidden := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(|createContextualFragment`)
	if m := forbidden.FindAllString(js, -1); m != nil {
		t.Errorf("console.js uses %v", m)
	}
}

func TestConsoleAuth(t *testing.T) {
	type state struct {
		TokenRequired bool   `json:"token_required"`
		Authenticated bool   `json:"authenticated"`
		Error         string `json:"error"`
	}
	for _, tc := range []struct {
		name, token, auth string
		status            int
		want              state
	}{
		{"no token set", "", "", 200, state{TokenRequired: false, Authenticated: true}},
		{"no token set, one sent", "", "Bearer anything", 200, state{TokenRequired: false, Authenticated: true}},
		{"token set, none sent", "s3cret", "", 200, state{TokenRequired: true}},
		{"right token", "s3cret", "Bearer s3cret", 200, state{TokenRequired: true, Authenticated: true}},
		{"right token, scheme in lower case", "s3cret", "bearer s3cret", 200, state{TokenRequired: true, Authenticated: true}},
		{"wrong token", "s3cret", "Bearer s3cre", 401, state{Error: "wrong admin token"}},
		{"not a bearer token", "s3cret", "Basic czNjcmV0", 401, state{Error: "wrong admin token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := serve(t, console.New(console.Options{Token: tc.token}), "GET", "/ui/auth", tc.auth)
			if res.StatusCode != tc.status {
				t.Errorf("status %d, want %d", res.StatusCode, tc.status)
			}
			if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
			var got state
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
