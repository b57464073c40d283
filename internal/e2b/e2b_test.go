package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/checkpoint"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/usage"
)

// These tests run the E2B API over a real transport against a real
// service with a real store and runtime, on a data directory that has no
// templates and boots no VM: enough for everything but a sandbox that
// runs. Sandboxes in a given state are rows written into the store, as a
// server that made them would have left them.

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// fakeEnvd records the envd requests it is handed.
type fakeEnvd struct {
	mu   sync.Mutex
	reqs []envd.Request
}

func (f *fakeEnvd) Serve(w http.ResponseWriter, r *http.Request, req envd.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	w.Header().Set("X-Fake-Envd", r.URL.Path)
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeEnvd) last(t *testing.T) envd.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("envd got no request")
	}
	return f.reqs[len(f.reqs)-1]
}

type testServer struct {
	url    string
	svc    *service.Service
	cps    *checkpoint.Service
	st     *store.Store
	envd   *fakeEnvd
	admin  string // API keys
	alice  string
	bob    string
	aliceP service.Principal
	bobP   service.Principal
}

const testDomain = "e2b.test"

func newTestServer(t *testing.T, opts ...func(*Config)) *testServer {
	t.Helper()
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	// Boot artifacts the runtime checks for; no VM is started with them.
	for _, p := range []string{dir.Kernel(), dir.Initramfs(), guest.ManifestPath(dir)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("not used"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs)
		}
	})
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: dir, Accel: "tcg", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(rt), Store: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	admin, err := svc.EnsureAdminKey(ctx, dir.AdminKey())
	if err != nil {
		t.Fatal(err)
	}
	ap, err := svc.Authenticate(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{svc: svc, st: st, envd: &fakeEnvd{}, admin: admin}
	for _, u := range []struct {
		name string
		key  *string
		p    *service.Principal
	}{{"alice", &ts.alice, &ts.aliceP}, {"bob", &ts.bob, &ts.bobP}} {
		k, err := svc.CreateKey(ctx, ap, apiv1.CreateKey{Name: u.name, Role: apiv1.RoleUser, Format: apiv1.KeyFormatE2B})
		if err != nil {
			t.Fatal(err)
		}
		*u.key = k.Key
		if *u.p, err = svc.Authenticate(ctx, k.Key); err != nil {
			t.Fatal(err)
		}
	}
	ts.cps = checkpoint.New(checkpoint.Config{Store: st, Sandboxes: svc, Log: log})
	cfg := Config{Service: svc, Checkpoints: ts.cps, Log: log, Domain: testDomain, Envd: ts.envd, WaitTimeout: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	ts.url = hs.URL
	return ts
}

// row records a sandbox of owner in state, as if this server had made it.
func (ts *testServer) row(t *testing.T, owner service.Principal, state string, edit ...func(*store.Sandbox)) string {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	exp := now.Add(time.Hour)
	sb := store.Sandbox{
		ID: ids.New("sbx"), Owner: owner.KeyID, State: state,
		TemplateRef: "base:latest", TemplateDigest: "sha256:" + strings.Repeat("ab", 32),
		VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096, TimeoutS: 3600, OnTimeout: "delete",
		Metadata: map[string]string{}, Network: json.RawMessage(`{"egress":"allow"}`),
		CreatedAt: now, ExpiresAt: &exp,
	}
	for _, e := range edit {
		e(&sb)
	}
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID,
		Status: apiv1.OpSucceeded, CreatedAt: now, FinishedAt: &now}
	if err := ts.st.InsertSandbox(context.Background(), sb, op); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with key in X-API-Key (none when ""), body as is,
// and header pairs.
func (ts *testServer) do(t *testing.T, method, path, key, body string, header ...string) answer {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if strings.EqualFold(header[i], "Host") {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// must sends a request that must answer status and decodes its body into
// out when out is not nil.
func (ts *testServer) must(t *testing.T, status int, method, path, key, body string, out any) answer {
	t.Helper()
	a := ts.do(t, method, path, key, body)
	if a.status != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.body, status)
	}
	if out != nil {
		if err := json.Unmarshal(a.body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, a.body)
		}
	}
	return a
}

// e2bError checks that a is an error in E2B's shape with status and a
// message holding every one of want.
func e2bError(t *testing.T, a answer, status int, want ...string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d (%s), want %d", a.status, a.body, status)
	}
	var e map[string]any
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", a.body, err)
	}
	if code, ok := e["code"].(float64); !ok || int(code) != status {
		t.Errorf("body code %v, want %d: %s", e["code"], status, a.body)
	}
	msg, _ := e["message"].(string)
	if msg == "" {
		t.Errorf("body has no message: %s", a.body)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q does not say %q", msg, w)
		}
	}
}

