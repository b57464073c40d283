package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestAPIBadInput sends every route of the HTTP API the bad input a client
// may send: wrong JSON, missing fields, oversized bodies, bad paths, IDs and
// query values, bad credentials, another tenant's IDs, spent attach tokens,
// requests the state does not allow and reused idempotency keys. Each answer
// must be the contract's error (the status, Content-Type application/json,
// {"error": {"code", "message"}} with the status's code and a message that
// says what was wrong), and after each request that could change something
// the server's visible state must be as it was: the sandboxes and their
// states, the keys, the commands and their states, and the files under
// /tmp of both sandboxes.
//
// It boots two VMs: one for the admin key and one for a user key "a".
func TestAPIBadInput(t *testing.T) {
	runBadInput(t, sharedServer(t))
}

// TestAPIBadInputPostgres runs the same table against a server whose store
// is PostgreSQL: every answer must be the same.
func TestAPIBadInputPostgres(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	runBadInput(t, newServerEnv(t, []string{"AIRLOCK_STORE=" + pg.NewDatabase(t)}, "--ping-interval", "1s"))
}

func runBadInput(t *testing.T, s *server) {
	fx := newBadFixture(t, s)
	t.Run("health", fx.testHealth)
	t.Run("auth", func(t *testing.T) { fx.runCases(t, fx.authCases()) })
	t.Run("ids", func(t *testing.T) { fx.runCases(t, fx.idCases()) })
	t.Run("json", func(t *testing.T) { fx.runCases(t, fx.jsonCases()) })
	t.Run("query", func(t *testing.T) { fx.runCases(t, fx.queryCases()) })
	t.Run("paths", func(t *testing.T) { fx.runCases(t, fx.pathCases()) })
	t.Run("tenants", fx.testTenants)
	t.Run("tokens", func(t *testing.T) { fx.runCases(t, fx.tokenCases()) })
	t.Run("idempotency", fx.testIdempotency)
	t.Run("conflicts", fx.testConflicts)
	t.Run("deleted", fx.testDeleted)
}

// badReq is one request, built by hand so that any part of it can be wrong.
type badReq struct {
	method, path string   // path with its query
	authz        string   // the Authorization header; "" sends none
	body         any      // nil, a string or []byte sent as is, or a value sent as JSON
	size         int64    // > 0: a generated body of this many bytes that starts with body
	header       []string // more header name/value pairs
}

// badCase is a request and the error status it must answer.
type badCase struct {
	name   string
	req    badReq
	status int
	// check looks further at the answer; optional.
	check func(t *testing.T, a badAnswer)
}

// badAnswer is what came back.
type badAnswer struct {
	status int
	header http.Header
	body   []byte
	stream bool // an event stream, closed unread
}

// badRoute is a route with inputs that are valid, so that a case spoils
// exactly one thing.
type badRoute struct {
	name, method, path string // path with its query
	body               any
}

// badFixture holds what the cases act on, and the server's state as it
// must stay.
type badFixture struct {
	s *server

	admin, keyA, keyB string // API keys
	adminID           string // the admin key's ID
	keyAID, keyBID    string
	victimID          string // a user key that bad requests try to delete
	revoked           string // a key that was deleted

	sbx, sbxA   string // the admin's and a's sandboxes
	sbxLive     bool   // the admin's sandbox is not deleted yet
	op, opA     string // their create operations
	cmdIdle     string // admin's, never attached: "created"
	cmdProbe    string // admin's, never attached, for requests that a faulty server could start it with
	cmdA        string // a's, never attached: "created"
	cmdT1       string // a's, ran to its exit through its token
	tokT1       string // its spent token
	cmdT2       string // a's, never attached
	tokT2       string // its unused token
	cmdRun      string // admin's `sleep 300`, attached and running
	runStream   *sseReader
	runResponse *http.Response

	tarBody []byte
	base    map[string]string // the state every bad request must leave as it was
}

// The file every sandbox keeps at /tmp/keep/file.txt; bad requests write
// under /tmp/badinput, which must never exist.
const badKeepContent = "keep me\n"

var badCodes = map[int]string{
	400: apiv1.CodeInvalidArgument, 401: apiv1.CodeUnauthenticated, 403: apiv1.CodePermissionDenied,
	404: apiv1.CodeNotFound, 409: apiv1.CodeConflict, 413: apiv1.CodePayloadTooLarge,
	429: apiv1.CodeResourceExhausted, 500: apiv1.CodeInternal, 503: apiv1.CodeUnavailable,
}

func newBadFixture(t *testing.T, s *server) *badFixture {
	t.Helper()
	fx := &badFixture{s: s, admin: s.key, sbxLive: true}
	if parts := strings.Split(s.key, "_"); len(parts) == 3 {
		fx.adminID = "key" + parts[1]
	} else {
		t.Fatalf("the admin key %q is not alk_<id>_<secret>", s.key[:4])
	}

	// Keys first: their cleanups run after the sandboxes' deletes.
	a := fx.newKey(t, "badinput-a")
	b := fx.newKey(t, "badinput-b")
	fx.keyA, fx.keyAID, fx.keyB, fx.keyBID = a.Key, a.ID, b.Key, b.ID
	fx.victimID = fx.newKey(t, "badinput-victim").ID
	r := fx.newKey(t, "badinput-revoked")
	s.must(t, 204, "DELETE", "/v1/keys/"+r.ID, fx.admin, nil, nil)
	fx.revoked = r.Key

	// Both sandboxes boot at once.
	var made, madeA apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", fx.admin, apiv1.CreateSandbox{Template: "tiny"}, &made)
	t.Cleanup(func() { s.deleteSandbox(t, fx.admin, made.Sandbox.ID) })
	s.must(t, 202, "POST", "/v1/sandboxes", fx.keyA, apiv1.CreateSandbox{Template: "tiny"}, &madeA)
	t.Cleanup(func() { s.deleteSandbox(t, fx.keyA, madeA.Sandbox.ID) })
	for _, w := range []struct{ key, op string }{{fx.admin, made.Operation.ID}, {fx.keyA, madeA.Operation.ID}} {
		if op := s.waitOp(t, w.key, w.op); op.Status != apiv1.OpSucceeded {
			t.Fatalf("create %s failed: %+v", op.TargetID, op.Error)
		}
	}
	fx.sbx, fx.op = made.Sandbox.ID, made.Operation.ID
	fx.sbxA, fx.opA = madeA.Sandbox.ID, madeA.Operation.ID

	s.must(t, 204, "PUT", "/v1/sandboxes/"+fx.sbx+"/files?path=/tmp/keep/file.txt", fx.admin, []byte(badKeepContent), nil)
	s.must(t, 204, "POST", "/v1/sandboxes/"+fx.sbx+"/fs/mkdir", fx.admin, apiv1.Path{Path: "/tmp/keep/sub"}, nil)
	s.must(t, 204, "PUT", "/v1/sandboxes/"+fx.sbxA+"/files?path=/tmp/keep/file.txt", fx.keyA, []byte(badKeepContent), nil)

	fx.cmdIdle = fx.newCommand(t, fx.admin, fx.sbx, apiv1.CommandRequest{Argv: []string{"cat"}, Stdin: true}).ID
	fx.cmdProbe = fx.newCommand(t, fx.admin, fx.sbx, apiv1.CommandRequest{Argv: []string{"cat"}, Stdin: true}).ID
	run := fx.newCommand(t, fx.admin, fx.sbx, apiv1.CommandRequest{Argv: []string{"sleep", "300"}})
	fx.cmdRun = run.ID
	fx.runResponse, fx.runStream = s.attach(t, run.ID, fx.admin, 0)
	t.Cleanup(func() { fx.runResponse.Body.Close() })
	if ev, err := fx.runStream.next(); err != nil || ev.name != apiv1.EventStart {
		t.Fatalf("the stream of %s began with %q (%v), want start", run.ID, ev.name, err)
	}
	fx.cmdA = fx.newCommand(t, fx.keyA, fx.sbxA, apiv1.CommandRequest{Argv: []string{"cat"}, Stdin: true,
		PTY: &apiv1.PTY{Rows: 24, Cols: 80}}).ID
	t1 := fx.newCommand(t, fx.keyA, fx.sbxA, apiv1.CommandRequest{Cmd: "echo hi"})
	fx.cmdT1, fx.tokT1 = t1.ID, t1.Attach.Token
	resp, r1 := s.attach(t, t1.ID, t1.Attach.Token, 0)
	if o := readToExit(t, r1); o.stdout != "hi\n" || o.exit.ExitCode != 0 {
		t.Fatalf("echo hi through its token: %+v", o)
	}
	resp.Body.Close()
	t2 := fx.newCommand(t, fx.keyA, fx.sbxA, apiv1.CommandRequest{Argv: []string{"true"}})
	fx.cmdT2, fx.tokT2 = t2.ID, t2.Attach.Token

	fx.tarBody = badTar(t)
	fx.base = fx.snapshot(t)
	for k, want := range map[string]string{
		"sandbox " + fx.sbx: apiv1.StateRunning, "sandbox " + fx.sbxA: apiv1.StateRunning,
		"command " + fx.cmdIdle: apiv1.CommandCreated, "command " + fx.cmdProbe: apiv1.CommandCreated,
		"command " + fx.cmdRun: apiv1.CommandRunning,
		"command " + fx.cmdA:   apiv1.CommandCreated, "command " + fx.cmdT1: apiv1.CommandExited,
		"command " + fx.cmdT2:          apiv1.CommandCreated,
		fx.sbx + " /tmp/keep/file.txt": "file 8 0644", fx.sbxA + " /tmp/keep/file.txt": "file 8 0644",
	} {
		if got := fx.base[k]; got != want {
			t.Fatalf("before the cases, %s is %q, want %q (state: %v)", k, got, want, fx.base)
		}
	}
	return fx
}

