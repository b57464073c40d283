package envd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// testLog writes to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// fixture is an envd Server over a real service and store without VMs:
// its sandbox is recorded as running but has no VM, so every call that
// reaches the guest fails as it does for a sandbox whose VM is gone.
type fixture struct {
	svc   *service.Service
	srv   *Server
	url   string
	p     service.Principal
	sbx   string
	token string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(testLog{t}, nil))
	// The runtime is never called: the one sandbox is added after the
	// service recovered, and nothing boots.
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(sandboxtest.New(t, dir)), Store: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	key, err := svc.EnsureAdminKey(ctx, dir.Root+"/admin.key")
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.Authenticate(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: ids.New("sbx"), Owner: p.KeyID, State: apiv1.StateRunning, TemplateRef: "tiny:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{"A": "1"}, Metadata: map[string]string{}}
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: p.KeyID, Status: apiv1.OpSucceeded}
	if err := st.InsertSandbox(ctx, sb, op); err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, srv: New(svc, svc.Commands(), log), p: p, sbx: sb.ID, token: svc.SandboxAccessToken(sb.ID)}
	t.Cleanup(f.srv.Close)
	// As the router does: the token header decides Authorized.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.srv.Serve(w, r, Request{Principal: p, SandboxID: sb.ID, Authorized: svc.CheckSandboxAccessToken(sb.ID, r.Header.Get("X-Access-Token"))})
	}))
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f
}

// answer is what a request got back.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (f *fixture) do(t *testing.T, method, path string, body []byte, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
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

// unary calls a unary procedure with the token.
func (f *fixture) unary(t *testing.T, proc, body string) answer {
	return f.do(t, "POST", proc, []byte(body), "Content-Type", "application/json", "X-Access-Token", f.token,
		"Connect-Protocol-Version", "1")
}

// stream calls a streaming procedure with the token and returns the
// messages and the end-of-stream message.
func (f *fixture) stream(t *testing.T, proc string, body []byte, headers ...string) (int, []string, string) {
	t.Helper()
	h := append([]string{"Content-Type", "application/connect+json", "X-Access-Token", f.token}, headers...)
	a := f.do(t, "POST", proc, body, h...)
	var msgs []string
	r := bytes.NewReader(a.body)
	for {
		flags, p, err := readEnvelope(r, MaxMessage)
		if err == io.EOF {
			t.Fatalf("%s: the stream has no end-of-stream message: %q", proc, a.body)
		}
		if err != nil {
			t.Fatalf("%s: %v in %q", proc, err, a.body)
		}
		if flags&flagEndStream != 0 {
			return a.status, msgs, string(p)
		}
		msgs = append(msgs, string(p))
	}
}

// code is the Connect code of an error body or end-of-stream message.
func code(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Code  string `json:"code"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not a Connect error: %q", b)
	}
	if e.Error.Code != "" {
		return e.Error.Code
	}
	return e.Code
}

func TestRoutesAndAuth(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		headers []string
		status  int
		code    string // Connect code, or the REST body's code as a number
	}{
		{"rpc without token", "POST", "/process.Process/List", `{}`, []string{"Content-Type", "application/json"}, 401, codeUnauthenticated},
		{"rpc with a wrong token", "POST", "/process.Process/List", `{}`, []string{"Content-Type", "application/json", "X-Access-Token", "ea_nope"}, 401, codeUnauthenticated},
		{"envs without token", "GET", "/envs", "", nil, 401, "401"},
		{"health needs no token", "GET", "/health", "", nil, 204, ""},
		{"preflight", "OPTIONS", "/process.Process/Start", "", nil, 204, ""},
		{"unknown route", "GET", "/metrics", "", []string{"X-Access-Token", f.token}, 404, "404"},
		{"unknown procedure", "POST", "/process.Process/Fork", `{}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 501, codeUnimplemented},
		{"unknown service", "POST", "/filesystem.Filesystem/Chown", `{}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 501, codeUnimplemented},
		{"client stream as unary", "POST", "/process.Process/StreamInput", `{}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 415, "415"},
		{"GET of the client stream", "GET", "/process.Process/StreamInput", "", []string{"X-Access-Token", f.token}, 405, "405"},
		{"GET of a procedure", "GET", "/process.Process/List", "", []string{"X-Access-Token", f.token}, 405, "405"},
		{"binary protobuf", "POST", "/process.Process/List", `{}`, []string{"Content-Type", "application/proto", "X-Access-Token", f.token}, 415, "415"},
		{"invalid JSON", "POST", "/process.Process/List", `{"a":`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 400, codeInvalidArgument},
		{"not an object", "POST", "/filesystem.Filesystem/Stat", `["/"]`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 400, codeInvalidArgument},
		{"wrong field type", "POST", "/filesystem.Filesystem/Stat", `{"path":7}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token}, 400, codeInvalidArgument},
		{"bad timeout", "POST", "/process.Process/List", `{}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token, "Connect-Timeout-Ms", "-5"}, 400, codeInvalidArgument},
		{"bad user", "POST", "/filesystem.Filesystem/Stat", `{"path":"x"}`, []string{"Content-Type", "application/json", "X-Access-Token", f.token,
			"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("../etc:"))}, 401, codeUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := f.do(t, tt.method, tt.path, []byte(tt.body), tt.headers...)
			if a.status != tt.status {
				t.Fatalf("status %d, want %d: %s", a.status, tt.status, a.body)
			}
			if a.header.Get("Access-Control-Allow-Origin") != "*" {
				t.Errorf("no CORS header")
			}
			switch {
			case tt.code == "":
			case tt.code[0] >= '0' && tt.code[0] <= '9':
				var e struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				}
				if json.Unmarshal(a.body, &e) != nil || strconv.Itoa(e.Code) != tt.code || e.Message == "" {
					t.Fatalf("body %s, want {message, code: %s}", a.body, tt.code)
				}
			default:
				if got := code(t, a.body); got != tt.code {
					t.Fatalf("code %s, want %s: %s", got, tt.code, a.body)
				}
			}
		})
	}
}