func TestAuth(t *testing.T) {
	ts := newTestServer(t)
	e2bError(t, ts.do(t, "GET", "/v2/sandboxes", "", ""), 401, "X-API-Key")
	e2bError(t, ts.do(t, "GET", "/v2/sandboxes", "e2b_"+strings.Repeat("0", 40), ""), 401, "not valid")
	e2bError(t, ts.do(t, "GET", "/v2/sandboxes", "e2b_nothex", ""), 401)
	e2bError(t, ts.do(t, "GET", "/v2/sandboxes", "", "", "Authorization", "Bearer "+ts.alice), 401, "X-API-Key")
	// Routes E2B does not have, or airlock does not serve, still want a key.
	e2bError(t, ts.do(t, "POST", "/v3/templates", "", "{}"), 401)
	e2bError(t, ts.do(t, "POST", "/sandboxes", "", `{"templateID":"base"}`), 401)

	// The header's name is not case-sensitive (the JS SDK sends X-API-KEY).
	for _, name := range []string{"X-API-KEY", "x-api-key", "X-Api-Key"} {
		a := ts.do(t, "GET", "/v2/sandboxes", "", "", name, ts.alice)
		if a.status != 200 || strings.TrimSpace(string(a.body)) != "[]" {
			t.Errorf("%s: %d %s, want 200 []", name, a.status, a.body)
		}
	}
	// A native-format key works too, with its tenancy.
	ts.must(t, 200, "GET", "/v2/sandboxes", ts.admin, "", nil)
	// /health needs no key.
	if a := ts.do(t, "GET", "/health", "", ""); a.status != http.StatusNoContent {
		t.Errorf("GET /health: %d %s", a.status, a.body)
	}
}

func TestErrorShapes(t *testing.T) {
	ts := newTestServer(t)
	e2bError(t, ts.do(t, "GET", "/nope", ts.alice, ""), 404, "no route")
	e2bError(t, ts.do(t, "GET", "/sandboxes/../keys", ts.alice, ""), 404)
	a := ts.do(t, "PATCH", "/sandboxes", ts.alice, "")
	e2bError(t, a, 405, "GET or POST")
	if a.header.Get("Allow") != "GET, POST" {
		t.Errorf("Allow %q", a.header.Get("Allow"))
	}
	for _, c := range []struct{ method, path, want string }{
		{"POST", "/v3/templates", "template builds"},
		{"GET", "/templates", "template builds"},
		{"GET", "/templates/aliases/base", "template builds"},
		{"POST", "/v2/templates/x/builds/y", "template builds"},
		{"PUT", "/snapshots", "snapshot route"},
		{"GET", "/snapshots/x/y", "snapshot route"},
		{"GET", "/templates/base", "template builds"},
		{"DELETE", "/templates/base", "template builds"},
		{"POST", "/volumes", "volumes"},
		{"GET", "/sandboxes/metrics?sandbox_ids=a", "metrics of many sandboxes"},
	} {
		e2bError(t, ts.do(t, c.method, c.path, ts.alice, "{}"), 501, c.want)
	}
}

func TestCreateBadInput(t *testing.T) {
	ts := newTestServer(t)
	for _, c := range []struct {
		name, path, body string
		status           int
		want             []string
	}{
		{"malformed JSON", "/sandboxes", `{"templateID":`, 400, []string{"ends early"}},
		{"not JSON", "/v2/sandboxes", `templateID=base`, 400, []string{"not valid JSON"}},
		{"not an object", "/v2/sandboxes", `["base"]`, 400, []string{"JSON object"}},
		{"empty body", "/v2/sandboxes", ``, 400, []string{"empty"}},
		{"trailing data", "/v2/sandboxes", `{"templateID":"base"} {}`, 400, []string{"after its JSON"}},
		{"unknown field", "/v2/sandboxes", `{"templateID":"base","cpuCount":4}`, 400, []string{`"cpuCount"`}},
		{"unknown nested field", "/v2/sandboxes", `{"templateID":"base","network":{"allowIn":[]}}`, 400, []string{`"allowIn"`}},
		{"wrong type", "/v2/sandboxes", `{"templateID":"base","timeout":"300"}`, 400, []string{`"timeout"`, "integer"}},
		{"no template", "/v2/sandboxes", `{"timeout":60}`, 400, []string{"templateID is required"}},
		{"zero timeout", "/sandboxes", `{"templateID":"base","timeout":0}`, 400, []string{"timeout 0"}},
		{"negative timeout", "/v2/sandboxes", `{"templateID":"base","timeout":-5}`, 400, []string{"timeout -5"}},
		{"autoPauseMemory false", "/v2/sandboxes", `{"templateID":"base","autoPause":true,"autoPauseMemory":false}`, 400, []string{"autoPauseMemory"}},
		{"mcp", "/v2/sandboxes", `{"templateID":"base","mcp":{"github":{}}}`, 400, []string{"mcp"}},
		{"iam", "/v2/sandboxes", `{"templateID":"base","iam":{"tokens":{"t":{"audience":"a","tokenType":"JWT-SVID"}}}}`, 400, []string{"iam"}},
		{"volumes", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`, 400, []string{"volumeMounts"}},
		{"private traffic", "/v2/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, 400, []string{"allowPublicTraffic"}},
		{"egress proxy", "/v2/sandboxes", `{"templateID":"base","network":{"egressProxy":{"address":"p:1080"}}}`, 400, []string{"egressProxy"}},
		{"mask host", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":"x"}}`, 400, []string{"maskRequestHost"}},
		{"rules", "/v2/sandboxes", `{"templateID":"base","network":{"rules":{"api.example.com":[{"transform":{"headers":{"A":"b"}}}]}}}`, 400, []string{"network.rules"}},
		{"https ports", "/v2/sandboxes", `{"templateID":"base","network":{"httpsPorts":[3000]}}`, 400, []string{"httpsPorts"}},
		{"deny domain", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["evil.example"]}}`, 400, []string{"network.denyOut[0]", "CIDR"}},
		{"allow domain alone", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["pypi.org"]}}`, 400, []string{"network.allowOut[0]", "0.0.0.0/0"}},
		{"ipv6", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["::/0"]}}`, 400, []string{"IPv6"}},
		{"port", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["1.2.3.4:443"],"denyOut":["0.0.0.0/0"]}}`, 400, []string{"port"}},
		{"bad metadata key", "/v2/sandboxes", `{"templateID":"base","metadata":{"a b":"c"}}`, 400, []string{"metadata"}},
		{"unknown template", "/v2/sandboxes", `{"templateID":"nope"}`, 404, []string{`"nope:latest" not found`}},
		{"bad template name", "/v2/sandboxes", `{"templateID":"team/My Template"}`, 400, []string{"team/My Template"}},
		{"code interpreter", "/v2/sandboxes", `{"templateID":"code-interpreter-v1"}`, 404, []string{`"code-interpreter:latest" not found`}},
		{"v1 body of Python 2.34", "/sandboxes", `{"templateID":"base","allow_internet_access":true,"autoPause":false,"autoResume":{"enabled":false},"envVars":{},"metadata":{},"secure":true,"timeout":300}`, 404, []string{`"base:latest" not found`}},
		{"v1 secure false", "/sandboxes", `{"templateID":"base","secure":false,"timeout":300}`, 404, []string{"not found"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e2bError(t, ts.do(t, "POST", c.path, ts.alice, c.body), c.status, c.want...)
		})
	}
	// Nothing was made by any of them.
	all, err := ts.svc.ListSandboxes(context.Background(), service.Principal{Role: apiv1.RoleAdmin}, service.SandboxFilter{})
	if err != nil || len(all.Items) != 0 {
		t.Errorf("sandboxes after bad creates: %v %v", all.Items, err)
	}
}

