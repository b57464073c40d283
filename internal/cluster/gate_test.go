package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockhq/airlock/internal/clustertls"
)

// A node's internal API answers a server's certificate for anything,
// another node's for template images only, and nothing else; a server's
// internal listener answers both roles and nothing else.
func TestGates(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	as := func(role, path string) *http.Request {
		r := httptest.NewRequest("GET", path, nil)
		if role != "" {
			leaf := &x509.Certificate{DNSNames: []string{role}}
			r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}
		}
		return r
	}
	image := TemplatesPath + "sha256:" + "ab/image"
	for _, c := range []struct {
		gate       func(http.Handler) http.Handler
		role, path string
		want       int
	}{
		{NodeGate, clustertls.RoleServer, "/v1/sandboxes/sbx_1/exec", http.StatusTeapot},
		{NodeGate, clustertls.RoleServer, image, http.StatusTeapot},
		{NodeGate, clustertls.RoleNode, image, http.StatusTeapot},
		{NodeGate, clustertls.RoleNode, "/v1/sandboxes/sbx_1/exec", http.StatusForbidden},
		{NodeGate, clustertls.RoleNode, TemplatesPath + "../../v1/sandboxes", http.StatusForbidden},
		{NodeGate, clustertls.RoleNode, "/internal/v1/templatesx", http.StatusForbidden},
		{NodeGate, "airlock-other", image, http.StatusForbidden},
		{NodeGate, "", image, http.StatusForbidden},
		{ServerGate, clustertls.RoleNode, image, http.StatusTeapot},
		{ServerGate, clustertls.RoleServer, image, http.StatusTeapot},
		{ServerGate, "airlock-other", image, http.StatusForbidden},
		{ServerGate, "", image, http.StatusForbidden},
	} {
		w := httptest.NewRecorder()
		c.gate(ok).ServeHTTP(w, as(c.role, c.path))
		if w.Code != c.want {
			t.Errorf("%q asking for %s: %d %s, want %d", c.role, c.path, w.Code, w.Body, c.want)
		}
	}
}