func (fx *badFixture) newKey(t *testing.T, name string) apiv1.KeyCreated {
	t.Helper()
	var k apiv1.KeyCreated
	fx.s.must(t, 201, "POST", "/v1/keys", fx.admin, apiv1.CreateKey{Name: name, Role: apiv1.RoleUser}, &k)
	t.Cleanup(func() { fx.s.call(t, "DELETE", "/v1/keys/"+k.ID, fx.admin, nil) })
	return k
}

func (fx *badFixture) newCommand(t *testing.T, key, sbx string, req apiv1.CommandRequest) apiv1.CommandSession {
	t.Helper()
	var c apiv1.CommandSession
	fx.s.must(t, 201, "POST", "/v1/sandboxes/"+sbx+"/commands", key, req, &c)
	return c
}

// badTar is a tar stream holding one file.
func badTar(t *testing.T) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "badinput.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("x\n"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// routes lists every served route but /healthz and /metrics, with valid
// inputs acting on the given IDs. Requests that would change something
// aim at /tmp/badinput or at /tmp/keep, which the state check watches.
func (fx *badFixture) routes(sbx, cmd, op, key string) []badRoute {
	sp := "/v1/sandboxes/" + sbx
	cp := "/v1/commands/" + cmd
	return []badRoute{
		{"keys_create", "POST", "/v1/keys", `{"name":"badinput-probe","role":"user"}`},
		{"keys_list", "GET", "/v1/keys", nil},
		{"keys_get", "GET", "/v1/keys/" + key, nil},
		{"keys_limits", "PATCH", "/v1/keys/" + key, `{"limits":{"sandboxes":100}}`},
		{"keys_delete", "DELETE", "/v1/keys/" + key, nil},
		{"operation_get", "GET", "/v1/operations/" + op, nil},
		{"sandboxes_create", "POST", "/v1/sandboxes", `{"template":"tiny"}`},
		{"sandboxes_list", "GET", "/v1/sandboxes", nil},
		{"sandbox_get", "GET", sp, nil},
		{"sandbox_delete", "DELETE", sp, nil},
		{"sandbox_events", "GET", sp + "/events", nil},
		{"commands_create", "POST", sp + "/commands", `{"cmd":"mkdir -p /tmp/badinput"}`},
		{"commands_list", "GET", sp + "/commands", nil},
		{"exec", "POST", sp + "/exec", `{"cmd":"mkdir -p /tmp/badinput"}`},
		{"command_get", "GET", cp, nil},
		{"attach", "GET", cp + "/attach", nil},
		{"stdin", "POST", cp + "/stdin", "x"},
		{"signal", "POST", cp + "/signal", `{"signal":"TERM"}`},
		{"resize", "POST", cp + "/resize", `{"rows":40,"cols":120}`},
		{"files_put", "PUT", sp + "/files?path=/tmp/badinput/f", "x"},
		{"files_get", "GET", sp + "/files?path=/tmp/keep/file.txt", nil},
		{"files_delete", "DELETE", sp + "/files?path=/tmp/keep/file.txt", nil},
		{"fs_stat", "GET", sp + "/fs/stat?path=/tmp/keep", nil},
		{"fs_list", "GET", sp + "/fs/list?path=/tmp/keep", nil},
		{"fs_mkdir", "POST", sp + "/fs/mkdir", `{"path":"/tmp/badinput/d"}`},
		{"fs_move", "POST", sp + "/fs/move", `{"from":"/tmp/keep/file.txt","to":"/tmp/badinput/m"}`},
		{"archive_get", "GET", sp + "/archive?path=/tmp/keep", nil},
		{"archive_put", "PUT", sp + "/archive?path=/tmp/badinput", fx.tarBody},
		{"network_put", "PUT", sp + "/network", `{"egress":"deny"}`},
		{"egress_log", "GET", sp + "/egress-log", nil},
		{"ports", "GET", sp + "/ports/8000/x", nil},
		{"tunnel", "GET", sp + "/tunnel/8000", nil},
		{"templates_list", "GET", "/v1/templates", nil},
		{"template_get", "GET", "/v1/templates/tiny", nil},
		{"secrets_create", "POST", "/v1/secrets", `{"name":"badinput-probe","value":"v"}`},
		{"secrets_list", "GET", "/v1/secrets", nil},
		{"secrets_delete", "DELETE", "/v1/secrets/badinput-probe", nil},
	}
}

// adminRoutes are the routes on the admin's resources: a created command
// and a key that must outlive every bad request.
func (fx *badFixture) adminRoutes() []badRoute {
	return fx.routes(fx.sbx, fx.cmdIdle, fx.op, fx.victimID)
}

func (fx *badFixture) route(name string) badRoute {
	for _, r := range fx.adminRoutes() {
		if r.name == name {
			return r
		}
	}
	panic("no route " + name)
}

func badBearer(key string) string { return "Bearer " + key }

func badWithQuery(path, q string) string {
	if strings.Contains(path, "?") {
		return path + "&" + q
	}
	return path + "?" + q
}

// Sending and checking.

var badClient = &http.Client{
	Timeout:       2 * time.Minute,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// badContentType is what a client sends with the body of path.
func badContentType(path string) string {
	p, _, _ := strings.Cut(path, "?")
	switch {
	case strings.HasSuffix(p, "/archive"):
		return "application/x-tar"
	case strings.HasSuffix(p, "/files"), strings.HasSuffix(p, "/stdin"):
		return "application/octet-stream"
	}
	return "application/json"
}

func (fx *badFixture) send(t *testing.T, r badReq) badAnswer {
	t.Helper()
	if r.size > 0 {
		return fx.sendLarge(t, r)
	}
	var body io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(j)
	}
	req, err := http.NewRequest(r.method, fx.s.url+r.path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, badClip(r.path), err)
	}
	if body != nil {
		req.Header.Set("Content-Type", badContentType(r.path))
	}
	if r.authz != "" {
		req.Header.Set("Authorization", r.authz)
	}
	for i := 0; i+1 < len(r.header); i += 2 {
		req.Header.Set(r.header[i], r.header[i+1])
	}
	resp, err := badClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, badClip(r.path), err)
	}
	defer resp.Body.Close()
	a := badAnswer{status: resp.StatusCode, header: resp.Header}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		a.stream = true
		return a
	}
	if a.body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20)); err != nil {
		t.Fatalf("%s %s: read the answer: %v", r.method, badClip(r.path), err)
	}
	return a
}

// sendLarge sends a generated body over a connection of its own, reading
// the answer while the body is still going out: a server that refuses a
// large body answers before it has read it all.
func (fx *badFixture) sendLarge(t *testing.T, r badReq) badAnswer {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fx.s.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	var head strings.Builder
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nContent-Type: %s\r\nConnection: close\r\n",
		r.method, r.path, fx.s.addr, r.size, badContentType(r.path))
	if r.authz != "" {
		fmt.Fprintf(&head, "Authorization: %s\r\n", r.authz)
	}
	for i := 0; i+1 < len(r.header); i += 2 {
		fmt.Fprintf(&head, "%s: %s\r\n", r.header[i], r.header[i+1])
	}
	head.WriteString("\r\n")
	prefix, _ := r.body.(string)
	suffix := ""
	if strings.HasPrefix(prefix, "{") {
		suffix = `"}`
	}
	body := io.MultiReader(strings.NewReader(prefix),
		&badFill{n: r.size - int64(len(prefix)+len(suffix))}, strings.NewReader(suffix))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.WriteString(conn, head.String()); err != nil {
			return
		}
		io.Copy(conn, body) // fails once the server stops reading: expected
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		conn.Close()
		<-done
		t.Fatalf("%s %s with a %d-byte body: no answer: %v", r.method, badClip(r.path), r.size, err)
	}
	a := badAnswer{status: resp.StatusCode, header: resp.Header}
	a.body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	conn.Close()
	<-done
	return a
}