// TestCreateChunked sends create bodies without a Content-Length, as the
// JS SDK 2.51 does.
func TestCreateChunked(t *testing.T) {
	ts := newTestServer(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	fmt.Fprintf(conn, "POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\ncontent-type: application/json\r\n"+
		"transfer-encoding: chunked\r\n\r\n%s%s0\r\n\r\n", ts.alice, chunk(`{"templateID":`), chunk(`"code-interpreter-v1"}`))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// The whole body was read: the template it names is the one refused.
	e2bError(t, answer{resp.StatusCode, resp.Header, b}, 404, "code-interpreter")
}

func TestTenancy(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + id, ""},
		{"DELETE", "/sandboxes/" + id, ""},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":60}`},
		{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":60}`},
		{"POST", "/sandboxes/" + id + "/pause", `{}`},
		{"POST", "/sandboxes/" + id + "/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{}`},
		{"POST", "/sandboxes/" + id + "/resume", `{}`},
		{"PUT", "/sandboxes/" + id + "/network", `{}`},
		{"GET", "/sandboxes/" + id + "/metrics", ""},
		{"GET", "/sandboxes/" + id + "/logs", ""},
		{"GET", "/v2/sandboxes/" + id + "/logs", ""},
		{"POST", "/sandboxes/" + id + "/fork", `{"count":2}`},
		{"POST", "/sandboxes/" + id + "/snapshots", `{"name":"x"}`},
	} {
		t.Run(c.method+" "+strings.TrimPrefix(c.path, "/sandboxes/"+id), func(t *testing.T) {
			// Bob's answer is the same as for a sandbox that does not exist.
			e2bError(t, ts.do(t, c.method, c.path, ts.bob, c.body), 404, "not found")
			missing := strings.Replace(c.path, id, "sbx"+strings.Repeat("z", 20), 1)
			e2bError(t, ts.do(t, c.method, missing, ts.alice, c.body), 404, "not found")
		})
	}
	var list []ListedSandbox
	ts.must(t, 200, "GET", "/v2/sandboxes", ts.bob, "", &list)
	if len(list) != 0 {
		t.Errorf("bob lists %+v", list)
	}
	ts.must(t, 200, "GET", "/sandboxes", ts.bob, "", &list)
	if len(list) != 0 {
		t.Errorf("bob lists %+v", list)
	}
	ts.must(t, 200, "GET", "/v2/sandboxes", ts.alice, "", &list)
	if len(list) != 1 || list[0].SandboxID != id {
		t.Errorf("alice lists %+v", list)
	}
	ts.must(t, 200, "GET", "/v2/sandboxes", ts.admin, "", &list)
	if len(list) != 1 {
		t.Errorf("admin lists %+v", list)
	}
	// Alice's sandbox is untouched by Bob's tries.
	sb, err := ts.svc.GetSandbox(context.Background(), ts.aliceP, id)
	if err != nil || sb.State != apiv1.StateRunning {
		t.Errorf("after bob: %+v %v", sb, err)
	}
}

func TestGet(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning, func(sb *store.Sandbox) {
		sb.Metadata = map[string]string{"app": "demo"}
		sb.OnTimeout = "suspend"
		sb.Network = json.RawMessage(`{"egress":"deny","allow":["pypi.org"]}`)
	})
	var d map[string]any
	ts.must(t, 200, "GET", "/sandboxes/"+id, ts.alice, "", &d)
	want := map[string]any{
		"sandboxID": id, "templateID": "base", "alias": "base", "clientID": clientID,
		"state": "running", "cpuCount": 2.0, "memoryMB": 1024.0, "diskSizeMB": 4096.0,
		"envdVersion": DefaultEnvdVersion, "envdAccessToken": ts.svc.SandboxAccessToken(id),
		"domain": testDomain,
	}
	for k, v := range want {
		if d[k] != v {
			t.Errorf("%s = %v, want %v", k, d[k], v)
		}
	}
	if md, _ := d["metadata"].(map[string]any); md["app"] != "demo" {
		t.Errorf("metadata %v", d["metadata"])
	}
	if lc, _ := d["lifecycle"].(map[string]any); lc["onTimeout"] != "pause" || lc["autoResume"] != false {
		t.Errorf("lifecycle %v", d["lifecycle"])
	}
	net, _ := d["network"].(map[string]any)
	if b, _ := json.Marshal(net); string(b) != `{"allowOut":["pypi.org"],"allowPublicTraffic":true,"denyOut":["0.0.0.0/0"]}` {
		t.Errorf("network %s", b)
	}
	end, err := time.Parse(time.RFC3339, d["endAt"].(string))
	if err != nil || time.Until(end) < 59*time.Minute || time.Until(end) > 61*time.Minute {
		t.Errorf("endAt %v %v", d["endAt"], err)
	}

	// Without a lease, endAt is far away; a suspended sandbox is paused.
	id2 := ts.row(t, ts.aliceP, apiv1.StateSuspended, func(sb *store.Sandbox) { sb.ExpiresAt, sb.TimeoutS = nil, 0 })
	var d2 SandboxDetail
	ts.must(t, 200, "GET", "/sandboxes/"+id2, ts.alice, "", &d2)
	if d2.State != "paused" || d2.EndAt.Year() != 9999 || d2.Lifecycle.OnTimeout != "kill" || d2.Lifecycle.AutoResume {
		t.Errorf("suspended: %+v", d2)
	}
	// One that wakes on request resumes on traffic: autoResume.
	id5 := ts.row(t, ts.aliceP, apiv1.StateSuspended, func(sb *store.Sandbox) { sb.OnTimeout, sb.WakeOnRequest = "suspend", true })
	var d5 SandboxDetail
	ts.must(t, 200, "GET", "/sandboxes/"+id5, ts.alice, "", &d5)
	if d5.Lifecycle != (lifecycle{AutoResume: true, OnTimeout: "pause"}) {
		t.Errorf("lifecycle of one that resumes on traffic: %+v", d5.Lifecycle)
	}
	// Deleted and failed sandboxes are gone, the failed one saying why.
	id3 := ts.row(t, ts.aliceP, apiv1.StateDeleted)
	e2bError(t, ts.do(t, "GET", "/sandboxes/"+id3, ts.alice, ""), 404, "not found")
	id4 := ts.row(t, ts.aliceP, apiv1.StateFailed, func(sb *store.Sandbox) {
		sb.LastError = &store.Error{Code: "internal", Message: "the VM exited"}
	})
	e2bError(t, ts.do(t, "GET", "/sandboxes/"+id4, ts.alice, ""), 404, "the VM exited")
}

