package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const testKey = "key-for-tests"

// fakeServer implements just enough of the HTTP API, over a real
// transport, for the CLI's commands: sandboxes with operations that finish
// on the first poll, commands that echo, and one in-memory file tree per
// server.
type fakeServer struct {
	url string

	mu        sync.Mutex
	n         int
	sandboxes map[string]*apiv1.Sandbox
	ops       map[string]*apiv1.Operation
	opFail    map[string]string // op ID → the error it fails with
	commands  map[string]*fakeCommand
	files     map[string]*fakeFile // by clean absolute path; "/" always exists
	created   []apiv1.CreateSandbox
	pageSize  int
	tpl       fakeTemplates                   // see template_test.go
	metrics   map[string]apiv1.SandboxMetrics // of running sandboxes; see top_test.go
	measured  []string                        // the sandboxes whose metrics were asked for
}

type fakeCommand struct {
	req     apiv1.CommandRequest
	started bool
	stdin   bytes.Buffer
	eof     chan struct{}
	signals []string
	signal  chan string
}

type fakeFile struct {
	dir  bool
	link string
	mode fs.FileMode
	data []byte
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{sandboxes: map[string]*apiv1.Sandbox{}, ops: map[string]*apiv1.Operation{},
		opFail: map[string]string{}, commands: map[string]*fakeCommand{},
		files: map[string]*fakeFile{"/": {dir: true, mode: 0o755}}, pageSize: 2, tpl: newFakeTemplates(),
		metrics: map[string]apiv1.SandboxMetrics{}}
	mux := http.NewServeMux()
	f.templateRoutes(mux)
	mux.HandleFunc("POST /v1/sandboxes", f.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes", f.listSandboxes)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.deleteSandbox)
	mux.HandleFunc("GET /v1/operations/{id}", f.getOperation)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands", f.createCommand)
	mux.HandleFunc("GET /v1/commands/{id}/attach", f.attach)
	mux.HandleFunc("POST /v1/commands/{id}/stdin", f.stdin)
	mux.HandleFunc("POST /v1/commands/{id}/signal", f.signal)
	mux.HandleFunc("POST /v1/commands/{id}/resize", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.writeFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.readFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", f.stat)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/archive", f.archiveIn)
	mux.HandleFunc("GET /v1/sandboxes/{id}/archive", f.archiveOut)
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", f.sandboxMetrics)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			fakeError(w, 401, "unauthenticated", "bad key")
			return
		}
		// The file tree belongs to every sandbox there is.
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/"); ok && strings.Contains(rest, "/") {
			id, _, _ := strings.Cut(rest, "/")
			f.mu.Lock()
			sb := f.sandbox(w, id)
			f.mu.Unlock()
			if sb == nil {
				return
			}
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func fakeError(w http.ResponseWriter, status int, code, msg string) {
	fakeJSON(w, status, apiv1.ErrorBody{Error: apiv1.Error{Code: code, Message: msg}})
}

func fakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) id(prefix string) string {
	f.n++
	return fmt.Sprintf("%s%d", prefix, f.n)
}

// addSandbox adds a running sandbox.
func (f *fakeServer) addSandbox(id string, created time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[id] = &apiv1.Sandbox{ID: id, State: apiv1.StateRunning, Template: apiv1.TemplateRef{Ref: "base:latest"}, CreatedAt: created}
}

func (f *fakeServer) sandbox(w http.ResponseWriter, id string) *apiv1.Sandbox {
	sb := f.sandboxes[id]
	if sb == nil {
		fakeError(w, 404, "not_found", "no sandbox "+id)
	}
	return sb
}

