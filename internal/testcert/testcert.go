// Package testcert makes certificates for tests: a CA, server certificates
// for the loopback addresses and client certificates, written as PEM files
// into a directory (a t.TempDir()). ECDSA P-256 keys; every certificate is
// valid from an hour ago for a day.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority that signs the others.
type CA struct {
	Cert     *x509.Certificate
	Key      *ecdsa.PrivateKey
	CertFile string // its certificate, PEM
	Pool     *x509.CertPool
}

// Pair names the PEM files of a certificate and its key.
type Pair struct {
	CertFile, KeyFile string
}

// TLS returns the pair as a tls.Certificate.
func (p Pair) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var serial atomic.Int64

// NewCA makes a CA named name, its certificate written to dir/name.pem.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := template(name)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, Key: key, CertFile: filepath.Join(dir, name+".pem"), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Server makes a server certificate for 127.0.0.1, ::1 and localhost,
// written to dir/name.pem and dir/name-key.pem.
func (ca *CA) Server(t testing.TB, dir, name string) Pair {
	t.Helper()
	tmpl := template(name)
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return ca.sign(t, dir, name, tmpl)
}

// Peer makes a certificate for both ends of a link between two nodes:
// server and client use, for 127.0.0.1, ::1 and localhost.
func (ca *CA) Peer(t testing.TB, dir, name string) Pair {
	t.Helper()
	tmpl := template(name)
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return ca.sign(t, dir, name, tmpl)
}

// Client makes a client certificate whose Common Name is cn.
func (ca *CA) Client(t testing.TB, dir, cn string) Pair {
	t.Helper()
	tmpl := template(cn)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.sign(t, dir, "client-"+cn, tmpl)
}

func (ca *CA) sign(t testing.TB, dir, name string, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	p := Pair{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")}
	writePEM(t, p.CertFile, "CERTIFICATE", der)
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.KeyFile, "EC PRIVATE KEY", kd)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func template(cn string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
