package oci

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// victim is a service on the host's loopback that a hostile registry
// would have a pull reach: it counts what it gets.
type victim struct {
	srv  *httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	auth []string // Authorization headers seen
}

func newVictim(t *testing.T, h http.Handler) *victim {
	t.Helper()
	v := &victim{}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.hits.Add(1)
		v.mu.Lock()
		v.auth = append(v.auth, r.Header.Get("Authorization"))
		v.mu.Unlock()
		if h != nil {
			h.ServeHTTP(w, r)
			return
		}
		io.WriteString(w, `{"token":"stolen"}`)
	}))
	t.Cleanup(v.srv.Close)
	return v
}

func (v *victim) host() string { return strings.TrimPrefix(v.srv.URL, "http://") }

// bearerRealm makes the registry ask for a token from realm, once armed
// (the test pushes first).
func bearerRealm(realm string, armed *atomic.Bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if armed.Load() && r.Header.Get("Authorization") != "Bearer t0ken-from-the-realm" {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="reg"`, realm))
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// TestPullRealms: a registry that sends the token exchange to another
// host, a name for the host's loopback included, is refused before
// anything is sent there; a realm on the registry's own host works.
func TestPullRealms(t *testing.T) {
	img := markedImage(t, "linux", "amd64")
	v := newVictim(t, nil)
	_, port, _ := net.SplitHostPort(v.host())
	for _, tt := range []struct {
		realm string
		ours  bool // refused by the guard, not by go-containerregistry's own check of IP literals
	}{
		{"http://localhost:" + port + "/token", true},
		{"https://auth.evil.example/token", true},
		{"http://" + v.host() + "/token", false},
		{"http://169.254.169.254/latest/token", false},
	} {
		t.Run(tt.realm, func(t *testing.T) {
			var armed atomic.Bool
			reg := newRegistry(t, bearerRealm(tt.realm, &armed))
			ref := reg.push(t, "team/app:1", img, nil)
			armed.Store(true)
			_, _, err := Pull(context.Background(), ref, PullOptions{Username: "alice", Password: "s3cret-pw", Trusted: []string{reg.host}})
			if err == nil {
				t.Fatal("Pull worked")
			}
			if tt.ours && (!errors.Is(err, errdefs.ErrPermission) || !strings.Contains(err.Error(), "neither its own host nor a trusted registry")) {
				t.Fatalf("Pull = %v, want ErrPermission saying the realm is not the registry's", err)
			}
			if strings.Contains(err.Error(), "s3cret-pw") {
				t.Errorf("the error repeats the password: %v", err)
			}
		})
	}
	if n := v.hits.Load(); n != 0 {
		t.Errorf("the service on loopback got %d requests", n)
	}

	// The registry's own realm.
	var reg *testRegistry
	var armed atomic.Bool
	reg = newRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret-pw" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				io.WriteString(w, `{"token":"t0ken-from-the-realm"}`)
				return
			}
			bearerRealm("http://"+reg.host+"/token", &armed)(next).ServeHTTP(w, r)
		})
	})
	ref := reg.push(t, "team/app:1", img, nil)
	armed.Store(true)
	if _, _, err := Pull(context.Background(), ref, PullOptions{Username: "alice", Password: "s3cret-pw", Trusted: []string{reg.host}}); err != nil {
		t.Fatalf("Pull with the registry's own realm: %v", err)
	}
}

// TestPullRedirects: a registry may send blobs elsewhere, but not to a
// loopback service the operator did not trust; a trusted one receives
// no credentials.
func TestPullRedirects(t *testing.T) {
	img := markedImage(t, "linux", "amd64")
	redirectBlobs := func(to func() string) func(http.Handler) http.Handler {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					http.Redirect(w, r, to()+r.URL.Path, http.StatusTemporaryRedirect)
					return
				}
				basicAuth("alice", "s3cret-pw")(next).ServeHTTP(w, r)
			})
		}
	}

	v := newVictim(t, nil)
	_, port, _ := net.SplitHostPort(v.host())
	for _, to := range []string{v.srv.URL, "http://localhost:" + port} {
		reg := newRegistry(t, redirectBlobs(func() string { return to }))
		ref := reg.push(t, "team/app:1", img, &authn.Basic{Username: "alice", Password: "s3cret-pw"})
		_, _, err := Pull(context.Background(), ref, PullOptions{Username: "alice", Password: "s3cret-pw", Trusted: []string{reg.host}})
		if !errors.Is(err, errdefs.ErrPermission) || !strings.Contains(err.Error(), "loopback address") {
			t.Fatalf("Pull redirected to %s = %v, want ErrPermission naming the loopback address", to, err)
		}
	}
	if n := v.hits.Load(); n != 0 {
		t.Errorf("the service on loopback got %d requests", n)
	}

	// A CDN the operator trusts serves the blobs, without credentials.
	src := newRegistry(t, nil)
	src.push(t, "team/app:1", img, nil)
	cdn := newVictim(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get("http://" + src.host + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	reg2 := newRegistry(t, redirectBlobs(func() string { return cdn.srv.URL }))
	ref2 := reg2.push(t, "team/app:1", img, &authn.Basic{Username: "alice", Password: "s3cret-pw"})
	got, _, err := Pull(context.Background(), ref2, PullOptions{Username: "alice", Password: "s3cret-pw", Trusted: []string{reg2.host, cdn.host()}})
	if err != nil {
		t.Fatalf("Pull redirected to a trusted CDN: %v", err)
	}
	if p := readFile(t, filepath.Join(flattenTo(t, got), "platform")); p != "linux/amd64" {
		t.Errorf("platform = %q", p)
	}
	cdn.mu.Lock()
	defer cdn.mu.Unlock()
	if cdn.hits.Load() == 0 {
		t.Error("the CDN served nothing")
	}
	for _, a := range cdn.auth {
		if a != "" {
			t.Errorf("the CDN was sent credentials: %q", a)
		}
	}
}

// TestPullHostCredentials: the host's docker config is read only when
// the operator allows it.
func TestPullHostCredentials(t *testing.T) {
	reg := newRegistry(t, basicAuth("operator", "host-s3cret"))
	ref := reg.push(t, "private/app:1", markedImage(t, "linux", "amd64"), &authn.Basic{Username: "operator", Password: "host-s3cret"})
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.host, base64.StdEncoding.EncodeToString([]byte("operator:host-s3cret")))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)

	_, _, err := Pull(context.Background(), ref, reg.trust())
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("Pull without host credentials = %v, want ErrUnauthenticated with no credentials", err)
	}
	opts := reg.trust()
	opts.HostCredentials = true
	if _, _, err := Pull(context.Background(), ref, opts); err != nil {
		t.Fatalf("Pull with host credentials: %v", err)
	}
}

// TestPullErrorBody: what a registry writes in an error is cut to a line,
// and credentials it echoes are not repeated.
func TestPullErrorBody(t *testing.T) {
	echo := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				msg := "bad request from " + r.Header.Get("Authorization") + " password s3cret-pw token " +
					strings.Repeat("Zm9v", 12) + "\nsecond line\x1b[31m"
				fmt.Fprintf(w, `{"errors":[{"code":"MANIFEST_INVALID","message":%q}]}`, msg)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	raw := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, "<html>"+r.Header.Get("Authorization")+"\n"+strings.Repeat("x", 5000)+"</html>")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	for name, wrap := range map[string]func(http.Handler) http.Handler{"structured": echo, "raw": raw} {
		t.Run(name, func(t *testing.T) {
			reg := newRegistry(t, wrap)
			_, _, err := Pull(context.Background(), reg.host+"/team/app:1",
				PullOptions{Username: "alice", Password: "s3cret-pw", Trusted: []string{reg.host}})
			if err == nil {
				t.Fatal("Pull worked")
			}
			msg := err.Error()
			basic := base64.StdEncoding.EncodeToString([]byte("alice:s3cret-pw"))
			for _, leak := range []string{"s3cret-pw", basic, "Zm9vZm9v", "second line", "\n", "\x1b", "xxxxxxxxxx"} {
				if strings.Contains(msg, leak) {
					t.Errorf("the error holds %q: %q", leak, msg)
				}
			}
			if len(msg) > 600 {
				t.Errorf("the error is %d bytes long: %q", len(msg), msg)
			}
			if !strings.Contains(msg, reg.host) || !strings.Contains(msg, "status") {
				t.Errorf("the error does not say which registry and status: %q", msg)
			}
		})
	}
}

// TestSpecialRange: the addresses a pull reaches only for a trusted
// registry.
func TestSpecialRange(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1":                "loopback",
		"::1":                      "loopback",
		"::ffff:127.0.0.1":         "loopback",
		"169.254.169.254":          "link-local",
		"fe80::1":                  "link-local",
		"10.1.2.3":                 "private",
		"172.31.0.1":               "private",
		"192.168.0.1":              "private",
		"100.100.100.200":          "shared (CGNAT)",
		"fd00:ec2::254":            "unique-local",
		"64:ff9b::a9fe:a9fe":       "link-local", // NAT64 of 169.254.169.254
		"2002:7f00:1::1":           "loopback",   // 6to4 of 127.0.0.1
		"0.0.0.0":                  "this-network",
		"::":                       "unspecified",
		"168.63.129.16":            "cloud service",
		"198.18.0.1":               "benchmarking",
		"224.0.0.1":                "multicast",
		"8.8.8.8":                  "",
		"2606:4700:4700::1111":     "",
		"64:ff9b::808:808":         "",
		"::ffff:93.184.216.34":     "",
		"2001:4860:4860::8888":     "",
		"172.32.0.1":               "",
		"100.128.0.1":              "",
		"fe00::1":                  "",
		"2002:808:808::1":          "",
		"192.0.2.1":                "",
		"64:ff9b:1::a00:1":         "local NAT64",
		"::ffff:169.254.169.254":   "link-local",
		"::ffff:10.0.0.1":          "private",
		"fec0::1":                  "site-local",
		"ff02::1":                  "multicast",
		"255.255.255.255":          "reserved",
		"240.0.0.1":                "reserved",
		"192.0.0.170":              "protocol-assignment",
		"2001:db8::1":              "",
		"::ffff:0:0":               "this-network",
		"0.1.2.3":                  "this-network",
		"100.64.0.0":               "shared (CGNAT)",
		"127.255.255.255":          "loopback",
		"169.254.0.0":              "link-local",
		"::ffff:192.168.255.255":   "private",
		"2002:c0a8:101::1":         "private", // 6to4 of 192.168.1.1
		"64:ff9b::c0a8:101":        "private", // NAT64 of 192.168.1.1
		"64:ff9b::7f00:1":          "loopback",
		"2002:a9fe:a9fe::1":        "link-local",
		"fc00::1":                  "unique-local",
		"fdff:ffff:ffff::1":        "unique-local",
		"febf:ffff::1":             "link-local",
		"ff00::1":                  "multicast",
		"224.0.0.251":              "multicast",
		"239.255.255.250":          "multicast",
		"198.19.255.255":           "benchmarking",
		"198.20.0.0":               "",
		"::ffff:198.18.0.1":        "benchmarking",
		"2002:c612:1::1":           "benchmarking",
		"::2":                      "",
		"1.1.1.1":                  "",
		"2a00:1450:4001::200e":     "",
		"2a00:1450:4001:80f::200e": "",
	} {
		if got := specialRange(netip.MustParseAddr(addr)); got != want {
			t.Errorf("specialRange(%s) = %q, want %q", addr, got, want)
		}
	}
}

// TestCleanLine: one printable line, credentials out, digests kept.
func TestCleanLine(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for in, want := range map[string]string{
		"manifest unknown": "manifest unknown",
		"first\nsecond":    "first",
		"a\x1b[31mred\x00": "a[31mred",
		"got Bearer abc.def and Basic YWxpY2U6cHc=": "got Bearer [redacted] and Basic [redacted]",
		"blob " + digest + " unknown":               "blob " + digest + " unknown",
		"token " + strings.Repeat("Zm9v", 10):       "token [redacted]",
		"pw hunter22 here":                          "pw [redacted] here",
		strings.Repeat("é", 200):                    strings.Repeat("é", 160) + "…",
	} {
		if got := cleanLine(in, "hunter22", "", "x"); got != want {
			t.Errorf("cleanLine(%q) = %q, want %q", in, got, want)
		}
	}
}
