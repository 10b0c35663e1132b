package helm_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/shardq/shardq/config"
)

// A pod of a StatefulSet as the kubelet would run it, without running it:
// its environment and arguments resolved, its volumes written to a
// directory, so that shardq's own config loader can say whether the node
// starts and with what settings.

// image is what the shardq image (the repository's Dockerfile) gives a
// container: its entrypoint and environment.
type image struct {
	entrypoint []string
	env        map[string]string
}

// readImage reads the ENV and ENTRYPOINT of the Dockerfile's last stage.
func readImage(t *testing.T) image {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	img := image{env: map[string]string{}}
	for _, line := range lines {
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			img = image{env: map[string]string{}}
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("Dockerfile: ENV %q: want KEY=VALUE pairs", rest)
				}
				img.env[k] = v
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &img.entrypoint); err != nil {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: %v", rest, err)
			}
		}
	}
	if len(img.entrypoint) == 0 {
		t.Fatal("Dockerfile: no ENTRYPOINT in its last stage")
	}
	return img
}

// externalSecrets stand for the Secrets a user makes before installing,
// which the value sets name: key to value.
func externalSecrets(t *testing.T) map[string]map[string]string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, ca := selfSigned(t)
	return map[string]map[string]string{
		"mqtt-users":   {"htpasswd": "alice:" + string(hash) + "\n"},
		"shardq-admin": {"token": "admin-secret"},
		"shardq-peers": {"token": "cluster-secret"},
		"shardq-tls":   {"tls.crt": cert, "tls.key": key, "ca.crt": ca},
	}
}

// selfSigned returns a certificate, its key and its CA (itself), in PEM.
func selfSigned(t *testing.T) (cert, key, ca string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shardq"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	c := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return c, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})), c
}

// pod is one pod of a StatefulSet, resolved.
type pod struct {
	name   string
	labels map[string]string
	// root is the directory standing for the container's file system:
	// each volume is written under it at its mount path.
	root      string
	container corev1.Container
	// env is the container's environment, the image's included.
	env  map[string]string
	args []string // the command line, entrypoint first
	// writable are the mount paths of volumes the container may write.
	writable []string
}

// newPod resolves the pod of the StatefulSet with the ordinal: its
// environment (field and Secret references, $(VAR) expansion), its
// command line and its volumes, from the rendered objects and the
// external Secrets.
func newPod(t *testing.T, m *manifests, sts *appsv1.StatefulSet, ordinal int, img image, external map[string]map[string]string) *pod {
	t.Helper()
	spec := sts.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", sts.Name, len(spec.Containers))
	}
	c := spec.Containers[0]
	p := &pod{name: sts.Name + "-" + strconv.Itoa(ordinal), labels: sts.Spec.Template.Labels, root: t.TempDir(), container: c, env: map[string]string{}}
	secret := func(name, key string) string {
		if v, ok := m.secretValue(name, key); ok {
			return v
		}
		if v, ok := external[name][key]; ok {
			return v
		}
		t.Errorf("%s: Secret %s has no key %q (the chart does not make it and the test's cluster has none)", p.name, name, key)
		return ""
	}

	if c.Image == "" || len(c.Command) > 0 {
		t.Errorf("%s: image %q, command %q: want the image's entrypoint", p.name, c.Image, c.Command)
	}
	// $(VAR) names a variable of the container's env defined before it,
	// not one of the image's.
	defined := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			defined[e.Name] = expand(e.Value, defined)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				defined[e.Name] = p.name
			case "metadata.namespace":
				defined[e.Name] = namespace
			default:
				t.Errorf("%s: env %s from field %s, which this test does not know", p.name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			defined[e.Name] = secret(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		default:
			t.Errorf("%s: env %s from %+v, which this test does not know", p.name, e.Name, e.ValueFrom)
		}
	}
	for k, v := range img.env {
		p.env[k] = v
	}
	for k, v := range defined {
		p.env[k] = v
	}
	p.args = slices.Clone(img.entrypoint)
	for _, a := range c.Args {
		p.args = append(p.args, expand(a, defined))
	}

	configFiles := p.mount(t, m, sts, external)
	// Paths the container sees are under root here: in its arguments, its
	// environment and its config files (not in Secrets, which hold no
	// paths but might hold a string that looks like one).
	p.args = p.rebase(p.args)
	for k, v := range p.env {
		p.env[k] = p.rebase([]string{v})[0]
	}
	for _, path := range configFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		write(t, path, p.rebase([]string{string(data)})[0])
	}
	return p
}

