package cluster

import (
	"net/url"
	"slices"
	"testing"
)

func interestKey(node, filter string) string { return node + "/" + url.PathEscape(filter) }

func matched(t *interest, topic string) (nodes []string, groups map[string][]string) {
	var m matches
	t.match(topic, &m)
	for id := range m.nodes {
		nodes = append(nodes, id)
	}
	slices.Sort(nodes)
	groups = map[string][]string{}
	for g, ids := range m.groups {
		for id := range ids {
			groups[g] = append(groups[g], id)
		}
		slices.Sort(groups[g])
	}
	return nodes, groups
}

func TestInterestMatch(t *testing.T) {
	var x interest
	for _, k := range [][2]string{
		{"a", "s/1/t"}, {"b", "s/+/t"}, {"c", "s/#"}, {"d", "#"}, {"e", "+/1/+"},
		{"a", "$share/g/s/+/t"}, {"b", "$share/g/s/+/t"}, {"c", "$SHARE/h/s/1/#"},
		{"f", "$SYS/#"}, {"a", "x//y"},
	} {
		x.apply(interestKey(k[0], k[1]), true)
	}
	cases := []struct {
		topic  string
		nodes  []string
		groups map[string][]string
	}{
		{"s/1/t", []string{"a", "b", "c", "d", "e"}, map[string][]string{"$share/g/s/+/t": {"a", "b"}, "$SHARE/h/s/1/#": {"c"}}},
		{"s/2/t", []string{"b", "c", "d"}, map[string][]string{"$share/g/s/+/t": {"a", "b"}}},
		{"s", []string{"c", "d"}, map[string][]string{}},
		{"s/1", []string{"c", "d"}, map[string][]string{"$SHARE/h/s/1/#": {"c"}}},
		{"q", []string{"d"}, map[string][]string{}},
		{"$SYS/x", []string{"f"}, map[string][]string{}}, // no top-level wildcard matches $ topics
		{"x//y", []string{"a", "d"}, map[string][]string{}},
	}
	for _, c := range cases {
		nodes, groups := matched(&x, c.topic)
		if !slices.Equal(nodes, c.nodes) {
			t.Errorf("%s: nodes %v, want %v", c.topic, nodes, c.nodes)
		}
		if len(groups) != len(c.groups) {
			t.Errorf("%s: groups %v, want %v", c.topic, groups, c.groups)
		}
		for g, ids := range c.groups {
			if !slices.Equal(groups[g], ids) {
				t.Errorf("%s: group %s has %v, want %v", c.topic, g, groups[g], ids)
			}
		}
	}

	// Removing every key leaves an empty index.
	x.apply(interestKey("b", "$share/g/s/+/t"), false)
	if _, groups := matched(&x, "s/3/t"); !slices.Equal(groups["$share/g/s/+/t"], []string{"a"}) {
		t.Errorf("after b left g: %v", groups)
	}
	for _, k := range [][2]string{
		{"a", "s/1/t"}, {"b", "s/+/t"}, {"c", "s/#"}, {"d", "#"}, {"e", "+/1/+"},
		{"a", "$share/g/s/+/t"}, {"c", "$SHARE/h/s/1/#"}, {"f", "$SYS/#"}, {"a", "x//y"},
		{"z", "never/added"},
	} {
		x.apply(interestKey(k[0], k[1]), false)
	}
	if !x.root.empty() {
		t.Errorf("index not empty after every removal: %+v", x.root.children)
	}
}