func TestEnvsAndHealth(t *testing.T) {
	f := newFixture(t)
	a := f.do(t, "GET", "/envs", nil, "X-Access-Token", f.token)
	if a.status != 200 || string(a.body) != `{"A":"1"}` {
		t.Fatalf("envs: %d %s", a.status, a.body)
	}
	// A sandbox that is not running answers 502, which the SDK reads as
	// "not running".
	other := *f
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.srv.Serve(w, r, Request{Principal: f.p, SandboxID: ids.New("sbx")})
	}))
	defer hs.Close()
	other.url = hs.URL
	if a := other.do(t, "GET", "/health", nil); a.status != 502 {
		t.Fatalf("health of an unknown sandbox: %d %s", a.status, a.body)
	}
}

// The Python SDK's request shapes (research 9.4): pretty-printed JSON in
// the envelope, explicit defaults, connect-content-encoding identity.
func pythonStart(cmd string) []byte {
	return appendEnvelope(nil, 0, []byte("{\n  \"process\": {\n    \"cmd\": \"/bin/bash\",\n    \"args\": [\n      \"-l\",\n      \"-c\",\n      "+
		strconv.Quote(cmd)+"\n    ]\n  },\n  \"stdin\": false\n}"))
}

var pythonHeaders = []string{"Connect-Protocol-Version", "1", "Connect-Content-Encoding", "identity", "Connect-Timeout-Ms", "60000",
	"Keepalive-Ping-Interval", "50", "E2b-Sandbox-Port", "49983"}

