// Package deploy_test checks the packaging files: the Dockerfile, the
// compose file with its Prometheus and Grafana configuration, and the
// systemd unit. No Docker engine runs where the tests do, so each file is
// parsed and checked against what shardq accepts: every node of the
// compose file and of the image must start with its settings, every file
// mounted must exist, every port must be shardq's.
package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"github.com/shardq/shardq/internal/testbin"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardq/shardq/config"
)

// root is the repository, relative to this package.
const root = ".."

// composeFile is the part of the compose format deploy/docker-compose.yml
// uses. Decoding it with KnownFields makes a misspelt key an error.
type composeFile struct {
	Name     string             `yaml:"name"`
	XShardq  map[string]any     `yaml:"x-shardq"`
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

type service struct {
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Image       string            `yaml:"image"`
	Restart     string            `yaml:"restart"`
	Hostname    string            `yaml:"hostname"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   []string          `yaml:"depends_on"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

var shardqNodes = []string{"shardq-1", "shardq-2", "shardq-3"}

func TestDeployComposeServices(t *testing.T) {
	c := readCompose(t)
	var names []string
	for name := range c.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{"etcd", "grafana", "prometheus", "shardq-1", "shardq-2", "shardq-3"}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}

	hostPorts := map[string]string{}
	for _, name := range names {
		s := c.Services[name]
		t.Run(name, func(t *testing.T) {
			if s.Image == "" || !strings.Contains(s.Image, ":") || strings.HasSuffix(s.Image, ":latest") {
				t.Errorf("image %q: want a pinned tag", s.Image)
			}
			if s.Build != nil {
				if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
					t.Errorf("build: %v", err)
				}
			}
			for _, p := range s.Ports {
				// 127.0.0.1:HOST:CONTAINER: nothing is published beyond this machine.
				parts := strings.Split(p, ":")
				if len(parts) != 3 || parts[0] != "127.0.0.1" {
					t.Errorf("port %q: want 127.0.0.1:HOST:CONTAINER", p)
					continue
				}
				if other, dup := hostPorts[parts[1]]; dup {
					t.Errorf("host port %s published by %s and %s", parts[1], other, name)
				}
				hostPorts[parts[1]] = name
			}
			for _, v := range s.Volumes {
				src, _, ok := strings.Cut(v, ":")
				if !ok {
					t.Errorf("volume %q: want SOURCE:TARGET", v)
					continue
				}
				if strings.HasPrefix(src, ".") {
					if _, err := os.Stat(src); err != nil {
						t.Errorf("mounted file: %v", err)
					}
				} else if _, ok := c.Volumes[src]; !ok {
					t.Errorf("volume %q is not declared under volumes", src)
				}
			}
			for _, d := range s.DependsOn {
				if _, ok := c.Services[d]; !ok {
					t.Errorf("depends on %q, which is no service", d)
				}
			}
		})
	}
}

// TestDeployComposeNodesStart checks that each shardq node of the compose
// file starts with its settings, those of the image beneath them: shardq
// accepts every variable and argument, each node has its own name and
// volume, and the ports published are the ones it listens on.
func TestDeployComposeNodesStart(t *testing.T) {
	c := readCompose(t)
	img := readDockerfile(t)
	volumes := map[string]bool{}
	for _, name := range shardqNodes {
		t.Run(name, func(t *testing.T) {
			s := c.Services[name]
			if s.Build == nil || s.Build.Context != root || s.Build.Dockerfile != "Dockerfile" {
				t.Fatalf("build %+v: want the repository's Dockerfile", s.Build)
			}
			env := maps(img.env, s.Environment)
			args := img.cmd
			if len(s.Command) > 0 {
				args = s.Command
			}
			cfg := loadConfig(t, args, env)
			if cfg.NodeID != name {
				t.Errorf("node_id %q, want %q", cfg.NodeID, name)
			}
			if _, port, _ := net.SplitHostPort(cfg.HTTP); port != defaultHTTPPort() {
				t.Errorf("listen.http %q, want the default port %s", cfg.HTTP, defaultHTTPPort())
			}
			// Open inside the container: credentials said explicitly.
			if config.Loopback(cfg.MQTT) || !cfg.AnonymousAllowed() || cfg.Admin.Token == "" {
				t.Errorf("listen.mqtt %q, anonymous %v, token %q: want every address, anonymous clients and a token", cfg.MQTT, cfg.AnonymousAllowed(), cfg.Admin.Token)
			}
			var data string
			for _, v := range s.Volumes {
				if src, dst, _ := strings.Cut(v, ":"); dst == cfg.DataDir {
					data = src
				}
			}
			if data == "" || volumes[data] {
				t.Errorf("data dir %s: want a volume of its own, got %q", cfg.DataDir, data)
			}
			volumes[data] = true
			// One cluster: every node on the compose file's etcd, dialed
			// by its service name.
			if !cfg.Clustered() || cfg.Cluster.Etcd.Endpoints[0] != "http://etcd:2379" {
				t.Errorf("etcd %v: want the etcd service", cfg.Cluster.Etcd.Endpoints)
			}
			if host, _, _ := net.SplitHostPort(cfg.Cluster.Advertise); host != name {
				t.Errorf("cluster.advertise %q: want the node's service name", cfg.Cluster.Advertise)
			}
			published := map[string]bool{}
			for _, p := range s.Ports {
				published[p[strings.LastIndexByte(p, ':')+1:]] = true
			}
			for _, addr := range []string{cfg.MQTT, cfg.WS, cfg.HTTP} {
				if _, port, _ := net.SplitHostPort(addr); !published[port] {
					t.Errorf("listener %s is not published", addr)
				}
			}
		})
	}
}

