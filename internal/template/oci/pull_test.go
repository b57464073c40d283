package oci

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestPull pushes a layered image to a registry, pulls it and flattens it.
func TestPull(t *testing.T) {
	cfg := v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
		WorkingDir: "/srv",
		User:       "1000:1000",
		Entrypoint: []string{"/bin/app", "--serve"},
		Cmd:        []string{"--port", "8080"},
	}
	img := newImage(t, "linux", "amd64", cfg,
		newLayer(t, dirEntry("srv/"), fileEntry("srv/old", "lower"), fileEntry("bin/app", "v1")),
		newLayer(t, whiteoutEntry("srv/old"), fileEntry("bin/app", "v2")),
	)
	reg := newRegistry(t, nil)
	ref := reg.push(t, "team/app:1.0", img, nil)
	want := digestOf(t, img)

	for _, tt := range []struct {
		name string
		ref  string
		opts PullOptions
	}{
		{"by tag", ref, reg.trust()},
		{"by digest", reg.host + "/team/app@" + want, reg.trust()},
		{"insecure", ref, PullOptions{Insecure: true, Trusted: []string{reg.host}}},
		{"trusted among others", ref, PullOptions{Trusted: []string{"registry.example.com", reg.host}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, digest, err := Pull(context.Background(), tt.ref, tt.opts)
			if err != nil {
				t.Fatalf("Pull: %v", err)
			}
			if digest != want {
				t.Errorf("digest = %s, want %s", digest, want)
			}
			c, err := ImageConfig(got)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Env, cfg.Env) || c.WorkingDir != cfg.WorkingDir || c.User != cfg.User ||
				!slices.Equal(c.Entrypoint, cfg.Entrypoint) || !slices.Equal(c.Cmd, cfg.Cmd) {
				t.Errorf("ImageConfig = %+v, want %+v", c, cfg)
			}
			root := flattenTo(t, got)
			if b := readFile(t, filepath.Join(root, "bin/app")); b != "v2" {
				t.Errorf("bin/app = %q, want v2", b)
			}
			mustNotExist(t, filepath.Join(root, "srv/old"))
		})
	}
}

// TestPullPlatforms checks the choice of platform from indexes and images.
func TestPullPlatforms(t *testing.T) {
	reg := newRegistry(t, nil)
	amd64 := markedImage(t, "linux", "amd64")
	arm64 := markedImage(t, "linux", "arm64")
	multi := reg.push(t, "multi:latest", index(t, arm64, amd64), nil)
	armOnly := reg.push(t, "arm:latest", arm64, nil)
	armIndex := reg.push(t, "armindex:latest", index(t, arm64, markedImage(t, "linux", "s390x")), nil)

	img, digest, err := Pull(context.Background(), multi, reg.trust())
	if err != nil {
		t.Fatalf("Pull index: %v", err)
	}
	if want := digestOf(t, amd64); digest != want {
		t.Errorf("index: digest = %s, want the amd64 image's %s", digest, want)
	}
	if got := readFile(t, filepath.Join(flattenTo(t, img), "platform")); got != "linux/amd64" {
		t.Errorf("index: flattened the %s image", got)
	}

	for _, tt := range []struct {
		ref  string
		want []string
	}{
		{armOnly, []string{"is linux/arm64 only", "linux/amd64"}},
		{armIndex, []string{"is linux/arm64, linux/s390x only", "linux/amd64"}},
	} {
		_, _, err := Pull(context.Background(), tt.ref, reg.trust())
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Pull %s = %v, want ErrInvalid", tt.ref, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Pull %s = %q, want it to say %q", tt.ref, err, w)
			}
		}
	}
}

// TestPullErrors checks the class of each failure.
func TestPullErrors(t *testing.T) {
	reg := newRegistry(t, nil)
	reg.push(t, "team/app:1.0", markedImage(t, "linux", "amd64"), nil)

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	for _, tt := range []struct {
		name    string
		ref     string
		trusted []string
		wantErr error
		wantMsg string
	}{
		{"unknown tag", reg.host + "/team/app:2.0", []string{reg.host}, errdefs.ErrNotFound, ""},
		{"unknown repository", reg.host + "/team/nothing:1.0", []string{reg.host}, errdefs.ErrNotFound, ""},
		{"unknown digest", reg.host + "/team/app@sha256:" + strings.Repeat("0", 64), []string{reg.host}, errdefs.ErrNotFound, strings.Repeat("0", 64)},
		{"malformed", reg.host + "/Team/App::1", nil, errdefs.ErrInvalid, ""},
		{"unreachable", dead + "/team/app:1.0", []string{dead}, errdefs.ErrUnavailable, dead},
		{"loopback, not trusted", reg.host + "/team/app:1.0", nil, errdefs.ErrPermission, "loopback address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Pull(context.Background(), tt.ref, PullOptions{Trusted: tt.trusted})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Pull = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Pull = %q, want it to name %q", err, tt.wantMsg)
			}
		})
	}
}