func (f *fakeServer) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CreateSandbox
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	sb := &apiv1.Sandbox{ID: f.id("sbx"), State: apiv1.StateCreating, Template: apiv1.TemplateRef{Ref: req.Template + ":latest"},
		VCPUs: max(req.VCPUs, 1), MemoryMiB: req.MemoryMiB, Metadata: req.Metadata, CreatedAt: time.Now()}
	op := &apiv1.Operation{ID: f.id("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Status: apiv1.OpRunning, CreatedAt: time.Now()}
	if req.Template == "broken" {
		f.opFail[op.ID] = "template broken does not boot: kernel panic"
	}
	f.sandboxes[sb.ID], f.ops[op.ID] = sb, op
	fakeJSON(w, 202, apiv1.SandboxOperation{Sandbox: *sb, Operation: *op})
}

func (f *fakeServer) getOperation(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.ops[r.PathValue("id")]
	if op == nil {
		fakeError(w, 404, "not_found", "no operation "+r.PathValue("id"))
		return
	}
	if !op.Done() && r.URL.Query().Get("wait_s") != "" {
		now := time.Now()
		op.Status, op.FinishedAt = apiv1.OpSucceeded, &now
		sb := f.sandboxes[op.TargetID]
		switch {
		case op.Kind == apiv1.OpBuild:
			f.finishBuild(op.TargetID)
		case f.opFail[op.ID] != "":
			op.Status = apiv1.OpFailed
			op.Error = &apiv1.Status{Code: "internal", Message: f.opFail[op.ID]}
			sb.State, sb.LastError = apiv1.StateFailed, op.Error
		case op.Kind == apiv1.OpCreate:
			sb.State = apiv1.StateRunning
		case op.Kind == apiv1.OpDelete:
			sb.State = apiv1.StateDeleted
		}
	}
	fakeJSON(w, 200, op)
}

func (f *fakeServer) getSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandbox(w, r.PathValue("id")); sb != nil {
		fakeJSON(w, 200, sb)
	}
}

func (f *fakeServer) listSandboxes(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	var match []apiv1.Sandbox
	for _, sb := range f.sandboxes {
		if st := q.Get("state"); st != "" && sb.State != st || st == "" && sb.State == apiv1.StateDeleted {
			continue
		}
		ok := true
		for k, v := range q {
			if name, found := strings.CutPrefix(k, "metadata."); found && sb.Metadata[name] != v[0] {
				ok = false
			}
		}
		if ok {
			match = append(match, *sb)
		}
	}
	sort.Slice(match, func(i, j int) bool { return match[i].ID < match[j].ID })
	start, _ := strconv.Atoi(q.Get("page_token"))
	end := min(start+f.pageSize, len(match))
	page := apiv1.List[apiv1.Sandbox]{Items: match[start:end]}
	if end < len(match) {
		page.NextPageToken = strconv.Itoa(end)
	}
	fakeJSON(w, 200, page)
}

func (f *fakeServer) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandbox(w, r.PathValue("id"))
	if sb == nil {
		return
	}
	sb.State = apiv1.StateDeleting
	op := &apiv1.Operation{ID: f.id("op"), Kind: apiv1.OpDelete, TargetID: sb.ID, Status: apiv1.OpRunning}
	f.ops[op.ID] = op
	fakeJSON(w, 202, apiv1.SandboxOperation{Sandbox: *sb, Operation: *op})
}

func (f *fakeServer) createCommand(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CommandRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandbox(w, r.PathValue("id")); sb == nil {
		return
	} else if sb.State != apiv1.StateRunning {
		fakeError(w, 409, "conflict", "sandbox "+sb.ID+" is "+sb.State)
		return
	}
	id := f.id("cmd")
	f.commands[id] = &fakeCommand{req: req, eof: make(chan struct{}), signal: make(chan string, 4)}
	fakeJSON(w, 201, apiv1.CommandSession{ID: id, SandboxID: r.PathValue("id"), State: "created"})
}

func (f *fakeServer) command(id string) *fakeCommand {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commands[id]
}

