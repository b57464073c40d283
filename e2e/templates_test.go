package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// buildServer is a server whose templates and template snapshots are its
// own, with the built-in tiny and base linked in: its builds and the
// storage it reclaims touch nothing the other servers use.
var (
	buildOnce sync.Once
	buildSrv  *server
	buildErr  error
)

func buildServer(t *testing.T) *server {
	t.Helper()
	buildOnce.Do(func() {
		var home string
		if home, buildErr = privateTemplatesHome("tiny", "base"); buildErr != nil {
			return
		}
		var hosts []string
		if hosts, buildErr = reserveRegistries(); buildErr != nil {
			return
		}
		buildSrv, buildErr = launchServerAt(home, nil, "--ping-interval", "1s", "--max-builds", "2",
			"--max-build-context", "4", "--trusted-registries", strings.Join(hosts, ","))
	})
	if buildErr != nil {
		t.Fatalf("start a build server: %v", buildErr)
	}
	return buildSrv
}

// privateTemplatesHome makes a data directory sharing the set-up one's
// boot artifacts, with its own templates directory holding links to the
// named built-in templates' images, and its own snapshots.
func privateTemplatesHome(names ...string) (string, error) {
	home, err := os.MkdirTemp("", "alh")
	if err != nil {
		return "", err
	}
	src := dataDir()
	for _, n := range []string{"boot", "accel.json"} {
		if err := os.Symlink(filepath.Join(src.Root, n), filepath.Join(home, n)); err != nil {
			return "", err
		}
	}
	dst := template.Open(datadir.Dir{Root: home})
	for _, n := range names {
		if _, err := dst.Link(template.Open(src), n); err != nil {
			return "", fmt.Errorf("template %s is not set up: %w", n, err)
		}
	}
	return home, nil
}

// build posts a template build and waits for its operation.
func (s *server) build(t *testing.T, req apiv1.CreateTemplate) (apiv1.Template, apiv1.Operation) {
	t.Helper()
	var res apiv1.TemplateOperation
	s.must(t, 202, "POST", "/v1/templates", s.key, req, &res)
	if res.Template.Status != apiv1.TemplateBuilding || res.Operation.Kind != apiv1.OpBuild {
		t.Fatalf("POST /v1/templates answered %+v", res)
	}
	op := s.waitOp(t, s.key, res.Operation.ID)
	var tpl apiv1.Template
	s.must(t, 200, "GET", "/v1/templates/"+req.Name+":"+tagOr(req.Tag), s.key, nil, &tpl)
	return tpl, op
}

func tagOr(tag string) string {
	if tag == "" {
		return "latest"
	}
	return tag
}

// mustBuild builds a template that must succeed.
func (s *server) mustBuild(t *testing.T, req apiv1.CreateTemplate) apiv1.Template {
	t.Helper()
	tpl, op := s.build(t, req)
	if op.Status != apiv1.OpSucceeded || tpl.Status != apiv1.TemplateReady {
		t.Fatalf("build %s failed: %+v\nlog:\n%s", req.Name, op.Error, s.buildLogText(t, req.Name+":"+tagOr(req.Tag)))
	}
	return tpl
}

// buildLog reads a template's build log to its end event.
func (s *server) buildLog(t *testing.T, ref string) ([]apiv1.BuildLogLine, apiv1.BuildEnd) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/templates/"+ref+"/build-log", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("build log of %s: %d %s", ref, resp.StatusCode, b)
	}
	r := newSSEReader(resp.Body)
	var lines []apiv1.BuildLogLine
	for {
		ev, err := r.next()
		if err != nil {
			t.Fatalf("build log of %s ended without an end event: %v", ref, err)
		}
		switch ev.name {
		case "log":
			var ln apiv1.BuildLogLine
			if err := json.Unmarshal([]byte(ev.data), &ln); err != nil {
				t.Fatalf("log event %q: %v", ev.data, err)
			}
			lines = append(lines, ln)
		case "end":
			var end apiv1.BuildEnd
			if err := json.Unmarshal([]byte(ev.data), &end); err != nil {
				t.Fatalf("end event %q: %v", ev.data, err)
			}
			return lines, end
		}
	}
}

func (s *server) buildLogText(t *testing.T, ref string) string {
	lines, end := s.buildLog(t, ref)
	var b strings.Builder
	for _, ln := range lines {
		fmt.Fprintf(&b, "[%d %s] %s\n", ln.Step, ln.Stream, ln.Text)
	}
	fmt.Fprintf(&b, "end: %+v\n", end)
	return b.String()
}

// exec runs a command in a sandbox and returns its result.
func (s *server) exec(t *testing.T, sbx string, req apiv1.CommandRequest) apiv1.ExecResult {
	t.Helper()
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+sbx+"/exec", s.key, req, &res)
	return res
}