// badFill reads as n bytes of 'a'.
type badFill struct{ n int64 }

func (f *badFill) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	for i := range p {
		p[i] = 'a'
	}
	f.n -= int64(len(p))
	return len(p), nil
}

func badClip(s string) string {
	if len(s) > 120 {
		return s[:120] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return s
}

// badContractError decodes a's body as the contract's error; ok is false (and
// the test failed) when it is not one.
func badContractError(t *testing.T, what string, a badAnswer) (apiv1.Error, bool) {
	t.Helper()
	if a.stream {
		t.Errorf("%s: answered %d with an event stream, want a JSON error", what, a.status)
		return apiv1.Error{}, false
	}
	if mt, _, err := mime.ParseMediaType(a.header.Get("Content-Type")); err != nil || mt != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", what, a.header.Get("Content-Type"))
	}
	var eb struct {
		Error *apiv1.Error `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil || eb.Error == nil {
		t.Errorf("%s: the body is not {\"error\": {\"code\", \"message\"}} (%v): %s", what, err, badClip(string(a.body)))
		return apiv1.Error{}, false
	}
	return *eb.Error, true
}

// badCheckError checks that a is the contract's error for status want.
func badCheckError(t *testing.T, what string, a badAnswer, want int) apiv1.Error {
	t.Helper()
	if a.status != want {
		t.Errorf("%s: status %d, want %d: %s", what, a.status, want, badClip(string(a.body)))
		if a.status < 400 {
			return apiv1.Error{}
		}
	}
	e, ok := badContractError(t, what, a)
	if !ok {
		return e
	}
	if c := badCodes[a.status]; e.Code != c {
		t.Errorf("%s: code %q with status %d, want %q", what, e.Code, a.status, c)
	}
	if len(strings.Fields(e.Message)) < 3 {
		t.Errorf("%s: message %q does not say what was wrong", what, e.Message)
	}
	// The leaks are phrases, not bare words: a message may echo a random ID
	// back, and one such as OPVLSQLS… holds "sql".
	for _, leak := range []string{"runtime error", "panic:", "nil pointer", "json: ", "sql: ", "sqlite", "goroutine "} {
		if strings.Contains(strings.ToLower(e.Message), leak) {
			t.Errorf("%s: message %q shows internals (%q)", what, e.Message, leak)
		}
	}
	return e
}

// badMayChange reports whether r could change the server's state if it were
// wrongly obeyed.
func badMayChange(r badReq, a badAnswer) bool {
	p, _, _ := strings.Cut(r.path, "?")
	return r.method != "GET" || strings.HasSuffix(p, "/attach") || a.status < 300
}

func (fx *badFixture) runCases(t *testing.T, cases []badCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := fx.send(t, c.req)
			badCheckError(t, c.req.method+" "+badClip(c.req.path), a, c.status)
			if c.check != nil {
				c.check(t, a)
			}
			if badMayChange(c.req, a) {
				fx.settle(t)
			}
		})
	}
}

// The server's state.

// snapshot is what bad requests must not change, as "what" → "how".
func (fx *badFixture) snapshot(t *testing.T) map[string]string {
	t.Helper()
	w := map[string]string{}
	var sbs apiv1.List[apiv1.Sandbox]
	fx.s.must(t, 200, "GET", "/v1/sandboxes?limit=1000", fx.admin, nil, &sbs)
	for _, sb := range sbs.Items {
		w["sandbox "+sb.ID] = sb.State
	}
	var keys apiv1.List[apiv1.Key]
	fx.s.must(t, 200, "GET", "/v1/keys", fx.admin, nil, &keys)
	for _, k := range keys.Items {
		w["key "+k.ID] = k.Name + " " + k.Role
	}
	for _, sbx := range fx.sandboxes() {
		var cmds apiv1.List[apiv1.Command]
		fx.s.must(t, 200, "GET", "/v1/sandboxes/"+sbx+"/commands?limit=1000", fx.admin, nil, &cmds)
		for _, c := range cmds.Items {
			w["command "+c.ID] = c.State
		}
		var ls struct {
			Items []apiv1.Stat `json:"items"`
		}
		fx.s.must(t, 200, "GET", "/v1/sandboxes/"+sbx+"/fs/list?path=/tmp&depth=4", fx.admin, nil, &ls)
		for _, st := range ls.Items {
			w[sbx+" "+st.Path] = badStatLine(st)
		}
		// Where a relative path would land.
		for _, p := range []string{"/root/tmp", "/badinput"} {
			status, b := fx.s.call(t, "GET", "/v1/sandboxes/"+sbx+"/fs/stat?path="+p, fx.admin, nil)
			switch status {
			case 200:
				var st apiv1.Stat
				json.Unmarshal(b, &st)
				w[sbx+" "+p] = badStatLine(st)
			case 404:
			default:
				t.Fatalf("stat %s in %s: %d %s", p, sbx, status, b)
			}
		}
	}
	return w
}

func badStatLine(st apiv1.Stat) string {
	if st.Type == "file" {
		return fmt.Sprintf("file %d %s", st.SizeBytes, st.Mode)
	}
	return st.Type
}

func (fx *badFixture) sandboxes() []string {
	if fx.sbxLive {
		return []string{fx.sbx, fx.sbxA}
	}
	return []string{fx.sbxA}
}

func badDiff(before, after map[string]string) string {
	var lines []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			lines = append(lines, fmt.Sprintf("  gone:    %s (was %s)", k, v))
		} else if w != v {
			lines = append(lines, fmt.Sprintf("  changed: %s: %s -> %s", k, v, w))
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			lines = append(lines, fmt.Sprintf("  new:     %s (%s)", k, v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// settle fails the test if the state is not as it was, and then puts back
// what it can so that the next cases are judged on their own.
func (fx *badFixture) settle(t *testing.T) {
	t.Helper()
	now := fx.snapshot(t)
	d := badDiff(fx.base, now)
	if d == "" {
		return
	}
	t.Errorf("the request changed the server's state:\n%s", d)
	for k := range now {
		if _, ok := fx.base[k]; ok {
			continue
		}
		kind, rest, _ := strings.Cut(k, " ")
		switch kind {
		case "key":
			fx.s.call(t, "DELETE", "/v1/keys/"+rest, fx.admin, nil)
		case "sandbox":
			fx.s.deleteSandbox(t, fx.admin, rest)
		case "command": // cannot be undone
		default: // a new path in sandbox kind
			fx.s.call(t, "DELETE", "/v1/sandboxes/"+kind+"/files?recursive=true&path="+rest, fx.admin, nil)
		}
	}
	for _, sbx := range fx.sandboxes() {
		fx.s.call(t, "PUT", "/v1/sandboxes/"+sbx+"/files?mode=0644&path=/tmp/keep/file.txt", fx.admin, []byte(badKeepContent))
	}
	if fx.sbxLive {
		fx.s.call(t, "POST", "/v1/sandboxes/"+fx.sbx+"/fs/mkdir", fx.admin, apiv1.Path{Path: "/tmp/keep/sub"})
	}
	fx.base = fx.snapshot(t)
}

// The groups of cases.

func (fx *badFixture) testHealth(t *testing.T) {
	for _, c := range []struct{ name, authz string }{{"no_key", ""}, {"wrong_key", "Bearer wrong"}} {
		t.Run("healthz_"+c.name, func(t *testing.T) {
			a := fx.send(t, badReq{method: "GET", path: "/healthz", authz: c.authz})
			var h apiv1.Health
			if a.status != 200 || json.Unmarshal(a.body, &h) != nil || h.Status != "ok" {
				t.Errorf("GET /healthz: %d %s, want 200 {\"status\":\"ok\"} without a key", a.status, badClip(string(a.body)))
			}
		})
	}
	t.Run("metrics_open_on_loopback", func(t *testing.T) {
		a := fx.send(t, badReq{method: "GET", path: "/metrics"})
		mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
		if a.status != 200 || mt != "text/plain" || !bytes.Contains(a.body, []byte("airlock_http_requests_total")) {
			t.Errorf("GET /metrics without a key on a loopback server: %d %q %s, want 200 Prometheus text",
				a.status, a.header.Get("Content-Type"), badClip(string(a.body)))
		}
	})
}

// authCases: every route but /healthz and /metrics answers 401 to a
// request without a valid key, and does nothing.
func (fx *badFixture) authCases() []badCase {
	secretless := fx.admin[:strings.LastIndex(fx.admin, "_")+1]
	variants := []struct{ name, authz string }{
		{"no_header", ""},
		{"unknown_key", "Bearer alk_badinputbadinputbadi_badinputbadinputbadinputbadinputbadi"},
		{"garbage_key", "Bearer not-a-key"},
		{"wrong_secret", "Bearer " + secretless + "wrongsecretwrongsecretwrongsecret"},
		{"key_with_trailing_junk", "Bearer " + fx.admin + " x"},
		{"revoked_key", "Bearer " + fx.revoked},
		{"bearer_without_key", "Bearer"},
		{"bearer_blank", "Bearer    "},
		{"key_without_scheme", fx.admin},
		{"basic_scheme", "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+fx.admin))},
		{"token_scheme", "Token " + fx.admin},
		{"scheme_glued_to_key", "Bearer" + fx.admin},
		{"attach_token_of_another_command", "Bearer " + fx.tokT2},
	}
	var cases []badCase
	for _, r := range fx.adminRoutes() {
		for _, v := range variants {
			cases = append(cases, badCase{name: r.name + "/" + v.name, status: 401,
				req: badReq{method: r.method, path: r.path, authz: v.authz, body: r.body}})
		}
	}
	cases = append(cases, badCase{name: "attach/garbage_attach_token", status: 401,
		req: badReq{method: "GET", path: "/v1/commands/" + fx.cmdIdle + "/attach", authz: "Bearer act_garbage"}})
	return cases
}

// idCases: malformed and unknown IDs answer 404 on every route that takes
// one.
func (fx *badFixture) idCases() []badCase {
	const sbxP, cmdP, opP, keyP = "{sbx}", "{cmd}", "{op}", "{key}"
	kinds := []struct {
		placeholder, prefix, real, other string
	}{
		{sbxP, "sbx", fx.sbx, fx.cmdIdle},
		{cmdP, "cmd", fx.cmdIdle, fx.sbx},
		{opP, "op", fx.op, fx.sbx},
		{keyP, "key", fx.victimID, fx.sbx},
	}
	var cases []badCase
	for _, k := range kinds {
		ids := []struct{ name, id string }{
			{"upper_case_prefix", strings.ToUpper(k.prefix)},
			{"bang", k.prefix + "!"},
			{"200_chars", k.prefix + strings.Repeat("a", 200-len(k.prefix))},
			{"unknown", k.prefix + "badinputbadinputbadi"},
			{"upper_case_of_a_real_one", strings.ToUpper(k.real)},
			{"id_of_another_kind", k.other},
			{"dot_dot", ".."},
		}
		for _, r := range fx.routes(sbxP, cmdP, opP, keyP) {
			p, _, _ := strings.Cut(r.path, "?")
			if !strings.Contains(p, k.placeholder) {
				continue
			}
			for _, id := range ids {
				if id.id == ".." && !strings.HasSuffix(p, k.placeholder) {
					continue // ".." inside a longer path names another route
				}
				cases = append(cases, badCase{name: r.name + "/" + id.name, status: 404,
					req: badReq{method: r.method, path: strings.Replace(r.path, k.placeholder, id.id, 1),
						authz: badBearer(fx.admin), body: r.body}})
			}
		}
	}
	for _, ref := range []string{"nosuchtemplate", "tiny:nosuchtag", "sha256:" + strings.Repeat("0", 64)} {
		cases = append(cases, badCase{name: "template_get/" + ref, status: 404,
			req: badReq{method: "GET", path: "/v1/templates/" + ref, authz: badBearer(fx.admin)}})
	}
	return cases
}

// jsonCases: malformed, mistyped, incomplete and oversized JSON bodies
// answer 400 (413 when over 1 MiB) on every JSON route.
func (fx *badFixture) jsonCases() []badCase {
	admin := badBearer(fx.admin)
	type jsonRoute struct {
		route badRoute
		field string   // a string field, for the oversized body
		bad   []string // bodies wrong for this route
	}
	jr := []jsonRoute{
		{fx.route("keys_create"), "name", []string{
			`{"name":5,"role":"user"}`, `{"name":"badinput-probe","role":1}`, `{"name":["badinput-probe"]}`,
			`{}`, `{"role":"user"}`, `{"name":""}`, `{"name":"badinput-probe","role":"root"}`,
		}},
		{fx.route("sandboxes_create"), "template", []string{
			`{"template":5}`, `{"template":"tiny","vcpus":"two"}`, `{"template":"tiny","memory_mib":1.5}`,
			`{"template":"tiny","timeout_s":"900"}`, `{"template":"tiny","env":["A=1"]}`,
			`{"template":"tiny","metadata":{"k":1}}`, `{"template":"tiny","network":"deny"}`,
			`{"template":"tiny","vcpus":99999999999999999999}`,
			`{}`, `{"vcpus":1}`, `{"template":""}`,
			`{"template":"tiny","vcpus":-1}`, `{"template":"tiny","vcpus":100000}`,
			`{"template":"tiny","memory_mib":1}`, `{"template":"tiny","disk_mib":1}`,
			`{"template":"tiny","timeout_s":-1}`, `{"template":"tiny","on_timeout":"explode"}`,
			`{"template":"tiny","idle_s":-1}`, `{"template":"tiny","idle_s":31536001}`, `{"template":"tiny","idle_s":"10m"}`,
			`{"template":"tiny","idle_s":1.5}`, `{"template":"tiny","idle_s":60,"on_idle":"sleep"}`,
			`{"template":"tiny","on_idle":5}`, `{"template":"tiny","idle_s":60,"wake_on_request":true}`,
			`{"template":"tiny","network":{"egress":"sometimes"}}`,
			`{"template":"tiny","network":{"egress":"deny","allow":["10.0.0.0/33"]}}`,
			`{"template":"tiny","network":{"egress":"deny","allow":"example.com"}}`,
			`{"template":"tiny","network":{"egress":"deny","bogus":1}}`,
			`{"template":"tiny","network":{"egress":"deny","deny":["::1"]}}`,
			`{"template":"tiny","network":{"credentials":[{"host":"api.example.com","header":"X-Key","secret":"never-stored"}]}}`,
			`{"template":"tiny","metadata":{"bad key!":"v"}}`, `{"template":"tiny","env":{"A=B":"1"}}`,
		}},
		{fx.route("signal"), "signal", []string{
			`{"signal":9}`, `{"signal":["TERM"]}`, `{}`, `{"signal":""}`, `{"signal":"BOGUS"}`,
		}},
		{fx.route("resize"), "rows", []string{
			`{"rows":"x","cols":80}`, `{"rows":40.5,"cols":80}`, `{"rows":40}`, `{}`,
			`{"rows":0,"cols":80}`, `{"rows":-1,"cols":80}`, `{"rows":10001,"cols":80}`,
		}},
		{fx.route("fs_mkdir"), "path", []string{`{"path":5}`, `{}`, `{"path":""}`}},
		{fx.route("fs_move"), "from", []string{
			`{"from":1,"to":"/tmp/badinput/m"}`, `{"from":"/tmp/keep/file.txt","to":["/tmp/badinput/m"]}`,
			`{"from":"/tmp/keep/file.txt"}`, `{"to":"/tmp/badinput/m"}`, `{}`,
		}},
	}
	for _, name := range []string{"commands_create", "exec"} {
		jr = append(jr, jsonRoute{fx.route(name), "cmd", []string{
			`{"argv":"ls"}`, `{"cmd":["ls"]}`, `{"argv":[1]}`, `{"argv":["true"],"env":{"A":1}}`,
			`{"argv":["true"],"stdin":"yes"}`, `{"argv":["true"],"pty":{"rows":"x","cols":80}}`,
			`{"argv":["true"],"pty":{"rows":-1,"cols":80}}`, `{"argv":["true"],"pty":{"rows":70000,"cols":80}}`,
			`{"argv":["true"],"pty":{"rows":0,"cols":80}}`, `{"argv":["true"],"pty":{"rows":24,"cols":80,"bogus":1}}`,
			`{"argv":["true"],"timeout_s":1.5}`, `{"argv":["true"],"timeout_s":-1}`,
			`{}`, `{"argv":[]}`, `{"argv":["mkdir","/tmp/badinput"],"cmd":"mkdir /tmp/badinput"}`, `{"argv":[""]}`,
			`{"argv":["true"],"cwd":"tmp"}`, `{"argv":["true"],"env":{"A=B":"1"}}`,
		}})
	}
	jr[len(jr)-1].bad = append(jr[len(jr)-1].bad, `{"argv":["cat"],"stdin":true}`) // exec takes no stdin

	var cases []badCase
	for _, j := range jr {
		r := j.route
		valid := r.body.(string)
		add := func(name, body string, status int, header ...string) {
			cases = append(cases, badCase{name: r.name + "/" + name, status: status,
				req: badReq{method: r.method, path: r.path, authz: admin, body: body, header: header}})
		}
		add("not_json", "hello", 400)
		add("array", "["+valid+"]", 400)
		add("string", `"text"`, 400)
		add("number", "5", 400)
		add("null", "null", 400)
		add("empty_body", "", 400)
		add("truncated", valid[:len(valid)-1], 400)
		add("trailing_garbage", valid+" x", 400)
		add("two_objects", valid+valid, 400)
		add("unknown_field", strings.TrimSuffix(valid, "}")+`,"bogus":1}`, 400)
		for _, b := range j.bad {
			add(b, b, 400)
		}
		cases = append(cases, badCase{name: r.name + "/10_MiB", status: 413, req: badReq{method: r.method, path: r.path,
			authz: admin, body: `{"` + j.field + `":"`, size: 10 << 20}})
	}
	cases = append(cases,
		badCase{name: "sandboxes_create/unknown_template", status: 404,
			req: badReq{method: "POST", path: "/v1/sandboxes", authz: admin, body: `{"template":"nosuchtemplate-badinput"}`}},
		badCase{name: "keys_create/10_MiB_with_idempotency_key", status: 413,
			req: badReq{method: "POST", path: "/v1/keys", authz: admin, body: `{"name":"`, size: 10 << 20,
				header: []string{"Idempotency-Key", "badinput-large"}}})
	return cases
}

