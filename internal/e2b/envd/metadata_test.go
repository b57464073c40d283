package envd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// newLiveFixture is a fixture whose sandbox runs: its guest is the real
// agent in this process (sandboxtest), on this host's filesystem. dir is
// a directory there for the test's files, on a filesystem that keeps
// user extended attributes as the guest's ext4 does (a host whose
// temporary directory keeps none is Lacking).
func newLiveFixture(t *testing.T) (f *fixture, dir string) {
	t.Helper()
	dir = testenv.XattrDir(t)
	ctx := context.Background()
	dd := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dd.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(testLog{t}, nil))
	rt := sandboxtest.New(t, dd)
	if _, err := rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(ctx, service.Config{Dir: dd, Runtime: service.RuntimeOf(rt), Store: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	key, err := svc.EnsureAdminKey(ctx, dd.Root+"/admin.key")
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.Authenticate(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	so, err := svc.CreateSandbox(ctx, p, apiv1.CreateSandbox{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if op, err := svc.GetOperation(ctx, p, so.Operation.ID, 10*time.Second); err != nil || op.Status != apiv1.OpSucceeded {
		t.Fatalf("create: %+v, %v", op, err)
	}
	sbx := so.Sandbox.ID
	f = &fixture{svc: svc, srv: New(svc, svc.Commands(), log), p: p, sbx: sbx, token: svc.SandboxAccessToken(sbx)}
	f.srv.poll = 20 * time.Millisecond
	t.Cleanup(f.srv.Close)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.srv.Serve(w, r, Request{Principal: p, SandboxID: sbx, Authorized: svc.CheckSandboxAccessToken(sbx, r.Header.Get("X-Access-Token"))})
	}))
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f, dir
}

// gotEntry is what the tests read of an EntryInfo.
type gotEntry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata"`
}

// multipartBody is a form with a part named "file" for each name, whose
// content is the name.
func multipartBody(t *testing.T, names ...string) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, n := range names {
		w, err := mw.CreateFormFile("file", n)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(n))
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), mw.FormDataContentType()
}