func TestList(t *testing.T) {
	ts := newTestServer(t)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	at := func(i int, md map[string]string) func(*store.Sandbox) {
		return func(sb *store.Sandbox) { sb.CreatedAt, sb.Metadata = base.Add(time.Duration(i)*time.Minute), md }
	}
	r0 := ts.row(t, ts.aliceP, apiv1.StateRunning, at(0, map[string]string{"app": "a b&c=d", "team": "x"}))
	r1 := ts.row(t, ts.aliceP, apiv1.StateRunning, at(1, map[string]string{"app": "other"}))
	p2 := ts.row(t, ts.aliceP, apiv1.StatePaused, at(2, nil))
	s3 := ts.row(t, ts.aliceP, apiv1.StateSuspended, at(3, map[string]string{"app": "a b&c=d"}))
	ts.row(t, ts.aliceP, apiv1.StateDeleted, at(4, nil))
	ts.row(t, ts.aliceP, apiv1.StateFailed, at(5, nil))
	ts.row(t, ts.aliceP, apiv1.StateCreating, at(6, nil))
	ts.row(t, ts.bobP, apiv1.StateRunning, at(7, nil))

	ids := func(list []ListedSandbox) []string {
		out := []string{}
		for _, l := range list {
			out = append(out, l.SandboxID)
		}
		return out
	}
	check := func(query string, want ...string) answer {
		t.Helper()
		var list []ListedSandbox
		a := ts.must(t, 200, "GET", "/v2/sandboxes"+query, ts.alice, "", &list)
		if got := ids(list); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", query, got, want)
		}
		return a
	}
	a := check("", s3, p2, r1, r0) // newest first
	if a.header.Get("X-Total-Running") != "2" || a.header.Get("X-Next-Token") != "" {
		t.Errorf("headers %v", a.header)
	}
	check("?order=asc", r0, r1, p2, s3)
	check("?state=running", r1, r0)
	check("?state=paused", s3, p2)
	check("?state=running,paused", s3, p2, r1, r0)
	check("?state=running&state=paused", s3, p2, r1, r0)
	check("?template=base", s3, p2, r1, r0)
	check("?template=code-interpreter-v1")
	check("?startedAfter="+url.QueryEscape(base.Add(90*time.Second).Format(time.RFC3339Nano)), s3, p2)
	check("?source=ci", s3, p2, r1, r0) // unknown parameters are E2B's SDK's own

	// Metadata as the SDKs encode it: each key and value encoded, the
	// pairs joined, and the whole encoded again as the query value.
	md := url.Values{}
	md.Set(url.QueryEscape("app"), url.QueryEscape("a b&c=d"))
	check("?metadata="+url.QueryEscape(md.Encode()), s3, r0)
	md.Set(url.QueryEscape("team"), url.QueryEscape("x"))
	check("?metadata="+url.QueryEscape(md.Encode()), r0)
	check("?metadata=" + url.QueryEscape("app=other") + "&state=paused")

	// Pages.
	a = check("?limit=3", s3, p2, r1)
	next := a.header.Get("X-Next-Token")
	if next == "" {
		t.Fatal("no X-Next-Token on a full page")
	}
	a = check("?limit=3&nextToken="+url.QueryEscape(next), r0)
	if a.header.Get("X-Next-Token") != "" {
		t.Errorf("X-Next-Token on the last page")
	}
	a = check("?limit=1&order=asc", r0)
	check("?limit=2&order=asc&nextToken="+url.QueryEscape(a.header.Get("X-Next-Token")), r1, p2)

	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?state=killed", "?order=up",
		"?nextToken=garbage", "?startedAfter=yesterday", "?metadata=%zz"} {
		e2bError(t, ts.do(t, "GET", "/v2/sandboxes"+q, ts.alice, ""), 400)
	}

	// The old list: running ones only, with a metadata filter.
	var list []ListedSandbox
	ts.must(t, 200, "GET", "/sandboxes", ts.alice, "", &list)
	if got := ids(list); strings.Join(got, ",") != r1+","+r0 {
		t.Errorf("GET /sandboxes: %v", got)
	}
	ts.must(t, 200, "GET", "/sandboxes?metadata="+url.QueryEscape("app=other"), ts.alice, "", &list)
	if got := ids(list); strings.Join(got, ",") != r1 {
		t.Errorf("GET /sandboxes by metadata: %v", got)
	}
	for _, l := range list {
		if l.ClientID != clientID || l.State != "running" || l.EnvdVersion == "" || l.TemplateID != "base" {
			t.Errorf("listed %+v", l)
		}
	}
}

