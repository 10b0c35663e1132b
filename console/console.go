package console

import (
	"crypto/subtle"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
)

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// assets are the console's pages, scripts and styles.
//
//go:embed assets
var assets embed.FS

// contentSecurityPolicy lets the pages load only the console's own scripts,
// styles and images and talk only to their own origin: no inline script
// or event handler runs, whatever a message payload holds.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Options configure the console.
type Options struct {
	// Token is the admin token (http.admin_token); empty when none is set.
	Token string
}

// Console serves the web console under Prefix.
type Console struct {
	token string
	files http.Handler
}

// New returns the console.
func New(opts Options) *Console {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("console: embedded assets: " + err.Error()) // the directory is embedded above
	}
	return &Console{token: opts.Token, files: http.StripPrefix(Prefix, http.FileServerFS(sub))}
}

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == Prefix+"auth" {
		c.auth(w, r)
		return
	}
	// The pages change with the binary: always revalidate.
	h.Set("Cache-Control", "no-cache")
	c.files.ServeHTTP(w, r)
}

// AuthState is the answer to GET /ui/auth.
type AuthState struct {
	// TokenRequired is true when the node has an admin token.
	TokenRequired bool `json:"token_required"`
	// Authenticated is true when the request carried the right token (or
	// no token is required).
	Authenticated bool `json:"authenticated"`
}

// auth answers GET /ui/auth: whether a token is required and whether the
// request's bearer token, if it has one, is right. A wrong one gets 401.
func (c *Console) auth(w http.ResponseWriter, r *http.Request) {
	state := AuthState{TokenRequired: c.token != "", Authenticated: c.token == ""}
	status := http.StatusOK
	var doc any = state
	if auth := r.Header.Get("Authorization"); auth != "" && c.token != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		if ok && strings.EqualFold(scheme, "Bearer") &&
			subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(c.token)) == 1 {
			state.Authenticated = true
			doc = state
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="shardq"`)
			status = http.StatusUnauthorized
			doc = struct {
				Error string `json:"error"`
			}{"wrong admin token"}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(doc)
}
