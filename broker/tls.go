package broker

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"

	"github.com/shardq/shardq/config"
)

// certStore holds a listener's certificate and the CAs of its clients'
// certificates, read from files; reload replaces them for the handshakes
// that follow, without touching the connections already made.
type certStore struct {
	state atomic.Pointer[certState]
}

type certState struct {
	cert       tls.Certificate
	clientCAs  *x509.CertPool
	clientAuth tls.ClientAuthType
}

// tlsFiles names the files of a certificate store.
type tlsFiles struct {
	cert, key, clientCA string
	require             bool
}

func mqttTLSFiles(c *config.Config) tlsFiles {
	t := c.Protocol.TLS
	return tlsFiles{cert: t.Cert, key: t.Key, clientCA: t.ClientCA, require: t.RequireClientCert}
}

func httpTLSFiles(c *config.Config) tlsFiles {
	return tlsFiles{cert: c.Admin.TLS.Cert, key: c.Admin.TLS.Key}
}

// readCerts reads the files of f.
func readCerts(f tlsFiles) (*certState, error) {
	cert, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("broker: loading %s and %s: %w", f.cert, f.key, err)
	}
	s := &certState{cert: cert, clientAuth: tls.NoClientCert}
	if f.clientCA != "" {
		if s.clientCAs, err = config.LoadCertPool(f.clientCA); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
		s.clientAuth = tls.VerifyClientCertIfGiven
		if f.require {
			s.clientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return s, nil
}

func newCertStore(f tlsFiles) (*certStore, error) {
	s, err := readCerts(f)
	if err != nil {
		return nil, err
	}
	cs := &certStore{}
	cs.state.Store(s)
	return cs, nil
}

// config returns the TLS configuration of a listener: each handshake takes
// the store's current certificate and client CAs.
func (cs *certStore) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s := cs.state.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{s.cert},
				ClientCAs:    s.clientCAs,
				ClientAuth:   s.clientAuth,
			}, nil
		},
	}
}
