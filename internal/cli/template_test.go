package cli

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// fakeTemplates is the fake server's template state, guarded by
// fakeServer.mu. A build's log is decided when it starts: a Dockerfile
// with "RUN false" fails at that step, anything else is ready.
type fakeTemplates struct {
	templates map[string]*apiv1.Template // by name:tag
	builds    map[string]*fakeBuild      // by build ID
	latest    map[string]string          // name:tag → its last build's ID
	contexts  map[string][]byte          // uploaded tars by ID
	ctxTypes  []string                   // Content-Type of each upload
	creates   []apiv1.CreateTemplate
	saves     []apiv1.SaveTemplate
	logGets   int
	// contextLimit, if not 0, is the largest context the server takes.
	contextLimit int
	// cutLogs is how many more log streams end after their first line,
	// without an end event.
	cutLogs int
}

type fakeBuild struct {
	id    string
	ref   string
	opID  string
	lines []apiv1.BuildLogLine
	end   apiv1.BuildEnd
	done  bool
}

func newFakeTemplates() fakeTemplates {
	return fakeTemplates{templates: map[string]*apiv1.Template{}, builds: map[string]*fakeBuild{},
		latest: map[string]string{}, contexts: map[string][]byte{}}
}

func (f *fakeServer) templateRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/templates", f.listTemplates)
	mux.HandleFunc("GET /v1/templates/{ref}", f.getTemplate)
	mux.HandleFunc("POST /v1/templates", f.createTemplate)
	mux.HandleFunc("DELETE /v1/templates/{ref}", f.deleteTemplate)
	mux.HandleFunc("GET /v1/templates/{ref}/build-log", f.buildLog)
	mux.HandleFunc("PUT /v1/build-contexts", f.putBuildContext)
	mux.HandleFunc("POST /v1/sandboxes/{id}/template", f.saveSandbox)
}

// templateKey is the name:tag a ref names; f.mu is held.
func (f *fakeServer) templateKey(ref string) string {
	if strings.HasPrefix(ref, "sha256:") {
		for k, t := range f.tpl.templates {
			if t.Digest == ref {
				return k
			}
		}
		return ref
	}
	if !strings.Contains(ref, ":") {
		return ref + ":latest"
	}
	return ref
}

func (f *fakeServer) listTemplates(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var all []apiv1.Template
	for _, t := range f.tpl.templates {
		all = append(all, *t)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name+":"+all[i].Tag < all[j].Name+":"+all[j].Tag })
	start, _ := strconv.Atoi(r.URL.Query().Get("page_token"))
	end := min(start+f.pageSize, len(all))
	page := apiv1.List[apiv1.Template]{Items: all[start:end]}
	if end < len(all) {
		page.NextPageToken = strconv.Itoa(end)
	}
	fakeJSON(w, 200, page)
}

func (f *fakeServer) getTemplate(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tpl.templates[f.templateKey(r.PathValue("ref"))]
	if t == nil {
		fakeError(w, 404, "not_found", "no template "+r.PathValue("ref"))
		return
	}
	fakeJSON(w, 200, t)
}

func (f *fakeServer) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	f.mu.Lock()
	defer f.mu.Unlock()
	if !strings.Contains(ref, ":") {
		fakeError(w, 400, "invalid_argument", "template "+ref+": name the tag to delete")
		return
	}
	if f.tpl.templates[ref] == nil {
		fakeError(w, 404, "not_found", "no template "+ref)
		return
	}
	delete(f.tpl.templates, ref)
	w.WriteHeader(204)
}

func (f *fakeServer) putBuildContext(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tpl.ctxTypes = append(f.tpl.ctxTypes, r.Header.Get("Content-Type"))
	if f.tpl.contextLimit > 0 && len(data) > f.tpl.contextLimit {
		fakeError(w, 413, "payload_too_large", fmt.Sprintf("build context is over the limit of %d bytes", f.tpl.contextLimit))
		return
	}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		if _, err := tr.Next(); err == io.EOF {
			break
		} else if err != nil {
			fakeError(w, 400, "invalid_argument", "build context is not a valid tar archive: "+err.Error())
			return
		}
	}
	sum := sha256.Sum256(data)
	id := "ctx" + hex.EncodeToString(sum[:])[:24]
	f.tpl.contexts[id] = data
	fakeJSON(w, 201, apiv1.BuildContext{ID: id, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))})
}

