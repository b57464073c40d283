package mitm

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNewCA(t *testing.T) {
	ca, err := NewCA("airlock sandbox sbx123")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(ca.CertPEM())
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("CertPEM is not a PEM certificate: %q", ca.CertPEM())
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"is a CA", cert.IsCA && cert.BasicConstraintsValid},
		{"path length 0", cert.MaxPathLen == 0 && cert.MaxPathLenZero},
		{"key usage cert sign", cert.KeyUsage&x509.KeyUsageCertSign != 0},
		{"common name", cert.Subject.CommonName == "airlock sandbox sbx123"},
		{"valid now", time.Now().After(cert.NotBefore) && time.Now().Before(cert.NotAfter)},
		{"valid about 10 years", cert.NotAfter.Sub(cert.NotBefore) > 9*365*24*time.Hour},
		{"ECDSA P-256", cert.PublicKeyAlgorithm == x509.ECDSA},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("CA certificate: not %s", c.name)
		}
	}
	if _, err := NewCA(""); err == nil {
		t.Error("NewCA with an empty name succeeded")
	}
}

func TestLoadOrCreateCA(t *testing.T) {
	// other provides a key that does not belong to the pair under test.
	otherDir := t.TempDir()
	if _, err := LoadOrCreateCA(otherDir, "other"); err != nil {
		t.Fatal(err)
	}
	otherKey, err := os.ReadFile(filepath.Join(otherDir, caKeyFile))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		// spoil changes the created pair before the second load.
		spoil func(t *testing.T, dir string)
		// wantErr: the second load fails (and leaves the files as they were); else it succeeds.
		wantErr string
		// wantSame: the second load returns the first certificate.
		wantSame bool
	}{
		{name: "reloads the same pair", wantSame: true},
		{name: "corrupt key", wantErr: "ca.key", spoil: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, caKeyFile), "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n", 0o600)
		}},
		{name: "key not PEM", wantErr: "ca.key", spoil: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, caKeyFile), "garbage", 0o600)
		}},
		{name: "corrupt certificate", wantErr: "ca.crt", spoil: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, caCertFile), "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n", 0o644)
		}},
		{name: "truncated certificate", wantErr: "ca.crt", spoil: func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, caCertFile))
			write(t, filepath.Join(dir, caCertFile), string(b[:len(b)/2]), 0o644)
		}},
		{name: "key of another CA", wantErr: "does not match", spoil: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, caKeyFile), string(otherKey), 0o600)
		}},
		{name: "certificate without key", wantErr: "without", spoil: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, caKeyFile))
		}},
		{name: "key without certificate: a new pair", spoil: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, caCertFile))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sbx", "ca") // created on demand
			first, err := LoadOrCreateCA(dir, "airlock test")
			if err != nil {
				t.Fatal(err)
			}
			for file, mode := range map[string]os.FileMode{caKeyFile: 0o600, caCertFile: 0o644} {
				fi, err := os.Stat(filepath.Join(dir, file))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != mode {
					t.Errorf("%s mode %v, want %v", file, fi.Mode().Perm(), mode)
				}
			}
			onDisk, _ := os.ReadFile(filepath.Join(dir, caCertFile))
			if !bytes.Equal(onDisk, first.CertPEM()) {
				t.Error("ca.crt differs from CertPEM")
			}
			if tt.spoil != nil {
				tt.spoil(t, dir)
			}
			before := snapshot(t, dir)

			second, err := LoadOrCreateCA(dir, "airlock test")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one naming %q", err, tt.wantErr)
				}
				if after := snapshot(t, dir); after != before {
					t.Errorf("files changed after a failed load:\n%s\nwas\n%s", after, before)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if same := bytes.Equal(first.CertPEM(), second.CertPEM()); same != tt.wantSame {
				t.Errorf("same certificate = %v, want %v", same, tt.wantSame)
			}
			// The reloaded key signs leaves that the certificate on disk verifies.
			leaf, err := second.Leaf(testHost)
			if err != nil {
				t.Fatal(err)
			}
			diskPEM, _ := os.ReadFile(filepath.Join(dir, caCertFile))
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(diskPEM)
			if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: testHost, Roots: pool}); err != nil {
				t.Errorf("leaf from the loaded CA: %v", err)
			}
		})
	}
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// snapshot describes the files in dir, contents included.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		fmt.Fprintf(&b, "%s %x\n", e.Name(), data)
	}
	return b.String()
}