// queryCases: bad query values and unknown query parameters answer 400.
func (fx *badFixture) queryCases() []badCase {
	admin := badBearer(fx.admin)
	sp := "/v1/sandboxes/" + fx.sbx
	cp := "/v1/commands/" + fx.cmdIdle
	otherToken := func(id string) string {
		return base64.RawURLEncoding.EncodeToString([]byte("after:" + id))
	}
	c := func(name, method, path string, body any, header ...string) badCase {
		return badCase{name: name, status: 400, req: badReq{method: method, path: path, authz: admin, body: body, header: header}}
	}
	cases := []badCase{
		c("sandboxes_list/limit_0", "GET", "/v1/sandboxes?limit=0", nil),
		c("sandboxes_list/limit_5000", "GET", "/v1/sandboxes?limit=5000", nil),
		c("sandboxes_list/limit_1001", "GET", "/v1/sandboxes?limit=1001", nil),
		c("sandboxes_list/limit_negative", "GET", "/v1/sandboxes?limit=-1", nil),
		c("sandboxes_list/limit_abc", "GET", "/v1/sandboxes?limit=abc", nil),
		c("sandboxes_list/limit_fraction", "GET", "/v1/sandboxes?limit=1.5", nil),
		c("sandboxes_list/page_token_garbage", "GET", "/v1/sandboxes?page_token=garbage", nil),
		c("sandboxes_list/page_token_of_commands", "GET", "/v1/sandboxes?page_token="+otherToken(fx.cmdIdle), nil),
		c("sandboxes_list/state_bogus", "GET", "/v1/sandboxes?state=bogus", nil),
		c("sandboxes_list/state_upper_case", "GET", "/v1/sandboxes?state=RUNNING", nil),
		c("sandboxes_list/metadata_without_name", "GET", "/v1/sandboxes?metadata.=x", nil),
		c("commands_list/limit_0", "GET", sp+"/commands?limit=0", nil),
		c("commands_list/limit_5000", "GET", sp+"/commands?limit=5000", nil),
		c("commands_list/limit_abc", "GET", sp+"/commands?limit=abc", nil),
		c("commands_list/page_token_garbage", "GET", sp+"/commands?page_token=garbage", nil),
		c("commands_list/page_token_of_sandboxes", "GET", sp+"/commands?page_token="+otherToken(fx.sbx), nil),
		c("operation_get/wait_s_negative", "GET", "/v1/operations/"+fx.op+"?wait_s=-1", nil),
		c("operation_get/wait_s_61", "GET", "/v1/operations/"+fx.op+"?wait_s=61", nil),
		c("operation_get/wait_s_abc", "GET", "/v1/operations/"+fx.op+"?wait_s=abc", nil),
		c("operation_get/wait_s_fraction", "GET", "/v1/operations/"+fx.op+"?wait_s=1.5", nil),
		c("files_put/mode_999", "PUT", sp+"/files?path=/tmp/badinput/f&mode=999", "x"),
		c("files_put/mode_abc", "PUT", sp+"/files?path=/tmp/badinput/f&mode=abc", "x"),
		c("files_put/mode_negative", "PUT", sp+"/files?path=/tmp/badinput/f&mode=-644", "x"),
		c("files_put/mode_too_large", "PUT", sp+"/files?path=/tmp/badinput/f&mode=17777", "x"),
		c("files_put/mode_hex", "PUT", sp+"/files?path=/tmp/badinput/f&mode=0x1ff", "x"),
		c("files_put/mode_symbolic", "PUT", sp+"/files?path=/tmp/badinput/f&mode=rw-r--r--", "x"),
		c("files_put/mode_on_existing_file", "PUT", sp+"/files?path=/tmp/keep/file.txt&mode=999", "x"),
		c("fs_list/depth_0", "GET", sp+"/fs/list?path=/tmp&depth=0", nil),
		c("fs_list/depth_17", "GET", sp+"/fs/list?path=/tmp&depth=17", nil),
		c("fs_list/depth_negative", "GET", sp+"/fs/list?path=/tmp&depth=-1", nil),
		c("fs_list/depth_abc", "GET", sp+"/fs/list?path=/tmp&depth=abc", nil),
		c("files_delete/recursive_maybe", "DELETE", sp+"/files?path=/tmp/keep&recursive=maybe", nil),
		c("stdin/eof_maybe", "POST", cp+"/stdin?eof=maybe", "x"),
		c("attach/last_event_id_abc", "GET", cp+"/attach", nil, "Last-Event-ID", "abc"),
		c("attach/last_event_id_negative", "GET", cp+"/attach", nil, "Last-Event-ID", "-1"),
		// The command has no events yet: 1000 is past the last one, and
		// the request must not start it.
		c("attach/last_event_id_past_the_end", "GET", "/v1/commands/"+fx.cmdProbe+"/attach", nil, "Last-Event-ID", "1000"),
	}
	for _, r := range fx.adminRoutes() {
		if r.name == "ports" {
			continue // the ports proxy passes its query on to the guest
		}
		body := r.body
		if r.name == "sandboxes_create" {
			body = `{"template":"nosuchtemplate-badinput"}` // a server that ignores the query must not boot a VM
		}
		cases = append(cases, c(r.name+"/unknown_query_parameter", r.method, badWithQuery(r.path, "bogus=1"), body))
	}
	return cases
}