// mount writes each volume the container mounts under root: the keys of
// ConfigMaps and Secrets as files, and notes which mounts are writable
// (claims and emptyDirs). It returns the files of ConfigMaps.
func (p *pod) mount(t *testing.T, m *manifests, sts *appsv1.StatefulSet, external map[string]map[string]string) (configFiles []string) {
	t.Helper()
	spec := sts.Spec.Template.Spec
	claims := map[string]bool{}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		claims[pvc.Name] = true
	}
	for _, vm := range p.container.VolumeMounts {
		dst := filepath.Join(p.root, vm.MountPath)
		files := map[string]string{} // path in the volume: content
		var vol *corev1.Volume
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == vm.Name {
				vol = &spec.Volumes[i]
			}
		}
		switch {
		case vol == nil && claims[vm.Name]:
			p.writable = append(p.writable, vm.MountPath)
		case vol == nil:
			t.Errorf("%s: volume mount %s names no volume nor claim template", p.name, vm.Name)
		case vol.EmptyDir != nil:
			p.writable = append(p.writable, vm.MountPath)
		case vol.ConfigMap != nil:
			var cm *corev1.ConfigMap
			for _, x := range m.configMaps {
				if x.Name == vol.ConfigMap.Name {
					cm = x
				}
			}
			if cm == nil {
				t.Errorf("%s: volume %s: no ConfigMap %s", p.name, vm.Name, vol.ConfigMap.Name)
				continue
			}
			files = project(t, cm.Data, vol.ConfigMap.Items)
		case vol.Secret != nil:
			items := map[string]string{}
			for _, x := range m.secrets {
				if x.Name == vol.Secret.SecretName {
					for k, v := range x.StringData {
						items[k] = v
					}
					for k, v := range x.Data {
						items[k] = string(v)
					}
				}
			}
			if len(items) == 0 {
				items = external[vol.Secret.SecretName]
			}
			if len(items) == 0 {
				t.Errorf("%s: volume %s: no Secret %s", p.name, vm.Name, vol.Secret.SecretName)
			}
			files = project(t, items, vol.Secret.Items)
		default:
			t.Errorf("%s: volume %s of a kind this test does not know", p.name, vm.Name)
		}
		if vm.SubPath != "" {
			content, ok := files[vm.SubPath]
			if !ok {
				t.Errorf("%s: mount %s: subPath %s is not in volume %s", p.name, vm.MountPath, vm.SubPath, vm.Name)
			}
			files = map[string]string{"": content}
		}
		for rel, content := range files {
			write(t, filepath.Join(dst, rel), content)
			if vol != nil && vol.ConfigMap != nil {
				configFiles = append(configFiles, filepath.Join(dst, rel))
			}
		}
		if len(files) == 0 {
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return configFiles
}

// load runs shardq's config loader on the pod's command line and
// environment, as `shardq serve` does when the pod starts.
func (p *pod) load(t *testing.T) *config.Config {
	t.Helper()
	if len(p.args) < 2 || filepath.Base(p.args[0]) != "shardq" || p.args[1] != "serve" {
		t.Fatalf("%s: command line %q: want shardq serve", p.name, p.args)
	}
	cfg, err := config.Load(p.args[2:], func(k string) string { return p.env[k] })
	if err != nil {
		t.Fatalf("%s: shardq refuses to start with %q:\n%v", p.name, p.args, err)
	}
	return cfg
}

// inRoot returns the path the container sees for a path under root.
func (p *pod) inRoot(path string) string {
	rel, err := filepath.Rel(p.root, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return path
	}
	return "/" + rel
}

// rebase puts the container's mount paths under root in each string,
// longest first so that /etc/shardq/users is not taken for /etc/shardq.
func (p *pod) rebase(ss []string) []string {
	mounts := make([]string, 0, len(p.container.VolumeMounts))
	for _, vm := range p.container.VolumeMounts {
		mounts = append(mounts, vm.MountPath)
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	out := make([]string, len(ss))
	for i, s := range ss {
		var b strings.Builder
	scan:
		for len(s) > 0 {
			for _, m := range mounts {
				if after, ok := strings.CutPrefix(s, m); ok && (after == "" || after[0] == '/' || !isPathByte(after[0])) {
					b.WriteString(filepath.Join(p.root, m))
					s = after
					continue scan
				}
			}
			c := s[0]
			b.WriteByte(c)
			s = s[1:]
			// Only a path's start is rebased, not its middle.
			for isPathByte(c) && len(s) > 0 && isPathByte(s[0]) {
				b.WriteByte(s[0])
				s = s[1:]
			}
		}
		out[i] = b.String()
	}
	return out
}

func isPathByte(c byte) bool {
	return c == '/' || c == '.' || c == '-' || c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// project returns the files a ConfigMap or Secret volume holds: every
// key, or the items' keys at their paths.
func project(t *testing.T, data map[string]string, items []corev1.KeyToPath) map[string]string {
	t.Helper()
	if len(items) == 0 {
		return data
	}
	files := map[string]string{}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			t.Errorf("volume item %s: no such key (keys: %v)", it.Key, sortedKeys(data))
		}
		files[it.Path] = v
	}
	return files
}

// expand replaces $(VAR) with the variable's value as the kubelet does:
// only variables defined before, $$ for a literal $.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			if end := strings.IndexByte(s[i:], ')'); end > 0 {
				if v, ok := env[s[i+2:i+end]]; ok {
					b.WriteString(v)
					i += end
					continue
				}
			}
			b.WriteByte('$')
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