// TestDeployPrometheusConfigs checks that both scrape configs scrape
// shardq's HTTP port and load rules that exist.
// defaultHTTPPort is the port of the default HTTP address.
func defaultHTTPPort() string {
	_, port, _ := net.SplitHostPort(config.DefaultHTTP)
	return port
}

func TestDeployPrometheusConfigs(t *testing.T) {
	port := defaultHTTPPort()
	type promConfig struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
		RuleFiles []string `yaml:"rule_files"`
	}
	read := func(path string) promConfig {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var p promConfig
		if err := yaml.Unmarshal(data, &p); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(p.ScrapeConfigs) != 1 || p.ScrapeConfigs[0].MetricsPath != "/metrics" || len(p.RuleFiles) != 1 {
			t.Fatalf("%s: want one /metrics scrape config and one rule file, got %+v", path, p)
		}
		return p
	}
	targets := func(p promConfig) []string {
		var out []string
		for _, s := range p.ScrapeConfigs[0].StaticConfigs {
			out = append(out, s.Targets...)
		}
		return out
	}

	example := read(filepath.Join(root, "examples", "prometheus.yml"))
	if got := targets(example); !slices.Equal(got, []string{"127.0.0.1:" + port}) {
		t.Errorf("examples/prometheus.yml scrapes %v, want 127.0.0.1:%s", got, port)
	}
	if _, err := os.Stat(filepath.Join(root, "examples", example.RuleFiles[0])); err != nil {
		t.Errorf("examples/prometheus.yml rule file: %v", err)
	}

	compose := read("prometheus.yml")
	var want []string
	for _, n := range shardqNodes {
		want = append(want, n+":"+port)
	}
	if got := targets(compose); !slices.Equal(got, want) {
		t.Errorf("deploy/prometheus.yml scrapes %v, want %v", got, want)
	}
	// The compose file mounts the rules beside the config, as it names them.
	prom := readCompose(t).Services["prometheus"]
	mounted := map[string]string{}
	for _, v := range prom.Volumes {
		parts := strings.Split(v, ":")
		mounted[parts[1]] = parts[0]
	}
	if src := mounted["/etc/prometheus/prometheus.yml"]; src != "./prometheus.yml" {
		t.Errorf("prometheus.yml mounted from %q", src)
	}
	if src := mounted["/etc/prometheus/"+compose.RuleFiles[0]]; src != "../examples/shardq-alerts.yml" {
		t.Errorf("rule file %s mounted from %q, want ../examples/shardq-alerts.yml", compose.RuleFiles[0], src)
	}
}

// TestDeployGrafanaProvisioning checks that Grafana gets Prometheus as its
// default data source and the dashboard where its provider looks.
func TestDeployGrafanaProvisioning(t *testing.T) {
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name, Type, URL, Access string
			IsDefault               bool `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	var dash struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name, Type string
			Options    struct{ Path string }
		} `yaml:"providers"`
	}
	for path, v := range map[string]any{"grafana/datasources.yml": &ds, "grafana/dashboards.yml": &dash} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if ds.APIVersion != 1 || len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" ||
		ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("data sources %+v: want the compose file's Prometheus, by default", ds)
	}
	if dash.APIVersion != 1 || len(dash.Providers) != 1 || dash.Providers[0].Type != "file" {
		t.Fatalf("dashboard providers %+v: want one file provider", dash)
	}
	grafana := readCompose(t).Services["grafana"]
	found := false
	for _, v := range grafana.Volumes {
		parts := strings.Split(v, ":")
		if filepath.Dir(parts[1]) == dash.Providers[0].Options.Path && parts[0] == "../examples/grafana/shardq.json" {
			found = true
		}
	}
	if !found {
		t.Errorf("examples/grafana/shardq.json is not mounted in %s", dash.Providers[0].Options.Path)
	}
	data, err := os.ReadFile(filepath.Join(root, "examples", "grafana", "shardq.json"))
	if err != nil {
		t.Fatal(err)
	}
	var board struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title string `json:"title"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &board); err != nil || board.UID == "" || len(board.Panels) == 0 {
		t.Errorf("dashboard: %v, uid %q, %d panels", err, board.UID, len(board.Panels))
	}
}