func TestStreamsRefuseBadInputAndChangeNothing(t *testing.T) {
	f := newFixture(t)
	oversize := make([]byte, 5)
	binary.BigEndian.PutUint32(oversize[1:], MaxMessage+1)
	tests := []struct {
		name string
		proc string
		body []byte
		code string
	}{
		{"length prefix over the limit", "/process.Process/Start", oversize, codeResourceExhausted},
		{"truncated envelope", "/process.Process/Start", pythonStart("echo hi")[:20], codeInvalidArgument},
		{"short prefix", "/process.Process/Start", []byte{0, 0}, codeInvalidArgument},
		{"no envelope", "/process.Process/Start", nil, codeInvalidArgument},
		{"end-stream flag from the client", "/process.Process/Start", appendEnvelope(nil, flagEndStream, []byte(`{}`)), codeInvalidArgument},
		{"invalid JSON", "/process.Process/Start", appendEnvelope(nil, 0, []byte(`{"process":`)), codeInvalidArgument},
		{"no process", "/process.Process/Start", appendEnvelope(nil, 0, []byte(`{"stdin":true}`)), codeInvalidArgument},
		{"empty cmd", "/process.Process/Start", appendEnvelope(nil, 0, []byte(`{"process":{"cmd":""}}`)), codeInvalidArgument},
		{"zero pty", "/process.Process/Start", appendEnvelope(nil, 0, []byte(`{"process":{"cmd":"x"},"pty":{"size":{}}}`)), codeInvalidArgument},
		{"bad env key", "/process.Process/Start", appendEnvelope(nil, 0, []byte(`{"process":{"cmd":"x","envs":{"A=B":"c"}}}`)), codeInvalidArgument},
		// A valid request reaches the service, which has no VM to run it in.
		{"valid, Python shape", "/process.Process/Start", pythonStart("echo hi"), codeFailedPrecondition},
		{"connect to no process", "/process.Process/Connect", appendEnvelope(nil, 0, []byte(`{"process":{"pid":42}}`)), codeNotFound},
		{"connect by unknown tag", "/process.Process/Connect", appendEnvelope(nil, 0, []byte(`{"process":{"tag":"nope"}}`)), codeNotFound},
		{"connect with both selectors", "/process.Process/Connect", appendEnvelope(nil, 0, []byte(`{"process":{"pid":1,"tag":"x"}}`)), codeInvalidArgument},
		{"watch a path of a sandbox without VM", "/filesystem.Filesystem/WatchDir", appendEnvelope(nil, 0, []byte(`{"path":"/tmp"}`)), codeFailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, msgs, end := f.stream(t, tt.proc, tt.body, pythonHeaders...)
			if status != 200 || len(msgs) != 0 {
				t.Fatalf("status %d, messages %q", status, msgs)
			}
			if got := code(t, []byte(end)); got != tt.code {
				t.Fatalf("end %s, want code %s", end, tt.code)
			}
		})
	}
	cmds, err := f.svc.Commands().ListCommands(context.Background(), f.p, f.sbx, "", 100)
	if err != nil || len(cmds.Items) != 0 {
		t.Fatalf("commands after refused starts: %+v %v", cmds.Items, err)
	}
}

func TestUnaryProcessCalls(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		proc, body string
		status     int
		code       string
		want       string
	}{
		{"/process.Process/List", `{}`, 200, "", `{"processes":[]}`},
		{"/process.Process/SendSignal", `{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}`, 404, codeNotFound, ""},
		{"/process.Process/SendSignal", `{"process":{"pid":42},"signal":"SIGNAL_SIGHUP"}`, 400, codeInvalidArgument, ""},
		{"/process.Process/SendSignal", `{"process":{"pid":42},"signal":1}`, 501, codeUnimplemented, ""},
		{"/process.Process/SendInput", `{"process":{"pid":42},"input":{"stdin":"aGk="}}`, 404, codeNotFound, ""},
		{"/process.Process/SendInput", `{"process":{"pid":42},"input":{"stdin":"not base64!"}}`, 400, codeInvalidArgument, ""},
		{"/process.Process/SendInput", `{"process":{"pid":42},"input":{}}`, 501, codeUnimplemented, ""},
		{"/process.Process/CloseStdin", `{"process":{"tag":"t"}}`, 404, codeNotFound, ""},
		{"/process.Process/Update", `{"process":{"pid":1},"pty":{"size":{"cols":10,"rows":5}}}`, 404, codeNotFound, ""},
		{"/filesystem.Filesystem/Stat", `{"path":"/etc"}`, 400, codeFailedPrecondition, ""},
		{"/filesystem.Filesystem/ListDir", `{"path":"/etc","depth":1}`, 400, codeFailedPrecondition, ""},
		{"/filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"w1"}`, 404, codeNotFound, ""},
		{"/filesystem.Filesystem/RemoveWatcher", `{"watcher_id":"w1"}`, 404, codeNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.proc+" "+tt.body, func(t *testing.T) {
			a := f.unary(t, tt.proc, tt.body)
			if a.status != tt.status {
				t.Fatalf("status %d, want %d: %s", a.status, tt.status, a.body)
			}
			if tt.code != "" && code(t, a.body) != tt.code {
				t.Fatalf("body %s, want code %s", a.body, tt.code)
			}
			if tt.want != "" && string(a.body) != tt.want {
				t.Fatalf("body %s, want %s", a.body, tt.want)
			}
		})
	}
}

