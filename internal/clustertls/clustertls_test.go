package clustertls

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Generate makes a CA and a certificate per role; Load takes a
// directory only for the role its certificate carries and only when its
// CA signed it. A second Generate into the same directory is refused.
func TestGenerateLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if err := Generate(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	for sub, role := range map[string]string{"node": RoleNode, "server": RoleServer} {
		id, err := Load(filepath.Join(dir, sub), role)
		if err != nil || id.Role != role {
			t.Fatalf("load %s as %s: %v", sub, role, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, sub, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s's key: %v %v, want mode 0600", sub, fi.Mode(), err)
		}
	}
	if _, err := Load(filepath.Join(dir, "node"), RoleServer); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "airlock-server") {
		t.Errorf("a node's certificate loaded as a server's: %v", err)
	}
	// A certificate with another cluster's CA beside it.
	other := filepath.Join(t.TempDir(), "other")
	if err := Generate(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	mixed := t.TempDir()
	for from, name := range map[string]string{filepath.Join(other, CAFile): CAFile,
		filepath.Join(dir, "node", CertFile): CertFile, filepath.Join(dir, "node", KeyFile): KeyFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mixed, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(mixed, RoleNode); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "is not a certificate of the CA") {
		t.Errorf("a certificate of another CA: %v", err)
	}
	if _, err := Load(t.TempDir(), RoleNode); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "cluster-certs") {
		t.Errorf("an empty directory: %v", err)
	}
	if err := Generate(dir, time.Hour); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second CA over the first: %v", err)
	}
}

// Both ends check the other: a listener answers a member of its cluster
// and tells the handler its role; it refuses a client without a
// certificate or with another CA's, and a client refuses a listener of
// another CA or of the role it did not call.
func TestHandshake(t *testing.T) {
	dir, other := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, d := range []string{dir, other} {
		if err := Generate(d, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	load := func(d, sub, role string) *Identity {
		id, err := Load(filepath.Join(d, sub), role)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	server, node := load(dir, "server", RoleServer), load(dir, "node", RoleNode)
	stranger := load(other, "node", RoleNode)

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, PeerRole(r))
	}))
	srv.TLS = server.ServerConfig()
	srv.StartTLS()
	defer srv.Close()
	get := func(tr http.RoundTripper) (string, error) {
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(srv.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := get(node.Transport(RoleServer)); err != nil || got != RoleNode {
		t.Errorf("a node calling a server: %q, %v", got, err)
	}
	if got, err := get(server.Transport(RoleServer)); err != nil || got != RoleServer {
		t.Errorf("a server calling a server: %q, %v", got, err)
	}
	if got, err := get(node.Transport(RoleNode)); err == nil {
		t.Errorf("a node took a server's certificate for a node's: %q", got)
	}
	// The stranger trusts this cluster's CA: only its own certificate is
	// in the way.
	cfg := stranger.ClientConfig(RoleServer)
	cfg.RootCAs = server.pool
	if got, err := get(&http.Transport{TLSClientConfig: cfg}); err == nil {
		t.Errorf("a certificate of another CA was taken: %q", got)
	}
	cfg = node.ClientConfig(RoleServer)
	cfg.Certificates = nil
	if got, err := get(&http.Transport{TLSClientConfig: cfg}); err == nil {
		t.Errorf("a client without a certificate was answered: %q", got)
	}
	if got, err := get(stranger.Transport(RoleServer)); err == nil {
		t.Errorf("a client took a listener of another CA: %q", got)
	}
	if got := PeerRole(httptest.NewRequest("GET", "/", nil)); got != "" {
		t.Errorf("the role of a plain request: %q", got)
	}
}