// image is what the Dockerfile's final stage says.
type image struct {
	from        []string // the FROM lines
	user        string
	env         map[string]string
	volumes     []string
	expose      []string
	healthcheck []string // its CMD, exec form
	entrypoint  []string
	cmd         []string // ENTRYPOINT then CMD
	copies      []string // COPY destinations of the final stage
}

// readDockerfile reads the instructions of the Dockerfile that matter
// here; the exec forms are JSON.
func readDockerfile(t *testing.T) image {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	cont := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && cont == "" {
			continue
		}
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cont += l + " "
			continue
		}
		lines = append(lines, cont+line)
		cont = ""
	}
	img := image{env: map[string]string{}}
	execForm := func(s string) []string {
		var v []string
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatalf("Dockerfile: %q is not an exec form: %v", s, err)
		}
		return v
	}
	var cmd []string
	for _, line := range lines {
		op, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(op) {
		case "FROM":
			img.from = append(img.from, rest)
			img.copies = nil
		case "USER":
			img.user = rest
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				img.env[k] = v
			}
		case "VOLUME":
			img.volumes = append(img.volumes, strings.Fields(rest)...)
		case "EXPOSE":
			img.expose = append(img.expose, strings.Fields(rest)...)
		case "HEALTHCHECK":
			_, c, ok := strings.Cut(rest, "CMD ")
			if !ok {
				t.Fatalf("HEALTHCHECK without CMD: %q", rest)
			}
			img.healthcheck = execForm(c)
		case "ENTRYPOINT":
			img.entrypoint = execForm(rest)
		case "CMD":
			cmd = execForm(rest)
		case "COPY":
			f := strings.Fields(rest)
			img.copies = append(img.copies, f[len(f)-1])
		}
	}
	img.cmd = cmd
	return img
}

func TestDeployDockerfile(t *testing.T) {
	img := readDockerfile(t)
	if len(img.from) < 2 || !strings.Contains(img.from[0], " AS ") {
		t.Errorf("FROM %v: want a build stage and a final stage", img.from)
	}
	if img.user == "" || img.user == "root" || strings.HasPrefix(img.user, "0") {
		t.Errorf("USER %q: want a user that is not root", img.user)
	}
	bin := img.entrypoint
	if len(bin) != 1 || !slices.Contains(img.copies, bin[0]) {
		t.Fatalf("ENTRYPOINT %v: want the shardq binary the final stage copies (%v)", bin, img.copies)
	}
	// The image listens on every address: it refuses to start without
	// credentials, naming the listeners, and starts with those of the
	// Dockerfile's docker run line.
	_, err := config.Load(img.cmd[1:], func(k string) string { return img.env[k] })
	for _, want := range []string{"listen.mqtt:", "listen.http:", "SHARDQ_ADMIN_TOKEN"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the image without credentials: %v, want a refusal naming %s", err, want)
		}
	}
	cfg := loadConfig(t, img.cmd, maps(img.env, map[string]string{"SHARDQ_ALLOW_ANONYMOUS": "true", "SHARDQ_ADMIN_TOKEN": "t"}))
	if !slices.Contains(img.volumes, cfg.DataDir) || !slices.Contains(img.copies, cfg.DataDir) {
		t.Errorf("data dir %s: want it a VOLUME, made (owned by the user) in the image; volumes %v", cfg.DataDir, img.volumes)
	}
	for _, addr := range []string{cfg.MQTT, cfg.WS, cfg.HTTP} {
		if _, port, _ := net.SplitHostPort(addr); !slices.Contains(img.expose, port) {
			t.Errorf("listener %s not in EXPOSE %v", addr, img.expose)
		}
	}
	if len(img.healthcheck) < 2 || img.healthcheck[0] != bin[0] || img.healthcheck[1] != "health" {
		t.Fatalf("HEALTHCHECK %v: want %s health", img.healthcheck, bin[0])
	}
	// The check runs: with no node on the image's HTTP port it fails (exit
	// 1) naming the address it asked, rather than refusing its flags (2).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	check := exec.Command(shardqBinary(t), img.healthcheck[1:]...)
	check.Env = []string{"SHARDQ_HTTP=:" + port}
	out, err := check.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), addr) {
		t.Errorf("%v against no node: %v\n%s\nwant exit 1 naming %s", img.healthcheck, err, out, addr)
	}
}

// unit is a systemd unit file: its sections and their settings, in order.
type unit map[string][][2]string

