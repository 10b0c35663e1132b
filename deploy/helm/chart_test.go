// Package helm_test checks the Helm chart in shardq/ without a Kubernetes
// cluster: helm's lint, then for several value sets the rendered objects,
// each decoded strictly into its Kubernetes type, checked against each
// other (Services, probes and the disruption budget find the pods and
// ports they name) and against shardq itself: each pod's command line,
// environment and mounted files go through shardq's config loader, which
// must accept them with the node id, addresses and etcd the chart means.
//
// It is a module of its own so that shardq's module does not depend on
// Helm and the Kubernetes libraries.
package helm_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/shardq/shardq/config"
)

const (
	chartDir  = "shardq"
	release   = "sq"
	namespace = "queues"
	// clusterDomain is the chart's default.
	clusterDomain = "cluster.local"
)

// valueSet is a user's values and what they mean for the cluster.
type valueSet struct {
	name   string
	values map[string]any
	nodes  int
	// etcd are the endpoints the nodes must use; nil: the chart's etcd.
	etcd      []string
	anonymous bool
}

var externalEtcd = []string{"http://etcd-0.etcd.db.svc:2379", "http://etcd-1.etcd.db.svc:2379", "http://etcd-2.etcd.db.svc:2379"}

var valueSets = []valueSet{
	{name: "defaults", nodes: 3},
	{name: "external etcd", nodes: 3, etcd: externalEtcd,
		values: map[string]any{"etcd": map[string]any{"enabled": false, "endpoints": toAny(externalEtcd)}}},
	{name: "service monitor", nodes: 3,
		values: map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}}},
	{name: "five nodes", nodes: 5, values: map[string]any{"replicaCount": 5}},
	{name: "single node", nodes: 1, etcd: []string{},
		values: map[string]any{"replicaCount": 1, "etcd": map[string]any{"enabled": false}}},
	{name: "existing secrets and cluster TLS", nodes: 3, values: map[string]any{
		"auth": map[string]any{
			"users":        map[string]any{"existingSecret": "mqtt-users", "key": "htpasswd"},
			"adminToken":   map[string]any{"existingSecret": "shardq-admin", "key": "token"},
			"clusterToken": map[string]any{"existingSecret": "shardq-peers", "key": "token"},
		},
		"cluster": map[string]any{"tlsSecret": "shardq-tls"},
	}},
	{name: "anonymous and more config", nodes: 3, anonymous: true, values: map[string]any{
		"auth":             map[string]any{"allowAnonymous": true},
		"ports":            map[string]any{"mqtt": 11883, "http": 18990},
		"fullnameOverride": "broker",
		"config": map[string]any{
			"storage": map[string]any{"min_free_bytes": 1073741824},
			"queues":  map[string]any{"declared": map[string]any{"orders": map[string]any{"partitions": 16}}},
			// The chart's own keys win over the user's.
			"listen": map[string]any{"mqtt": "127.0.0.1:1"},
		},
	}},
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestChartLint runs helm lint on every value set: an error or a warning
// fails.
func TestChartLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			l := lint.All(chartDir, vs.values, namespace, false)
			for _, msg := range l.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Logf("helm lint: %s", msg)
				}
			}
		})
	}
}

// TestChartRenders renders every value set and checks the objects.
func TestChartRenders(t *testing.T) {
	ch := loadChart(t)
	img := readImage(t)
	external := externalSecrets(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m := decodeManifests(t, render(t, ch, vs.values))
			if t.Failed() {
				t.FailNow()
			}
			checkChart(t, m, vs, img, external)
		})
	}
}

