package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// manifests are the objects one rendering of the chart makes, decoded
// into their Kubernetes types.
type manifests struct {
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*serviceMonitor
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) the chart writes; decoding into it rejects
// any other field, as a misspelt one would be.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// decoder decodes the Kubernetes objects of client-go's scheme from YAML,
// refusing unknown and duplicate fields: what `kubectl apply
// --validate=strict` refuses.
var decoder = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	kjson.SerializerOptions{Yaml: true, Strict: true})

// decodeManifests decodes every document of the rendered templates
// (NOTES.txt and partials left out).
func decodeManifests(t *testing.T, rendered map[string]string) *manifests {
	t.Helper()
	m := &manifests{}
	names := map[string]string{} // kind/name: template
	for _, file := range sortedKeys(rendered) {
		if !strings.HasSuffix(file, ".yaml") {
			continue
		}
		for i, doc := range splitDocuments(rendered[file]) {
			where := fmt.Sprintf("%s (document %d)", file, i+1)
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Errorf("%s: %v\n%s", where, err, doc)
				continue
			}
			key := head.Kind + "/" + head.Metadata.Name
			if prev, ok := names[key]; ok {
				t.Errorf("%s: %s also made by %s", where, key, prev)
			}
			names[key] = where
			if head.APIVersion == "monitoring.coreos.com/v1" && head.Kind == "ServiceMonitor" {
				sm, err := decodeServiceMonitor(doc)
				if err != nil {
					t.Errorf("%s: %v\n%s", where, err, doc)
					continue
				}
				m.serviceMonitors = append(m.serviceMonitors, sm)
				continue
			}
			obj, _, err := decoder.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Errorf("%s: %v\n%s", where, err, doc)
				continue
			}
			switch o := obj.(type) {
			case *appsv1.StatefulSet:
				m.statefulSets = append(m.statefulSets, o)
			case *corev1.Service:
				m.services = append(m.services, o)
			case *corev1.ConfigMap:
				m.configMaps = append(m.configMaps, o)
			case *corev1.Secret:
				m.secrets = append(m.secrets, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			default:
				t.Errorf("%s: a %T, which this test does not check", where, obj)
			}
		}
	}
	return m
}

// splitDocuments returns the non-empty YAML documents of a template.
func splitDocuments(s string) []string {
	var docs []string
	for doc := range strings.SplitSeq("\n"+s, "\n---") {
		// What follows "---" on its line, such as a comment, belongs to no document.
		if i := strings.IndexByte(doc, '\n'); i >= 0 {
			doc = doc[i+1:]
		} else {
			doc = ""
		}
		blank := true
		for line := range strings.Lines(doc) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				blank = false
				break
			}
		}
		if !blank {
			docs = append(docs, doc)
		}
	}
	return docs
}

func decodeServiceMonitor(doc string) (*serviceMonitor, error) {
	data, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var sm serviceMonitor
	if err := dec.Decode(&sm); err != nil {
		return nil, err
	}
	for _, e := range sm.Spec.Endpoints {
		for _, d := range []string{e.Interval, e.ScrapeTimeout} {
			if _, err := time.ParseDuration(d); err != nil {
				return nil, fmt.Errorf("endpoint %q: %w", e.Port, err)
			}
		}
	}
	return &sm, nil
}

// statefulSet returns the StatefulSet whose pods have the component label.
func (m *manifests) statefulSet(t *testing.T, component string) *appsv1.StatefulSet {
	t.Helper()
	for _, s := range m.statefulSets {
		if s.Spec.Template.Labels["app.kubernetes.io/component"] == component {
			return s
		}
	}
	t.Fatalf("no StatefulSet of %s pods", component)
	return nil
}

// service returns the Service of that name, or nil.
func (m *manifests) service(name string) *corev1.Service {
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// secretValue returns the value of key in the rendered Secret name.
func (m *manifests) secretValue(name, key string) (string, bool) {
	for _, s := range m.secrets {
		if s.Name != name {
			continue
		}
		if v, ok := s.StringData[key]; ok {
			return v, true
		}
		if v, ok := s.Data[key]; ok {
			return string(v), true
		}
	}
	return "", false
}

// selects reports whether the selector matches the labels; an empty
// selector matches nothing here, as a Service's does.
func selects(sel map[string]string, podLabels map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(podLabels))
}

// containerPort returns the container port a Service's target port or a
// probe's port names, by name or number.
func containerPort(c corev1.Container, port intOrName) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if (port.name != "" && p.Name == port.name) || (port.name == "" && p.ContainerPort == port.number) {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

type intOrName struct {
	name   string
	number int32
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
