package broker

import (
	"os"
	"reflect"
	"slices"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestOpenAPIMessages: the bodies and answers of publishing and finding
// messages, which docs/openapi.yaml writes out in components.requestBodies
// and components.responses, have exactly the JSON fields of their types,
// as TestOpenAPI checks components.schemas.
func TestOpenAPIMessages(t *testing.T) {
	data, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			RequestBodies map[string]content `yaml:"requestBodies"`
			Responses     map[string]content `yaml:"responses"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	search := doc.Components.Responses["Messages"].schema()
	for _, tc := range []struct {
		name   string
		schema schema
		v      any
	}{
		{"requestBodies.Publish", doc.Components.RequestBodies["Publish"].schema(), PublishRequest{}},
		{"responses.Published", doc.Components.Responses["Published"].schema(), Published{}},
		{"responses.Messages (a search)", search.oneOf(1), MessageSearch{}},
	} {
		var documented []string
		for p := range tc.schema.Properties {
			documented = append(documented, p)
		}
		slices.Sort(documented)
		if fields := jsonFields(reflect.TypeOf(tc.v)); !slices.Equal(documented, fields) {
			t.Errorf("%s has %v; the node takes or writes %v", tc.name, documented, fields)
		}
	}
	if ref := search.oneOf(0).Ref; ref != "#/components/schemas/MessageList" {
		t.Errorf("responses.Messages: a peek answers %q, want the MessageList", ref)
	}
}

// content is a request body or a response of an OpenAPI document.
type content struct {
	Content map[string]struct {
		Schema schema `yaml:"schema"`
	} `yaml:"content"`
}

func (c content) schema() schema { return c.Content["application/json"].Schema }

type schema struct {
	Ref        string         `yaml:"$ref"`
	OneOf      []schema       `yaml:"oneOf"`
	Properties map[string]any `yaml:"properties"`
}

func (s schema) oneOf(i int) schema {
	if i < len(s.OneOf) {
		return s.OneOf[i]
	}
	return schema{}
}