// startBuild records a build of name:tag with its log and operation; f.mu
// is held.
func (f *fakeServer) startBuild(name, tag string, lines []apiv1.BuildLogLine, end apiv1.BuildEnd) apiv1.TemplateOperation {
	if tag == "" {
		tag = "latest"
	}
	ref := name + ":" + tag
	b := &fakeBuild{id: f.id("bld"), ref: ref, lines: lines, end: end}
	op := &apiv1.Operation{ID: f.id("op"), Kind: apiv1.OpBuild, TargetID: b.id, Status: apiv1.OpRunning, CreatedAt: time.Now()}
	b.opID = op.ID
	t := &apiv1.Template{Name: name, Tag: tag, Status: apiv1.TemplateBuilding, BuildID: b.id, CreatedAt: time.Now()}
	f.tpl.builds[b.id], f.tpl.latest[ref], f.tpl.templates[ref], f.ops[op.ID] = b, b.id, t, op
	return apiv1.TemplateOperation{Template: *t, Operation: *op}
}

// finishBuild ends a build as its log says, with its template and its
// operation; f.mu is held.
func (f *fakeServer) finishBuild(id string) {
	b := f.tpl.builds[id]
	if b == nil || b.done {
		return
	}
	b.done = true
	t := f.tpl.templates[b.ref]
	op := f.ops[b.opID]
	now := time.Now()
	op.Status, op.FinishedAt = apiv1.OpSucceeded, &now
	if t == nil {
		return
	}
	t.Status, t.Digest, t.Error = b.end.Status, b.end.Digest, b.end.Error
	if b.end.Status == apiv1.TemplateFailed {
		op.Status, op.Error = apiv1.OpFailed, b.end.Error
	} else {
		t.SizeBytes = 3 << 20
	}
}