func (u unit) values(section, key string) []string {
	var out []string
	for _, kv := range u[section] {
		if kv[0] == key {
			out = append(out, kv[1])
		}
	}
	return out
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = nil
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q is neither a section nor KEY=VALUE in one", path, i+1, line)
			}
			u[section] = append(u[section], [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	return u
}

func TestDeploySystemdUnit(t *testing.T) {
	u := readUnit(t, "shardq.service")
	for _, s := range []string{"Unit", "Service", "Install"} {
		if _, ok := u[s]; !ok {
			t.Errorf("no [%s] section", s)
		}
	}
	start := u.values("Service", "ExecStart")
	if len(start) != 1 {
		t.Fatalf("ExecStart %v: want one", start)
	}
	args := strings.Fields(start[0])
	env := map[string]string{}
	for _, e := range u.values("Service", "Environment") {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	// The unit listens on every address: it starts with the users file
	// and the token file its comment has the operator make, not without.
	if _, err := config.Load(args[2:], func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "listen.http:") {
		t.Errorf("the unit without its token: %v, want a refusal naming listen.http", err)
	}
	if ef := u.values("Service", "EnvironmentFile"); len(ef) != 1 || strings.HasPrefix(ef[0], "-") {
		t.Errorf("EnvironmentFile=%v: want one, required (it holds the token)", ef)
	}
	if r := u.values("Service", "ExecReload"); len(r) != 1 || !strings.Contains(r[0], "-HUP $MAINPID") {
		t.Errorf("ExecReload=%v: want SIGHUP, which reloads users, ACL and certificates", r)
	}
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("# shardq passwd alice > users\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	installed := maps(env, map[string]string{"SHARDQ_USERS_FILE": users, "SHARDQ_ADMIN_TOKEN": "t"})
	cfg := loadConfig(t, args[1:], installed)
	if cfg.AnonymousAllowed() || config.Loopback(cfg.MQTT) {
		t.Errorf("the unit serves %s with anonymous clients %v: want every address, users only", cfg.MQTT, cfg.AnonymousAllowed())
	}

	hardening := map[string]string{
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectKernelModules":    "yes",
		"ProtectControlGroups":    "yes",
		"RestrictNamespaces":      "yes",
		"RestrictSUIDSGID":        "yes",
		"LockPersonality":         "yes",
		"MemoryDenyWriteExecute":  "yes",
		"CapabilityBoundingSet":   "",
		"SystemCallArchitectures": "native",
	}
	for k, want := range hardening {
		if got := u.values("Service", k); len(got) != 1 || got[0] != want {
			t.Errorf("%s=%v, want %q", k, got, want)
		}
	}
	// The data directory is the one place it may write.
	if rw := u.values("Service", "ReadWritePaths"); len(rw) != 1 || rw[0] != cfg.DataDir {
		t.Errorf("ReadWritePaths=%v, want the data dir %s", rw, cfg.DataDir)
	}
	if sd := u.values("Service", "StateDirectory"); len(sd) != 1 || "/var/lib/"+sd[0] != cfg.DataDir {
		t.Errorf("StateDirectory=%v: want it to make the data dir %s", sd, cfg.DataDir)
	}
	// The drain of a shutdown (30 s) fits before systemd's SIGKILL.
	ts := u.values("Service", "TimeoutStopSec")
	if len(ts) != 1 {
		t.Errorf("TimeoutStopSec=%v: want one", ts)
	} else if d, err := time.ParseDuration(ts[0]); err != nil || d <= 30*time.Second {
		t.Errorf("TimeoutStopSec=%s: want more than the 30 s of a drain", ts[0])
	}

	// systemd's own check, where systemd is installed (Debian's systemd
	// package): the unit with ExecStart pointing at a real binary.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("systemd-analyze not found (Debian package systemd): the unit is checked by the parse above only")
		return
	}
	data, err := os.ReadFile("shardq.service")
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "shardq.service")
	text := strings.Replace(string(data), "ExecStart="+args[0], "ExecStart="+shardqBinary(t), 1)
	if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	// verify exits 0 on unknown keys and bad values; it says so, though.
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// loadConfig returns the configuration of `shardq ARGS` in the
// environment env, failing the test unless shardq would start with it.
func loadConfig(t *testing.T, args []string, env map[string]string) *config.Config {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("command %v: want shardq serve", args)
	}
	cfg, err := config.Load(args[1:], func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("shardq %s with %v: %v", strings.Join(args, " "), env, err)
	}
	return cfg
}

// maps returns the union of ms, the later ones winning.
func maps(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestMain(m *testing.M) { testbin.Main(m) }

// shardqBinary builds the shardq command once per test run.
func shardqBinary(t *testing.T) string {
	t.Helper()
	return testbin.Shardq(t, false)
}
