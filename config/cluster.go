package config

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/auth"
)

// PlacementFor returns the ids of the nodes that may own the partitions of
// queue: the nodes of the first cluster.placement rule whose pattern
// matches it, or nil when none does (any node may).
func (c *Config) PlacementFor(queue string) []string {
	for _, r := range c.Cluster.Placement {
		if ok, _ := path.Match(r.Queues, queue); ok && r.Queues != "" {
			return r.Nodes
		}
	}
	return nil
}

// validateCluster checks the cluster settings of a clustered node; a
// single node ignores them.
func (c *Config) validateCluster(fail func(path, reason string, err error)) {
	if !c.Clustered() {
		return
	}
	cl := c.Cluster
	if reason := checkAddr(cl.Addr); reason != "" {
		fail("cluster.addr", reason, nil)
	}
	if cl.Advertise != "" {
		if reason := checkAddr(cl.Advertise); reason != "" {
			fail("cluster.advertise", reason, nil)
		}
	}
	if cl.Addr != "" && checkAddr(cl.Addr) == "" && !Loopback(cl.Addr) && cl.TLS.Cert == "" && !cl.AllowInsecure {
		fail("cluster.addr", fmt.Sprintf("%q is not a loopback address: the links between nodes carry every message, and peers' calls "+
			"need proving who makes them; set cluster.tls (mutual TLS, see the README), or cluster.allow_insecure: true on a network "+
			"you trust (with cluster.token to authenticate the calls)", cl.Addr), nil)
	}
	if cl.ReplaceAfter < time.Second {
		fail("cluster.replace_after", fmt.Sprintf("must be at least 1s, got %s", cl.ReplaceAfter), nil)
	}
	if cl.MaxMoves < 1 || cl.MaxMoves > 1000 {
		fail("cluster.max_moves", fmt.Sprintf("must be from 1 to 1000, got %d", cl.MaxMoves), nil)
	}
	if cl.RaftLogKeep < 10 {
		fail("cluster.raft_log_keep", fmt.Sprintf("must be at least 10, got %d", cl.RaftLogKeep), nil)
	}
	if d := cl.LeaseTTL; d < MinLeaseTTL || d > MaxLeaseTTL {
		fail("cluster.lease_ttl", fmt.Sprintf("must be from %s to %s, got %s", MinLeaseTTL, MaxLeaseTTL, d), nil)
	}

	e := cl.Etcd
	for _, ep := range e.Endpoints {
		u, err := url.Parse(ep)
		switch {
		case err != nil:
			fail("cluster.etcd.endpoints", fmt.Sprintf("must be http:// or https:// URLs, got %q", ep), err)
		case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			fail("cluster.etcd.endpoints", fmt.Sprintf("must be http:// or https:// URLs, got %q", ep), nil)
		}
	}
	if d := e.DialTimeout; d <= 0 {
		fail("cluster.etcd.dial_timeout", fmt.Sprintf("must be positive, got %s", d), nil)
	}
	if p := e.Prefix; !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") {
		fail("cluster.etcd.prefix", fmt.Sprintf("must start and end with /, got %q", p), nil)
	}
	if e.CA != "" {
		if _, err := LoadCertPool(e.CA); err != nil {
			fail("cluster.etcd.ca", err.Error(), err)
		}
	}
	switch {
	case (e.Cert == "") != (e.Key == ""):
		fail("cluster.etcd.cert", "set both cluster.etcd.cert and cluster.etcd.key, or neither", nil)
	case e.Cert != "":
		if _, err := tls.LoadX509KeyPair(e.Cert, e.Key); err != nil {
			fail("cluster.etcd.cert", "cannot load the certificate and key: "+err.Error(), err)
		}
	}

	switch ct := cl.TLS; {
	case ct == (ClusterTLS{}):
	case ct.Cert == "" || ct.Key == "" || ct.CA == "":
		fail("cluster.tls", "set cert, key and ca together, or none of them", nil)
	default:
		if _, err := tls.LoadX509KeyPair(ct.Cert, ct.Key); err != nil {
			fail("cluster.tls.cert", "cannot load the certificate and key: "+err.Error(), err)
		}
		if _, err := LoadCertPool(ct.CA); err != nil {
			fail("cluster.tls.ca", err.Error(), err)
		}
	}

	for i, r := range cl.Placement {
		rpath := fmt.Sprintf("cluster.placement[%d]", i)
		switch {
		case r.Queues != "" && len(r.Tenants) > 0:
			fail(rpath+".tenants", "a rule names queues or tenants, not both: split it in two", nil)
		case len(r.Tenants) > 0:
			for _, name := range r.Tenants {
				if err := auth.ValidUsername(name); err != nil {
					fail(rpath+".tenants", fmt.Sprintf("must be usernames: %v", err), nil)
				}
			}
		case r.Queues == "":
			fail(rpath+".queues", "must be a pattern of queue names (path.Match), such as orders-*, or give tenants instead", nil)
		}
		if _, err := path.Match(r.Queues, ""); err != nil {
			fail(rpath+".queues", fmt.Sprintf("must be a pattern of queue names (path.Match), got %q", r.Queues), err)
		}
		if len(r.Nodes) == 0 {
			fail(rpath+".nodes", "must list at least one node id", nil)
		}
		for j, id := range r.Nodes {
			switch {
			case !validName(id):
				fail(rpath+".nodes", fmt.Sprintf("node ids must be 1 to 128 characters of A-Z a-z 0-9 _ . -, got %q", id), nil)
			case slices.Contains(r.Nodes[:j], id):
				fail(rpath+".nodes", fmt.Sprintf("lists %q twice", id), nil)
			}
		}
	}

	// A replication factor that the placement of a queue cannot hold.
	for i, r := range cl.Placement {
		if rf := c.Queues.Defaults.ReplicationFactor; rf > len(r.Nodes) {
			what := r.Queues
			if len(r.Tenants) > 0 {
				what = "tenants " + strings.Join(r.Tenants, ",")
			}
			fail("queues.defaults.replication_factor", fmt.Sprintf("is %d, more than the %d nodes cluster.placement[%d] (%s) allows its queues", rf, len(r.Nodes), i, what), nil)
		}
	}
	for name, o := range c.Queues.Declared {
		nodes := c.PlacementFor(name)
		if nodes != nil && o.ReplicationFactor > len(nodes) {
			fail("queues.declared."+name+".replication_factor", fmt.Sprintf("is %d, more than the %d nodes cluster.placement allows the queue (%s)", o.ReplicationFactor, len(nodes), strings.Join(nodes, ", ")), nil)
		}
	}
}
