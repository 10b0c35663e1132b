package broker

import (
	"net/http"
	"net/http/pprof"

	"github.com/shardq/shardq/console"
)

// handler serves /healthz, /readyz, /metrics (unless metrics are off),
// /debug/pprof/, the admin API (admin.go) and the web console (/ui/, where / leads).
func (b *Broker) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !b.Ready() {
			why := "not ready"
			switch {
			case b.shutdown.Load():
				why = "not ready: shutting down"
			case !b.health.storageOK():
				why = "not ready: storage writes failing"
			case b.disk.low():
				why = "not ready: disk below min_free_bytes"
			case b.node != nil && b.node.Ready() != nil:
				why = "not ready: " + b.node.Ready().Error()
			}
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	// The admin API and the profiles need the admin token, when there is
	// one (adminauth.go); health and metrics stay open.
	a := &adminAPI{b: b, log: b.log.With("component", "admin")}
	mux.HandleFunc("GET /debug/pprof/", a.guard(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/profile", a.guard(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/trace", a.guard(pprof.Trace))
	if b.cfg.Admin.Metrics {
		mux.Handle("GET /metrics", b.metricsHandler())
	}
	a.mount(mux)
	mux.Handle(console.Prefix, console.New(console.Options{Token: b.cfg.Admin.Token}))
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	return mux
}