// putContext uploads a tar as a build context.
func (s *server) putContext(t *testing.T, tarball []byte) apiv1.BuildContext {
	t.Helper()
	var bc apiv1.BuildContext
	s.must(t, 201, "PUT", "/v1/build-contexts", s.key, tarball, &bc)
	return bc
}

// tarEntry is one entry of a tar made in a test.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, Typeflag: e.typ, Linkname: e.link,
			ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// busyboxLayer is a layer with the host's static busybox as /bin/busybox
// and /bin/sh, so that an image has a shell.
func busyboxLayer(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/usr/bin/busybox")
	if err != nil {
		testenv.Lacking(t, "no static busybox on this host (apt-get install busybox-static; airlock setup installs it): %v", err)
	}
	entries := []tarEntry{{name: "bin/", typ: tar.TypeDir}, {name: "bin/busybox", body: string(bb), mode: 0o755}}
	for _, applet := range []string{"sh", "cat", "ls", "stat", "echo", "pwd", "env", "id", "sleep", "wget", "test"} {
		entries = append(entries, tarEntry{name: "bin/" + applet, typ: tar.TypeSymlink, link: "busybox"})
	}
	return makeTar(t, entries...)
}

func layer(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is an image of several layers with a whiteout, an opaque
// directory, a symlink, a file mode and owner, and Env and WorkingDir in
// its configuration.
func testImage(t *testing.T, arch string) v1.Image {
	t.Helper()
	l2 := makeTar(t,
		tarEntry{name: "data/", typ: tar.TypeDir},
		tarEntry{name: "data/keep/", typ: tar.TypeDir},
		tarEntry{name: "data/keep/a.txt", body: "kept\n"},
		tarEntry{name: "data/gone.txt", body: "to be deleted\n"},
		tarEntry{name: "data/opaque/", typ: tar.TypeDir},
		tarEntry{name: "data/opaque/old.txt", body: "lower\n"},
		tarEntry{name: "app/", typ: tar.TypeDir},
	)
	l3 := makeTar(t,
		tarEntry{name: "data/.wh.gone.txt"},
		tarEntry{name: "data/opaque/", typ: tar.TypeDir},
		tarEntry{name: "data/opaque/.wh..wh..opq"},
		tarEntry{name: "data/opaque/new.txt", body: "upper\n"},
		tarEntry{name: "data/link", typ: tar.TypeSymlink, link: "keep/a.txt"},
		tarEntry{name: "data/setuid", body: "#!/bin/sh\n", mode: 0o4755, uid: 1234, gid: 5678},
	)
	img, err := mutate.AppendLayers(empty.Image, layer(t, busyboxLayer(t)), layer(t, l2), layer(t, l3))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/bin", "GREETING=hello from the image"}
	cf.Config.WorkingDir = "/app"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// registryPool holds loopback listeners reserved before the build server
// starts, which it names in --trusted-registries: a pull reaches a
// registry on loopback only when the operator named it.
var registryPool = make(chan net.Listener, 16)

// reserveRegistries fills registryPool and returns the listeners'
// addresses.
func reserveRegistries() ([]string, error) {
	var hosts []string
	for range cap(registryPool) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		registryPool <- l
		hosts = append(hosts, l.Addr().String())
	}
	return hosts, nil
}

// trustedListener returns a listener the build server trusts.
func trustedListener(t *testing.T) net.Listener {
	t.Helper()
	buildServer(t)
	select {
	case l := <-registryPool:
		return l
	default:
		t.Fatalf("all %d loopback registries the build server trusts are taken: reserve more in reserveRegistries", cap(registryPool))
		return nil
	}
}

// loopbackListener listens on a port of 127.0.0.1.
func loopbackListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testRegistry serves go-containerregistry's registry on loopback,
// counting requests, optionally behind basic auth.
type testRegistry struct {
	srv      *httptest.Server
	host     string
	requests atomic.Int64
}

// newTestRegistry starts a registry the build server trusts.
func newTestRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	return newTestRegistryOn(t, trustedListener(t), user, pass)
}

// newTestRegistryOn starts a registry on l.
func newTestRegistryOn(t *testing.T, l net.Listener, user, pass string) *testRegistry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr := &testRegistry{}
	tr.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.requests.Add(1)
		if user != "" {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, r)
	}))
	tr.srv.Listener.Close()
	tr.srv.Listener = l
	tr.srv.Start()
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

