package config

import (
	"fmt"

	"github.com/shardq/shardq/auth"
	"gopkg.in/yaml.v3"
)

// DefaultTenant names the entry of tenants that holds the limits of every
// tenant not named.
const DefaultTenant = "default"

// Tenant bounds what one tenant may make the node do, under tenants.NAME
// (a username) or tenants.default. A tenant is the MQTT username of a
// client (the certificate's common name with mqtt.tls.cn_as_username);
// clients without one are the tenant "". A named tenant's limits start
// from default's; 0 means no limit.
type Tenant struct {
	// MaxQueues bounds the queues the tenant's clients created (by a
	// publish or a subscription to a new name): one more is refused, PUBACK
	// or SUBACK 0x97.
	MaxQueues int `yaml:"max_queues"`
	// MaxBytes bounds the bytes stored in the tenant's queues (on this
	// node, in a cluster): past it the tenant's publishes to them get 0x97
	// (checked against figures refreshed every second).
	MaxBytes int64 `yaml:"max_bytes"`
	// PublishRate bounds the tenant's publishes to queues, in messages per
	// second over all its connections (on this node): a token bucket with
	// one second of burst. A publish past it gets 0x97, or with Throttle
	// waits for its turn (the client's next packets wait with it).
	PublishRate int  `yaml:"publish_rate"`
	Throttle    bool `yaml:"throttle"`
	// MaxConnections bounds the tenant's connected clients (on this node):
	// one more gets CONNACK 0x97 (0x03 for MQTT 3.1.1).
	MaxConnections int `yaml:"max_connections"`
}

// TenantLimits returns the limits of tenant user: its entry, else
// default's. ok is false when the config names no tenant at all.
func (c *Config) TenantLimits(user string) (t Tenant, ok bool) {
	if len(c.Tenants) == 0 {
		return Tenant{}, false
	}
	if t, named := c.Tenants[user]; named && user != "" {
		return t, true
	}
	return c.Tenants[DefaultTenant], true
}

// tenants decodes tenants: default first, then each named tenant from
// default's limits and the fields its entry sets.
func (d *decoder) tenants(n *yaml.Node, path string) error {
	pairs, err := d.pairs(n, path)
	if err != nil {
		return err
	}
	if d.c.Tenants == nil {
		d.c.Tenants = map[string]Tenant{}
	}
	var base Tenant
	for _, p := range pairs {
		if p.key.Value == DefaultTenant {
			tpath := join(path, p.key.Value)
			d.c.origin[tpath] = origin{file: d.file, line: p.key.Line}
			d.fail(d.section(d.tagged(&base))(p.value, tpath))
			d.c.Tenants[DefaultTenant] = base
		}
	}
	for _, p := range pairs {
		if p.key.Value == DefaultTenant {
			continue
		}
		tpath := join(path, p.key.Value)
		d.c.origin[tpath] = origin{file: d.file, line: p.key.Line}
		t := base
		d.fail(d.section(d.tagged(&t))(p.value, tpath))
		d.c.Tenants[p.key.Value] = t
	}
	return nil
}

// validateTenants checks each tenant's name and limits.
func (c *Config) validateTenants(fail func(key, msg string, err error)) {
	for name, t := range c.Tenants {
		key := "tenants." + name
		if name != DefaultTenant {
			if err := auth.ValidUsername(name); err != nil {
				fail(key, fmt.Sprintf("is not a username (%v); a tenant is named after its clients' username, or default for the rest", err), nil)
			}
		}
		for _, f := range []struct {
			name string
			n    int64
		}{{"max_queues", int64(t.MaxQueues)}, {"max_bytes", t.MaxBytes}, {"publish_rate", int64(t.PublishRate)}, {"max_connections", int64(t.MaxConnections)}} {
			if _, set := c.origin[key+"."+f.name]; name != DefaultTenant && !set {
				continue // default's, reported there
			}
			if f.n < 0 {
				fail(key+"."+f.name, fmt.Sprintf("must be 0 (no limit) or more, got %d", f.n), nil)
			}
		}
	}
}