// pathCases: paths in the sandbox that are not absolute, clean and short
// answer 400; missing ones 404; a directory where a file is expected 400.
func (fx *badFixture) pathCases() []badCase {
	admin := badBearer(fx.admin)
	sp := "/v1/sandboxes/" + fx.sbx
	long := "/tmp/badinput" + strings.Repeat("/"+strings.Repeat("a", 99), 50)
	bad := []struct{ name, q, json string }{
		{"no_path", "", ""},
		{"empty_path", "path=", ""},
		{"relative", "path=tmp/badinput/x", "tmp/badinput/x"},
		{"dot_dot", "path=/tmp/keep/../badinput/x", "/tmp/keep/../badinput/x"},
		{"dot_dot_last", "path=/tmp/keep/sub/..", "/tmp/keep/sub/.."},
		{"nul", "path=/tmp/badinput/a%00b", "/tmp/badinput/a\x00b"},
		{"5000_bytes", "path=" + long, long},
		{"two_paths", "path=/tmp/badinput/x&path=/tmp/keep", ""},
	}
	var cases []badCase
	c := func(name string, status int, method, path string, body any) {
		cases = append(cases, badCase{name: name, status: status, req: badReq{method: method, path: path, authz: admin, body: body}})
	}
	for _, r := range []struct {
		name, method, route string
		body                any
	}{
		{"files_put", "PUT", "/files", "x"},
		{"files_get", "GET", "/files", nil},
		{"files_delete", "DELETE", "/files", nil},
		{"files_delete_recursive", "DELETE", "/files", nil},
		{"fs_stat", "GET", "/fs/stat", nil},
		{"fs_list", "GET", "/fs/list", nil},
		{"archive_get", "GET", "/archive", nil},
		{"archive_put", "PUT", "/archive", fx.tarBody},
	} {
		for _, b := range bad {
			q := b.q
			if r.name == "files_delete_recursive" {
				q = strings.TrimPrefix(q+"&recursive=true", "&")
			}
			path := sp + r.route
			if q != "" {
				path += "?" + q
			}
			c(r.name+"/"+b.name, 400, r.method, path, r.body)
		}
	}
	for _, b := range bad {
		if b.json == "" && b.name != "empty_path" {
			continue
		}
		c("fs_mkdir/"+b.name, 400, "POST", sp+"/fs/mkdir", apiv1.Path{Path: b.json})
		c("fs_move/from_"+b.name, 400, "POST", sp+"/fs/move", apiv1.Move{From: b.json, To: "/tmp/badinput/m"})
		c("fs_move/to_"+b.name, 400, "POST", sp+"/fs/move", apiv1.Move{From: "/tmp/keep/file.txt", To: b.json})
	}

	// Missing paths.
	for _, p := range []string{"/tmp/nosuch", "/tmp/nosuch/deeper"} {
		n := strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "_")
		c("files_get/missing_"+n, 404, "GET", sp+"/files?path="+p, nil)
		c("files_delete/missing_"+n, 404, "DELETE", sp+"/files?path="+p, nil)
		c("files_delete_recursive/missing_"+n, 404, "DELETE", sp+"/files?recursive=true&path="+p, nil)
		c("fs_stat/missing_"+n, 404, "GET", sp+"/fs/stat?path="+p, nil)
		c("fs_list/missing_"+n, 404, "GET", sp+"/fs/list?path="+p, nil)
		c("archive_get/missing_"+n, 404, "GET", sp+"/archive?path="+p, nil)
		c("fs_move/missing_from_"+n, 404, "POST", sp+"/fs/move", apiv1.Move{From: p, To: "/tmp/badinput/m"})
	}

	// A directory where a file is expected, and other refusals.
	c("files_get/directory", 400, "GET", sp+"/files?path=/tmp/keep", nil)
	c("files_get/root_directory", 400, "GET", sp+"/files?path=/", nil)
	c("files_put/onto_a_directory", 400, "PUT", sp+"/files?path=/tmp/keep", "x")
	c("files_put/onto_an_empty_directory", 400, "PUT", sp+"/files?path=/tmp/keep/sub", "x")
	c("files_delete/non_empty_directory_without_recursive", 400, "DELETE", sp+"/files?path=/tmp/keep", nil)
	c("files_delete/root", 400, "DELETE", sp+"/files?path=/", nil)
	c("files_delete/root_recursive", 400, "DELETE", sp+"/files?path=/&recursive=true", nil)
	c("archive_put/not_a_tar", 400, "PUT", sp+"/archive?path=/tmp/badinput", "this is not a tar stream")
	return cases
}

