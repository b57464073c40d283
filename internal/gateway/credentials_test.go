package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

func credentialPolicy() policy.Policy {
	return policy.Policy{
		Allow: []string{"api.test", "plain.test"},
		Credentials: []policy.Credential{
			{Host: "api.test", Header: "Authorization", Secret: "token", Format: "Bearer {}", PlainHTTP: true},
		},
	}
}

func secrets(m map[string]string) func(context.Context, string) (string, error) {
	return func(_ context.Context, name string) (string, error) {
		if v, ok := m[name]; ok {
			return v, nil
		}
		return "", errors.New("no such secret")
	}
}

// credentialNet is a test network with policy p, whose host api.test
// resolves to api, which is redirected to srv, with the CA ca and the
// secret "token" = "s3cret".
func credentialNet(t *testing.T, p policy.Policy, api netip.AddrPort, srv *httptest.Server, ca *mitm.CA) *testNet {
	t.Helper()
	n := newTestNet(t, p, netOptions{
		redirect: map[netip.AddrPort]string{api: srv.Listener.Addr().String()},
		config: func(c *Config) {
			c.CA = ca
			c.Secret = secrets(map[string]string{"token": "s3cret"})
		},
	})
	n.dns.set("api.test", api.Addr().String())
	return n
}

func TestCredentialsHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hostHandler))
	t.Cleanup(srv.Close)
	api := netip.MustParseAddrPort("203.0.113.30:80")
	plain := netip.MustParseAddrPort("203.0.113.32:80")
	ca, err := mitm.NewCA("sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNet(t, credentialPolicy(), netOptions{
		redirect: map[netip.AddrPort]string{api: srv.Listener.Addr().String(), plain: srv.Listener.Addr().String()},
		config: func(c *Config) {
			c.CA = ca
			c.Secret = secrets(map[string]string{"token": "s3cret"})
		},
	})
	n.dns.set("api.test", api.Addr().String())
	n.dns.set("plain.test", plain.Addr().String())

	c, err := n.dial(api.String())
	if err != nil {
		t.Fatal(err)
	}
	body, err := httpGet(c, "api.test")
	c.Close()
	if err != nil || body != "host=api.test auth=Bearer s3cret" {
		t.Fatalf("GET api.test: %q, %v", body, err)
	}
	n.waitEvent(t, func(e Event) bool { return e.Host == "api.test" && e.Verdict == "allow" && e.BytesOut > 0 })

	// A host without credential rules is spliced, untouched.
	c, err = n.dial(plain.String())
	if err != nil {
		t.Fatal(err)
	}
	body, err = httpGet(c, "plain.test")
	c.Close()
	if err != nil || body != "host=plain.test auth=" {
		t.Fatalf("GET plain.test: %q, %v", body, err)
	}
}

// Without a secret store, or without the secret, credentials fail closed.
func TestCredentialsFailClosed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hostHandler))
	t.Cleanup(srv.Close)
	api := netip.MustParseAddrPort("203.0.113.30:80")
	ca, err := mitm.NewCA("sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		secret func(context.Context, string) (string, error)
	}{
		{"no secret store", nil},
		{"secret missing", secrets(nil)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newTestNet(t, credentialPolicy(), netOptions{
				redirect: map[netip.AddrPort]string{api: srv.Listener.Addr().String()},
				config:   func(c *Config) { c.CA, c.Secret = ca, tt.secret },
			})
			n.dns.set("api.test", api.Addr().String())
			c, err := n.dial(api.String())
			if err != nil {
				t.Fatal(err)
			}
			body, err := httpGet(c, "api.test")
			c.Close()
			if err == nil || !strings.Contains(err.Error(), "403") {
				t.Fatalf("GET: %q, %v, want 403", body, err)
			}
		})
	}
}

