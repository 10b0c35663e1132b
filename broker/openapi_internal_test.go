package broker

import (
	"context"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"gopkg.in/yaml.v3"

	"github.com/shardq/shardq/cluster"
	"github.com/shardq/shardq/queue"
)

// openAPI is the part of docs/openapi.yaml the test reads.
type openAPI struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

// TestOpenAPI: docs/openapi.yaml is a valid OpenAPI 3.1 document that
// names every route of the admin API with
// its methods, and no other; each schema it gives for a type of the API
// has exactly the JSON fields the node writes.
func TestOpenAPI(t *testing.T) {
	data, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if err := spec.Validate(context.Background()); err != nil {
		t.Fatalf("docs/openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	served := map[string]bool{}
	for _, r := range (&adminAPI{}).routes() {
		for method := range r.methods {
			served[strings.ToLower(method)+" "+r.path] = true
			if _, ok := doc.Paths[r.path][strings.ToLower(method)]; !ok {
				t.Errorf("docs/openapi.yaml has no %s %s", method, r.path)
			}
		}
	}
	for path, ops := range doc.Paths {
		for op := range ops {
			if op == "parameters" {
				continue
			}
			if !served[op+" "+path] {
				t.Errorf("docs/openapi.yaml has %s %s, which the node does not serve", strings.ToUpper(op), path)
			}
		}
	}

	types := map[string]any{
		"QueueList": QueueList{}, "QueueView": QueueView{}, "PartitionView": PartitionView{}, "GroupView": GroupView{},
		"GroupPartitionView": GroupPartitionView{}, "CountsView": CountsView{}, "RatesView": RatesView{}, "Settings": Settings{},
		"MessageList": MessageList{}, "MessageView": MessageView{}, "Property": Property{}, "DeadLetterView": DeadLetterView{},
		"PurgeResult": PurgeResult{}, "QueueDeleted": QueueDeleted{}, "GroupDeleted": GroupDeleted{},
		"SeekRequest": SeekRequest{}, "SeekResult": SeekResult{}, "SoughtPartition": queue.SoughtPartition{},
		"ReplayRequest": ReplayRequest{}, "ReplayResult": ReplayResult{}, "ReplayedLetter": ReplayedLetter{},
		"History": History{}, "HistorySample": HistorySample{}, "ClientList": ClientList{}, "ClientView": ClientView{},
		"SubscriptionView": SubscriptionView{}, "ConsumerView": ConsumerView{}, "ClientDisconnected": ClientDisconnected{},
		"RetainedList": RetainedList{}, "RetainedView": RetainedView{},
		"ClusterView": ClusterView{}, "NodeStatus": cluster.NodeStatus{}, "PartitionStatus": cluster.PartitionStatus{},
		"DrainView": DrainView{}, "PlacementView": PlacementView{}, "PlacementRuleView": PlacementRuleView{}, "Error": Error{},
	}
	for name, v := range types {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("docs/openapi.yaml has no schema %s", name)
			continue
		}
		var documented []string
		for p := range s.Properties {
			documented = append(documented, p)
		}
		slices.Sort(documented)
		if fields := jsonFields(reflect.TypeOf(v)); !slices.Equal(documented, fields) {
			t.Errorf("schema %s has %v; the node writes %v", name, documented, fields)
		}
	}
	for name := range doc.Components.Schemas {
		if _, ok := types[name]; !ok {
			t.Errorf("schema %s is of no type the test knows: add it to the test", name)
		}
	}
}

// jsonFields returns the JSON names of t's fields, those of embedded
// structs included, sorted.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