// TestPullAuth pulls from a registry that requires basic auth.
func TestPullAuth(t *testing.T) {
	reg := newRegistry(t, basicAuth("alice", "s3cret"))
	img := markedImage(t, "linux", "amd64")
	ref := reg.push(t, "private/app:1", img, &authn.Basic{Username: "alice", Password: "s3cret"})

	for _, tt := range []struct {
		name string
		opts PullOptions
	}{
		{"anonymous", reg.trust()},
		{"wrong password", PullOptions{Username: "alice", Password: "guess", Trusted: []string{reg.host}}},
	} {
		_, _, err := Pull(context.Background(), ref, tt.opts)
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Pull = %v, want ErrUnauthenticated", tt.name, err)
		} else if !strings.Contains(err.Error(), "registry_auth") {
			t.Errorf("%s: Pull = %q, want it to mention registry_auth", tt.name, err)
		}
	}

	got, digest, err := Pull(context.Background(), ref, PullOptions{Username: "alice", Password: "s3cret", Trusted: []string{reg.host}})
	if err != nil {
		t.Fatalf("Pull with the password: %v", err)
	}
	if want := digestOf(t, img); digest != want {
		t.Errorf("digest = %s, want %s", digest, want)
	}
	if b := readFile(t, filepath.Join(flattenTo(t, got), "platform")); b != "linux/amd64" {
		t.Errorf("platform = %q", b)
	}
}

// TestPullUntrusted checks that a registry not trusted is never contacted.
func TestPullUntrusted(t *testing.T) {
	reg := newRegistry(t, nil)
	ref := reg.push(t, "team/app:1.0", markedImage(t, "linux", "amd64"), nil)
	before := reg.requests.Load()

	_, _, err := Pull(context.Background(), ref, PullOptions{Trusted: []string{"registry.example.com", "docker.io"}})
	if !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("Pull = %v, want ErrPermission", err)
	}
	for _, w := range []string{reg.host, "registry.example.com, docker.io"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Pull = %q, want it to name %q", err, w)
		}
	}
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("the untrusted registry got %d requests, want 0", n)
	}
}

// TestCheckRef checks references and how their registries are matched
// against the trusted list.
func TestCheckRef(t *testing.T) {
	for _, tt := range []struct {
		ref     string
		trusted []string
		wantErr error
	}{
		{"alpine", nil, nil},
		{"alpine", []string{"docker.io"}, nil},
		{"index.docker.io/library/alpine", []string{"docker.io"}, nil},
		{"docker.io/library/alpine", []string{"index.docker.io"}, nil},
		{"ghcr.io/org/img", []string{"docker.io"}, errdefs.ErrPermission},
		{"registry.example.com:5000/img", []string{"registry.example.com"}, errdefs.ErrPermission},
		{"registry.example.com:5000/img", []string{"registry.example.com:5000"}, nil},
		{"registry.example.com/img", []string{"Registry.Example.com"}, nil},
		{"registry.example.com.evil.net/img", []string{"registry.example.com"}, errdefs.ErrPermission},
		{"registry.example.com/img", []string{"https://registry.example.com"}, errdefs.ErrInvalid},
		{"registry.example.com/img@sha256:" + strings.Repeat("0", 64), []string{"registry.example.com"}, nil},
		{"registry.example.com/Img", nil, errdefs.ErrInvalid},
		{"registry.example.com/img:", nil, errdefs.ErrInvalid},
		{"", nil, errdefs.ErrInvalid},
	} {
		if err := CheckRef(tt.ref, tt.trusted); !errors.Is(err, tt.wantErr) {
			t.Errorf("CheckRef(%q, %q) = %v, want %v", tt.ref, tt.trusted, err, tt.wantErr)
		}
	}
}