// testTenants: a user key sees and touches only its own sandboxes; another
// tenant's IDs answer 404 exactly as unknown ones do.
func (fx *badFixture) testTenants(t *testing.T) {
	authB := badBearer(fx.keyB)
	var cases []badCase
	for _, r := range fx.routes(fx.sbxA, fx.cmdA, fx.opA, fx.keyAID) {
		switch {
		case strings.HasPrefix(r.name, "keys_"), strings.HasPrefix(r.name, "template"), strings.HasPrefix(r.name, "secrets_"),
			r.name == "sandboxes_create", r.name == "sandboxes_list":
			continue
		}
		cases = append(cases, badCase{name: "b_on_a/" + r.name, status: 404,
			req: badReq{method: r.method, path: r.path, authz: authB, body: r.body}, check: fx.noLeak})
	}
	cases = append(cases,
		badCase{name: "b_on_a/operation_get_wait", status: 404, check: fx.noLeak,
			req: badReq{method: "GET", path: "/v1/operations/" + fx.opA + "?wait_s=2", authz: authB}},
		badCase{name: "b_on_a/files_get_relative_path", status: 404, check: fx.noLeak,
			req: badReq{method: "GET", path: "/v1/sandboxes/" + fx.sbxA + "/files?path=tmp/x", authz: authB}},
		badCase{name: "b_on_a/attach_with_last_event_id", status: 404, check: fx.noLeak,
			req: badReq{method: "GET", path: "/v1/commands/" + fx.cmdT1 + "/attach", authz: authB, header: []string{"Last-Event-ID", "1"}}},
		badCase{name: "b_on_admin/sandbox_get", status: 404, check: fx.noLeak,
			req: badReq{method: "GET", path: "/v1/sandboxes/" + fx.sbx, authz: authB}},
		badCase{name: "user_b/keys_create", status: 403,
			req: badReq{method: "POST", path: "/v1/keys", authz: authB, body: `{"name":"badinput-probe","role":"user"}`}},
		badCase{name: "user_b/keys_create_admin", status: 403,
			req: badReq{method: "POST", path: "/v1/keys", authz: authB, body: `{"name":"badinput-probe","role":"admin"}`}},
		badCase{name: "user_a/keys_create", status: 403,
			req: badReq{method: "POST", path: "/v1/keys", authz: badBearer(fx.keyA), body: `{"name":"badinput-probe","role":"user"}`}},
		badCase{name: "user_b/keys_delete_a", status: 403,
			req: badReq{method: "DELETE", path: "/v1/keys/" + fx.keyAID, authz: authB}},
		badCase{name: "user_b/keys_delete_admin", status: 403,
			req: badReq{method: "DELETE", path: "/v1/keys/" + fx.adminID, authz: authB}},
	)
	fx.runCases(t, cases)

	// A's IDs answer B exactly as unknown IDs do.
	for _, p := range []struct{ name, known, unknown string }{
		{"sandbox", "/v1/sandboxes/" + fx.sbxA, "/v1/sandboxes/sbxbadinputbadinputbadi"},
		{"command", "/v1/commands/" + fx.cmdA, "/v1/commands/cmdbadinputbadinputbadi"},
		{"operation", "/v1/operations/" + fx.opA, "/v1/operations/opbadinputbadinputbadi"},
		{"files", "/v1/sandboxes/" + fx.sbxA + "/files?path=/tmp/keep/file.txt", "/v1/sandboxes/sbxbadinputbadinputbadi/files?path=/tmp/keep/file.txt"},
	} {
		t.Run("same_as_unknown/"+p.name, func(t *testing.T) {
			known := fx.send(t, badReq{method: "GET", path: p.known, authz: authB})
			unknown := fx.send(t, badReq{method: "GET", path: p.unknown, authz: authB})
			ek := badCheckError(t, "GET "+p.known, known, 404)
			eu := badCheckError(t, "GET "+p.unknown, unknown, 404)
			idK := strings.Split(strings.TrimPrefix(p.known, "/v1/"), "/")[1]
			idU := strings.Split(strings.TrimPrefix(p.unknown, "/v1/"), "/")[1]
			idK, _, _ = strings.Cut(idK, "?")
			idU, _, _ = strings.Cut(idU, "?")
			if strings.ReplaceAll(ek.Message, idK, "ID") != strings.ReplaceAll(eu.Message, idU, "ID") {
				t.Errorf("another tenant's ID is told apart from an unknown one: %q vs %q", ek.Message, eu.Message)
			}
		})
	}

	t.Run("lists_hide_a", func(t *testing.T) {
		for _, q := range []string{"", "?state=running", "?limit=1000"} {
			var l apiv1.List[apiv1.Sandbox]
			fx.s.must(t, 200, "GET", "/v1/sandboxes"+q, fx.keyB, nil, &l)
			for _, sb := range l.Items {
				t.Errorf("GET /v1/sandboxes%s with key b lists %s (state %s), which b did not create", q, sb.ID, sb.State)
			}
		}
		var keys apiv1.List[apiv1.Key]
		fx.s.must(t, 200, "GET", "/v1/keys", fx.keyB, nil, &keys)
		if len(keys.Items) != 1 || keys.Items[0].ID != fx.keyBID {
			t.Errorf("GET /v1/keys with key b lists %+v, want only b's own key", keys.Items)
		}
		var la apiv1.List[apiv1.Sandbox]
		fx.s.must(t, 200, "GET", "/v1/sandboxes", fx.keyA, nil, &la)
		if len(la.Items) != 1 || la.Items[0].ID != fx.sbxA {
			t.Errorf("GET /v1/sandboxes with key a lists %+v, want only %s", la.Items, fx.sbxA)
		}
	})
}