// TestChartRefuses checks that values which cannot make a working
// cluster fail at install, saying why, rather than as pods that crash.
func TestChartRefuses(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"nodes without etcd", map[string]any{"etcd": map[string]any{"enabled": false}}, "needs etcd"},
		{"both etcds", map[string]any{"etcd": map[string]any{"endpoints": toAny(externalEtcd)}}, "etcd.enabled=false"},
		{"no nodes", map[string]any{"replicaCount": 0}, "replicaCount"},
		{"misspelt value", map[string]any{"replicas": 5}, "replicas"},
		{"endpoint without scheme", map[string]any{"etcd": map[string]any{"enabled": false, "endpoints": []any{"etcd:2379"}}}, "endpoints"},
		{"even etcd", map[string]any{"etcd": map[string]any{"replicaCount": 2}}, "replicaCount"},
		{"grace shorter than the drain", map[string]any{"terminationGracePeriodSeconds": 10}, "terminationGracePeriodSeconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderErr(ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func render(t *testing.T, ch *chart.Chart, values map[string]any) map[string]string {
	t.Helper()
	out, err := renderErr(ch, values)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// renderErr renders the chart as `helm install` would (values checked
// against values.schema.json first), without a cluster to look Secrets up in.
func renderErr(ch *chart.Chart, values map[string]any) (map[string]string, error) {
	vals, err := chartutil.ToRenderValues(ch, values,
		chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true},
		chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, vals)
}

// checkChart checks the objects of one rendering.
func checkChart(t *testing.T, m *manifests, vs valueSet, img image, external map[string]map[string]string) {
	sts := m.statefulSet(t, "broker")
	if got := ptrValue(sts.Spec.Replicas); got != int32(vs.nodes) {
		t.Errorf("StatefulSet %s: %d replicas, want %d", sts.Name, got, vs.nodes)
	}
	for _, s := range m.statefulSets {
		checkStatefulSet(t, m, s)
	}
	for _, s := range m.services {
		checkService(t, m, s)
	}
	checkDisruptionBudget(t, m, sts, vs.nodes)
	checkServiceMonitors(t, m, sts, vs)

	// The nodes' etcd: the endpoints given, or every member of the chart's.
	want := vs.etcd
	if want == nil {
		want = etcdMembers(t, m)
	}
	clustered := len(want) > 0
	headless := m.service(sts.Spec.ServiceName)
	for ordinal := range vs.nodes {
		p := newPod(t, m, sts, ordinal, img, external)
		cfg := p.load(t)
		if cfg.NodeID != p.name {
			t.Errorf("%s: node_id %q, want the pod's name", p.name, cfg.NodeID)
		}
		if !slices.Equal(cfg.Cluster.Etcd.Endpoints, want) {
			t.Errorf("%s: etcd endpoints %q, want %q", p.name, cfg.Cluster.Etcd.Endpoints, want)
		}
		if cfg.Clustered() != clustered {
			t.Errorf("%s: clustered %v, want %v", p.name, cfg.Clustered(), clustered)
		}
		if cfg.Admin.Token == "" {
			t.Errorf("%s: no admin token: the HTTP listener is off loopback", p.name)
		}
		if cfg.AnonymousAllowed() != vs.anonymous {
			t.Errorf("%s: anonymous MQTT clients %v, want %v", p.name, cfg.AnonymousAllowed(), vs.anonymous)
		}
		// Each listener on the container port of its name, on every address.
		for _, l := range []struct{ name, addr string }{{"mqtt", cfg.MQTT}, {"ws", cfg.WS}, {"http", cfg.HTTP}} {
			checkListener(t, p, l.name, l.addr)
		}
		if !slices.Contains(p.writable, p.inRoot(cfg.DataDir)) {
			t.Errorf("%s: data_dir %s is not a writable volume (writable: %q)", p.name, p.inRoot(cfg.DataDir), p.writable)
		}
		if clustered {
			checkListener(t, p, "cluster", cfg.Cluster.Addr)
			// Peers dial the pod's name under the headless Service, on
			// the port the node listens on.
			host, port, _ := net.SplitHostPort(cfg.Cluster.Advertise)
			if wantHost := p.name + "." + sts.Spec.ServiceName + "." + namespace + ".svc." + clusterDomain; host != wantHost {
				t.Errorf("%s: cluster.advertise %q, want host %s", p.name, cfg.Cluster.Advertise, wantHost)
			}
			if headless == nil || !selects(headless.Spec.Selector, p.labels) {
				t.Errorf("%s: cluster.advertise %q: the headless Service does not select the pod", p.name, cfg.Cluster.Advertise)
			}
			if _, listen, _ := net.SplitHostPort(cfg.Cluster.Addr); port != listen {
				t.Errorf("%s: cluster.advertise %q, cluster.addr %q: peers would dial a port the node does not listen on", p.name, cfg.Cluster.Advertise, cfg.Cluster.Addr)
			}
			if cfg.Cluster.Token == "" && cfg.Cluster.TLS.Cert == "" {
				t.Errorf("%s: the links between nodes have neither TLS nor a token", p.name)
			}
		}
		if ordinal == 0 {
			checkProbes(t, p, cfg)
			checkSecurity(t, sts)
		}
	}
}