func (tr *testRegistry) push(t *testing.T, repo string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	ref, err := name.ParseReference(tr.host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return tr.host + "/" + repo
}

func TestTemplateFromOCIImage(t *testing.T) {
	s := buildServer(t)
	reg := newTestRegistry(t, "", "")
	ref := reg.push(t, "team/tree:v1", testImage(t, "amd64"))

	tpl := s.mustBuild(t, apiv1.CreateTemplate{Name: "oci-tree", Tag: "v1", From: "docker://" + ref})
	if tpl.WorkingDir != "/app" || !slices.Contains(tpl.Env, "GREETING=hello from the image") {
		t.Errorf("template keeps the image config: %+v", tpl)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "oci-tree:v1"})
	if sb.Template.Digest != tpl.Digest {
		t.Errorf("sandbox template digest %s, want %s", sb.Template.Digest, tpl.Digest)
	}

	// The flattened tree: the whiteout removed gone.txt, the opaque
	// directory hides the lower layer's file, the rest is as written.
	res := s.exec(t, sb.ID, apiv1.CommandRequest{Argv: []string{"/bin/ls", "-A", "/data", "/data/opaque"}})
	if res.ExitCode != 0 || res.Stdout != "/data:\nkeep\nlink\nopaque\nsetuid\n\n/data/opaque:\nnew.txt\n" {
		t.Errorf("ls /data /data/opaque = %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = s.exec(t, sb.ID, apiv1.CommandRequest{Argv: []string{"/bin/stat", "-c", "%a %u %g %F", "/data/setuid", "/data/link"}})
	if res.Stdout != "4755 1234 5678 regular file\n777 0 0 symbolic link\n" {
		t.Errorf("stat = %q %q", res.Stdout, res.Stderr)
	}
	res = s.exec(t, sb.ID, apiv1.CommandRequest{Argv: []string{"/bin/cat", "/data/link"}})
	if res.Stdout != "kept\n" {
		t.Errorf("cat /data/link = %q %q", res.Stdout, res.Stderr)
	}
	// The image's Env and WorkingDir are every command's defaults; a
	// command's own win.
	res = s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: `pwd; echo "$GREETING"; echo "$PATH"`})
	if res.Stdout != "/app\nhello from the image\n/bin\n" {
		t.Errorf("defaults = %q %q", res.Stdout, res.Stderr)
	}
	res = s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: `pwd; echo "$GREETING"`, Cwd: "/data", Env: map[string]string{"GREETING": "mine"}})
	if res.Stdout != "/data\nmine\n" {
		t.Errorf("overridden defaults = %q %q", res.Stdout, res.Stderr)
	}

	// A second build of the same image reuses the flattened base.
	s.mustBuild(t, apiv1.CreateTemplate{Name: "oci-tree", Tag: "v2", From: "docker://" + ref})
	lines, _ := s.buildLog(t, "oci-tree:v2")
	if !logHas(lines, "image cached") {
		t.Errorf("the second build of the same image did not reuse it:\n%s", s.buildLogText(t, "oci-tree:v2"))
	}
}

func logHas(lines []apiv1.BuildLogLine, text string) bool {
	for _, ln := range lines {
		if strings.Contains(ln.Text, text) {
			return true
		}
	}
	return false
}

func TestTemplateFromOCIArchive(t *testing.T) {
	s := buildServer(t)
	img := testImage(t, "amd64")
	var buf bytes.Buffer
	tag, _ := name.NewTag("example.com/archived:v1")
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	bc := s.putContext(t, buf.Bytes())
	if !strings.HasPrefix(bc.ID, "ctx") || !strings.HasPrefix(bc.Digest, "sha256:") {
		t.Fatalf("build context %+v", bc)
	}
	s.mustBuild(t, apiv1.CreateTemplate{Name: "oci-archived", From: "oci-archive:" + bc.ID})
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "oci-archived"})
	res := s.exec(t, sb.ID, apiv1.CommandRequest{Argv: []string{"/bin/cat", "/data/opaque/new.txt", "/data/keep/a.txt"}})
	if res.Stdout != "upper\nkept\n" {
		t.Errorf("cat = %q %q", res.Stdout, res.Stderr)
	}
}