func TestTimeoutAndRefresh(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	expiry := func() time.Duration {
		t.Helper()
		sb, err := ts.svc.GetSandbox(context.Background(), ts.aliceP, id)
		if err != nil || sb.ExpiresAt == nil {
			t.Fatalf("%+v %v", sb, err)
		}
		return time.Until(*sb.ExpiresAt)
	}
	ts.must(t, 204, "POST", "/sandboxes/"+id+"/timeout", ts.alice, `{"timeout":60}`, nil)
	if e := expiry(); e < 55*time.Second || e > 61*time.Second {
		t.Errorf("after timeout 60: expires in %v", e)
	}
	// A refresh never shortens the lease; it lengthens it.
	ts.must(t, 204, "POST", "/sandboxes/"+id+"/refreshes", ts.alice, `{"duration":10}`, nil)
	if e := expiry(); e < 55*time.Second {
		t.Errorf("refresh 10 shortened the lease to %v", e)
	}
	ts.must(t, 204, "POST", "/sandboxes/"+id+"/refreshes", ts.alice, `{"duration":600}`, nil)
	if e := expiry(); e < 595*time.Second || e > 601*time.Second {
		t.Errorf("after refresh 600: expires in %v", e)
	}
	// setTimeout shortens it.
	ts.must(t, 204, "POST", "/sandboxes/"+id+"/timeout", ts.alice, `{"timeout":30}`, nil)
	if e := expiry(); e > 31*time.Second {
		t.Errorf("after timeout 30: expires in %v", e)
	}
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/timeout", ts.alice, `{"timeout":0}`), 400, "timeout 0")
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/timeout", ts.alice, `{}`), 400, "timeout is required")
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/timeout", ts.alice, ``), 400, "empty")
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/refreshes", ts.alice, `{"duration":3601}`), 400, "3600")
}

func TestConnectRunning(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	var sb Sandbox
	ts.must(t, 200, "POST", "/v2/sandboxes/"+id+"/connect", ts.alice, ``, &sb)
	if sb.SandboxID != id || sb.EnvdAccessToken != ts.svc.SandboxAccessToken(id) || sb.ClientID != clientID ||
		sb.EnvdVersion != DefaultEnvdVersion || sb.Domain == nil || *sb.Domain != testDomain || sb.TemplateID != "base" {
		t.Errorf("connect: %+v", sb)
	}
	lease := func() time.Duration {
		v, err := ts.svc.GetSandbox(context.Background(), ts.aliceP, id)
		if err != nil {
			t.Fatal(err)
		}
		return time.Until(*v.ExpiresAt)
	}
	// The hour-long lease is not shortened by a 300 s connect...
	if l := lease(); l < 59*time.Minute {
		t.Errorf("connect shortened the lease to %v", l)
	}
	// ...and is lengthened by a longer one.
	ts.must(t, 200, "POST", "/sandboxes/"+id+"/connect", ts.alice, `{"timeout":7200}`, &sb)
	if l := lease(); l < 119*time.Minute {
		t.Errorf("connect 7200: lease %v", l)
	}
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/connect", ts.alice, `{}`), 400, "timeout is required")
	e2bError(t, ts.do(t, "POST", "/v2/sandboxes/"+id+"/connect", ts.alice, `{"memory":false}`), 400, "memory: false")
	e2bError(t, ts.do(t, "POST", "/v2/sandboxes/"+id+"/connect", ts.alice, `{"timeout":0}`), 400, "timeout 0")
	// resume is for paused sandboxes only.
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/resume", ts.alice, `{"timeout":60}`), 409, "already running")
}

