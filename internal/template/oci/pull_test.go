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
		{"by tag", ref, PullOptions{}},
		{"by digest", reg.host + "/team/app@" + want, PullOptions{}},
		{"insecure", ref, PullOptions{Insecure: true}},
		{"trusted", ref, PullOptions{Trusted: []string{"registry.example.com", reg.host}}},
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

	img, digest, err := Pull(context.Background(), multi, PullOptions{})
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
		_, _, err := Pull(context.Background(), tt.ref, PullOptions{})
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
		wantErr error
		wantMsg string
	}{
		{"unknown tag", reg.host + "/team/app:2.0", errdefs.ErrNotFound, ""},
		{"unknown repository", reg.host + "/team/nothing:1.0", errdefs.ErrNotFound, ""},
		{"unknown digest", reg.host + "/team/app@sha256:" + strings.Repeat("0", 64), errdefs.ErrNotFound, ""},
		{"malformed", reg.host + "/Team/App::1", errdefs.ErrInvalid, ""},
		{"unreachable", dead + "/team/app:1.0", errdefs.ErrUnavailable, dead},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Pull(context.Background(), tt.ref, PullOptions{})
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
		{"anonymous", PullOptions{}},
		{"wrong password", PullOptions{Username: "alice", Password: "guess"}},
	} {
		_, _, err := Pull(context.Background(), ref, tt.opts)
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Pull = %v, want ErrUnauthenticated", tt.name, err)
		} else if !strings.Contains(err.Error(), "registry_auth") {
			t.Errorf("%s: Pull = %q, want it to mention registry_auth", tt.name, err)
		}
	}

	got, digest, err := Pull(context.Background(), ref, PullOptions{Username: "alice", Password: "s3cret"})
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
// by itself, elsewhere only if insecure.
func TestPullPlainHTTP(t *testing.T) {
	img := markedImage(t, "linux", "amd64")
	t.Run("loopback beyond 127.0.0.1", func(t *testing.T) {
		reg := newRegistryOn(t, "127.0.0.2:0", nil)
		ref := reg.push(t, "team/app:1", img, nil)
		if _, _, err := Pull(context.Background(), ref, PullOptions{}); err != nil {
			t.Fatalf("Pull: %v", err)
		}
	})
	t.Run("not loopback", func(t *testing.T) {
		addr := nonLoopbackAddr(t)
		reg := newRegistryOn(t, net.JoinHostPort(addr, "0"), nil)
		ref := reg.push(t, "team/app:1", img, nil)
		if _, _, err := Pull(context.Background(), ref, PullOptions{}); err == nil {
			t.Error("Pull over plain HTTP to a registry on " + addr + " worked without Insecure")
		}
		if _, _, err := Pull(context.Background(), ref, PullOptions{Insecure: true}); err != nil {
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

// TestPlainHTTPGuard checks which requests the guard lets through.
func TestPlainHTTPGuard(t *testing.T) {
	for _, tt := range []struct {
		url      string
		insecure bool
		want     bool
	}{
		{"https://10.0.0.5/v2/", false, true},
		{"https://registry.example.com/v2/", false, true},
		{"http://127.0.0.1:5000/v2/", false, true},
		{"http://127.3.4.5:5000/v2/", false, true},
		{"http://[::1]:5000/v2/", false, true},
		{"http://localhost:5000/v2/", false, true},
		{"http://localhost/v2/", false, true},
		{"http://10.0.0.5/v2/", false, false},
		{"http://192.168.1.10:5000/v2/", false, false},
		{"http://registry.localhost:5000/v2/", false, false},
		{"http://registry.example.com/v2/", false, false},
		{"http://registry.example.com/v2/", true, true},
	} {
		var called bool
		g := &plainHTTPGuard{insecure: tt.insecure, next: roundTripFunc(func(*http.Request) (*http.Response, error) {
			called = true
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
		})}
		req, err := http.NewRequest(http.MethodGet, tt.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = g.RoundTrip(req)
		if called != tt.want {
			t.Errorf("%s (insecure %v): sent %v, want %v", tt.url, tt.insecure, called, tt.want)
		}
		if !tt.want && !errors.Is(err, errdefs.ErrPermission) {
			t.Errorf("%s: err = %v, want ErrPermission", tt.url, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