// TestPullPlainHTTP checks when plain HTTP is used: to any loopback address
// by itself, elsewhere only if insecure. The registries are trusted: their
// addresses are closed to others.
func TestPullPlainHTTP(t *testing.T) {
	img := markedImage(t, "linux", "amd64")
	t.Run("loopback beyond 127.0.0.1", func(t *testing.T) {
		reg := newRegistryOn(t, "127.0.0.2:0", nil)
		ref := reg.push(t, "team/app:1", img, nil)
		if _, _, err := Pull(context.Background(), ref, reg.trust()); err != nil {
			t.Fatalf("Pull: %v", err)
		}
	})
	t.Run("not loopback", func(t *testing.T) {
		addr := nonLoopbackAddr(t)
		reg := newRegistryOn(t, net.JoinHostPort(addr, "0"), nil)
		ref := reg.push(t, "team/app:1", img, nil)
		if _, _, err := Pull(context.Background(), ref, reg.trust()); err == nil {
			t.Error("Pull over plain HTTP to a registry on " + addr + " worked without Insecure")
		}
		if _, _, err := Pull(context.Background(), ref, PullOptions{Insecure: true, Trusted: []string{reg.host}}); err != nil {
			t.Errorf("Pull with Insecure: %v", err)
		}
	})
}

// nonLoopbackAddr returns an IPv4 address of this machine that is not a
// loopback one, or skips the test.
func nonLoopbackAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address")
	return ""
}

// TestRegistryGuardCheck checks which requests the guard lets through by
// their URL: plain HTTP, and the hosts a pull may send its own requests
// to. A redirect is judged only by scheme here, and by address as it is
// dialled.
func TestRegistryGuardCheck(t *testing.T) {
	for _, tt := range []struct {
		registry string
		trusted  []string
		url      string
		redirect bool
		insecure bool
		want     bool
	}{
		{"10.0.0.5", nil, "https://10.0.0.5/v2/", false, false, true},
		{"registry.example.com", nil, "https://registry.example.com/v2/", false, false, true},
		{"127.0.0.1:5000", nil, "http://127.0.0.1:5000/v2/", false, false, true},
		{"127.3.4.5:5000", nil, "http://127.3.4.5:5000/v2/", false, false, true},
		{"[::1]:5000", nil, "http://[::1]:5000/v2/", false, false, true},
		{"localhost:5000", nil, "http://localhost:5000/v2/", false, false, true},
		{"localhost", nil, "http://localhost/v2/", false, false, true},
		{"10.0.0.5", nil, "http://10.0.0.5/v2/", false, false, false},
		{"192.168.1.10:5000", nil, "http://192.168.1.10:5000/v2/", false, false, false},
		{"registry.localhost:5000", nil, "http://registry.localhost:5000/v2/", false, false, false},
		{"registry.example.com", nil, "http://registry.example.com/v2/", false, false, false},
		{"registry.example.com", nil, "http://registry.example.com/v2/", false, true, true},
		{"registry.example.com", nil, "http://cdn.example.net/blob", true, false, false},
		// Token realms: the registry's site, or a trusted registry.
		{"index.docker.io", nil, "https://auth.docker.io/token", false, false, true},
		{"index.docker.io", nil, "https://registry-1.docker.io/v2/", false, false, true},
		{"ghcr.io", nil, "https://ghcr.io/token", false, false, true},
		{"registry.example.com", nil, "https://auth.example.com:8443/token", false, false, true},
		{"registry.example.com", nil, "https://auth.example.net/token", false, false, false},
		{"registry.example.com", nil, "https://registry.example.com.evil.net/token", false, false, false},
		{"team.github.io", nil, "https://other.github.io/token", false, false, false},
		{"registry.example.com", []string{"auth.example.net"}, "https://auth.example.net/token", false, false, true},
		{"127.0.0.1:5000", nil, "http://127.0.0.1:7700/v1/keys", false, false, false},
		{"127.0.0.1:5000", []string{"127.0.0.1:7700"}, "http://127.0.0.1:7700/token", false, false, true},
		{"10.0.0.5", nil, "https://10.0.0.6/token", false, false, false},
		// Redirects: any host over HTTPS.
		{"registry.example.com", nil, "https://cdn.example.net/blob?sig=x", true, false, true},
	} {
		reg, err := name.NewRegistry(tt.registry, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		g := newRegistryGuard(reg, tt.trusted, tt.insecure)
		req, err := http.NewRequest(http.MethodGet, tt.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tt.redirect {
			req.Response = &http.Response{StatusCode: http.StatusTemporaryRedirect}
		}
		err = g.check(req)
		if (err == nil) != tt.want {
			t.Errorf("registry %s, trusted %q: %s (redirect %v, insecure %v): %v, want allowed %v",
				tt.registry, tt.trusted, tt.url, tt.redirect, tt.insecure, err, tt.want)
		}
		if err != nil && !errors.Is(err, errdefs.ErrPermission) {
			t.Errorf("%s: err = %v, want ErrPermission", tt.url, err)
		}
	}
}