// checkStatefulSet checks what the API server and the controller need of
// a StatefulSet: its selector matches its pods, its headless Service
// exists, selects them and publishes them before they are ready (a node
// is ready only once it reaches its peers; etcd members once they have
// a quorum).
func checkStatefulSet(t *testing.T, m *manifests, s *appsv1.StatefulSet) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(s.Spec.Template.Labels)) {
		t.Errorf("StatefulSet %s: selector %v does not match its pods' labels %v (%v)", s.Name, s.Spec.Selector, s.Spec.Template.Labels, err)
	}
	h := m.service(s.Spec.ServiceName)
	switch {
	case h == nil:
		t.Errorf("StatefulSet %s: no Service %q (serviceName)", s.Name, s.Spec.ServiceName)
	case h.Spec.ClusterIP != corev1.ClusterIPNone:
		t.Errorf("Service %s of StatefulSet %s: clusterIP %q, want None (headless)", h.Name, s.Name, h.Spec.ClusterIP)
	case !h.Spec.PublishNotReadyAddresses:
		t.Errorf("Service %s of StatefulSet %s: publishNotReadyAddresses false: pods could not find each other before they are ready", h.Name, s.Name)
	case !selects(h.Spec.Selector, s.Spec.Template.Labels):
		t.Errorf("Service %s of StatefulSet %s does not select its pods", h.Name, s.Name)
	}
	for _, vm := range s.Spec.Template.Spec.Containers[0].VolumeMounts {
		if vm.SubPath != "" && !vm.ReadOnly {
			t.Errorf("StatefulSet %s: mount %s of a subPath is writable", s.Name, vm.MountPath)
		}
	}
}

// checkService checks that the Service selects the pods of exactly one
// StatefulSet and that each port targets a port of their container.
func checkService(t *testing.T, m *manifests, s *corev1.Service) {
	t.Helper()
	var pods []*appsv1.StatefulSet
	for _, sts := range m.statefulSets {
		if selects(s.Spec.Selector, sts.Spec.Template.Labels) {
			pods = append(pods, sts)
		}
	}
	if len(pods) != 1 {
		t.Errorf("Service %s selects the pods of %d StatefulSets, want 1", s.Name, len(pods))
		return
	}
	c := pods[0].Spec.Template.Spec.Containers[0]
	if len(s.Spec.Ports) == 0 {
		t.Errorf("Service %s has no port", s.Name)
	}
	for _, sp := range s.Spec.Ports {
		target := intOrName{name: sp.TargetPort.StrVal, number: sp.TargetPort.IntVal}
		if target == (intOrName{}) {
			target.number = sp.Port
		}
		if _, ok := containerPort(c, target); !ok {
			t.Errorf("Service %s: port %s targets %s, which container %s of %s does not have", s.Name, sp.Name, sp.TargetPort.String(), c.Name, pods[0].Name)
		}
	}
}