func TestDockerfileBuildCacheAndFailure(t *testing.T) {
	s := buildServer(t)
	ctxTar := makeTar(t,
		tarEntry{name: "app/", typ: tar.TypeDir},
		tarEntry{name: "app/hello.txt", body: "hello from the context\n"},
		tarEntry{name: "app/run.sh", body: "#!/bin/sh\necho ran\n", mode: 0o755},
	)
	bc := s.putContext(t, ctxTar)
	dockerfile := func(last string) string {
		return "FROM tiny\n" +
			"ARG WHO=world\n" +
			"ENV GREETING=hi\n" +
			"WORKDIR /srv\n" +
			"COPY app/ ./app/\n" +
			"RUN echo \"$GREETING $WHO\" > built.txt && ./app/run.sh > ran.txt\n" +
			"RUN " + last + "\n" +
			"CMD [\"sleep\", \"1000\"]\n"
	}
	tpl := s.mustBuild(t, apiv1.CreateTemplate{Name: "df", Tag: "v1", Dockerfile: dockerfile("echo one > last.txt"),
		Context: bc.ID, BuildArgs: map[string]string{"WHO": "airlock"}})
	if tpl.StartCmd == "" || tpl.WorkingDir != "/srv" || !slices.Contains(tpl.Env, "GREETING=hi") {
		t.Errorf("template %+v: want the CMD as start_cmd, workdir /srv, GREETING=hi", tpl)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "df:v1"})
	res := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "cat built.txt ran.txt last.txt app/hello.txt; stat -c '%a %u' app/run.sh; echo $WHO"})
	if res.Stdout != "hi airlock\nran\none\nhello from the context\n755 0\n\n" {
		t.Errorf("built tree = %q %q", res.Stdout, res.Stderr)
	}

	// A rebuild with the last step changed reruns only that step.
	s.mustBuild(t, apiv1.CreateTemplate{Name: "df", Tag: "v2", Dockerfile: dockerfile("echo two > last.txt"),
		Context: bc.ID, BuildArgs: map[string]string{"WHO": "airlock"}})
	lines, _ := s.buildLog(t, "df:v2")
	cached := map[int]bool{}
	for _, ln := range lines {
		if ln.Stream == "info" && strings.Contains(ln.Text, ": cached") {
			cached[ln.Step] = true
		}
	}
	// Steps: 1 ENV, 2 WORKDIR, 3 COPY, 4 RUN, 5 RUN (changed).
	if !cached[3] || !cached[4] || cached[5] {
		t.Errorf("cached steps %v, want 3 and 4, not 5:\n%s", cached, s.buildLogText(t, "df:v2"))
	}
	sb2 := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "df:v2"})
	if res := s.exec(t, sb2.ID, apiv1.CommandRequest{Cmd: "cat last.txt built.txt"}); res.Stdout != "two\nhi airlock\n" {
		t.Errorf("rebuilt tree = %q %q", res.Stdout, res.Stderr)
	}

	// A failing RUN names its step, exit code and last lines; the tag is
	// not made, and nothing of the build is left.
	failed, op := s.build(t, apiv1.CreateTemplate{Name: "df-broken", Dockerfile: "FROM tiny\nRUN echo first line; echo second line >&2; exit 3\n"})
	if op.Status != apiv1.OpFailed || failed.Status != apiv1.TemplateFailed || failed.Error == nil {
		t.Fatalf("a failing RUN: op %+v, template %+v", op, failed)
	}
	for _, want := range []string{"step 1", "exited with code 3", "first line", "second line"} {
		if !strings.Contains(op.Error.Message, want) {
			t.Errorf("build error %q does not say %q", op.Error.Message, want)
		}
	}
	_, end := s.buildLog(t, "df-broken:latest")
	if end.Status != apiv1.TemplateFailed || end.Error == nil || !strings.Contains(end.Error.Message, "exited with code 3") {
		t.Errorf("build log end %+v", end)
	}
	var list apiv1.List[apiv1.Template]
	s.must(t, 200, "GET", "/v1/templates", s.key, nil, &list)
	for _, tp := range list.Items {
		if tp.Name == "df-broken" && (tp.Status != apiv1.TemplateFailed || tp.Digest != "") {
			t.Errorf("a failed build is listed as %+v", tp)
		}
	}
	checkNoBuildLeftovers(t, s)
}

// checkNoBuildLeftovers checks that no build sandbox and no temporary
// file of a build is left once builds ended.
func checkNoBuildLeftovers(t *testing.T, s *server) {
	t.Helper()
	waitFor(t, func() bool {
		ents, _ := os.ReadDir(filepath.Join(s.home, "sandboxes"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "sbxbuild") {
				return false
			}
		}
		tmp, _ := filepath.Glob(filepath.Join(s.home, "templates", ".*"))
		return len(tmp) == 0
	})
}

