package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardq/shardq/config"
	"github.com/shardq/shardq/hooks"
	"github.com/shardq/shardq/queue"
)

// tenants holds the limits of config tenants and what each tenant uses
// of them. A tenant is a client's username ("" anonymous); its state is
// made when one of its clients first connects and kept (a handful of
// numbers per username). Without a tenants section nothing here runs:
// b.tenants is nil.
//
// Publish rate and connections are counted on the path they limit;
// queues are counted when one would be created; the bytes of a tenant's
// queues, and the queues whose owner is over its max_bytes, are refreshed
// every second (refresh), so that a publish costs one map lookup.
type tenants struct {
	cfg *config.Config
	// owners returns the owner of each queue this node knows, and the
	// bytes it holds here (0 for a queue whose partitions are elsewhere).
	owners func() []ownedQueue

	mu sync.Mutex
	by map[string]*tenant

	// full names the queues whose owner is at its max_bytes.
	full atomic.Pointer[map[string]bool]

	publishes   *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	connections *prometheus.GaugeVec
	queues      *prometheus.GaugeVec
	bytes       *prometheus.GaugeVec
}

// ownedQueue is a queue, its owner and its bytes on this node.
type ownedQueue struct {
	name, owner string
	bytes       int64
}

// Labels of shardq_tenant_refusals_total.
const (
	tenantRate        = "publish_rate"
	tenantBytes       = "max_bytes"
	tenantQueues      = "max_queues"
	tenantConnections = "max_connections"
)

// tenant is one tenant's limits and use.
type tenant struct {
	name string
	lim  config.Tenant

	mu     sync.Mutex
	tokens float64
	last   time.Time

	conns atomic.Int64

	published prometheus.Counter
}

func newTenants(cfg *config.Config, node prometheus.Labels, owners func() []ownedQueue) *tenants {
	t := &tenants{cfg: cfg, owners: owners, by: map[string]*tenant{}}
	t.full.Store(&map[string]bool{})
	t.publishes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardq_tenant_publishes_total",
		Help: "Publishes to queues this node took from the tenant's clients (stored or not).", ConstLabels: node}, []string{"tenant"})
	t.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardq_tenant_refusals_total",
		Help: "Requests of the tenant's clients refused by its limits: publish_rate, max_bytes, max_queues, max_connections.", ConstLabels: node}, []string{"tenant", "limit"})
	t.connections = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_tenant_connections",
		Help: "Connected clients of the tenant on this node.", ConstLabels: node}, []string{"tenant"})
	t.queues = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_tenant_queues",
		Help: "Queues the tenant's clients created (in a cluster, in the whole cluster).", ConstLabels: node}, []string{"tenant"})
	t.bytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardq_tenant_bytes",
		Help: "Bytes stored in the tenant's queues on this node.", ConstLabels: node}, []string{"tenant"})
	return t
}

func (t *tenants) collectors() []prometheus.Collector {
	return []prometheus.Collector{t.publishes, t.refusals, t.connections, t.queues, t.bytes}
}

// get returns the state of tenant user, made on first use.
func (t *tenants) get(user string) *tenant {
	t.mu.Lock()
	defer t.mu.Unlock()
	tn := t.by[user]
	if tn == nil {
		lim, _ := t.cfg.TenantLimits(user)
		tn = &tenant{name: user, lim: lim, tokens: float64(lim.PublishRate), published: t.publishes.WithLabelValues(user)}
		t.by[user] = tn
		for _, l := range []string{tenantRate, tenantBytes, tenantQueues, tenantConnections} {
			t.refusals.WithLabelValues(user, l)
		}
		t.connections.WithLabelValues(user)
	}
	return tn
}

// refuse counts a refusal of tn by limit and returns the error that
// answers it (0x97).
func (t *tenants) refuse(tn *tenant, limit string, format string, args ...any) error {
	t.refusals.WithLabelValues(tn.name, limit).Inc()
	return fmt.Errorf("%w: tenant %q: %s", hooks.ErrQuotaExceeded, tn.name, fmt.Sprintf(format, args...))
}

// connect counts a connection of tn, or refuses it past max_connections.
func (t *tenants) connect(tn *tenant) error {
	max := int64(tn.lim.MaxConnections)
	for {
		n := tn.conns.Load()
		if max > 0 && n >= max {
			return t.refuse(tn, tenantConnections, "tenants.%s.max_connections (%d) reached", t.entry(tn), max)
		}
		if tn.conns.CompareAndSwap(n, n+1) {
			t.connections.WithLabelValues(tn.name).Set(float64(n + 1))
			return nil
		}
	}
}

