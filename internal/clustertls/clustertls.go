// Package clustertls is the TLS between a cluster's API replicas and its
// nodes: every one holds a certificate from the cluster's own CA, and
// both ends of every connection check the other's against it.
//
// A process reads its identity from one directory, laid out as a
// Kubernetes TLS Secret (and cert-manager's) is: ca.crt, the cluster CA;
// tls.crt and tls.key, its own certificate and key. A certificate's role
// is the DNS name it carries: RoleNode for node agents, RoleServer for
// API replicas. A client checks the server's certificate for the role it
// calls (not the address it dials, which the store records), and a server
// takes only clients whose certificate the CA signed; what each role may
// ask is for the handler to say (PeerRole).
package clustertls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// The roles, as the DNS names their certificates carry.
const (
	RoleNode   = "airlock-node"
	RoleServer = "airlock-server"
)

// The files of a directory.
const (
	CAFile   = "ca.crt"
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Identity is a process's cluster TLS: its certificate and the CA.
type Identity struct {
	cert tls.Certificate
	pool *x509.CertPool
	// Role is what the certificate says this process is.
	Role string
}

// Load reads dir's ca.crt, tls.crt and tls.key, and checks that the CA
// signed the certificate and that it carries role.
func Load(dir, role string) (*Identity, error) {
	fail := func(err error) (*Identity, error) {
		return nil, fmt.Errorf("cluster TLS in %s: %w (`airlock cluster-certs DIR` makes a CA and a certificate for each role): %w",
			dir, err, errdefs.ErrInvalid)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return fail(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fail(fmt.Errorf("%s holds no PEM certificate", CAFile))
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return fail(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fail(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: role,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fail(fmt.Errorf("%s is not a certificate of the CA in %s for %s: %v", CertFile, CAFile, role, err))
	}
	return &Identity{cert: cert, pool: pool, Role: role}, nil
}

// ServerConfig is the TLS a listener of this process serves: its
// certificate, and only clients with one from the CA.
func (id *Identity) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		ClientCAs:    id.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// ClientConfig is the TLS this process calls a peer of role with: its
// certificate, and the peer's checked against the CA and for role.
func (id *Identity) ClientConfig(role string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		RootCAs:      id.pool,
		ServerName:   role,
	}
}

// Transport is an HTTP transport that calls peers of role with
// ClientConfig and no proxy.
func (id *Identity) Transport(role string) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     id.ClientConfig(role),
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
}

// PeerRole returns the role the verified client certificate of r
// carries, "" if none (not TLS, or a certificate for no role).
func PeerRole(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return ""
	}
	leaf := r.TLS.VerifiedChains[0][0]
	for _, role := range []string{RoleServer, RoleNode} {
		if slices.Contains(leaf.DNSNames, role) {
			return role
		}
	}
	return ""
}

// Generate writes a new cluster CA to dir (ca.crt, ca.key) and a
// certificate for each role under dir/node and dir/server, each with
// ca.crt, tls.crt and tls.key, valid for years. It refuses a dir that
// already holds a CA.
func Generate(dir string, validity time.Duration) error {
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		return fmt.Errorf("%s already holds a cluster CA (ca.key): certificates of a new one would not be trusted by the old: %w", dir, errdefs.ErrConflict)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "airlock cluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, CAFile), "CERTIFICATE", caDER, 0o644); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return err
	}
	for sub, role := range map[string]string{"node": RoleNode, "server": RoleServer} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: role},
			DNSNames:     []string{role},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		d := filepath.Join(dir, sub)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(d, CAFile), "CERTIFICATE", caDER, 0o644); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(d, CertFile), "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		if err := writeKey(filepath.Join(d, KeyFile), key); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}