// attach runs the fake command: "exit N" exits N, "cat" echoes stdin at
// its EOF, "wait-signal" ends with the first signal it gets; anything else
// prints its argv (or cmd) on stdout and "warning" on stderr.
func (f *fakeServer) attach(w http.ResponseWriter, r *http.Request) {
	c := f.command(r.PathValue("id"))
	if c == nil {
		fakeError(w, 404, "not_found", "no command")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	id := 0
	send := func(name string, v any) {
		id++
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", id, name, b)
		w.(http.Flusher).Flush()
	}
	f.mu.Lock()
	c.started = true
	f.mu.Unlock()
	send(apiv1.EventStart, apiv1.StartEvent{PID: 10})
	argv := c.req.Argv
	switch {
	case len(argv) == 2 && argv[0] == "exit":
		code, _ := strconv.Atoi(argv[1])
		send(apiv1.EventExit, apiv1.ExitEvent{ExitCode: code})
	case len(argv) == 1 && argv[0] == "cat":
		select {
		case <-c.eof:
		case <-r.Context().Done():
			return
		}
		f.mu.Lock()
		in := slices.Clone(c.stdin.Bytes())
		f.mu.Unlock()
		send(apiv1.EventStdout, apiv1.DataEvent{Data: in})
		send(apiv1.EventExit, apiv1.ExitEvent{})
	case len(argv) == 1 && argv[0] == "wait-signal":
		select {
		case sig := <-c.signal:
			send(apiv1.EventExit, apiv1.ExitEvent{ExitCode: 130, Signal: &sig})
		case <-r.Context().Done():
		}
	default:
		out := c.req.Cmd
		if out == "" {
			out = strings.Join(argv, " ")
		}
		send(apiv1.EventStdout, apiv1.DataEvent{Data: []byte(out + "\n")})
		send(apiv1.EventStderr, apiv1.DataEvent{Data: []byte("warning\n")})
		send(apiv1.EventExit, apiv1.ExitEvent{})
	}
}

func (f *fakeServer) stdin(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.commands[r.PathValue("id")]
	if c == nil || !c.started || !c.req.Stdin {
		fakeError(w, 409, "conflict", "no stdin")
		return
	}
	c.stdin.Write(b)
	if r.URL.Query().Get("eof") == "1" {
		close(c.eof)
	}
	w.WriteHeader(204)
}

func (f *fakeServer) signal(w http.ResponseWriter, r *http.Request) {
	var s apiv1.Signal
	_ = json.NewDecoder(r.Body).Decode(&s)
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.commands[r.PathValue("id")]
	c.signals = append(c.signals, s.Signal)
	c.signal <- s.Signal
	w.WriteHeader(204)
}

// mkdirAll makes dir and its parents in the fake tree; f.mu is held.
func (f *fakeServer) mkdirAll(dir string) {
	for d := dir; ; d = path.Dir(d) {
		if f.files[d] == nil {
			f.files[d] = &fakeFile{dir: true, mode: 0o755}
		}
		if d == "/" {
			return
		}
	}
}

func (f *fakeServer) writeFile(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	mode := fs.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		n, _ := strconv.ParseUint(m, 8, 32)
		mode = fs.FileMode(n)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.files[p]; old != nil && old.dir {
		fakeError(w, 400, "invalid_argument", p+" is a directory")
		return
	}
	f.mkdirAll(path.Dir(p))
	f.files[p] = &fakeFile{mode: mode, data: data}
	w.WriteHeader(204)
}

func (f *fakeServer) readFile(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := r.URL.Query().Get("path")
	switch file := f.files[p]; {
	case file == nil:
		fakeError(w, 404, "not_found", "no such file "+p)
	case file.dir:
		fakeError(w, 400, "invalid_argument", p+" is a directory")
	default:
		w.Write(file.data)
	}
}

func (f *fakeServer) stat(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := r.URL.Query().Get("path")
	file := f.files[p]
	if file == nil {
		fakeError(w, 404, "not_found", "no such file or directory "+p)
		return
	}
	typ := "file"
	switch {
	case file.dir:
		typ = "dir"
	case file.link != "":
		typ = "symlink"
	}
	fakeJSON(w, 200, apiv1.Stat{Path: p, Type: typ, SizeBytes: int64(len(file.data)), Mode: fmt.Sprintf("%04o", file.mode)})
}

func (f *fakeServer) archiveIn(w http.ResponseWriter, r *http.Request) {
	dir := r.URL.Query().Get("path")
	tr := tar.NewReader(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mkdirAll(dir)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fakeError(w, 400, "invalid_argument", "bad tar: "+err.Error())
			return
		}
		p := path.Join(dir, h.Name)
		f.mkdirAll(path.Dir(p))
		switch h.Typeflag {
		case tar.TypeDir:
			f.files[p] = &fakeFile{dir: true, mode: fs.FileMode(h.Mode).Perm()}
		case tar.TypeSymlink:
			f.files[p] = &fakeFile{link: h.Linkname, mode: 0o777}
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			f.files[p] = &fakeFile{mode: fs.FileMode(h.Mode).Perm(), data: data}
		}
	}
	w.WriteHeader(204)
}

