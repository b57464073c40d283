package mitm

import (
	"bytes"
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const (
	// caValidity is how long a new CA certificate is valid.
	caValidity = 10 * 365 * 24 * time.Hour
	// leafValidity is how long a leaf certificate is valid after it is made.
	leafValidity = 7 * 24 * time.Hour
	// backdate is how far before now certificates start, to absorb clock skew
	// between the host and the guest.
	backdate = time.Hour
	// leafRenewBefore is how long before its NotAfter a cached leaf is re-made.
	leafRenewBefore = 24 * time.Hour
	// maxLeaves bounds the leaf cache; the oldest entry goes first.
	maxLeaves = 1000

	// File names inside the directory given to LoadOrCreateCA.
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
)

// CA is one sandbox's certificate authority: an ECDSA P-256 key that never leaves the host and a
// self-signed CA certificate the guest trusts. Leaf certificates per host are made on demand and cached
// (at most 1000; the oldest dropped), valid from 1h ago for 7 days (re-made when near expiry).
//
// A CA is safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	now     func() time.Time // the clock; time.Now except in tests

	mu     sync.Mutex               // guards leaves and order
	leaves map[string]*list.Element // host -> element of order holding a *leaf
	order  *list.List               // of *leaf, oldest first
}

// leaf is one cached leaf certificate.
type leaf struct {
	host string
	cert *tls.Certificate
}

// NewCA makes a fresh CA whose certificate is named commonName. The certificate is valid for 10 years,
// may sign only leaf certificates (MaxPathLen 0) and has KeyUsageCertSign.
func NewCA(commonName string) (*CA, error) {
	if commonName == "" {
		return nil, fmt.Errorf("new ca: empty common name: %w", errdefs.ErrInvalid)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new ca: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("new ca: create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new ca: parse certificate: %w", err)
	}
	return newCA(cert, key), nil
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey) *CA {
	return &CA{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		now:     time.Now,
		leaves:  make(map[string]*list.Element),
		order:   list.New(),
	}
}

// LoadOrCreateCA reads ca.crt and ca.key (PEM) from dir, or creates and writes them (key 0600, cert 0644,
// written atomically: temp file + rename). A corrupt pair is an error, not silently replaced.
//
// dir is created (0700) if missing. A loaded certificate keeps its own name; commonName is used only
// when creating. The key is written before the certificate, so a crash between the two leaves a key
// without a certificate, which no guest can trust yet: that state is replaced by a new pair. A
// certificate without its key, a key that does not match the certificate, a certificate that is not
// a CA or has expired are errors.
func LoadOrCreateCA(dir, commonName string) (*CA, error) {
	certPath := filepath.Join(dir, caCertFile)
	keyPath := filepath.Join(dir, caKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := os.ReadFile(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		ca, err := parseCA(certPEM, keyPEM, time.Now())
		if err != nil {
			return nil, fmt.Errorf("load ca from %s: %w", dir, err)
		}
		return ca, nil
	case certErr == nil && errors.Is(keyErr, fs.ErrNotExist):
		return nil, fmt.Errorf("load ca from %s: %s exists without %s", dir, caCertFile, caKeyFile)
	case errors.Is(certErr, fs.ErrNotExist) && (keyErr == nil || errors.Is(keyErr, fs.ErrNotExist)):
		// Nothing a guest could trust exists yet: make a new pair.
	case certErr != nil && !errors.Is(certErr, fs.ErrNotExist):
		return nil, fmt.Errorf("load ca: %w", certErr)
	default:
		return nil, fmt.Errorf("load ca: %w", keyErr)
	}

	ca, err := NewCA(commonName)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("create ca in %s: marshal key: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := atomicfile.WriteBytes(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	if err := atomicfile.WriteBytes(certPath, ca.certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	return ca, nil
}

// parseCA checks and assembles a CA from its PEM files as LoadOrCreateCA describes.
func parseCA(certPEM, keyPEM []byte, now time.Time) (*CA, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no CERTIFICATE block", caCertFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caCertFile, err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, fmt.Errorf("%s: not a CA certificate", caCertFile)
	}
	if now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%s: expired at %s", caCertFile, cert.NotAfter.Format(time.RFC3339))
	}

	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", caKeyFile)
	}
	var key *ecdsa.PrivateKey
	switch block.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caKeyFile, err)
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s: %T is not an ECDSA key", caKeyFile, k)
		}
		key = ek
	case "EC PRIVATE KEY":
		if key, err = x509.ParseECPrivateKey(block.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", caKeyFile, err)
		}
	default:
		return nil, fmt.Errorf("%s: unexpected PEM block %q", caKeyFile, block.Type)
	}
	if key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%s: curve %s, want P-256", caKeyFile, key.Curve.Params().Name)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", caKeyFile, caCertFile)
	}
	return newCA(cert, key), nil
}

// CertPEM returns the CA certificate in PEM form, for the guest's trust store. The caller owns the slice.
func (c *CA) CertPEM() []byte {
	return bytes.Clone(c.certPEM)
}

// Leaf returns a certificate for host (a DNS name or an IP address; case and a trailing dot are
// ignored) signed by the CA, from the cache when one is there and not near expiry.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	name := normalizeHost(host)
	if !validLeafName(name) {
		return nil, fmt.Errorf("leaf certificate for %q: invalid host name: %w", host, errdefs.ErrInvalid)
	}
	now := c.now()

	// Signing under the lock keeps one certificate per host; it takes well under a millisecond.
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.leaves[name]; ok {
		l := e.Value.(*leaf)
		if now.Before(l.cert.Leaf.NotAfter.Add(-leafRenewBefore)) {
			return l.cert, nil
		}
		c.order.Remove(e)
		delete(c.leaves, name)
	}
	cert, err := c.makeLeaf(name, now)
	if err != nil {
		return nil, fmt.Errorf("leaf certificate for %s: %w", name, err)
	}
	for c.order.Len() >= maxLeaves {
		oldest := c.order.Front()
		c.order.Remove(oldest)
		delete(c.leaves, oldest.Value.(*leaf).host)
	}
	c.leaves[name] = c.order.PushBack(&leaf{host: name, cert: cert})
	return cert, nil
}

// makeLeaf signs a new server certificate for name.
func (c *CA) makeLeaf(name string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	// Clients match the SAN; a common name is only set where it fits (RFC 5280: at most 64).
	if len(name) <= 64 {
		tmpl.Subject.CommonName = name
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: parsed}, nil
}

// validLeafName reports whether name (normalised) may go into a leaf: an IP address, or a DNS name of
// letters, digits, '-', '_' and non-empty dot-separated labels. Wildcards are refused.
func validLeafName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	if net.ParseIP(name) != nil {
		return true
	}
	label := 0
	for i := 0; i < len(name); i++ {
		switch b := name[i]; {
		case b == '.':
			if label == 0 {
				return false
			}
			label = 0
		case b >= 'a' && b <= 'z', b >= '0' && b <= '9', b == '-', b == '_':
			label++
			if label > 63 {
				return false
			}
		default:
			return false
		}
	}
	return label > 0
}

// randomSerial returns a random positive 128-bit certificate serial number.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