func TestCredentialsHTTPS(t *testing.T) {
	upstream, upstreamRoots := tlsServer(t, "api.test", http.HandlerFunc(hostHandler))
	api := netip.MustParseAddrPort("203.0.113.31:443")
	ca, err := mitm.NewCA("sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNet(t, credentialPolicy(), netOptions{
		redirect: map[netip.AddrPort]string{api: upstream},
		config: func(c *Config) {
			c.CA = ca
			c.RootCAs = upstreamRoots
			c.Secret = secrets(map[string]string{"token": "s3cret"})
		},
	})
	n.dns.set("api.test", api.Addr().String())
	guestRoots := x509.NewCertPool()
	guestRoots.AppendCertsFromPEM(ca.CertPEM())

	c, err := n.dial(api.String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: guestRoots})
	body, err := httpGet(tc, "api.test")
	if err != nil || body != "host=api.test auth=Bearer s3cret" {
		t.Fatalf("GET: %q, %v", body, err)
	}
	if issuer := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; issuer != "sandbox test CA" {
		t.Errorf("the guest saw a certificate from %q, want the sandbox's CA", issuer)
	}
	tc.Close()

	// Revoking the host closes an open intercepted connection.
	c, err = n.dial(api.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc = tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: guestRoots})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := n.gw.SetPolicy(policy.Policy{Allow: []string{"plain.test"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Fatal("the intercepted connection stayed open after its host was denied")
	}
	n.waitEvent(t, func(e Event) bool { return e.Host == "api.test" && e.Reason == "revoked:default-deny" })
}

// Where the address alone allows the flow (an IP rule, or egress allow),
// a request to a credential host still gets its credential.
func TestCredentialsWhenTheAddressDecides(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hostHandler))
	t.Cleanup(srv.Close)
	api := netip.MustParseAddrPort("203.0.113.30:80")
	ca, err := mitm.NewCA("sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []policy.Policy{
		{Allow: []string{"203.0.113.0/24"}, Credentials: credentialPolicy().Credentials},
		{Egress: "allow", Credentials: credentialPolicy().Credentials},
	} {
		n := credentialNet(t, p, api, srv, ca)
		c, err := n.dial(api.String())
		if err != nil {
			t.Fatal(err)
		}
		body, err := httpGet(c, "api.test")
		c.Close()
		if err != nil || body != "host=api.test auth=Bearer s3cret" {
			t.Fatalf("policy %+v: GET api.test: %q, %v", p, body, err)
		}
	}
}

// TestCredentialsPlainHTTPOptIn: on plain HTTP (port 80) a credential is
// sent only for a rule that says plain_http, so that a guest cannot make
// the secret cross the network in clear (TestCredentialsHTTPS covers
// HTTPS, which gets it either way). And a TRACE or TRACK to a credential host, which a server
// may answer by echoing the request (the header with it), is refused
// before anything goes upstream.
func TestCredentialsPlainHTTPOptIn(t *testing.T) {
	var upstream []string // methods the upstream saw
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstream = append(upstream, r.Method)
		mu.Unlock()
		hostHandler(w, r)
	}))
	t.Cleanup(srv.Close)
	api := netip.MustParseAddrPort("203.0.113.30:80")
	ca, err := mitm.NewCA("sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	newNet := func(plain bool) *testNet {
		p := credentialPolicy()
		p.Credentials[0].PlainHTTP = plain
		return credentialNet(t, p, api, srv, ca)
	}
	n := newNet(false)
	c, err := n.dial(api.String())
	if err != nil {
		t.Fatal(err)
	}
	body, err := httpGet(c, "api.test")
	c.Close()
	if err != nil || body != "host=api.test auth=" {
		t.Fatalf("plain GET api.test without plain_http: %q, %v; want no credential", body, err)
	}

	n = newNet(true)
	for _, method := range []string{"TRACE", "TRACK", "trace"} {
		c, err := n.dial(api.String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "%s / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer guest\r\n\r\n", method)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("%s to a credential host: %v", method, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if strings.Contains(string(b), "s3cret") {
			t.Fatalf("%s to a credential host echoed the secret: %q", method, b)
		}
		// A lower-case method is not taken for HTTP (method names are
		// case-sensitive): the flow is passed through as it is, with no
		// credential in it.
		if method != "trace" && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("%s to a credential host: %s; want 405", method, resp.Status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range upstream {
		if m == "TRACE" || m == "TRACK" {
			t.Fatalf("the upstream saw a %s", m)
		}
	}
}