func (f *fakeServer) archiveOut(w http.ResponseWriter, r *http.Request) {
	dir := r.URL.Query().Get("path")
	f.mu.Lock()
	defer f.mu.Unlock()
	if file := f.files[dir]; file == nil || !file.dir {
		fakeError(w, 404, "not_found", "no directory "+dir)
		return
	}
	var names []string
	for p := range f.files {
		if strings.HasPrefix(p, dir+"/") {
			names = append(names, p)
		}
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, p := range names {
		file := f.files[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, dir+"/"), Mode: int64(file.mode), ModTime: time.Unix(1700000000, 0)}
		switch {
		case file.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case file.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, file.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(file.data))
		}
		tw.WriteHeader(h)
		tw.Write(file.data)
	}
	tw.Close()
}

// run runs the airlock command line args against the fake server, with
// stdin from the string stdin, and returns its outputs and error.
func (f *fakeServer) run(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	t.Setenv("AIRLOCK_API_KEY", testKey)
	in, inw, perr := os.Pipe()
	if perr != nil {
		t.Fatal(perr)
	}
	defer in.Close()
	go func() {
		io.WriteString(inw, stdin)
		inw.Close()
	}()
	var out, errb bytes.Buffer
	env := &Env{Stdin: in, Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	// --url goes right after the subcommand, where every command takes it.
	full := slices.Clone(args)
	at := 1
	if args[0] == "sandbox" || args[0] == "op" || args[0] == "template" {
		at = 2
	}
	full = slices.Insert(full, at, "--url", f.url)
	err = Run(context.Background(), env, full)
	return out.String(), errb.String(), err
}

func TestAPIKey(t *testing.T) {
	dir := datadir.Dir{Root: t.TempDir()}
	t.Setenv("AIRLOCK_API_KEY", "")
	_, err := apiKey(dir)
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "set AIRLOCK_API_KEY") {
		t.Fatalf("no key anywhere: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir.Root, "admin.key"), []byte("  file-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := apiKey(dir); err != nil || k != "file-key" {
		t.Fatalf("from the file: %q %v", k, err)
	}
	t.Setenv("AIRLOCK_API_KEY", "env-key")
	if k, err := apiKey(dir); err != nil || k != "env-key" {
		t.Fatalf("from the environment: %q %v", k, err)
	}
}

func TestSecondsFlag(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"90", 90, true}, {"0", 0, true}, {"15m", 900, true}, {"1.5s", 2, true},
		{"-1", 0, false}, {"-5s", 0, false}, {"soon", 0, false},
	}
	for _, tc := range tests {
		var s secondsFlag
		err := s.Set(tc.in)
		if (err == nil) != tc.ok || tc.ok && (s.n != tc.want || !s.set) {
			t.Errorf("Set(%q): %d %v, want %d ok=%v", tc.in, s.n, err, tc.want, tc.ok)
		}
	}
}