func (f *fakeServer) createTemplate(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CreateTemplate
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tpl.creates = append(f.tpl.creates, req)
	if req.Context != "" && f.tpl.contexts[req.Context] == nil {
		fakeError(w, 404, "not_found", "build context "+req.Context)
		return
	}
	ref := req.Name + ":" + cmpOr(req.Tag, "latest")
	lines := []apiv1.BuildLogLine{
		{Step: 0, Stream: "info", Text: "build " + ref + " from base, 1 steps"},
		{Step: 1, Stream: "info", Text: "step 1/1: RUN echo hi"},
		{Step: 1, Stream: "stdout", Text: "hi"},
		{Step: 1, Stream: "stderr", Text: "warning: hi is short"},
	}
	sum := sha256.Sum256([]byte(req.Dockerfile + req.Context))
	end := apiv1.BuildEnd{Status: apiv1.TemplateReady, Digest: "sha256:" + hex.EncodeToString(sum[:])}
	if strings.Contains(req.Dockerfile, "RUN false") {
		lines[1].Text, lines[2].Text = "step 1/1: RUN false", "about to fail"
		end = apiv1.BuildEnd{Status: apiv1.TemplateFailed, Error: &apiv1.Status{Code: "build_failed", Message: "step 1: RUN false: exit status 1"}}
	}
	fakeJSON(w, 202, f.startBuild(req.Name, req.Tag, lines, end))
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (f *fakeServer) saveSandbox(w http.ResponseWriter, r *http.Request) {
	var req apiv1.SaveTemplate
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tpl.saves = append(f.tpl.saves, req)
	id := r.PathValue("id")
	sum := sha256.Sum256([]byte("saved " + id))
	end := apiv1.BuildEnd{Status: apiv1.TemplateReady, Digest: "sha256:" + hex.EncodeToString(sum[:])}
	fakeJSON(w, 202, f.startBuild(req.Name, req.Tag, []apiv1.BuildLogLine{{Stream: "info", Text: "saving " + id}}, end))
}

// buildLog replays the last build of a ref, with a ping between events,
// and ends it.
func (f *fakeServer) buildLog(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tpl.logGets++
	b := f.tpl.builds[f.tpl.latest[f.templateKey(r.PathValue("ref"))]]
	cut := f.tpl.cutLogs > 0
	if cut {
		f.tpl.cutLogs--
	}
	f.mu.Unlock()
	if b == nil {
		fakeError(w, 404, "not_found", "no build of "+r.PathValue("ref"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(name string, v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, ": ping\n\nevent: %s\ndata: %s\n\n", name, data)
		w.(http.Flusher).Flush()
	}
	for i, ln := range b.lines {
		if cut && i == 1 {
			return
		}
		send("log", ln)
	}
	f.mu.Lock()
	f.finishBuild(b.id)
	f.mu.Unlock()
	send("end", b.end)
}

// contextEntry is what a test checks of a tar entry.
type contextEntry struct {
	typ  byte
	mode int64
	link string
	data string
}

func readContext(t *testing.T, data []byte) (names []string, entries map[string]contextEntry) {
	t.Helper()
	entries = map[string]contextEntry{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, entries
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s is owned by %d:%d (%s:%s), want root", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		names = append(names, h.Name)
		entries[h.Name] = contextEntry{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: string(b)}
	}
}

func writeFile(t *testing.T, p string, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

const copyDockerfile = "FROM base\nCOPY . /app\nRUN echo hi\n"

func TestTemplateBuildUploadsContext(t *testing.T) {
	f := newFakeServer(t)
	top := t.TempDir()
	writeFile(t, filepath.Join(top, "outside.txt"), "not in the context", 0o644)
	dir := filepath.Join(top, "ctx")
	writeFile(t, filepath.Join(dir, "Dockerfile"), copyDockerfile, 0o644)
	writeFile(t, filepath.Join(dir, ".dockerignore"), "# build output and secrets\n*.log\n!keep.log\nsecret\n/build/**\n", 0o644)
	writeFile(t, filepath.Join(dir, "app", "main.py"), "print(1)\n", 0o644)
	writeFile(t, filepath.Join(dir, "app", "run.sh"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(dir, "app", "suid"), "x", 0o755|os.ModeSetuid)
	writeFile(t, filepath.Join(dir, "app", "debug.log"), "kept: *.log is for the root only", 0o600)
	writeFile(t, filepath.Join(dir, "debug.log"), "left out", 0o644)
	writeFile(t, filepath.Join(dir, "keep.log"), "put back", 0o644)
	writeFile(t, filepath.Join(dir, "secret", "key"), "left out", 0o600)
	writeFile(t, filepath.Join(dir, "build", "out.bin"), "left out", 0o644)
	if err := os.Chmod(filepath.Join(dir, "app"), 0o750); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"link": "app/main.py", "escape": "../outside.txt", "abslink": "/etc/passwd", "linkdir": "app"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, err := f.run(t, "", "template", "build", "-t", "app:v1", "--build-arg", "PY=3.12", "--build-arg", "EMPTY=",
		"--start-cmd", "python3 /app/main.py", "--ready-cmd", "true", "--vcpus", "2", "--memory", "512", "--disk", "2048", dir)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tpl.contexts) != 1 || len(f.tpl.creates) != 1 {
		t.Fatalf("%d contexts, %d builds: want one of each", len(f.tpl.contexts), len(f.tpl.creates))
	}
	if f.tpl.ctxTypes[0] != "application/x-tar" {
		t.Errorf("context sent as %q", f.tpl.ctxTypes[0])
	}
	req := f.tpl.creates[0]
	names, entries := readContext(t, f.tpl.contexts[req.Context])
	want := []string{".dockerignore", "Dockerfile", "abslink", "app/", "app/debug.log", "app/main.py", "app/run.sh", "app/suid",
		"build/", "escape", "keep.log", "link", "linkdir"}
	if !slices.Equal(names, want) {
		t.Fatalf("context entries\n%q\nwant\n%q", names, want)
	}
	for name, e := range map[string]contextEntry{
		"app/":          {typ: tar.TypeDir, mode: 0o750},
		"app/main.py":   {typ: tar.TypeReg, mode: 0o644, data: "print(1)\n"},
		"app/run.sh":    {typ: tar.TypeReg, mode: 0o755, data: "#!/bin/sh\n"},
		"app/suid":      {typ: tar.TypeReg, mode: 0o4755, data: "x"},
		"app/debug.log": {typ: tar.TypeReg, mode: 0o600, data: "kept: *.log is for the root only"},
		"keep.log":      {typ: tar.TypeReg, mode: 0o644, data: "put back"},
		"Dockerfile":    {typ: tar.TypeReg, mode: 0o644, data: copyDockerfile},
		"link":          {typ: tar.TypeSymlink, mode: 0o777, link: "app/main.py"},
		"escape":        {typ: tar.TypeSymlink, mode: 0o777, link: "../outside.txt"},
		"abslink":       {typ: tar.TypeSymlink, mode: 0o777, link: "/etc/passwd"},
		"linkdir":       {typ: tar.TypeSymlink, mode: 0o777, link: "app"},
	} {
		if got := entries[name]; got != e {
			t.Errorf("entry %s: %+v, want %+v", name, got, e)
		}
	}

	if req.Name != "app" || req.Tag != "v1" || req.Dockerfile != copyDockerfile || req.StartCmd != "python3 /app/main.py" ||
		req.ReadyCmd != "true" || req.VCPUs != 2 || req.MemoryMiB != 512 || req.DiskMiB != 2048 ||
		len(req.BuildArgs) != 2 || req.BuildArgs["PY"] != "3.12" || req.BuildArgs["EMPTY"] != "" {
		t.Errorf("request %+v", req)
	}
	digest := f.tpl.templates["app:v1"].Digest
	if digest == "" || !strings.HasSuffix(stdout, "\napp:v1 "+digest+"\n") {
		t.Errorf("stdout does not end with the ref and digest %s:\n%s", digest, stdout)
	}
	if !strings.Contains(stdout, "[step 1] hi\n") || strings.Contains(stdout, "warning") {
		t.Errorf("stdout should hold the step's stdout, only:\n%s", stdout)
	}
	for _, want := range []string{
		"skipping pipe: a named pipe is not a file, directory or symlink",
		"airlock: uploaded a build context of ",
		"[build] ==> build app:v1 from base",
		"[step 1] ==> step 1/1: RUN echo hi\n",
		"[step 1] warning: hi is short\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

func TestTemplateBuildFails(t *testing.T) {
	f := newFakeServer(t)
	dir := t.TempDir()
	df := filepath.Join(dir, "Dockerfile.bad")
	writeFile(t, df, "FROM base\nRUN false\n", 0o644)
	stdout, stderr, err := f.run(t, "", "template", "build", "-f", df, "-t", "bad")
	if ExitCode(err) != 1 {
		t.Fatalf("exit %d: %v", ExitCode(err), err)
	}
	if want := "build of bad:latest failed: step 1: RUN false: exit status 1"; Message(err) != want {
		t.Errorf("message %q, want %q", Message(err), want)
	}
	if strings.Contains(stdout, "sha256:") || !strings.Contains(stdout, "[step 1] about to fail") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if !strings.Contains(stderr, "[step 1] ==> step 1/1: RUN false") {
		t.Errorf("stderr:\n%s", stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Without COPY or ADD and without a directory, nothing is uploaded.
	if len(f.tpl.ctxTypes) != 0 || f.tpl.creates[0].Context != "" || f.tpl.creates[0].Tag != "" {
		t.Errorf("%d uploads, request %+v", len(f.tpl.ctxTypes), f.tpl.creates[0])
	}
}

func TestTemplateBuildStdinDefaultsContext(t *testing.T) {
	f := newFakeServer(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "app.py"), "print(2)\n", 0o644)
	t.Chdir(dir)
	// The Dockerfile on stdin copies: the current directory is sent.
	stdout, stderr, err := f.run(t, copyDockerfile, "template", "build", "-f", "-", "-t", "app", "-q")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	req := f.tpl.creates[0]
	names, _ := readContext(t, f.tpl.contexts[req.Context])
	if !slices.Equal(names, []string{"app.py"}) || req.Dockerfile != copyDockerfile {
		t.Errorf("context %q, request %+v", names, req)
	}
	// -q: the result alone.
	if want := "app:latest " + f.tpl.templates["app:latest"].Digest + "\n"; stdout != want || stderr != "" {
		t.Errorf("stdout %q, want %q; stderr %q", stdout, want, stderr)
	}
}

func TestTemplateBuildNoWait(t *testing.T) {
	f := newFakeServer(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "Dockerfile"), "FROM base\nRUN echo hi\n", 0o644)
	stdout, stderr, err := f.run(t, "", "template", "build", "--no-wait", "-t", "app:v2", dir)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tpl := f.tpl.templates["app:v2"]
	b := f.tpl.builds[tpl.BuildID]
	if stdout != b.opID+"\n" {
		t.Errorf("stdout %q, want the operation ID %s", stdout, b.opID)
	}
	if !strings.Contains(stderr, "`airlock template log app:v2`") {
		t.Errorf("stderr %q", stderr)
	}
	if f.tpl.logGets != 0 || tpl.Status != apiv1.TemplateBuilding {
		t.Errorf("--no-wait read the log %d times; status %s", f.tpl.logGets, tpl.Status)
	}
	// A directory given is always sent.
	if len(f.tpl.contexts) != 1 {
		t.Errorf("%d contexts sent", len(f.tpl.contexts))
	}
}

func TestTemplateBuildBadInput(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "My Project!")
	writeFile(t, filepath.Join(dir, "Dockerfile"), copyDockerfile, 0o644)
	empty := filepath.Join(top, "empty")
	writeFile(t, filepath.Join(empty, "Dockerfile"), " \n", 0o644)
	noInstr := filepath.Join(top, "comments")
	writeFile(t, noInstr, "# nothing but a comment\n", 0o644)
	noDockerfile := filepath.Join(top, "bare")
	if err := os.Mkdir(noDockerfile, 0o755); err != nil {
		t.Fatal(err)
	}
	badIgnore := filepath.Join(top, "badignore")
	writeFile(t, filepath.Join(badIgnore, "Dockerfile"), copyDockerfile, 0o644)
	writeFile(t, filepath.Join(badIgnore, ".dockerignore"), "[\n", 0o644)
	notDir := filepath.Join(dir, "Dockerfile")

	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no -t", []string{dir}, 2, "give the template to make with -t NAME[:TAG], e.g. -t my-project"},
		{"empty -t", []string{"-t", "", dir}, 2, "give the template to make with -t"},
		{"empty tag", []string{"-t", "app:", dir}, 2, `-t "app:" has an empty tag after the ':'`},
		{"empty name", []string{"-t", ":v1", dir}, 2, `-t ":v1" has no name before the ':'`},
		{"space in name", []string{"-t", "my app", dir}, 2, "a template name has no spaces"},
		{"build arg without =", []string{"-t", "app", "--build-arg", "PY", dir}, 2, `"PY" is not KEY=VALUE`},
		{"negative vcpus", []string{"-t", "app", "--vcpus", "-1", dir}, 2, "--vcpus must not be negative"},
		{"two contexts", []string{"-t", "app", dir, dir}, 2, "give at most one CONTEXT_DIR"},
		{"context is a file", []string{"-t", "app", notDir}, 2, "is not a directory"},
		{"context missing", []string{"-t", "app", filepath.Join(top, "nope")}, 2, "does not exist"},
		{"Dockerfile missing", []string{"-t", "app", "-f", filepath.Join(top, "nope"), dir}, 2, "Dockerfile " + filepath.Join(top, "nope") + " does not exist"},
		{"no Dockerfile in the context", []string{"-t", "app", noDockerfile}, 2, "there is no " + filepath.Join(noDockerfile, "Dockerfile") + ": name the Dockerfile with -f"},
		{"Dockerfile unreadable", []string{"-t", "app", "-f", dir}, 2, "read the Dockerfile"},
		{"Dockerfile empty", []string{"-t", "app", empty}, 2, "is empty"},
		{"Dockerfile without instructions", []string{"-t", "app", "-f", noInstr}, 2, "template build: Dockerfile: "},
		{"bad .dockerignore", []string{"-t", "app", badIgnore}, 2, `.dockerignore line 1: "[" is not a valid pattern`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeServer(t)
			_, _, err := f.run(t, "", append([]string{"template", "build"}, tc.args...)...)
			if ExitCode(err) != tc.code || err == nil || !strings.Contains(Message(err), tc.want) {
				t.Fatalf("exit %d, %v: want exit %d and %q", ExitCode(err), err, tc.code, tc.want)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.tpl.ctxTypes) != 0 || len(f.tpl.creates) != 0 {
				t.Fatalf("%d uploads and %d builds after a bad input", len(f.tpl.ctxTypes), len(f.tpl.creates))
			}
		})
	}
}

func TestTemplateBuildContextTooLarge(t *testing.T) {
	f := newFakeServer(t)
	f.tpl.contextLimit = 1024
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "Dockerfile"), copyDockerfile, 0o644)
	writeFile(t, filepath.Join(dir, "big"), strings.Repeat("x", 64<<10), 0o644)
	_, _, err := f.run(t, "", "template", "build", "-t", "app", dir)
	if !errors.Is(err, errdefs.ErrTooLarge) || Message(err) != "build context is over the limit of 1024 bytes" {
		t.Fatalf("got %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tpl.creates) != 0 {
		t.Fatalf("a build started without its context")
	}
}

// seedTemplates adds finished builds: app:v1 and app:v2 ready, broken:latest
// failed.
func seedTemplates(f *fakeServer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	created := time.Now().Add(-2 * time.Hour)
	for _, s := range []struct {
		name, tag string
		fail      bool
	}{{"app", "v1", false}, {"app", "v2", false}, {"broken", "latest", true}} {
		lines := []apiv1.BuildLogLine{{Stream: "info", Text: "build " + s.name}, {Step: 1, Stream: "stdout", Text: "line of " + s.tag}}
		end := apiv1.BuildEnd{Status: apiv1.TemplateReady, Digest: "sha256:" + strings.Repeat(s.tag[len(s.tag)-1:], 64)}
		if s.fail {
			end = apiv1.BuildEnd{Status: apiv1.TemplateFailed, Error: &apiv1.Status{Code: "build_failed", Message: "step 1 failed"}}
		}
		to := f.startBuild(s.name, s.tag, lines, end)
		f.finishBuild(to.Template.BuildID)
		t := f.tpl.templates[s.name+":"+s.tag]
		t.CreatedAt = created
		t.Source = &apiv1.TemplateSource{From: "docker://python:3.12", Steps: 2}
	}
}

func TestTemplateList(t *testing.T) {
	f := newFakeServer(t)
	seedTemplates(f)
	stdout, _, err := f.run(t, "", "template", "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "REF STATUS DIGEST SIZE CREATED SOURCE" {
		t.Fatalf("want a header and 3 templates over 2 pages:\n%s", stdout)
	}
	if got := strings.Join(strings.Fields(lines[1]), " "); got != "app:v1 ready 111111111111 3.0 MiB 2h ago docker://python:3.12 +2 steps" {
		t.Errorf("row %q", got)
	}
	if got := strings.Join(strings.Fields(lines[3]), " "); got != "broken:latest failed - - 2h ago docker://python:3.12 +2 steps" {
		t.Errorf("row %q", got)
	}
	stdout, _, err = f.run(t, "", "template", "ls", "--json")
	var items []apiv1.Template
	if err != nil || json.Unmarshal([]byte(stdout), &items) != nil || len(items) != 3 || items[1].Tag != "v2" {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
}

func TestTemplateGet(t *testing.T) {
	f := newFakeServer(t)
	seedTemplates(f)
	stdout, _, err := f.run(t, "", "template", "get", "app:v2")
	var tpl apiv1.Template
	if err != nil || json.Unmarshal([]byte(stdout), &tpl) != nil || tpl.Name != "app" || tpl.Tag != "v2" || tpl.Digest != "sha256:"+strings.Repeat("2", 64) {
		t.Fatalf("%v\n%s", err, stdout)
	}
	_, _, err = f.run(t, "", "template", "get", "nope:v1")
	if ExitCode(err) != 2 || Message(err) != "no template nope:v1" {
		t.Fatalf("missing template: exit %d, %v", ExitCode(err), err)
	}
	_, _, err = f.run(t, "", "template", "get")
	if ExitCode(err) != 2 {
		t.Fatalf("no ref: %v", err)
	}
}

func TestTemplateRemove(t *testing.T) {
	f := newFakeServer(t)
	seedTemplates(f)
	stdout, _, err := f.run(t, "", "template", "rm", "app:v1")
	if err != nil || stdout != "app:v1\n" {
		t.Fatalf("%q %v", stdout, err)
	}
	stdout, stderr, err := f.run(t, "", "template", "rm", "app:v1", "app:v2")
	if stdout != "app:v2\n" || ExitCode(err) != 2 || !strings.Contains(stderr, "template rm app:v1: no template app:v1") {
		t.Fatalf("stdout %q, exit %d, stderr %q", stdout, ExitCode(err), stderr)
	}
	f.mu.Lock()
	_, v1 := f.tpl.templates["app:v1"]
	_, v2 := f.tpl.templates["app:v2"]
	f.mu.Unlock()
	if v1 || v2 {
		t.Fatalf("still there: app:v1 %v, app:v2 %v", v1, v2)
	}
	if _, _, err := f.run(t, "", "template", "rm"); ExitCode(err) != 2 {
		t.Fatalf("rm without refs: %v", err)
	}
}

func TestTemplateLog(t *testing.T) {
	f := newFakeServer(t)
	seedTemplates(f)
	stdout, stderr, err := f.run(t, "", "template", "log", "app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "[step 1] line of v1\napp:v1 sha256:" + strings.Repeat("1", 64) + "\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	if stderr != "[build] ==> build app\n" {
		t.Errorf("stderr %q", stderr)
	}
	_, _, err = f.run(t, "", "template", "log", "broken")
	if ExitCode(err) != 1 || Message(err) != "build of broken failed: step 1 failed" {
		t.Errorf("failed build: exit %d, %v", ExitCode(err), err)
	}
	_, _, err = f.run(t, "", "template", "log", "nope:v1")
	if ExitCode(err) != 2 || Message(err) != "no build of nope:v1" {
		t.Errorf("unknown template: exit %d, %v", ExitCode(err), err)
	}
}

func TestTemplateLogResumes(t *testing.T) {
	f := newFakeServer(t)
	seedTemplates(f)
	f.mu.Lock()
	f.tpl.cutLogs = 1
	f.tpl.logGets = 0
	f.mu.Unlock()
	stdout, stderr, err := f.run(t, "", "template", "log", "app:v2")
	if err != nil {
		t.Fatal(err)
	}
	// The second stream replays the first line; it is shown once.
	if stderr != "[build] ==> build app\n" || !strings.HasPrefix(stdout, "[step 1] line of v2\napp:v2 ") {
		t.Errorf("stdout %q, stderr %q", stdout, stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tpl.logGets != 2 {
		t.Errorf("the log was opened %d times, want 2", f.tpl.logGets)
	}
}

func TestSandboxSave(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx9", time.Now())
	stdout, _, err := f.run(t, "", "sandbox", "save", "sbx9", "snap:v1")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	tpl := *f.tpl.templates["snap:v1"]
	op := *f.ops[f.tpl.builds[tpl.BuildID].opID]
	saves := slices.Clone(f.tpl.saves)
	f.mu.Unlock()
	if op.Status != apiv1.OpSucceeded || tpl.Status != apiv1.TemplateReady {
		t.Fatalf("returned before the operation finished: %s, template %s", op.Status, tpl.Status)
	}
	if stdout != "snap:v1 "+tpl.Digest+"\n" || tpl.Digest == "" {
		t.Errorf("stdout %q, want the ref and digest %s", stdout, tpl.Digest)
	}
	if len(saves) != 1 || saves[0] != (apiv1.SaveTemplate{Name: "snap", Tag: "v1"}) {
		t.Errorf("requests %+v", saves)
	}

	stdout, _, err = f.run(t, "", "sandbox", "save", "--no-wait", "sbx9", "snap")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	tpl = *f.tpl.templates["snap:latest"]
	opID := f.tpl.builds[tpl.BuildID].opID
	f.mu.Unlock()
	if stdout != opID+"\n" || tpl.Status != apiv1.TemplateBuilding {
		t.Errorf("--no-wait: stdout %q (op %s), template %s", stdout, opID, tpl.Status)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sbx9"}, "give a sandbox ID and NAME[:TAG]"},
		{[]string{"sbx9", ":v1"}, "has no name before the ':'"},
		{[]string{"sbxnone", "snap:v2"}, "no sandbox sbxnone"},
	} {
		_, _, err := f.run(t, "", append([]string{"sandbox", "save"}, tc.args...)...)
		if ExitCode(err) != 2 || !strings.Contains(Message(err), tc.want) {
			t.Errorf("save %q: exit %d, %v; want %q", tc.args, ExitCode(err), err, tc.want)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tpl.saves) != 2 {
		t.Errorf("%d save requests, want the 2 good ones", len(f.tpl.saves))
	}
}

func TestDockerignore(t *testing.T) {
	rules, err := parseDockerignore([]byte("\xef\xbb\xbf# comment\n  *.log  \n!keep.log\n/tmp\nnode_modules/\n**/cache\ndocs/**/*.md\n!docs/README.md\nbuild/**\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want bool
	}{
		{"debug.log", true},
		{"keep.log", false},
		{"src/debug.log", false}, // *.log is for the root only
		{"tmp", true},
		{"tmp/x/y", true},
		{"src/tmp", false},
		{"node_modules", true},
		{"node_modules/left-pad/index.js", true},
		{"cache", true},
		{"a/b/cache/x", true},
		{"docs/a.md", true},
		{"docs/x/y/a.md", true},
		{"docs/README.md", false},
		{"docs/a.txt", false},
		{"build", false}, // build/** leaves the directory, not what is in it
		{"build/out", true},
		{"# comment", false},
		{"main.go", false},
	}
	for _, tc := range tests {
		if got := rules.excluded(tc.path); got != tc.want {
			t.Errorf("excluded(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	if !rules.hasExceptions() {
		t.Error("no exceptions found")
	}
	if _, err := parseDockerignore([]byte("ok\nsrc/[a-\n")); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad pattern: %v", err)
	}
}

func TestSplitTemplateName(t *testing.T) {
	tests := []struct {
		in        string
		name, tag string
		ok        bool
	}{
		{"app", "app", "", true},
		{"app:v1", "app", "v1", true},
		{"", "", "", false},
		{"app:", "", "", false},
		{":v1", "", "", false},
		{"my app", "", "", false},
	}
	for _, tc := range tests {
		name, tag, err := splitTemplateName(tc.in)
		if (err == nil) != tc.ok || name != tc.name || tag != tc.tag {
			t.Errorf("splitTemplateName(%q) = %q, %q, %v", tc.in, name, tag, err)
		}
	}
}

func TestSuggestName(t *testing.T) {
	for in, want := range map[string]string{
		"/src/My Project!": "my-project",
		"/src/web_app.v2":  "web_app.v2",
		"/src/--x--":       "x",
		"/src/ÜÖ":          "myapp",
	} {
		if got := suggestName(in); got != want {
			t.Errorf("suggestName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