// noLeak checks that a 404 to key b says nothing of a.
func (fx *badFixture) noLeak(t *testing.T, a badAnswer) {
	for _, secret := range []string{fx.keyAID, "badinput-a", "owner", "another", "belongs", "permission"} {
		if bytes.Contains(bytes.ToLower(a.body), []byte(secret)) {
			t.Errorf("the answer to another tenant mentions %q: %s", secret, badClip(string(a.body)))
		}
	}
}

// tokenCases: an attach token opens its own command's stream until that
// stream delivered the exit, and nothing else.
func (fx *badFixture) tokenCases() []badCase {
	attach := func(cmd string) string { return "/v1/commands/" + cmd + "/attach" }
	idPart := strings.TrimPrefix(fx.cmdT2, "cmd")
	c := func(name string, status int, method, path, authz string, header ...string) badCase {
		return badCase{name: name, status: status, req: badReq{method: method, path: path, authz: authz, header: header}}
	}
	return []badCase{
		c("spent_token", 401, "GET", attach(fx.cmdT1), badBearer(fx.tokT1)),
		c("spent_token_with_last_event_id", 401, "GET", attach(fx.cmdT1), badBearer(fx.tokT1), "Last-Event-ID", "1"),
		c("token_of_another_command", 401, "GET", attach(fx.cmdT2), badBearer(fx.tokT1)),
		c("garbage_token", 401, "GET", attach(fx.cmdT2), "Bearer act_garbage"),
		c("token_prefix_only", 401, "GET", attach(fx.cmdT2), "Bearer act_"),
		c("token_without_secret", 401, "GET", attach(fx.cmdT2), "Bearer act_"+idPart),
		c("token_with_wrong_secret", 401, "GET", attach(fx.cmdT2), "Bearer act_"+idPart+"_wrongsecretwrongsecret"),
		c("token_with_extra_bytes", 401, "GET", attach(fx.cmdT2), badBearer(fx.tokT2+"x")),
		c("token_without_bearer", 401, "GET", attach(fx.cmdT2), fx.tokT2),
		// Without a valid credential the answer must not tell whether the
		// command exists.
		c("garbage_token_unknown_command", 401, "GET", attach("cmdbadinputbadinputbadi"), "Bearer act_garbage"),
		c("token_of_another_command_unknown_command", 401, "GET", attach("cmdbadinputbadinputbadi"), badBearer(fx.tokT2)),
		c("token_on_command_get", 401, "GET", "/v1/commands/"+fx.cmdT2, badBearer(fx.tokT2)),
		c("token_on_commands_list", 401, "GET", "/v1/sandboxes/"+fx.sbxA+"/commands", badBearer(fx.tokT2)),
		c("token_on_sandbox_delete", 401, "DELETE", "/v1/sandboxes/"+fx.sbxA, badBearer(fx.tokT2)),
		{name: "token_on_stdin", status: 401, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdT2 + "/stdin",
			authz: badBearer(fx.tokT2), body: "x"}},
		{name: "token_on_signal", status: 401, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdT2 + "/signal",
			authz: badBearer(fx.tokT2), body: `{"signal":"KILL"}`}},
		{name: "token_on_exec", status: 401, req: badReq{method: "POST", path: "/v1/sandboxes/" + fx.sbxA + "/exec",
			authz: badBearer(fx.tokT2), body: `{"cmd":"mkdir -p /tmp/badinput"}`}},
	}
}

// testIdempotency: Idempotency-Key is bounded, and a key reused for a
// different request is refused while a retry gets the first answer.
func (fx *badFixture) testIdempotency(t *testing.T) {
	admin := badBearer(fx.admin)
	long := strings.Repeat("k", 1000)
	fx.runCases(t, []badCase{
		{name: "key_1000_bytes/keys_create", status: 400, req: badReq{method: "POST", path: "/v1/keys", authz: admin,
			body: `{"name":"badinput-probe","role":"user"}`, header: []string{"Idempotency-Key", long}}},
		{name: "key_256_bytes/keys_create", status: 400, req: badReq{method: "POST", path: "/v1/keys", authz: admin,
			body: `{"name":"badinput-probe","role":"user"}`, header: []string{"Idempotency-Key", strings.Repeat("k", 256)}}},
		{name: "key_1000_bytes/sandboxes_create", status: 400, req: badReq{method: "POST", path: "/v1/sandboxes", authz: admin,
			body: `{"template":"nosuchtemplate-badinput"}`, header: []string{"Idempotency-Key", long}}},
		{name: "key_1000_bytes/keys_delete", status: 400, req: badReq{method: "DELETE", path: "/v1/keys/" + fx.victimID,
			authz: admin, header: []string{"Idempotency-Key", long}}},
		{name: "key_1000_bytes/exec", status: 400, req: badReq{method: "POST", path: "/v1/sandboxes/" + fx.sbx + "/exec",
			authz: admin, body: `{"cmd":"mkdir -p /tmp/badinput"}`, header: []string{"Idempotency-Key", long}}},
		{name: "key_1000_bytes/files_put", status: 400, req: badReq{method: "PUT", path: "/v1/sandboxes/" + fx.sbx + "/files?path=/tmp/badinput/f",
			authz: admin, body: "x", header: []string{"Idempotency-Key", long}}},
	})

	idem := fmt.Sprintf("badinput-%d", time.Now().UnixNano())
	keysNamed := func(t *testing.T, name string) []string {
		var keys apiv1.List[apiv1.Key]
		fx.s.must(t, 200, "GET", "/v1/keys", fx.admin, nil, &keys)
		var ids []string
		for _, k := range keys.Items {
			if k.Name == name {
				ids = append(ids, k.ID)
			}
		}
		return ids
	}
	t.Run("reuse", func(t *testing.T) {
		req := badReq{method: "POST", path: "/v1/keys", authz: admin, body: `{"name":"badinput-idem","role":"user"}`,
			header: []string{"Idempotency-Key", idem}}
		first := fx.send(t, req)
		if first.status != 201 {
			t.Fatalf("first POST /v1/keys with an Idempotency-Key: %d %s", first.status, first.body)
		}
		var made apiv1.KeyCreated
		json.Unmarshal(first.body, &made)
		t.Cleanup(func() {
			fx.s.call(t, "DELETE", "/v1/keys/"+made.ID, fx.admin, nil)
			fx.base = fx.snapshot(t)
		})
		fx.base = fx.snapshot(t)

		t.Run("same_request", func(t *testing.T) {
			again := fx.send(t, req)
			if again.status != 201 || !bytes.Equal(again.body, first.body) {
				t.Errorf("retry: %d %s, want the first answer 201 %s", again.status, again.body, first.body)
			}
			if again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry: Idempotent-Replayed %q, want \"true\"", again.header.Get("Idempotent-Replayed"))
			}
			fx.settle(t)
		})
		reuse := []badCase{
			{name: "different_body", status: 409, req: badReq{method: "POST", path: "/v1/keys", authz: admin,
				body: `{"name":"badinput-idem-2","role":"user"}`, header: []string{"Idempotency-Key", idem}}},
			{name: "different_route", status: 409, req: badReq{method: "POST", path: "/v1/sandboxes", authz: admin,
				body: `{"template":"nosuchtemplate-badinput"}`, header: []string{"Idempotency-Key", idem}}},
			{name: "different_method", status: 409, req: badReq{method: "DELETE", path: "/v1/keys/" + fx.victimID, authz: admin,
				header: []string{"Idempotency-Key", idem}}},
		}
		fx.runCases(t, reuse)
		if ids := keysNamed(t, "badinput-idem"); len(ids) != 1 || ids[0] != made.ID {
			t.Errorf("keys named badinput-idem: %v, want only %s", ids, made.ID)
		}
		if ids := keysNamed(t, "badinput-idem-2"); len(ids) != 0 {
			t.Errorf("keys named badinput-idem-2: %v, want none", ids)
		}
	})
	t.Run("error_answer_is_kept", func(t *testing.T) {
		k := idem + "-error"
		bad := badReq{method: "POST", path: "/v1/keys", authz: admin, body: `{"name":5}`, header: []string{"Idempotency-Key", k}}
		first := fx.send(t, bad)
		e1 := badCheckError(t, "first", first, 400)
		again := fx.send(t, bad)
		e2 := badCheckError(t, "retry", again, 400)
		if e1.Code != e2.Code || e1.Message != e2.Message {
			t.Errorf("retry answered %+v, the first %+v", e2, e1)
		}
		good := bad
		good.body = `{"name":"badinput-idem-3","role":"user"}`
		badCheckError(t, "the same key with a good body", fx.send(t, good), 409)
		if ids := keysNamed(t, "badinput-idem-3"); len(ids) != 0 {
			t.Errorf("keys named badinput-idem-3: %v, want none", ids)
		}
		fx.settle(t)
	})
}

