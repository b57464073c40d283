package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestMain points the docker config at an empty directory, so that no
// credentials of the machine running the tests are used.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oci-test-docker-config-")
	if err != nil {
		log.Fatal(err)
	}
	os.Setenv("DOCKER_CONFIG", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// entry is one tar entry of a test layer.
type entry struct {
	hdr  tar.Header
	body string
}

func dirEntry(name string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func fileEntry(name, body string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, body: body}
}

func symlinkEntry(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlinkEntry(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}}
}

func whiteoutEntry(name string) entry {
	return fileEntry(path.Join(path.Dir(name), ".wh."+path.Base(name)), "")
}

func opaqueEntry(dir string) entry {
	return fileEntry(path.Join(dir, ".wh..wh..opq"), "")
}

// tarOf returns a tar of entries; a regular file's size is its body's and
// an unset time is testTime.
func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.ModTime.IsZero() {
			h.ModTime = testTime
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// newLayer returns a layer of entries.
func newLayer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	b := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newImage returns an image for os/arch with config cfg and layers.
func newImage(t *testing.T, osName, arch string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: osName, Architecture: arch, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// markedImage returns an image for os/arch whose only file, /platform,
// says which it is.
func markedImage(t *testing.T, osName, arch string) v1.Image {
	t.Helper()
	return newImage(t, osName, arch, v1.Config{}, newLayer(t, fileEntry("platform", osName+"/"+arch)))
}

// flattenTo flattens img into a fresh directory and returns it.
func flattenTo(t *testing.T, img v1.Image) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Flatten(context.Background(), img, root, 1<<30); err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	return root
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Errorf("%s exists (or Lstat failed otherwise: %v)", p, err)
	}
}

func lstat(t *testing.T, p string) fs.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// testRegistry is an in-memory registry on 127.0.0.1.
type testRegistry struct {
	host     string // host:port
	requests atomic.Int64
}

// newRegistry starts a registry on 127.0.0.1; wrap, if not nil, stands in
// front of it.
func newRegistry(t *testing.T, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	return newRegistryOn(t, "127.0.0.1:0", wrap)
}

// newRegistryOn starts a registry listening on addr.
func newRegistryOn(t *testing.T, addr string, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	r := &testRegistry{}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	inner := h
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		inner.ServeHTTP(w, req)
	})}}
	srv.Start()
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// basicAuth lets through only requests with user and password.
func basicAuth(user, password string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// push writes img (a v1.Image or v1.ImageIndex) to repo:tag and returns
// the reference.
func (r *testRegistry) push(t *testing.T, repoTag string, img any, auth authn.Authenticator) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	nref, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{}
	if auth != nil {
		opts = append(opts, remote.WithAuth(auth))
	}
	switch x := img.(type) {
	case v1.Image:
		err = remote.Write(nref, x, opts...)
	case v1.ImageIndex:
		err = remote.WriteIndex(nref, x, opts...)
	default:
		t.Fatalf("push %T", img)
	}
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func digestOf(t *testing.T, img interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// index returns an index of imgs, each listed with its platform.
func index(t *testing.T, imgs ...v1.Image) v1.ImageIndex {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: cf.Platform()}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}

// trust returns the options of a pull that trusts r, as the operator
// names a registry on loopback.
func (r *testRegistry) trust() PullOptions { return PullOptions{Trusted: []string{r.host}} }