func TestFileAuth(t *testing.T) {
	f := newFixture(t)
	f.srv.now = func() time.Time { return time.Unix(1_800_000_000, 0) }
	sig := func(path, op, user string, exp *int64) string { return Signature(path, op, user, f.token, exp) }
	past, future := int64(1_700_000_000), int64(1_900_000_000)
	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return "/files?" + v.Encode()
	}
	octet := []string{"Content-Type", "application/octet-stream"}
	tests := []struct {
		name    string
		method  string
		path    string
		headers []string
		status  int
		msg     string
	}{
		{"no token, no signature", "GET", q("path", "/a"), nil, 401, "missing signature"},
		{"bad signature", "GET", q("path", "/a", "signature", "v1_nope"), nil, 401, "invalid signature"},
		{"signed for another path", "GET", q("path", "/b", "signature", sig("/a", opRead, "", nil)), nil, 401, "invalid signature"},
		{"signed for another user", "GET", q("path", "/a", "username", "root", "signature", sig("/a", opRead, "", nil)), nil, 401, "invalid signature"},
		{"signed to read, used to write", "POST", q("path", "/a", "signature", sig("/a", opRead, "", nil)), octet, 401, "invalid signature"},
		{"expired", "GET", q("path", "/a", "signature", sig("/a", opRead, "", &past), "signature_expiration", "1700000000"), nil, 401, "expired"},
		{"expiration not signed", "GET", q("path", "/a", "signature", sig("/a", opRead, "", nil), "signature_expiration", "1900000000"), nil, 401, "invalid signature"},
		{"bad expiration", "GET", q("path", "/a", "signature", "x", "signature_expiration", "soon"), nil, 400, "signature_expiration"},
		{"wrong token beside a good signature", "GET", q("path", "/a", "signature", sig("/a", opRead, "", nil)), []string{"X-Access-Token", "ea_x"}, 401, "does not match"},
		// Past the check, the sandbox has no VM: 502, as E2B's proxy answers
		// for a sandbox that is not running.
		{"signed read", "GET", q("path", "/a", "signature", sig("/a", opRead, "", nil)), nil, 502, ""},
		{"signed read, expiring", "GET", q("path", "/a", "username", "user", "signature", sig("/a", opRead, "user", &future), "signature_expiration", "1900000000"), nil, 502, ""},
		{"signed write", "POST", q("path", "/a", "signature", sig("/a", opWrite, "", nil)), octet, 502, ""},
		{"token read", "GET", q("path", "/a"), []string{"X-Access-Token", f.token}, 502, ""},
		{"raw upload without path", "POST", "/files", []string{"X-Access-Token", f.token, "Content-Type", "application/octet-stream"}, 400, "path query parameter is required"},
		{"upload of a text body", "POST", q("path", "/a"), []string{"X-Access-Token", f.token, "Content-Type", "text/plain"}, 400, "unsupported content type"},
		{"multipart without boundary", "POST", q("path", "/a"), []string{"X-Access-Token", f.token, "Content-Type", "multipart/form-data"}, 400, "boundary"},
		{"unknown encoding", "POST", q("path", "/a"), []string{"X-Access-Token", f.token, "Content-Type", "application/octet-stream", "Content-Encoding", "br"}, 400, "Content-Encoding"},
		{"bad user", "GET", q("path", "a", "username", "a b"), []string{"X-Access-Token", f.token}, 401, "invalid username"},
		{"nothing acceptable", "GET", q("path", "/a"), []string{"X-Access-Token", f.token, "Accept-Encoding", "br, identity;q=0"}, 406, "encoding"},
		{"DELETE", "DELETE", q("path", "/a"), []string{"X-Access-Token", f.token}, 405, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := f.do(t, tt.method, tt.path, []byte("data"), tt.headers...)
			if a.status != tt.status || !strings.Contains(string(a.body), tt.msg) {
				t.Fatalf("%d %s, want %d with %q", a.status, a.body, tt.status, tt.msg)
			}
		})
	}
}

// Vectors computed apart from this code (Python's hashlib and base64).
func TestSignatureVectors(t *testing.T) {
	exp := int64(1700000000)
	if got := Signature("/home/user/a.txt", "read", "user", "ea_tok", nil); got != "v1_sB8XVGfyRGTmYnzC/dASG/T/SZLR3vPbFqUpMThIj7c" {
		t.Errorf("read: %s", got)
	}
	if got := Signature("/home/user/a.txt", "write", "user", "ea_tok", &exp); got != "v1_TNbfyenirtYYKGdU1sT3z4zHvcKaqeswFUNX6ulUT3I" {
		t.Errorf("write, expiring: %s", got)
	}
}

func TestAcceptEncoding(t *testing.T) {
	tests := []struct {
		h      string
		gz, ok bool
	}{
		{"", false, true},
		{"gzip, deflate, br", false, true},
		{"identity;q=0, gzip", true, true},
		{"*;q=0, gzip;q=0.5", true, true},
		{"*;q=0", false, false},
		{"identity;q=0", false, false},
		{"br;q=1, identity; q=0", false, false},
	}
	for _, tt := range tests {
		if gz, ok := acceptEncoding(tt.h); gz != tt.gz || ok != tt.ok {
			t.Errorf("%q: gzip %v ok %v, want %v %v", tt.h, gz, ok, tt.gz, tt.ok)
		}
	}
}