func TestTemplateStartAndReadyCmd(t *testing.T) {
	s := buildServer(t)
	s.mustBuild(t, apiv1.CreateTemplate{Name: "served", From: "base",
		Steps:    []apiv1.BuildStep{{Run: "mkdir -p /srv/www && echo served > /srv/www/index.html"}},
		StartCmd: "cd /srv/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
		ReadyCmd: "curl -sf http://127.0.0.1:8000/ >/dev/null"})
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "served"})
	// The server answers as soon as the create has.
	if res := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "curl -sf http://127.0.0.1:8000/"}); res.ExitCode != 0 || res.Stdout != "served\n" {
		t.Errorf("curl right after create = %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

func TestSaveSandboxAsTemplate(t *testing.T) {
	s := buildServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	if res := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "echo prepared by hand > /root/notes.txt"}); res.ExitCode != 0 {
		t.Fatalf("write: %+v", res)
	}
	var res apiv1.TemplateOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/template", s.key, apiv1.SaveTemplate{Name: "saved", Tag: "v1"}, &res)
	if op := s.waitOp(t, s.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("save failed: %+v", op.Error)
	}
	// The sandbox goes on.
	if r := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "echo still here >> /root/notes.txt; cat /root/notes.txt"}); r.Stdout != "prepared by hand\nstill here\n" {
		t.Errorf("the saved sandbox after the save: %q %q", r.Stdout, r.Stderr)
	}
	sb2 := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "saved:v1"})
	if r := s.exec(t, sb2.ID, apiv1.CommandRequest{Cmd: "cat /root/notes.txt"}); r.Stdout != "prepared by hand\n" {
		t.Errorf("a sandbox of the saved template: %q %q", r.Stdout, r.Stderr)
	}
	var tpl apiv1.Template
	s.must(t, 200, "GET", "/v1/templates/saved:v1", s.key, nil, &tpl)
	if tpl.Source == nil || tpl.Source.From != "sandbox:"+sb.ID {
		t.Errorf("saved template source %+v", tpl.Source)
	}
	// A paused sandbox is saved and stays paused.
	var lop apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/pause", s.key, nil, &lop)
	s.waitOp(t, s.key, lop.Operation.ID)
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/template", s.key, apiv1.SaveTemplate{Name: "saved", Tag: "v2"}, &res)
	if op := s.waitOp(t, s.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("save of a paused sandbox failed: %+v", op.Error)
	}
	var cur apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &cur)
	if cur.State != apiv1.StatePaused {
		t.Errorf("after a save the paused sandbox is %s", cur.State)
	}
	sb3 := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "saved:v2"})
	if r := s.exec(t, sb3.ID, apiv1.CommandRequest{Cmd: "cat /root/notes.txt"}); r.Stdout != "prepared by hand\nstill here\n" {
		t.Errorf("a sandbox of the template saved while paused: %q %q", r.Stdout, r.Stderr)
	}
}