func TestParseInterspersed(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantPos  []string
		wantJSON bool
	}{
		{"flags first", []string{"--json", "a", "b"}, []string{"a", "b"}, true},
		{"flags last", []string{"a", "b", "--json"}, []string{"a", "b"}, true},
		{"flags between", []string{"a", "--json", "b"}, []string{"a", "b"}, true},
		{"dash is positional", []string{"-", "a"}, []string{"-", "a"}, false},
		{"after -- all is positional", []string{"a", "--", "--json"}, []string{"a", "--json"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet("x", "x", "x", &Env{Stderr: io.Discard})
			asJSON := fs.Bool("json", false, "")
			pos, err := parseInterspersed(fs, tc.args)
			if err != nil || !slices.Equal(pos, tc.wantPos) || *asJSON != tc.wantJSON {
				t.Fatalf("got %q json=%v err=%v, want %q json=%v", pos, *asJSON, err, tc.wantPos, tc.wantJSON)
			}
		})
	}
}

func TestHelpListsServerCommands(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &Env{Stdout: &out, Stderr: io.Discard}, []string{"help"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range commands() {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(c.name) + ` +` + regexp.QuoteMeta(c.summary) + `$`).MatchString(out.String()) {
			t.Errorf("help lacks %q", c.name)
		}
	}
	for _, name := range []string{"sandbox", "exec", "shell", "cp", "op"} {
		if !strings.Contains(out.String(), "  "+name+" ") {
			t.Errorf("help lacks %s", name)
		}
	}
}

// `airlock --help` lists the commands in two aligned columns: every
// summary starts at the same column, two spaces after the longest name.
func TestHelpColumnsAligned(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &Env{Stdout: &out, Stderr: io.Discard}, []string{"--help"}); err != nil {
		t.Fatal(err)
	}
	widest := 0
	for _, c := range commands() {
		widest = max(widest, len(c.name))
	}
	want := 2 + widest + 2
	rows := 0
	for _, c := range commands() {
		for _, line := range strings.Split(out.String(), "\n") {
			name, _, ok := strings.Cut(strings.TrimPrefix(line, "  "), " ")
			if !strings.HasPrefix(line, "  ") || !ok || name != c.name {
				continue
			}
			rows++
			if col := strings.Index(line, c.summary); col != want {
				t.Errorf("the summary of %s starts at column %d, want %d:\n%s", c.name, col, want, line)
			}
		}
	}
	if rows != len(commands()) {
		t.Errorf("found %d command rows, want %d:\n%s", rows, len(commands()), out.String())
	}
}

func TestUnreachableServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	t.Setenv("AIRLOCK_API_KEY", testKey)
	env := &Env{Stdout: io.Discard, Stderr: io.Discard, Dir: datadir.Dir{Root: t.TempDir()}}
	err := Run(context.Background(), env, []string{"sandbox", "ls", "--url", url})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "is `airlock serve` running?") {
		t.Fatalf("got %v", err)
	}
	if ExitCode(err) != 1 {
		t.Fatalf("exit %d", ExitCode(err))
	}
}

func TestShowProgress(t *testing.T) {
	// Not a terminal: one line once the wait passes a second, none before.
	var quick, slow bytes.Buffer
	for _, tc := range []struct {
		w    *bytes.Buffer
		wait time.Duration
	}{{&quick, 10 * time.Millisecond}, {&slow, progressAfter + 300*time.Millisecond}} {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { showProgress(tc.w, "creating sbx1…", stop); close(done) }()
		time.Sleep(tc.wait)
		close(stop)
		<-done
	}
	if quick.String() != "" {
		t.Errorf("a quick wait showed %q", quick.String())
	}
	if slow.String() != "airlock: creating sbx1…\n" {
		t.Errorf("a slow wait showed %q", slow.String())
	}
}