func TestPause(t *testing.T) {
	ts := newTestServer(t)
	for _, st := range []string{apiv1.StateSuspended, apiv1.StateSuspending} {
		id := ts.row(t, ts.aliceP, st)
		e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/pause", ts.alice, ``), 409, "already paused")
	}
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/pause", ts.alice, `{"memory":false}`), 400, "memory: false")
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+id+"/pause", ts.alice, `{"memory":true,"x":1}`), 400, `"x"`)
}

func TestKill(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	a := ts.do(t, "DELETE", "/sandboxes/"+id, ts.alice, "")
	if a.status != 204 || len(a.body) != 0 {
		t.Fatalf("kill: %d %s", a.status, a.body)
	}
	sb, err := ts.svc.GetSandbox(context.Background(), ts.aliceP, id)
	if err != nil || sb.State != apiv1.StateDeleted {
		t.Errorf("after kill: %s %v", sb.State, err)
	}
	// Killed again, or looked up: not found, which the SDK turns into false.
	e2bError(t, ts.do(t, "DELETE", "/sandboxes/"+id, ts.alice, ""), 404, "not found")
	e2bError(t, ts.do(t, "GET", "/sandboxes/"+id, ts.alice, ""), 404, "not found")
	e2bError(t, ts.do(t, "DELETE", "/sandboxes/nonsense-id", ts.alice, ""), 404, "not found")
}

func TestSetNetworkInput(t *testing.T) {
	ts := newTestServer(t)
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	for _, c := range []struct{ body, want string }{
		{`{"rules":{"a.example":[{}]}}`, "rules"},
		{`{"egressProxy":{"address":"p:1"}}`, "egressProxy"},
		{`{"denyOut":["x.example"]}`, "network.denyOut[0]"},
		{`{"allowOut":["x.example"]}`, "network.allowOut[0]"},
		{`{"allowPublicTraffic":false}`, `"allowPublicTraffic"`},
		{``, "empty"},
	} {
		e2bError(t, ts.do(t, "PUT", "/sandboxes/"+id+"/network", ts.alice, c.body), 400, c.want)
	}
}

// nobody is a usage source with no sandboxes: samples come by Add.
type nobody struct{}

func (nobody) Sandboxes() map[string]bool { return nil }
func (nobody) Measure(context.Context, string) (usage.Sample, error) {
	return usage.Sample{}, errors.New("not measured")
}

func TestMetricsAndLogs(t *testing.T) {
	hist, err := usage.New(usage.Config{Source: nobody{}})
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, func(c *Config) { c.Usage = hist })
	id := ts.row(t, ts.aliceP, apiv1.StateRunning)
	other := ts.row(t, ts.aliceP, apiv1.StateRunning)
	const t0 = 1_700_000_000
	for i := range 4 {
		hist.Add(id, usage.Sample{Time: time.Unix(t0+5*int64(i), 0), CPUCount: 2, CPUUsedPct: 12.345, MemUsed: 100 << 20,
			MemTotal: 1 << 30, MemCache: 7 << 20, DiskUsed: 1 << 30, DiskTotal: 4 << 30})
	}
	hist.Add(other, usage.Sample{Time: time.Unix(t0, 0)})
	for _, c := range []struct {
		name, query string
		want        []int64 // timestampUnix of the samples answered
	}{
		{"no window", "", []int64{t0, t0 + 5, t0 + 10, t0 + 15}},
		{"start", fmt.Sprintf("?start=%d", t0+5), []int64{t0 + 5, t0 + 10, t0 + 15}},
		{"end", fmt.Sprintf("?end=%d", t0+5), []int64{t0, t0 + 5}},
		{"both, included", fmt.Sprintf("?start=%d&end=%d", t0+5, t0+10), []int64{t0 + 5, t0 + 10}},
		{"start equals end", fmt.Sprintf("?start=%d&end=%d", t0+10, t0+10), []int64{t0 + 10}},
		{"a past window", "?start=0&end=10", []int64{}},
		{"a future window", fmt.Sprintf("?start=%d", t0+16), []int64{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := ts.must(t, 200, "GET", "/sandboxes/"+id+"/metrics"+c.query, ts.alice, "", nil)
			var got []map[string]any
			if err := json.Unmarshal(a.body, &got); err != nil || got == nil {
				t.Fatalf("metrics %s: %v (want a list)", a.body, err)
			}
			var stamps []int64
			for _, m := range got {
				stamps = append(stamps, int64(m["timestampUnix"].(float64)))
			}
			if fmt.Sprint(stamps) != fmt.Sprint(c.want) && !(len(stamps) == 0 && len(c.want) == 0) {
				t.Fatalf("samples at %v, want %v: %s", stamps, c.want, a.body)
			}
			if len(got) > 0 {
				want := map[string]any{"timestamp": time.Unix(int64(got[0]["timestampUnix"].(float64)), 0).UTC().Format(time.RFC3339),
					"cpuCount": 2.0, "cpuUsedPct": 12.35, "memUsed": float64(100 << 20), "memTotal": float64(1 << 30),
					"memCache": float64(7 << 20), "diskUsed": float64(1 << 30), "diskTotal": float64(4 << 30)}
				for k, v := range want {
					if got[0][k] != v {
						t.Errorf("%s = %v, want %v", k, got[0][k], v)
					}
				}
			}
		})
	}
	// Bad windows are refused, naming what is wrong.
	for _, c := range []struct{ query, want string }{
		{"?start=soon", "unix seconds"},
		{"?end=-5", "unix seconds"},
		{"?start=1.5", "unix seconds"},
		{"?start=", "unix seconds"},
		{"?end=99999999999999999999", "unix seconds"},
		{"?end=253402300800", "unix seconds"},
		{"?start=1&start=2", "once"},
		{fmt.Sprintf("?start=%d&end=%d", t0+10, t0+5), "after end"},
	} {
		e2bError(t, ts.do(t, "GET", "/sandboxes/"+id+"/metrics"+c.query, ts.alice, ""), 400, c.want)
	}
	// Another tenant's sandbox is not found, its samples unread.
	e2bError(t, ts.do(t, "GET", "/sandboxes/"+id+"/metrics", ts.bob, ""), 404, "not found")
	// Without a history every list is empty.
	bare := newTestServer(t)
	if a := bare.must(t, 200, "GET", "/sandboxes/"+bare.row(t, bare.aliceP, apiv1.StateRunning)+"/metrics", bare.alice, "", nil); strings.TrimSpace(string(a.body)) != "[]" {
		t.Errorf("metrics without a history: %s", a.body)
	}
	// Logs are not kept: both routes say so, and where the output is.
	for _, path := range []string{"/sandboxes/" + id + "/logs", "/v2/sandboxes/" + id + "/logs?limit=10"} {
		if a := ts.must(t, 501, "GET", path, ts.alice, "", nil); !strings.Contains(string(a.body), "airlock-start.log") {
			t.Errorf("GET %s: %s", path, a.body)
		}
	}
}