// testConflicts: stdin, signal and resize to a command that is not
// running answer 409; resize without a pty 400; none of them disturbs the
// command or its stream.
func (fx *badFixture) testConflicts(t *testing.T) {
	admin := badBearer(fx.admin)
	cmdReq := func(cmd, what string, body any) badReq {
		return badReq{method: "POST", path: "/v1/commands/" + cmd + "/" + what, authz: admin, body: body}
	}
	fx.runCases(t, []badCase{
		{name: "not_started/stdin", status: 409, req: cmdReq(fx.cmdIdle, "stdin", "x")},
		{name: "not_started/stdin_eof", status: 409, req: cmdReq(fx.cmdIdle, "stdin?eof=1", "")},
		{name: "not_started/signal", status: 409, req: cmdReq(fx.cmdIdle, "signal", `{"signal":"TERM"}`)},
		{name: "not_started/signal_kill", status: 409, req: cmdReq(fx.cmdIdle, "signal", `{"signal":"KILL"}`)},
		{name: "not_started/resize", status: 409, req: cmdReq(fx.cmdIdle, "resize", `{"rows":40,"cols":120}`)},
		{name: "not_started_pty/resize", status: 409, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdA + "/resize",
			authz: badBearer(fx.keyA), body: `{"rows":40,"cols":120}`}},
		{name: "not_started_pty/stdin", status: 409, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdA + "/stdin",
			authz: badBearer(fx.keyA), body: "x"}},
		{name: "running_without_pty/resize", status: 400, req: cmdReq(fx.cmdRun, "resize", `{"rows":40,"cols":120}`)},
		{name: "running_without_stdin/stdin", status: 409, req: cmdReq(fx.cmdRun, "stdin", "x")},
		{name: "running_without_stdin/stdin_eof", status: 409, req: cmdReq(fx.cmdRun, "stdin?eof=1", "")},
		{name: "running/signal_bogus", status: 400, req: cmdReq(fx.cmdRun, "signal", `{"signal":"BOGUS"}`)},
		{name: "running/signal_number", status: 400, req: cmdReq(fx.cmdRun, "signal", `{"signal":"9"}`)},
		{name: "exited/stdin", status: 409, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdT1 + "/stdin",
			authz: badBearer(fx.keyA), body: "x"}},
		{name: "exited/signal", status: 409, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdT1 + "/signal",
			authz: badBearer(fx.keyA), body: `{"signal":"TERM"}`}},
		{name: "exited/resize", status: 409, req: badReq{method: "POST", path: "/v1/commands/" + fx.cmdT1 + "/resize",
			authz: badBearer(fx.keyA), body: `{"rows":40,"cols":120}`}},
	})

	// A running command that reads stdin: an oversized post and a bad eof
	// value must not reach it.
	t.Run("running_with_stdin", func(t *testing.T) {
		cat := fx.newCommand(t, fx.admin, fx.sbx, apiv1.CommandRequest{Argv: []string{"cat"}, Stdin: true})
		resp, r := fx.s.attach(t, cat.ID, fx.admin, 0)
		defer resp.Body.Close()
		if ev, err := r.next(); err != nil || ev.name != apiv1.EventStart {
			t.Fatalf("the stream of cat began with %q (%v)", ev.name, err)
		}
		fx.base = fx.snapshot(t)
		fx.runCases(t, []badCase{
			{name: "stdin_17_MiB", status: 413, req: badReq{method: "POST", path: "/v1/commands/" + cat.ID + "/stdin",
				authz: admin, size: 17 << 20}},
			{name: "stdin_eof_maybe", status: 400, req: cmdReq(cat.ID, "stdin?eof=maybe", "bad\n")},
			{name: "resize_without_pty", status: 400, req: cmdReq(cat.ID, "resize", `{"rows":40,"cols":120}`)},
		})
		fx.s.must(t, 204, "POST", "/v1/commands/"+cat.ID+"/stdin?eof=1", fx.admin, "ok\n", nil)
		o := readToExit(t, r)
		if o.stdout != "ok\n" || o.stderr != "" || o.exit.ExitCode != 0 {
			t.Errorf("cat after the refused posts: stdout %q stderr %q exit %+v, want only \"ok\\n\"", o.stdout, o.stderr, o.exit)
		}
	})

	// The running sleep's stream saw none of it.
	t.Run("running_stream_unaffected", func(t *testing.T) {
		fx.s.must(t, 204, "POST", "/v1/commands/"+fx.cmdRun+"/signal", fx.admin, apiv1.Signal{Signal: "KILL"}, nil)
		o := readToExit(t, fx.runStream)
		if o.exit.Signal == nil || *o.exit.Signal != "KILL" || o.stdout != "" || o.stderr != "" {
			t.Errorf("sleep after the refused requests: %+v, want killed by KILL with no output", o)
		}
		if len(o.names) != 1 || o.names[0] != apiv1.EventExit {
			t.Errorf("sleep's stream after start: %v, want only exit", o.names)
		}
		// The stream's exit may come before the command's record says so.
		testenv.Eventually(t, 10*time.Second, "the killed command recorded as exited", func() (bool, string) {
			var c apiv1.Command
			fx.s.must(t, 200, "GET", "/v1/commands/"+fx.cmdRun, fx.admin, nil, &c)
			return c.State == apiv1.CommandExited, c.State
		})
		fx.base = fx.snapshot(t)
	})
	fx.runCases(t, []badCase{
		{name: "killed/signal", status: 409, req: cmdReq(fx.cmdRun, "signal", `{"signal":"TERM"}`)},
		{name: "killed/stdin", status: 409, req: cmdReq(fx.cmdRun, "stdin", "x")},
		{name: "killed/resize", status: 409, req: cmdReq(fx.cmdRun, "resize", `{"rows":40,"cols":120}`)},
	})
}

// testDeleted: a deleted sandbox stays readable, cannot be deleted again,
// and refuses commands and files with 409.
func (fx *badFixture) testDeleted(t *testing.T) {
	admin := badBearer(fx.admin)
	var res apiv1.SandboxOperation
	fx.s.must(t, 202, "DELETE", "/v1/sandboxes/"+fx.sbx, fx.admin, nil, &res)
	fx.sbxLive = false
	t.Run("delete_while_deleting", func(t *testing.T) {
		badCheckError(t, "DELETE again", fx.send(t, badReq{method: "DELETE", path: "/v1/sandboxes/" + fx.sbx, authz: admin}), 409)
	})
	if op := fx.s.waitOp(t, fx.admin, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("delete failed: %+v", op.Error)
	}
	var sb apiv1.Sandbox
	fx.s.must(t, 200, "GET", "/v1/sandboxes/"+fx.sbx, fx.admin, nil, &sb)
	if sb.State != apiv1.StateDeleted {
		t.Errorf("a deleted sandbox reads as %q, want deleted", sb.State)
	}
	fx.base = fx.snapshot(t)
	var cases []badCase
	for _, r := range fx.adminRoutes() {
		switch r.name {
		case "sandbox_delete", "commands_create", "exec", "attach", "stdin", "signal", "resize",
			"files_put", "files_get", "files_delete", "fs_stat", "fs_list", "fs_mkdir", "fs_move", "archive_get", "archive_put",
			"network_put", "ports", "tunnel":
			cases = append(cases, badCase{name: r.name, status: 409, req: badReq{method: r.method, path: r.path, authz: admin, body: r.body}})
		}
	}
	fx.runCases(t, cases)
}