// The SDK's files.write(path, data, {metadata}): X-Metadata-* headers on
// POST /files, multipart or octet-stream, keep the metadata on each file
// written, with keys lowercased; the answer, Stat and ListDir show it.
func TestUploadMetadata(t *testing.T) {
	f, dir := newLiveFixture(t)
	want := map[string]string{"author": "mish", "purpose": "up load", "empty": ""}
	headers := []string{"X-Access-Token", f.token, "X-Metadata-Author", "mish", "x-metadata-PURPOSE", "up load", "X-Metadata-Empty", ""}

	type written struct {
		Path     string            `json:"path"`
		Metadata map[string]string `json:"metadata"`
	}
	check := func(what string, a answer, paths ...string) {
		t.Helper()
		var got []written
		if a.status != 200 || json.Unmarshal(a.body, &got) != nil || len(got) != len(paths) {
			t.Fatalf("%s: %d %s", what, a.status, a.body)
		}
		for i, w := range got {
			if w.Path != paths[i] || !maps.Equal(w.Metadata, want) {
				t.Errorf("%s: entry %d is %+v, want %s with %v", what, i, w, paths[i], want)
			}
		}
	}

	raw := filepath.Join(dir, "raw.txt")
	a := f.do(t, "POST", "/files?path="+raw, []byte("raw"), append(headers, "Content-Type", "application/octet-stream")...)
	check("octet-stream", a, raw)

	body, ctype := multipartBody(t, filepath.Join(dir, "a.txt"), filepath.Join(dir, "sub", "b.txt"))
	a = f.do(t, "POST", "/files", body, append(headers, "Content-Type", ctype)...)
	check("multipart", a, filepath.Join(dir, "a.txt"), filepath.Join(dir, "sub", "b.txt"))

	var stat struct{ Entry gotEntry }
	if a := f.unary(t, "/filesystem.Filesystem/Stat", fmt.Sprintf(`{"path":%q}`, raw)); a.status != 200 || json.Unmarshal(a.body, &stat) != nil {
		t.Fatalf("stat: %d %s", a.status, a.body)
	}
	if !maps.Equal(stat.Entry.Metadata, want) {
		t.Errorf("stat: metadata %v, want %v", stat.Entry.Metadata, want)
	}
	var list struct{ Entries []gotEntry }
	if a := f.unary(t, "/filesystem.Filesystem/ListDir", fmt.Sprintf(`{"path":%q,"depth":2}`, dir)); a.status != 200 || json.Unmarshal(a.body, &list) != nil {
		t.Fatalf("list: %d %s", a.status, a.body)
	}
	seen := map[string]map[string]string{}
	for _, e := range list.Entries {
		seen[e.Name] = e.Metadata
	}
	for _, n := range []string{"raw.txt", "a.txt", "b.txt"} {
		if !maps.Equal(seen[n], want) {
			t.Errorf("list: %s has metadata %v, want %v", n, seen[n], want)
		}
	}
	if seen["sub"] != nil {
		t.Errorf("list: the directory has metadata %v", seen["sub"])
	}

	// A link to a file reads as the file, metadata and all, as through
	// envd.
	if err := os.Symlink(raw, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if a := f.unary(t, "/filesystem.Filesystem/Stat", fmt.Sprintf(`{"path":%q}`, filepath.Join(dir, "link"))); a.status != 200 ||
		json.Unmarshal(a.body, &stat) != nil || !maps.Equal(stat.Entry.Metadata, want) {
		t.Errorf("stat of a link: %d %s", a.status, a.body)
	}

	// Without metadata headers the answer has none, and the file written
	// again loses what it had.
	a = f.do(t, "POST", "/files?path="+raw, []byte("again"), "X-Access-Token", f.token, "Content-Type", "application/octet-stream")
	if a.status != 200 || strings.Contains(string(a.body), "metadata") {
		t.Fatalf("upload without metadata: %d %s", a.status, a.body)
	}
	if a := f.unary(t, "/filesystem.Filesystem/Stat", fmt.Sprintf(`{"path":%q}`, raw)); a.status != 200 || strings.Contains(string(a.body), "metadata") {
		t.Errorf("stat after an upload without metadata: %d %s", a.status, a.body)
	}
}

// Bad metadata is a 400 naming the key, before anything is written.
func TestUploadMetadataRefused(t *testing.T) {
	f, dir := newLiveFixture(t)
	many := []string{}
	for i := range 65 {
		many = append(many, fmt.Sprintf("X-Metadata-K%d", i), "v")
	}
	tests := []struct {
		name    string
		headers []string
		says    string
	}{
		{"empty key", []string{"X-Metadata-", "v"}, "empty"},
		{"control character in value", []string{"X-Metadata-Note", "tab\there"}, `"note"`},
		{"non-ASCII value", []string{"X-Metadata-Note", "caf\xc3\xa9"}, `"note"`},
		{"long key", []string{"X-Metadata-" + strings.Repeat("k", 201), "v"}, "longer than 200"},
		{"too large", []string{"X-Metadata-Big", strings.Repeat("v", 3990)}, "at most 4000"},
		{"too many", many, "65 metadata keys"},
		{"twice", []string{"X-Metadata-Dup", "1", "X-Metadata-Dup", "2"}, `"dup" is given more than once`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := filepath.Join(dir, "new", "file.txt")
			for _, mode := range []string{"octet-stream", "multipart"} {
				body, ctype := []byte("data"), "application/octet-stream"
				q := "?path=" + target
				if mode == "multipart" {
					body, ctype = multipartBody(t, target)
					q = ""
				}
				req, err := http.NewRequest("POST", f.url+"/files"+q, bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-Access-Token", f.token)
				req.Header.Set("Content-Type", ctype)
				for i := 0; i+1 < len(tt.headers); i += 2 {
					req.Header.Add(tt.headers[i], tt.headers[i+1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				var e struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				}
				derr := json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if resp.StatusCode != 400 || derr != nil || e.Code != 400 || !strings.Contains(e.Message, tt.says) {
					t.Errorf("%s: %d %+v, want 400 saying %q", mode, resp.StatusCode, e, tt.says)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
				t.Fatalf("a refused upload made its directory: %v", err)
			}
		})
	}
}

// watchDir({includeEntry: true, allowNetworkMounts: true}), which SDKs
// send from envd 0.6.3 and 0.6.4: the flag is accepted, and each event
// carries its entry, metadata included.
func TestWatchIncludeEntry(t *testing.T) {
	f, dir := newLiveFixture(t)
	path := filepath.Join(dir, "w.txt")
	write, err := http.NewRequest("POST", f.url+"/files?path="+path, strings.NewReader("hi"))
	if err != nil {
		t.Fatal(err)
	}
	write.Header.Set("X-Access-Token", f.token)
	write.Header.Set("Content-Type", "application/octet-stream")
	write.Header.Set("X-Metadata-Step", "one")
	go func() {
		time.Sleep(300 * time.Millisecond)
		// A failed write shows as no event below.
		if resp, err := http.DefaultClient.Do(write); err == nil {
			resp.Body.Close()
		}
	}()
	req := appendEnvelope(nil, 0, []byte(fmt.Sprintf(`{"path":%q,"recursive":false,"includeEntry":true,"allowNetworkMounts":true}`, dir)))
	status, msgs, end := f.stream(t, "/filesystem.Filesystem/WatchDir", req, "Connect-Timeout-Ms", "1500")
	if status != 200 || len(msgs) == 0 || msgs[0] != `{"start":{}}` {
		t.Fatalf("status %d, messages %q, end %s", status, msgs, end)
	}
	for _, m := range msgs[1:] {
		var r struct {
			Filesystem *struct {
				Name  string    `json:"name"`
				Type  string    `json:"type"`
				Entry *gotEntry `json:"entry"`
			} `json:"filesystem"`
		}
		if err := json.Unmarshal([]byte(m), &r); err != nil {
			t.Fatal(err)
		}
		if ev := r.Filesystem; ev != nil && ev.Name == "w.txt" && ev.Type == eventCreate {
			if ev.Entry == nil || ev.Entry.Path != path || ev.Entry.Type != fileTypeFile || ev.Entry.Metadata["step"] != "one" {
				t.Fatalf("create event %s: want the entry with its metadata", m)
			}
			return
		}
	}
	t.Fatalf("no create event for w.txt in %q (end %s)", msgs, end)
}