func TestSandboxRouting(t *testing.T) {
	ts := newTestServer(t)
	running := ts.row(t, ts.aliceP, apiv1.StateRunning)
	suspended := ts.row(t, ts.aliceP, apiv1.StateSuspended)
	deleted := ts.row(t, ts.aliceP, apiv1.StateDeleted)
	token := ts.svc.SandboxAccessToken(running)
	unknown := "sbx" + strings.Repeat("q", 20)

	gateway := func(t *testing.T, a answer, id, msg string) {
		t.Helper()
		if a.status != 502 {
			t.Fatalf("status %d %s, want 502", a.status, a.body)
		}
		var e proxyError
		if err := json.Unmarshal(a.body, &e); err != nil || e.SandboxID != id || e.Code != 502 || !strings.Contains(e.Message, msg) {
			t.Errorf("body %s (%v), want sandbox %s, code 502, %q", a.body, err, id, msg)
		}
	}
	// Unknown, deleted or malformed sandboxes: E2B's proxy answer.
	gateway(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Id", unknown, "E2b-Sandbox-Port", "49983"), unknown, "The sandbox was not found")
	gateway(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Id", deleted), deleted, "The sandbox was not found")
	gateway(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Id", "not-an-id"), "not-an-id", "The sandbox was not found")
	gateway(t, ts.do(t, "GET", "/", "", "", "Host", "49983-"+unknown+"."+testDomain), unknown, "The sandbox was not found")
	// A sandbox that does not run is not reachable.
	gateway(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Id", suspended), suspended, "suspended")
	// Nothing listens on a port of a sandbox without a VM.
	gateway(t, ts.do(t, "GET", "/", "", "", "Host", "3000-"+running+".example.org"), running, "port 3000")
	// Bad headers.
	e2bError(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Id", running, "E2b-Sandbox-Port", "http"), 400, "E2b-Sandbox-Port")
	e2bError(t, ts.do(t, "GET", "/health", "", "", "E2b-Sandbox-Port", "49983"), 400, "E2b-Sandbox-Id")

	// envd traffic reaches the envd handler as the owner, authorized only
	// with the sandbox's token, by header or by Host, any domain.
	for _, c := range []struct {
		name   string
		header []string
		auth   bool
	}{
		{"header, no token", []string{"E2b-Sandbox-Id", running, "E2b-Sandbox-Port", "49983"}, false},
		{"header, default port, token", []string{"E2b-Sandbox-Id", running, "X-Access-Token", token}, true},
		{"header, wrong token", []string{"E2b-Sandbox-Id", running, "X-Access-Token", ts.svc.SandboxAccessToken(suspended)}, false},
		{"host", []string{"Host", "49983-" + running + "." + testDomain, "X-Access-Token", token}, true},
		{"host with port, other domain", []string{"Host", "49983-" + running + ".sandbox.example.com:8443"}, false},
		{"host wins over headers", []string{"Host", "49983-" + running + ".x", "E2b-Sandbox-Id", unknown}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := ts.do(t, "POST", "/process.Process/List?x=1", "", "{}", c.header...)
			if a.status != 204 || a.header.Get("X-Fake-Envd") != "/process.Process/List" {
				t.Fatalf("%d %s %v: not served by envd", a.status, a.body, a.header)
			}
			req := ts.envd.last(t)
			if req.SandboxID != running || req.Authorized != c.auth || req.Principal.KeyID != ts.aliceP.KeyID {
				t.Errorf("envd request %+v, want sandbox %s, owner %s, authorized %v", req, running, ts.aliceP.KeyID, c.auth)
			}
		})
	}
	// A base URL ending in "/" makes paths start with "//": read as "/".
	a := ts.do(t, "POST", "//process.Process/List", "", "{}", "E2b-Sandbox-Id", running)
	if a.status != 204 || a.header.Get("X-Fake-Envd") != "/process.Process/List" {
		t.Errorf("//process.Process/List: %d %v", a.status, a.header)
	}
	ts.must(t, 200, "GET", "//v2/sandboxes", ts.alice, "", nil)

	// A Host that is not "<port>-<id>" is the control plane.
	for _, host := range []string{"api." + testDomain, "localhost", "127.0.0.1", "my-host.example", "0-x.example", "99999-" + running + ".x"} {
		a := ts.do(t, "GET", "/v2/sandboxes", ts.alice, "", "Host", host)
		if a.status != 200 {
			t.Errorf("Host %s: %d %s", host, a.status, a.body)
		}
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without a service")
	}
	if _, err := New(Config{Service: &service.Service{}, Envd: &fakeEnvd{}}); err == nil {
		t.Error("New without checkpoints")
	}
	if _, err := New(Config{Service: &service.Service{}, Checkpoints: &checkpoint.Service{}, Envd: &fakeEnvd{}, Domain: "http://x"}); err == nil {
		t.Error("a domain with a scheme")
	}
}

// TestForward: Config.Forward is offered the traffic of a sandbox and the
// control-plane calls that name one but reading its info, after the key
// is checked, and nothing else; what it declines is served here, and its error is
// answered in E2B's shape.
func TestForward(t *testing.T) {
	var mu sync.Mutex
	var offered []string
	ts := newTestServer(t, func(c *Config) {
		c.Forward = func(w http.ResponseWriter, r *http.Request, id string) (bool, error) {
			mu.Lock()
			offered = append(offered, r.Method+" "+r.URL.Path+" "+id)
			mu.Unlock()
			switch id {
			case "sbxremote":
				w.WriteHeader(299)
				return true, nil
			case "sbxdown":
				return false, fmt.Errorf("sandbox sbxdown is unavailable: node n1 is down: %w", errdefs.ErrUnavailable)
			}
			return false, nil
		}
	})
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := offered
		offered = nil
		return out
	}
	for _, c := range []struct {
		method, path, key string
		header            []string
		status            int
		offered           string
	}{
		{"GET", "/sandboxes/sbxremote", ts.alice, nil, 404, ""}, // its row, read here
		{"GET", "/sandboxes/sbxremote/metrics", ts.alice, nil, 299, "GET /sandboxes/sbxremote/metrics sbxremote"},
		{"DELETE", "/sandboxes/sbxremote", ts.alice, nil, 299, "DELETE /sandboxes/sbxremote sbxremote"},
		{"POST", "/sandboxes/sbxremote/timeout", ts.alice, nil, 299, "POST /sandboxes/sbxremote/timeout sbxremote"},
		{"DELETE", "/sandboxes/sbxremote", "", nil, 401, ""},
		{"DELETE", "/sandboxes/sbxremote", "e2b_" + strings.Repeat("0", 40), nil, 401, ""},
		{"POST", "/sandboxes/sbxlocal/pause", ts.alice, nil, 404, "POST /sandboxes/sbxlocal/pause sbxlocal"},
		{"POST", "/sandboxes/sbxdown/connect", ts.alice, nil, 503, "POST /sandboxes/sbxdown/connect sbxdown"},
		{"GET", "/v2/sandboxes", ts.alice, nil, 200, ""},
		{"POST", "/sandboxes/sbxremote/fork", ts.alice, nil, 299, "POST /sandboxes/sbxremote/fork sbxremote"},
		{"POST", "/sandboxes/sbxremote/snapshots", ts.alice, nil, 299, "POST /sandboxes/sbxremote/snapshots sbxremote"},
		// A snapshot is not a sandbox: nothing is offered.
		{"DELETE", "/templates/chk" + strings.Repeat("a", 20), ts.alice, nil, 404, ""},
		{"GET", "/snapshots?sandboxID=sbxremote", ts.alice, nil, 200, ""},
		{"POST", "/process.Process/List", "", []string{"Host", "49983-sbxremote." + testDomain}, 299, "POST /process.Process/List sbxremote"},
		{"GET", "/files", "", []string{"E2b-Sandbox-Id", "sbxremote"}, 299, "GET /files sbxremote"},
		{"GET", "/", "", []string{"Host", "8080-sbxdown." + testDomain}, 503, "GET / sbxdown"},
		{"GET", "/", "", []string{"Host", "8080-sbxlocal." + testDomain}, 502, "GET / sbxlocal"},
	} {
		a := ts.do(t, c.method, c.path, c.key, "", c.header...)
		got := take()
		if a.status != c.status || (c.offered == "") != (len(got) == 0) || len(got) > 1 || len(got) == 1 && got[0] != c.offered {
			t.Errorf("%s %s %v: %d %s, offered %q; want %d, offered %q", c.method, c.path, c.header, a.status, a.body, got, c.status, c.offered)
		}
		if c.status == 503 {
			var e Error
			if json.Unmarshal(a.body, &e) != nil || e.Code != 503 || !strings.Contains(e.Message, "node n1 is down") {
				t.Errorf("%s %s: the error %s is not E2B's shape with the reason", c.method, c.path, a.body)
			}
		}
	}
}

// lifecycle.autoResume (autoResume.enabled) has the sandbox wake on
// request; without it, or disabled, it does not.
func TestCreateAutoResume(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`, true},
		{`{"templateID":"base","autoPause":true,"autoResume":{"enabled":false}}`, false},
		{`{"templateID":"base","autoPause":true}`, false},
	} {
		var req newSandbox
		if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
			t.Fatal(err)
		}
		out, err := createRequest(req, true)
		if err != nil || out.WakeOnRequest != tc.want || out.OnTimeout != "suspend" {
			t.Errorf("%s: wake on request %v, on_timeout %q, %v; want %v, suspend", tc.body, out.WakeOnRequest, out.OnTimeout, err, tc.want)
		}
	}
}