func TestTemplateTagsDigestsAndReclaim(t *testing.T) {
	s := buildServer(t)
	one := s.mustBuild(t, apiv1.CreateTemplate{Name: "moving", From: "tiny", Steps: []apiv1.BuildStep{{Run: "echo one > /f"}}})
	sbOne := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "moving"})
	two := s.mustBuild(t, apiv1.CreateTemplate{Name: "moving", From: "tiny", Steps: []apiv1.BuildStep{{Run: "echo two > /f"}}})
	if one.Digest == two.Digest {
		t.Fatalf("two different builds share digest %s", one.Digest)
	}
	// The tag moved; the first digest still pins the first content.
	var got apiv1.Template
	s.must(t, 200, "GET", "/v1/templates/moving", s.key, nil, &got)
	if got.Digest != two.Digest {
		t.Errorf("moving:latest is %s, want %s", got.Digest, two.Digest)
	}
	byDigest := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: one.Digest})
	if r := s.exec(t, byDigest.ID, apiv1.CommandRequest{Cmd: "cat /f"}); r.Stdout != "one\n" {
		t.Errorf("a sandbox of %s reads %q", one.Digest, r.Stdout)
	}

	image := func(d string) string {
		return filepath.Join(s.home, "templates", "sha256-"+strings.TrimPrefix(d, "sha256:")+".ext4")
	}
	before := dirBytes(t, filepath.Join(s.home, "templates"))
	s.must(t, 204, "DELETE", "/v1/templates/moving:latest", s.key, nil, nil)
	s.must(t, 404, "GET", "/v1/templates/moving:latest", s.key, nil, nil)
	// The sandboxes that use the content keep working.
	if r := s.exec(t, sbOne.ID, apiv1.CommandRequest{Cmd: "cat /f; echo more > /g; cat /g"}); r.Stdout != "one\nmore\n" {
		t.Errorf("a sandbox of a deleted tag: %q %q", r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(image(one.Digest)); err != nil {
		t.Errorf("the image a sandbox uses was removed: %v", err)
	}
	if _, err := os.Stat(image(two.Digest)); err == nil {
		t.Errorf("the image of the deleted tag, which no sandbox uses, is still there")
	}
	s.deleteSandbox(t, s.key, sbOne.ID)
	s.deleteSandbox(t, s.key, byDigest.ID)
	waitFor(t, func() bool { _, err := os.Stat(image(one.Digest)); return err != nil })
	after := dirBytes(t, filepath.Join(s.home, "templates"))
	t.Logf("built template images: %d KiB before the delete, %d KiB once the sandboxes were gone", before>>10, after>>10)
	if after >= before {
		t.Errorf("deleting the tag and its sandboxes freed nothing: %d bytes before, %d after", before, after)
	}
	// The built-in templates stay.
	s.must(t, 200, "GET", "/v1/templates/tiny", s.key, nil, nil)
}

// dirBytes adds up the disk space the files under dir take.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func TestTemplateBadInput(t *testing.T) {
	s := buildServer(t)
	reg := newTestRegistry(t, "", "")
	armRef := reg.push(t, "team/arm:v1", testImage(t, "arm64"))
	authReg := newTestRegistry(t, "puller", "right")
	authRef := authReg.push(t, "team/private:v1", testImage(t, "amd64"), remote.WithAuth(&authn.Basic{Username: "puller", Password: "right"}))
	deadL := trustedListener(t) // trusted, and nothing listens there
	dead := deadL.Addr().String()
	deadL.Close()
	escCtx := s.putContext(t, makeTar(t, tarEntry{name: "esc", typ: tar.TypeSymlink, link: "/etc"}, tarEntry{name: "ok.txt", body: "ok\n"}))

	// Refused at once: each a 4xx naming the problem, and no build.
	for _, tc := range []struct {
		name   string
		body   any
		status int
		want   string
	}{
		{"bad name", `{"name": "Bad Name", "from": "tiny"}`, 400, "name"},
		{"bad tag", `{"name": "ok", "tag": "-x", "from": "tiny"}`, 400, "tag"},
		{"no name", `{"from": "tiny"}`, 400, "name is required"},
		{"wrong type", `{"name": 5, "from": "tiny"}`, 400, ""},
		{"no base", `{"name": "ok"}`, 400, "from is required"},
		{"both", `{"name": "ok", "from": "tiny", "dockerfile": "FROM tiny"}`, 400, "not both"},
		{"unknown base", `{"name": "ok", "from": "nosuch"}`, 404, "nosuch"},
		{"unsupported instruction", `{"name": "ok", "dockerfile": "FROM tiny\nRUN true\nSHELL [\"/bin/sh\"]\n"}`, 400, "line 3: SHELL"},
		{"multi-stage", `{"name": "ok", "dockerfile": "FROM tiny\nFROM base\n"}`, 400, "multi-stage"},
		{"copy without a context", `{"name": "ok", "from": "tiny", "steps": [{"copy": {"src": "a", "dest": "/a"}}]}`, 400, "build context"},
		{"copy out of the context", `{"name": "ok", "from": "tiny", "context": "` + escCtx.ID + `", "steps": [{"copy": {"src": "../etc/passwd", "dest": "/a"}}]}`, 400, ".."},
		{"unknown context", `{"name": "ok", "from": "tiny", "context": "ctx000000000000000000000000", "steps": [{"run": "true"}]}`, 404, ""},
		{"step with two fields", `{"name": "ok", "from": "tiny", "steps": [{"run": "true", "user": "x"}]}`, 400, ""},
		{"auth for a template base", `{"name": "ok", "from": "tiny", "registry_auth": {"username": "u", "password": "p"}}`, 400, "registry_auth"},
		{"ready without start", `{"name": "ok", "from": "tiny", "ready_cmd": "true"}`, 400, "start_cmd"},
		{"credentials in a build", `{"name": "ok", "from": "tiny", "network": {"egress": "allow", "credentials": [{"host": "api.example.com", "header": "Authorization", "secret": "k"}]}}`, 400, "credentials"},
		{"huge vcpus", `{"name": "ok", "from": "tiny", "vcpus": 100000}`, 400, "vcpus"},
		{"a loopback registry the operator did not name", `{"name": "ok", "from": "docker://127.0.0.1:1/team/x:v1"}`, 403, "not trusted"},
	} {
		status, body := s.call(t, "POST", "/v1/templates", s.key, tc.body)
		if status != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s, want %d mentioning %q", tc.name, status, body, tc.status, tc.want)
		}
	}

	// Failing in the build: the operation fails with the class and a
	// message that says what to do; no tag is made.
	for _, tc := range []struct {
		name string
		req  apiv1.CreateTemplate
		code string
		want string
	}{
		{"unknown image", apiv1.CreateTemplate{Name: "bad-unknown", From: "docker://" + reg.host + "/team/nope:v1"}, apiv1.CodeNotFound, "nope"},
		{"unreachable registry", apiv1.CreateTemplate{Name: "bad-unreachable", From: "docker://" + dead + "/team/x:v1"}, apiv1.CodeUnavailable, dead},
		{"wrong credentials", apiv1.CreateTemplate{Name: "bad-creds", From: "docker://" + authRef,
			RegistryAuth: &apiv1.RegistryAuth{Username: "puller", Password: "wrong"}}, apiv1.CodeUnauthenticated, "registry_auth"},
		{"not amd64", apiv1.CreateTemplate{Name: "bad-arch", From: "docker://" + armRef}, apiv1.CodeInvalidArgument, "arm64"},
		{"symlink out of the context", apiv1.CreateTemplate{Name: "bad-escape", From: "tiny", Context: escCtx.ID,
			Steps: []apiv1.BuildStep{{Copy: &apiv1.BuildCopy{Src: "esc/passwd", Dest: "/x"}}}}, apiv1.CodeInvalidArgument, "outside"},
	} {
		tpl, op := s.build(t, tc.req)
		if op.Status != apiv1.OpFailed || op.Error == nil || op.Error.Code != tc.code || !strings.Contains(op.Error.Message, tc.want) {
			t.Errorf("%s: operation %+v, want failed with %s mentioning %q", tc.name, op.Error, tc.code, tc.want)
		}
		if tpl.Status != apiv1.TemplateFailed || tpl.Digest != "" {
			t.Errorf("%s: template %+v", tc.name, tpl)
		}
		if _, err := os.Stat(filepath.Join(s.home, "templates", "refs", tc.req.Name)); err == nil {
			t.Errorf("%s: a failed build made a tag", tc.name)
		}
	}
	// The right credentials pull the same image.
	s.mustBuild(t, apiv1.CreateTemplate{Name: "good-creds", From: "docker://" + authRef,
		RegistryAuth: &apiv1.RegistryAuth{Username: "puller", Password: "right"}})

	// Build contexts: over the limit, not a tar.
	status, body := s.call(t, "PUT", "/v1/build-contexts", s.key, bytes.Repeat([]byte{0}, 5<<20))
	if status != 413 {
		t.Errorf("a 5 MiB context past a 4 MiB limit: %d %s", status, body)
	}
	status, body = s.call(t, "PUT", "/v1/build-contexts", s.key, "this is not a tar archive, not at all, no"+strings.Repeat(".", 600))
	if status != 400 {
		t.Errorf("a context that is not a tar: %d %s", status, body)
	}
	ents, _ := os.ReadDir(filepath.Join(s.home, "build-contexts"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("a refused upload left %s", e.Name())
		}
	}

	// Deleting: a tag in use by a build, a digest, an unknown tag.
	s.mustBuild(t, apiv1.CreateTemplate{Name: "held", From: "tiny", Steps: []apiv1.BuildStep{{Run: "echo held > /held"}}})
	var res apiv1.TemplateOperation
	s.must(t, 202, "POST", "/v1/templates", s.key, apiv1.CreateTemplate{Name: "on-held", From: "held",
		Steps: []apiv1.BuildStep{{Run: "sleep 8"}}}, &res)
	if status, body := s.call(t, "DELETE", "/v1/templates/held:latest", s.key, nil); status != 409 || !strings.Contains(string(body), res.Template.BuildID) {
		t.Errorf("delete of a tag a build uses: %d %s", status, body)
	}
	s.waitOp(t, s.key, res.Operation.ID)
	s.must(t, 204, "DELETE", "/v1/templates/held:latest", s.key, nil, nil)
	held := s.mustBuild(t, apiv1.CreateTemplate{Name: "held", From: "tiny", Steps: []apiv1.BuildStep{{Run: "echo again > /held"}}})
	if status, _ := s.call(t, "DELETE", "/v1/templates/"+held.Digest, s.key, nil); status != 400 {
		t.Errorf("delete by digest: %d, want 400", status)
	}
	if status, _ := s.call(t, "DELETE", "/v1/templates/nosuch:v9", s.key, nil); status != 404 {
		t.Errorf("delete of an unknown tag: %d, want 404", status)
	}
	if status, _ := s.call(t, "GET", "/v1/templates/nosuch:v9/build-log", s.key, nil); status != 404 {
		t.Errorf("build log of an unknown template: %d, want 404", status)
	}
	if status, body := s.call(t, "GET", "/v1/templates/tiny/build-log", s.key, nil); status != 404 || !strings.Contains(string(body), "built-in") {
		t.Errorf("build log of a built-in template: %d %s", status, body)
	}

	// Saving: bad names, unknown sandboxes.
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	if status, _ := s.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/template", s.key, `{"name": "Bad Name"}`); status != 400 {
		t.Errorf("save with a bad name: %d", status)
	}
	if status, _ := s.call(t, "POST", "/v1/sandboxes/sbxnosuch/template", s.key, `{"name": "ok"}`); status != 404 {
		t.Errorf("save of an unknown sandbox: %d", status)
	}
	checkNoBuildLeftovers(t, s)
}