// checkDisruptionBudget checks that the shardq pods have a budget of one
// pod down at a time, which selects them and no etcd pod.
func checkDisruptionBudget(t *testing.T, m *manifests, sts *appsv1.StatefulSet, nodes int) {
	t.Helper()
	var mine []string
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("PodDisruptionBudget %s: selector %v (%v)", pdb.Name, pdb.Spec.Selector, err)
			continue
		}
		matched := 0
		for _, s := range m.statefulSets {
			if sel.Matches(labels.Set(s.Spec.Template.Labels)) {
				matched++
			}
		}
		if matched != 1 {
			t.Errorf("PodDisruptionBudget %s selects the pods of %d StatefulSets, want 1", pdb.Name, matched)
		}
		if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.String() != "1" || pdb.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, minAvailable %v: want maxUnavailable 1 alone", pdb.Name, mu, pdb.Spec.MinAvailable)
		}
		if sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
			mine = append(mine, pdb.Name)
		}
	}
	if want := min(nodes-1, 1); len(mine) != want {
		t.Errorf("%d PodDisruptionBudgets (%q) select the shardq pods, want %d", len(mine), mine, want)
	}
}

// checkServiceMonitors checks that a ServiceMonitor is made when asked
// for and scrapes /metrics on the HTTP port of every shardq pod.
func checkServiceMonitors(t *testing.T, m *manifests, sts *appsv1.StatefulSet, vs valueSet) {
	t.Helper()
	want := 0
	if sm, ok := vs.values["serviceMonitor"].(map[string]any); ok && sm["enabled"] == true {
		want = 1
	}
	if len(m.serviceMonitors) != want {
		t.Fatalf("%d ServiceMonitors, want %d", len(m.serviceMonitors), want)
	}
	for _, sm := range m.serviceMonitors {
		if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
			t.Errorf("ServiceMonitor %s: namespaces %q, want the release's", sm.Metadata.Name, sm.Spec.NamespaceSelector.MatchNames)
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Fatalf("ServiceMonitor %s: selector %v (%v)", sm.Metadata.Name, sm.Spec.Selector, err)
		}
		var svcs []*corev1.Service
		for _, s := range m.services {
			if sel.Matches(labels.Set(s.Labels)) {
				svcs = append(svcs, s)
			}
		}
		if len(svcs) != 1 {
			t.Fatalf("ServiceMonitor %s selects %d Services, want 1", sm.Metadata.Name, len(svcs))
		}
		svc := svcs[0]
		if !selects(svc.Spec.Selector, sts.Spec.Template.Labels) || !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("ServiceMonitor %s: Service %s does not list every shardq pod, ready or not", sm.Metadata.Name, svc.Name)
		}
		if len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s: %d endpoints, want 1", sm.Metadata.Name, len(sm.Spec.Endpoints))
		}
		e := sm.Spec.Endpoints[0]
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port })
		if i < 0 || svc.Spec.Ports[i].TargetPort.StrVal != "http" || e.Path != "/metrics" {
			t.Errorf("ServiceMonitor %s: port %q path %q: want /metrics on the Service's port targeting http", sm.Metadata.Name, e.Port, e.Path)
		}
		for k, v := range vs.values["serviceMonitor"].(map[string]any)["labels"].(map[string]any) {
			if sm.Metadata.Labels[k] != v {
				t.Errorf("ServiceMonitor %s: label %s=%q, want %q", sm.Metadata.Name, k, sm.Metadata.Labels[k], v)
			}
		}
	}
}

// checkListener checks that a shardq listener is on every address of the
// pod, on the container port of that name.
func checkListener(t *testing.T, p *pod, name, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	cp, ok := containerPort(p.container, intOrName{name: name})
	if err != nil || host != "" || !ok || port != strconv.Itoa(int(cp.ContainerPort)) {
		t.Errorf("%s: listener %s on %q, container port %s %d: want :%d", p.name, name, addr, name, cp.ContainerPort, cp.ContainerPort)
	}
}

// checkProbes checks that startup and liveness ask /healthz, readiness
// /readyz, on the port shardq serves HTTP on.
func checkProbes(t *testing.T, p *pod, cfg *config.Config) {
	t.Helper()
	_, httpPort, _ := net.SplitHostPort(cfg.HTTP)
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startup", p.container.StartupProbe, "/healthz"},
		{"liveness", p.container.LivenessProbe, "/healthz"},
		{"readiness", p.container.ReadinessProbe, "/readyz"},
	} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", p.name, pr.name)
			continue
		}
		g := pr.probe.HTTPGet
		cp, ok := containerPort(p.container, intOrName{name: g.Port.StrVal, number: g.Port.IntVal})
		if g.Path != pr.path || !ok || strconv.Itoa(int(cp.ContainerPort)) != httpPort || g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s: %s probe %s %s on port %s: want HTTP %s on shardq's HTTP port %s", p.name, pr.name, g.Scheme, g.Path, g.Port.String(), pr.path, httpPort)
		}
	}
}