func TestLeaf(t *testing.T) {
	ca, err := NewCA("airlock test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	tests := []struct {
		name    string
		host    string
		verify  string // the name the leaf must verify for
		wantErr bool
	}{
		{name: "dns name", host: testHost, verify: testHost},
		{name: "upper case and trailing dot: same name", host: "API.Example.Test.", verify: testHost},
		{name: "ipv4", host: "192.0.2.7", verify: "192.0.2.7"},
		{name: "ipv6", host: "2001:db8::1", verify: "2001:db8::1"},
		{name: "long name without common name", host: strings.Repeat("a", 60) + ".example.test", verify: strings.Repeat("a", 60) + ".example.test"},
		{name: "empty", host: "", wantErr: true},
		{name: "wildcard", host: "*.example.test", wantErr: true},
		{name: "space", host: "a b.example.test", wantErr: true},
		{name: "empty label", host: "a..example.test", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, err := ca.Leaf(tt.host)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Leaf(%q) succeeded", tt.host)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			again, err := ca.Leaf(tt.host)
			if err != nil {
				t.Fatal(err)
			}
			if again != cert {
				t.Error("second Leaf call made a new certificate")
			}
			if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: tt.verify, Roots: pool,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("verify for %s: %v", tt.verify, err)
			}
			if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.test", Roots: pool}); err == nil {
				t.Error("leaf verifies for another name")
			}
			now := time.Now()
			if d := now.Sub(cert.Leaf.NotBefore); d < 59*time.Minute || d > 61*time.Minute {
				t.Errorf("NotBefore %v before now, want 1h", d)
			}
			if d := cert.Leaf.NotAfter.Sub(now); d < 7*24*time.Hour-time.Minute || d > 7*24*time.Hour {
				t.Errorf("NotAfter %v after now, want 7 days", d)
			}
			if cert.Leaf.IsCA {
				t.Error("leaf is a CA")
			}
		})
	}
	// Another CA's pool does not verify these leaves.
	other, _ := NewCA("other")
	otherPool := x509.NewCertPool()
	otherPool.AppendCertsFromPEM(other.CertPEM())
	cert, _ := ca.Leaf(testHost)
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: testHost, Roots: otherPool}); err == nil {
		t.Error("leaf verifies against another CA")
	}
}

func TestLeafCacheRenewAndEvict(t *testing.T) {
	ca, err := NewCA("airlock test")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca.now = func() time.Time { return now }
	first, err := ca.Leaf(testHost)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		advance time.Duration
		wantNew bool
	}{
		{name: "5 days on: cached", advance: 5 * 24 * time.Hour},
		{name: "6.5 days on: near expiry, re-made", advance: 13 * 12 * time.Hour, wantNew: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca.now = func() time.Time { return now.Add(tt.advance) }
			got, err := ca.Leaf(testHost)
			if err != nil {
				t.Fatal(err)
			}
			if (got != first) != tt.wantNew {
				t.Errorf("new certificate = %v, want %v", got != first, tt.wantNew)
			}
			if tt.wantNew && !got.Leaf.NotAfter.After(first.Leaf.NotAfter) {
				t.Error("re-made leaf does not last longer")
			}
		})
	}

	t.Run("oldest dropped past 1000", func(t *testing.T) {
		ca.now = time.Now
		oldest, err := ca.Leaf("oldest.example.test")
		if err != nil {
			t.Fatal(err)
		}
		for i := range maxLeaves - 1 {
			if _, err := ca.Leaf(fmt.Sprintf("h%d.example.test", i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := ca.order.Len(); n != maxLeaves {
			t.Fatalf("cache holds %d, want %d", n, maxLeaves)
		}
		if n := len(ca.leaves); n != maxLeaves {
			t.Fatalf("cache holds %d, want %d", n, maxLeaves)
		}
		// testHost's entry was the oldest and is gone now that "oldest" pushed the cache to 1000.
		if _, ok := ca.leaves[testHost]; ok {
			t.Error("the oldest entry was kept")
		}
		if again, _ := ca.Leaf("oldest.example.test"); again != oldest {
			t.Error("a newer entry was dropped")
		}
		if _, err := ca.Leaf("one-more.example.test"); err != nil {
			t.Fatal(err)
		}
		if _, ok := ca.leaves["oldest.example.test"]; ok {
			t.Error("the oldest entry was kept past 1000")
		}
	})
}