// disconnect uncounts a connection connect counted.
func (t *tenants) disconnect(tn *tenant) {
	t.connections.WithLabelValues(tn.name).Set(float64(tn.conns.Add(-1)))
}

// entry names the config entry tn's limits come from.
func (t *tenants) entry(tn *tenant) string {
	if _, named := t.cfg.Tenants[tn.name]; named && tn.name != "" {
		return tn.name
	}
	return config.DefaultTenant
}

// publish admits a publish of tn to queue name: within its publish rate
// (or, with throttle, once it is: the client's reads wait meanwhile), and
// into a queue whose owner is below its max_bytes.
func (t *tenants) publish(tn *tenant, name string) error {
	tn.published.Inc()
	if full := *t.full.Load(); len(full) > 0 && full[name] {
		return t.refuse(tn, tenantBytes, "queue %s is over its owner's max_bytes", name)
	}
	rate := float64(tn.lim.PublishRate)
	if rate <= 0 {
		return nil
	}
	tn.mu.Lock()
	now := time.Now()
	tn.tokens = min(rate, tn.tokens+now.Sub(tn.last).Seconds()*rate)
	tn.last = now
	tn.tokens--
	if tn.tokens >= 0 {
		tn.mu.Unlock()
		return nil
	}
	if !tn.lim.Throttle {
		tn.tokens++ // not taken
		tn.mu.Unlock()
		return t.refuse(tn, tenantRate, "tenants.%s.publish_rate (%d/s) reached", t.entry(tn), tn.lim.PublishRate)
	}
	// Taken ahead: it waits until the bucket is back at 0.
	wait := time.Duration(-tn.tokens / rate * float64(time.Second))
	tn.mu.Unlock()
	time.Sleep(wait)
	return nil
}

// create admits the creation of a queue by tenant owner: fewer queues
// than its max_queues are its. n counts the queues owner has.
func (t *tenants) create(ctx context.Context, name string) error {
	owner := queue.OwnerFrom(ctx)
	if owner == "" {
		return nil // anonymous: limits.max_queues alone bounds its queues
	}
	tn := t.get(owner)
	max := tn.lim.MaxQueues
	if max <= 0 {
		return nil
	}
	have := 0
	for _, q := range t.owners() {
		if q.owner == tn.name {
			have++
		}
	}
	if have >= max {
		return t.refuse(tn, tenantQueues, "tenants.%s.max_queues (%d) reached; queue %q not created", t.entry(tn), max, name)
	}
	return nil
}

// refresh recounts each tenant's queues and bytes, and which queues'
// owners are at their max_bytes.
func (t *tenants) refresh() {
	type use struct {
		queues int
		bytes  int64
		names  []string
	}
	uses := map[string]*use{}
	for _, q := range t.owners() {
		if q.owner == "" {
			continue // no tenant's: declared, made through the API, or by anonymous clients
		}
		u := uses[q.owner]
		if u == nil {
			u = &use{}
			uses[q.owner] = u
		}
		u.queues++
		u.bytes += q.bytes
		u.names = append(u.names, q.name)
	}
	full := map[string]bool{}
	t.mu.Lock()
	for name := range t.by {
		if uses[name] == nil {
			uses[name] = &use{}
		}
	}
	t.mu.Unlock()
	for name, u := range uses {
		t.queues.WithLabelValues(name).Set(float64(u.queues))
		t.bytes.WithLabelValues(name).Set(float64(u.bytes))
		if lim, _ := t.cfg.TenantLimits(name); lim.MaxBytes > 0 && u.bytes >= lim.MaxBytes {
			for _, q := range u.names {
				full[q] = true
			}
		}
	}
	t.full.Store(&full)
}

// ownedQueues lists the queues this node knows with their owners (in a
// cluster, as the catalog records them) and the bytes each holds here.
func (b *Broker) ownedQueues() []ownedQueue {
	var owners map[string]string
	if b.node != nil {
		owners = b.node.QueueOwners()
	}
	var out []ownedQueue
	for _, q := range b.manager.Queues() {
		if q.IsDLQ() {
			continue
		}
		owner := q.Owner()
		if owners != nil {
			owner = owners[q.Name()]
			delete(owners, q.Name())
		}
		out = append(out, ownedQueue{name: q.Name(), owner: owner, bytes: q.Bytes() + q.DLQ().Bytes()})
	}
	for name, owner := range owners {
		out = append(out, ownedQueue{name: name, owner: owner}) // its partitions are elsewhere
	}
	return out
}