func TestTemplateTrustedRegistries(t *testing.T) {
	reg := newTestRegistryOn(t, loopbackListener(t), "", "")
	ref := reg.push(t, "team/tree:v1", testImage(t, "amd64"))
	pushed := reg.requests.Load()
	s := newServer(t, "--trusted-registries", "registry.example.com, "+"mirror.example.com:5000")
	status, body := s.call(t, "POST", "/v1/templates", s.key, apiv1.CreateTemplate{Name: "untrusted", From: "docker://" + ref})
	if status != 403 || !strings.Contains(string(body), reg.host) || !strings.Contains(string(body), "registry.example.com") {
		t.Errorf("a pull from an untrusted registry: %d %s", status, body)
	}
	if n := reg.requests.Load() - pushed; n != 0 {
		t.Errorf("the untrusted registry got %d requests", n)
	}
	if out := runCLI(t, []string{"AIRLOCK_HOME=" + t.TempDir()}, nil, "serve", "--trusted-registries", "https://x/y"); out.code != 2 {
		t.Errorf("serve --trusted-registries with a URL: exit %d: %s", out.code, out.stderr)
	}
}

// TestTemplateCLI builds, lists, saves and removes templates through the
// CLI against a real server.
func TestTemplateCLI(t *testing.T) {
	s := buildServer(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "site", "index.html"), []byte("from the cli\n"), 0o644)
	os.Symlink("index.html", filepath.Join(dir, "site", "home.html"))
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM tiny\nARG GREETING=hello\nCOPY site/ /srv/site/\nRUN echo \"$GREETING\" > /srv/greeting\n"), 0o644)

	r := serverCLI(t, s, "", "template", "build", "-t", "cli-site:v1", "--build-arg", "GREETING=hi there", dir)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "cli-site:v1 sha256:") {
		t.Fatalf("template build: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "uploaded a build context") || !strings.Contains(r.stderr, "step 2") {
		t.Errorf("template build shows no upload or progress: %s", r.stderr)
	}
	digest := strings.Fields(r.stdout)[1]
	if r = serverCLI(t, s, "", "template", "ls"); r.code != 0 || !strings.Contains(r.stdout, "cli-site:v1") {
		t.Errorf("template ls: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r = serverCLI(t, s, "", "template", "get", "cli-site:v1"); r.code != 0 || !strings.Contains(r.stdout, digest) {
		t.Errorf("template get: %d %q %s", r.code, r.stdout, r.stderr)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "cli-site:v1"})
	res := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "cat /srv/site/index.html /srv/greeting; readlink /srv/site/home.html"})
	if res.Stdout != "from the cli\nhi there\nindex.html\n" {
		t.Errorf("the built tree: %q %q", res.Stdout, res.Stderr)
	}
	if r = serverCLI(t, s, "", "sandbox", "save", sb.ID, "cli-saved"); r.code != 0 || !strings.HasPrefix(r.stdout, "cli-saved:latest sha256:") {
		t.Errorf("sandbox save: %d %q %s", r.code, r.stdout, r.stderr)
	}

	// A failing build exits non-zero with the step's error.
	os.WriteFile(filepath.Join(dir, "Dockerfile.bad"), []byte("FROM tiny\nRUN echo broken >&2; exit 7\n"), 0o644)
	r = serverCLI(t, s, "", "template", "build", "-t", "cli-bad", "-f", filepath.Join(dir, "Dockerfile.bad"), dir)
	if r.code != 1 || !strings.Contains(r.stderr, "exited with code 7") || !strings.Contains(r.stderr, "broken") {
		t.Errorf("a failing build: %d %q %s", r.code, r.stdout, r.stderr)
	}
	// Bad input changes nothing.
	if r = serverCLI(t, s, "", "template", "build", "-t", "cli-x", filepath.Join(dir, "missing")); r.code != 2 {
		t.Errorf("a missing context: %d %s", r.code, r.stderr)
	}
	if r = serverCLI(t, s, "", "template", "rm", "cli-site:v1"); r.code != 0 {
		t.Errorf("template rm: %d %s", r.code, r.stderr)
	}
	if r = serverCLI(t, s, "", "template", "get", "cli-site:v1"); r.code != 2 {
		t.Errorf("template get of a removed tag: %d %q", r.code, r.stdout)
	}
}