// checkSecurity checks that the shardq pods run unprivileged on a
// read-only root file system.
func checkSecurity(t *testing.T, sts *appsv1.StatefulSet) {
	t.Helper()
	ps := sts.Spec.Template.Spec.SecurityContext
	c := sts.Spec.Template.Spec.Containers[0].SecurityContext
	if ps == nil || !ptrValue(ps.RunAsNonRoot) || ptrValue(ps.RunAsUser) == 0 {
		t.Errorf("StatefulSet %s: pod security context %+v: want a non-root user", sts.Name, ps)
	}
	if c == nil || !ptrValue(c.ReadOnlyRootFilesystem) || ptrValue(c.AllowPrivilegeEscalation) {
		t.Errorf("StatefulSet %s: container security context %+v: want a read-only root and no privilege escalation", sts.Name, c)
	}
	// A node hands its partitions over and drains for up to 30 s on SIGTERM.
	if g := ptrValue(sts.Spec.Template.Spec.TerminationGracePeriodSeconds); g <= 30 {
		t.Errorf("StatefulSet %s: terminationGracePeriodSeconds %d: want more than shardq's 30 s shutdown", sts.Name, g)
	}
}

// etcdMembers returns the client URLs of the chart's etcd members, from
// its StatefulSet: each pod's name under its headless Service, on the
// client port, as each member advertises it.
func etcdMembers(t *testing.T, m *manifests) []string {
	t.Helper()
	sts := m.statefulSet(t, "etcd")
	c := sts.Spec.Template.Spec.Containers[0]
	cp, ok := containerPort(c, intOrName{name: "client"})
	if !ok {
		t.Fatalf("etcd: no client port")
	}
	var urls, peers []string
	var initial string
	for i := range int(ptrValue(sts.Spec.Replicas)) {
		name := fmt.Sprintf("%s-%d", sts.Name, i)
		host := name + "." + sts.Spec.ServiceName + "." + namespace + ".svc." + clusterDomain
		urls = append(urls, fmt.Sprintf("http://%s:%d", host, cp.ContainerPort))
		peers = append(peers, fmt.Sprintf("%s=http://%s:2380", name, host))
		env := map[string]string{"POD_NAME": name}
		flags := map[string]string{}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			if k, v, ok := strings.Cut(expand(a, env), "="); ok {
				flags[k] = v
			}
		}
		if flags["--name"] != name || flags["--advertise-client-urls"] != urls[i] {
			t.Errorf("etcd %s: --name %q --advertise-client-urls %q, want %s and %s", name, flags["--name"], flags["--advertise-client-urls"], name, urls[i])
		}
		initial = flags["--initial-cluster"]
	}
	if initial != strings.Join(peers, ",") {
		t.Errorf("etcd: --initial-cluster %q, want %q", initial, strings.Join(peers, ","))
	}
	return urls
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TestChartReadme checks that the values table of the chart's README
// names every value of values.yaml, and nothing else.
func TestChartReadme(t *testing.T) {
	ch := loadChart(t)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for line := range strings.Lines(string(readme)) {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			key, _, _ := strings.Cut(rest, "`")
			documented[key] = true
		}
	}
	seen := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		seen[prefix] = true
		sub, ok := v.(map[string]any)
		if documented[prefix] || !ok || len(sub) == 0 {
			if !documented[prefix] {
				t.Errorf("README.md: value %s is not in the values table", prefix)
			}
			return
		}
		for k, x := range sub {
			walk(strings.TrimPrefix(prefix+"."+k, "."), x)
		}
	}
	walk("", ch.Values)
	for key := range documented {
		if !seen[key] {
			t.Errorf("README.md: the values table has %s, which values.yaml does not", key)
		}
	}
}