func TestKeepaliveInterval(t *testing.T) {
	for h, want := range map[string]time.Duration{"": 90 * time.Second, "50": 50 * time.Second, "0": 90 * time.Second,
		"-3": 90 * time.Second, "x": 90 * time.Second, "999999": time.Hour} {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Keepalive-Ping-Interval", h)
		if got := keepaliveInterval(r); got != want {
			t.Errorf("%q: %v, want %v", h, got, want)
		}
	}
}

func TestRetainedExits(t *testing.T) {
	f := newFixture(t)
	now := time.Unix(1000, 0)
	f.srv.now = func() time.Time { return now }
	tag := "job"
	f.srv.retain(f.sbx, 7, &tag, toEnd(apiv1.ExitEvent{ExitCode: 2}))
	f.srv.retain("sbxother", 8, nil, toEnd(apiv1.ExitEvent{}))
	if pid, ex, ok := f.srv.retainedExit(f.sbx, selector{Tag: "job", ByTag: true}); !ok || pid != 7 || ex.end.ExitCode != 2 {
		t.Fatalf("by tag: %d %+v %v", pid, ex, ok)
	}
	if _, _, ok := f.srv.retainedExit(f.sbx, selector{PID: 8}); ok {
		t.Fatal("another sandbox's process was found")
	}
	// A late Connect gets the start and the end.
	status, msgs, end := f.stream(t, "/process.Process/Connect", appendEnvelope(nil, 0, []byte(`{"process":{"pid":7}}`)))
	if status != 200 || len(msgs) != 2 || msgs[0] != `{"event":{"start":{"pid":7}}}` || !strings.Contains(msgs[1], `"exitCode":2`) || end != "{}" {
		t.Fatalf("late connect: %d %q %s", status, msgs, end)
	}
	now = now.Add(retention + time.Second)
	if _, _, ok := f.srv.retainedExit(f.sbx, selector{PID: 7}); ok {
		t.Fatal("an exit outlived its retention")
	}
}

// StreamInput's refusals before any input reaches a process, each the
// end-of-stream error of a 200 streaming answer. The input that does reach
// one is tested with a real process in e2e (TestE2BEnvd).
func TestStreamInputRefusals(t *testing.T) {
	f := newFixture(t)
	msgs := func(ms ...string) []byte {
		var b []byte
		for _, m := range ms {
			b = append(b, envelope(0, m)...)
		}
		return b
	}
	stdin := `{"data":{"input":{"stdin":"aGk="}}}`
	tests := []struct {
		name    string
		body    []byte
		headers []string
		code    string
		text    string
	}{
		{"no message", nil, nil, codeInvalidArgument, "send start first"},
		{"data before start", msgs(stdin), nil, codeInvalidArgument, "the first message must be start"},
		{"keepalive before start", msgs(`{"keepalive":{}}`), nil, codeInvalidArgument, "the first message must be start"},
		{"no such process", msgs(`{"start":{"process":{"pid":42}}}`, stdin), nil, codeNotFound, "pid 42"},
		{"no such tag", msgs(`{"start":{"process":{"tag":"job"}}}`), nil, codeNotFound, "job"},
		{"start without a process", msgs(`{"start":{}}`), nil, codeInvalidArgument, "process"},
		{"empty message", msgs(`{}`), nil, codeInvalidArgument, "give start, data or keepalive"},
		{"two members", msgs(`{"start":{"process":{"pid":1}},"keepalive":{}}`), nil, codeInvalidArgument, ""},
		{"not JSON", msgs(`{"start":`), nil, codeInvalidArgument, ""},
		{"cut envelope", msgs(`{"start":{"process":{"pid":1}}}`)[:3], nil, codeInvalidArgument, "envelope prefix"},
		{"bad flags", envelope(0x80, `{"start":{"process":{"pid":1}}}`), nil, codeInvalidArgument, "flags"},
		{"brotli", msgs(`{"start":{"process":{"pid":1}}}`), []string{"Connect-Content-Encoding", "br"}, codeUnimplemented, "encoding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, got, end := f.stream(t, "/process.Process/StreamInput", tt.body, tt.headers...)
			if status != 200 || len(got) != 0 {
				t.Fatalf("status %d, messages %q, want 200 and none", status, got)
			}
			if c := code(t, []byte(end)); c != tt.code || !strings.Contains(end, tt.text) {
				t.Fatalf("end %s, want code %s mentioning %q", end, tt.code, tt.text)
			}
		})
	}
}
