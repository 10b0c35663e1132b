package netfault

import (
	"net/netip"
	"slices"
	"testing"
)

func TestNetfaultUsedPrefixes(t *testing.T) {
	routes := `default via 192.0.2.1 dev eth0
10.77.3.0/24 dev snf12-1 proto kernel scope link src 10.77.3.1
local 10.77.3.1 dev snf12-1 table local proto kernel scope host src 10.77.3.1
broadcast 10.77.3.255 dev snf12-1 table local proto kernel scope link src 10.77.3.1
unreachable 10.77.128.0/17
`
	addrs := `1: lo    inet 127.0.0.1/8 scope host lo\       valid_lft forever preferred_lft forever
9: snf12-2    inet 10.77.9.1/24 scope global snf12-2\       valid_lft forever preferred_lft forever
`
	var got []string
	for _, p := range usedPrefixes(routes, addrs) {
		got = append(got, p.String())
	}
	want := []string{"10.77.3.0/24", "10.77.3.1/32", "10.77.3.255/32", "10.77.128.0/17", "127.0.0.0/8", "10.77.9.0/24"}
	if !slices.Equal(got, want) {
		t.Errorf("usedPrefixes = %v, want %v", got, want)
	}
	free := netip.MustParsePrefix("10.77.4.0/24")
	for _, p := range usedPrefixes(routes, addrs) {
		if p.Overlaps(free) {
			t.Errorf("%v overlaps %v", p, free)
		}
	}
}
