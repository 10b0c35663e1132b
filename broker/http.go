package broker

import (
	"net/http"
	"net/http/pprof"

	"github.com/shardq/shardq/console"
)

// handler serves /healthz, /readyz, /metrics (unless metrics are off),
// the admin API (admin.go) and the web console (/ui/, where / leads).
func (b *Broker) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !b.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	if b.cfg.Admin.Metrics {
		mux.Handle("GET /metrics", b.metricsHandler())
	}
	b.mountAdmin(mux)
	mux.Handle(console.Prefix, console.New(console.Options{Token: b.cfg.Admin.Token}))
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	return mux
}
