package broker

import (
	"reflect"

	"github.com/shardq/shardq/config"
)

// Reload applies what may change while the node runs, from the
// configuration load returns (read again, on SIGHUP): the users file, the ACL, the
// admin token, whether anonymous clients may connect, and the TLS
// certificates and client CAs of the MQTT and HTTPS listeners, read from
// their files again. Connections stay up: the new users and rules apply
// to the CONNECTs, publishes and subscriptions that follow, the new
// certificates to the handshakes that follow. Everything is read first and
// swapped only if all of it is valid: a failed reload changes nothing.
// Other settings keep their values until the node restarts; Reload logs
// the ones that differ.
func (b *Broker) Reload(load func() (*config.Config, error)) error {
	cfg, err := load()
	if err == nil {
		err = b.reload(cfg)
	}
	if err != nil {
		b.sec.reloads.WithLabelValues("failed").Inc()
		b.log.Error("reload failed: nothing changed", "err", err)
		return err
	}
	b.sec.reloads.WithLabelValues("ok").Inc()
	return nil
}

func (b *Broker) reload(cfg *config.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	pol, err := newPolicy(cfg)
	if err != nil {
		return err
	}
	var mqttCerts, httpCerts *certState
	if b.mqttCerts != nil {
		if mqttCerts, err = readCerts(mqttTLSFiles(cfg)); err != nil {
			return err
		}
	}
	if b.httpCerts != nil {
		if httpCerts, err = readCerts(httpTLSFiles(cfg)); err != nil {
			return err
		}
	}
	if restart := b.needsRestart(cfg); len(restart) > 0 {
		b.log.Warn("reload: these settings changed and take effect at the next start", "settings", restart)
	}
	b.policy.Store(pol)
	if mqttCerts != nil {
		b.mqttCerts.state.Store(mqttCerts)
	}
	if httpCerts != nil {
		b.httpCerts.state.Store(httpCerts)
	}
	b.log.Info("reloaded users, ACL and certificates", "users", pol.users.Len(), "acl_rules", pol.acl.Len(),
		"anonymous", pol.anonymous, "mqtt_tls", mqttCerts != nil, "http_tls", httpCerts != nil)
	return nil
}

// needsRestart names the settings of cfg that differ from the running
// ones and that Reload cannot apply.
func (b *Broker) needsRestart(cfg *config.Config) []string {
	old := b.cfg
	var out []string
	for _, s := range []struct {
		name     string
		was, now any
	}{
		{"listen", []string{old.MQTT, old.MQTTS, old.WS, old.WSS, old.HTTP}, []string{cfg.MQTT, cfg.MQTTS, cfg.WS, cfg.WSS, cfg.HTTP}},
		{"node_id", old.NodeID, cfg.NodeID},
		{"data_dir", old.DataDir, cfg.DataDir},
		{"queues", []any{old.Queues.Defaults, old.Queues.AutoCreate, old.Queues.Declared, old.Queues.MaxDelay, old.Queues.DeclaredMaxDelay},
			[]any{cfg.Queues.Defaults, cfg.Queues.AutoCreate, cfg.Queues.Declared, cfg.Queues.MaxDelay, cfg.Queues.DeclaredMaxDelay}},
		{"storage", old.Storage, cfg.Storage},
		{"limits", old.Limits, cfg.Limits},
		{"mqtt.max_packet_size", old.EffectiveMaxPacketSize(), cfg.EffectiveMaxPacketSize()},
		{"mqtt.max_keep_alive", old.Protocol.MaxKeepAlive, cfg.Protocol.MaxKeepAlive},
		{"mqtt.deny_subscribe", old.Protocol.DenySubscribe, cfg.Protocol.DenySubscribe},
		{"http.metrics", old.Admin.Metrics, cfg.Admin.Metrics},
		{"log_level", old.LogLevel, cfg.LogLevel},
		{"mqtt.tls (a TLS listener added or removed)", b.mqttCerts != nil, cfg.MQTTS != "" || cfg.WSS != ""},
		{"http.tls (HTTPS turned on or off)", b.httpCerts != nil, cfg.Admin.TLS.Cert != ""},
	} {
		if !reflect.DeepEqual(s.was, s.now) {
			out = append(out, s.name)
		}
	}
	return out
}
