package template

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestCodeInterpreterSettings(t *testing.T) {
	b, ok := LookupBuiltin("code-interpreter")
	if !ok {
		t.Fatal("no built-in code-interpreter")
	}
	if err := b.Defaults.validate(); err != nil {
		t.Fatal(err)
	}
	if b.Defaults.ReadyPort != 49999 || b.Defaults.ReadyPath != "/health" ||
		!strings.Contains(b.Defaults.StartCmd, CodeInterpreterServerPath) || !strings.HasPrefix(b.Defaults.Recipe, "sha256:") {
		t.Errorf("code-interpreter defaults = %+v", b.Defaults)
	}
	if !bytes.Contains(codeInterpreterServer, []byte("/execute")) {
		t.Error("the embedded server does not serve /execute")
	}
}

// TestCodeInterpreterServer runs the embedded server on the host against a
// real Jupyter kernel, with a python3 that has jupyter_client and ipykernel
// (Debian's python3-jupyter-client and python3-ipykernel, which the
// template installs too and make unit installs on the host).
func TestCodeInterpreterServer(t *testing.T) {
	py := jupyterPython(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	needLanguages(t)
	dir := t.TempDir()
	for _, f := range codeInterpreterFiles() {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f.path)), f.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(py, filepath.Join(dir, filepath.Base(CodeInterpreterServerPath)))
	cmd.Env = append(os.Environ(), fmt.Sprintf("AIRLOCK_CODE_INTERPRETER_PORT=%d", port), "HOME="+dir)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// SIGTERM, so that the server ends its kernels and drivers.
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("server output:\n%s", logs.String())
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// execute runs a request and returns the lines of its stream, each
	// with "_at", the seconds from the request to the line's arrival.
	execute := func(t *testing.T, body string) []map[string]any {
		t.Helper()
		start := time.Now()
		resp, err := http.Post(base+"//execute", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("execute %s: %s %s", body, resp.Status, b)
		}
		var lines []map[string]any
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			m["_at"] = time.Since(start).Seconds()
			lines = append(lines, m)
		}
		if len(lines) == 0 || lines[len(lines)-1]["type"] != "end_of_execution" {
			t.Fatalf("execute %s: stream does not end with end_of_execution: %v", body, lines)
		}
		return lines
	}
	find := func(t *testing.T, lines []map[string]any, typ string) map[string]any {
		for _, l := range lines {
			if l["type"] == typ {
				return l
			}
		}
		t.Fatalf("no %s line in %v", typ, lines)
		return nil
	}

	lines := execute(t, `{"code":"print(1)\nx = 41\nx + 1"}`)
	if find(t, lines, "number_of_executions")["execution_count"] == nil {
		t.Error("no execution_count")
	}
	if out := find(t, lines, "stdout"); out["text"] != "1\n" || out["timestamp"] == "" {
		t.Errorf("stdout line = %v", out)
	}
	if r := find(t, lines, "result"); r["text"] != "42" || r["is_main_result"] != true {
		t.Errorf("result line = %v", r)
	}
	e := find(t, execute(t, `{"code":"1/0","env_vars":{"A":"b"}}`), "error")
	if e["name"] != "ZeroDivisionError" || !strings.Contains(e["traceback"].(string), "ZeroDivisionError") {
		t.Errorf("error line = %v", e)
	}
	// An expression that is None makes no result line, as in Jupyter.
	if r := find(t, execute(t, `{"code":"import os; os.environ.get('A', 'unset')","env_vars":{"A":"b"}}`), "result"); r["text"] != "b" {
		t.Errorf("env_vars not set: %v", r)
	}
	if r := find(t, execute(t, `{"code":"import os; os.environ.get('A', 'unset')","language":"python"}`), "result"); r["text"] != "unset" {
		t.Errorf("env_vars not reset: %v", r)
	}

	resp, err := http.Post(base+"/contexts", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var ctx struct{ ID, Language, Cwd string }
	json.NewDecoder(resp.Body).Decode(&ctx)
	resp.Body.Close()
	if ctx.ID == "" || ctx.Language != "python" {
		t.Fatalf("context = %+v", ctx)
	}
	execute(t, fmt.Sprintf(`{"code":"kept = 7","context_id":%q}`, ctx.ID))
	if r := find(t, execute(t, fmt.Sprintf(`{"code":"kept * 6","context_id":%q}`, ctx.ID)), "result"); r["text"] != "42" {
		t.Errorf("context state: %v", r)
	}
	req, _ := http.NewRequest(http.MethodDelete, base+"/contexts/"+ctx.ID, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("delete context: %v %v", resp, err)
	}

	for _, tc := range codeInterpreterLanguages {
		t.Run(tc.lang, func(t *testing.T) {
			testCodeInterpreterLanguage(t, tc, base, execute, find)
		})
	}

	// Names of no language, or of one without an interpreter here,
	// are refused naming those there are.
	for _, body := range []string{`{"language":"cobol"}`, `{"language":"java"}`, `{"language":7}`} {
		for _, path := range []string{"/contexts", "/execute"} {
			req := body
			if path == "/execute" {
				req = `{"code":"1",` + body[1:]
			}
			resp, err := http.Post(base+path, "application/json", strings.NewReader(req))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 {
				t.Errorf("POST %s %s = %s %s, want 400", path, req, resp.Status, b)
				continue
			}
			if body == `{"language":7}` {
				continue
			}
			for _, lang := range []string{"python", "javascript (js)", "typescript (ts)", "bash", "r"} {
				if !strings.Contains(string(b), lang) {
					t.Errorf("POST %s %s = %s, which does not name %s", path, req, b, lang)
				}
			}
		}
	}
}

// A languageCase is what TestCodeInterpreterServer runs in one language.
type languageCase struct {
	lang, want string // as asked for, and as the context names it
	// set makes state; get shows it, as the text of its result or its
	// stdout; gone is get's text after a restart.
	set, get, kept, gone string
	// stream prints "out" on stdout and "err" on stderr, waits 1.5 s and
	// prints "late" on stdout.
	stream string
	// fail fails with an error named errName whose traceback holds trace.
	fail, errName, trace string
	// value has a result with the MIME field mime holding mimeHas.
	value, mime, mimeHas string
	// env shows env var A, set by the request, as its text.
	env string
}

var codeInterpreterLanguages = []languageCase{
	{
		lang: "python", want: "python", set: "kept = 6", get: "kept * 7", kept: "42",
		stream: "import sys, time\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)\ntime.sleep(1.5)\nprint('late')",
		fail:   "def f():\n    return 1 / 0\nf()", errName: "ZeroDivisionError", trace: "1 / 0",
		value: "{'a': 1}", mime: "text", mimeHas: "'a': 1",
		env: "import os; os.environ['A']",
	},
	{
		lang: "js", want: "javascript", set: "let kept = await Promise.resolve(6)", get: "kept * 7", kept: "42", gone: "undefined",
		stream: "console.log('out'); console.error('err'); await new Promise(r => setTimeout(r, 1500)); console.log('late')",
		fail:   "function f() { return null.x }\nf()", errName: "TypeError", trace: "at f (cell.js:1",
		value: "({a: [1, 2]})", mime: "json", mimeHas: `"a":[1,2]`,
		env: "process.env.A",
	},
	{
		lang: "ts", want: "typescript", set: "const kept: number = 6", get: "kept * 7", kept: "42", gone: "",
		stream: "console.log('out'); console.error('err'); await new Promise(r => setTimeout(r, 1500)); console.log('late')",
		fail:   "const s: string = 7", errName: "TSError", trace: "cell.ts(1,7): error TS2322",
		value: "interface P { a: number[] }\nconst p: P = {a: [1, 2]}\np", mime: "json", mimeHas: `"a":[1,2]`,
		env: "process.env.A",
	},
	{
		lang: "bash", want: "bash", set: "kept=42; cd /tmp", get: `echo "$kept $PWD"`, kept: "42 /tmp\n",
		stream: "echo out; echo err >&2; sleep 1.5; echo late",
		fail:   "ls /nonexistent-dir", errName: "CommandExitError", trace: "nonexistent-dir",
		env: `echo "$A"`,
	},
	{
		lang: "r", want: "r", set: "kept <- 6", get: "kept * 7", kept: "[1] 42",
		stream: "cat('out\\n'); message('err'); Sys.sleep(1.5); cat('late\\n')",
		fail:   "f <- function() stop('boom')\nf()", errName: "ERROR", trace: "boom",
		value: "data.frame(a = 1:2)", mime: "html", mimeHas: "<table",
		env: `Sys.getenv("A")`,
	},
}

// testCodeInterpreterLanguage runs tc's cases in a context of its own
// and in the language's default context, then restarts and deletes the
// context.
func testCodeInterpreterLanguage(t *testing.T, tc languageCase, base string,
	execute func(*testing.T, string) []map[string]any, find func(*testing.T, []map[string]any, string) map[string]any) {
	resp, err := http.Post(base+"/contexts", "application/json", strings.NewReader(fmt.Sprintf(`{"language":%q}`, tc.lang)))
	if err != nil {
		t.Fatal(err)
	}
	var ctx struct{ ID, Language, Cwd string }
	err = json.NewDecoder(resp.Body).Decode(&ctx)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || ctx.ID == "" || ctx.Language != tc.want {
		t.Fatalf("create context: %s %+v %v", resp.Status, ctx, err)
	}
	in := func(code string) string {
		b, err := json.Marshal(map[string]string{"code": code, "context_id": ctx.ID})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// text is what code gave: its main result's text, else its stdout.
	text := func(lines []map[string]any) string {
		var out strings.Builder
		for _, l := range lines {
			if l["type"] == "result" && l["is_main_result"] == true {
				s, _ := l["text"].(string)
				return s
			}
			if l["type"] == "stdout" {
				out.WriteString(l["text"].(string))
			}
		}
		return out.String()
	}
	for _, l := range execute(t, in(tc.set)) {
		if l["type"] == "error" {
			t.Fatalf("%s: %v", tc.set, l)
		}
	}
	want := tc.kept
	if got := text(execute(t, in(tc.get))); got != want {
		t.Errorf("state: %s gave %q, want %q", tc.get, got, want)
	}

	t.Run("stream", func(t *testing.T) {
		lines := execute(t, in(tc.stream))
		var stdout, stderr strings.Builder
		var outAt, end float64
		for _, l := range lines {
			switch l["type"] {
			case "stdout":
				if stdout.Len() == 0 {
					outAt = l["_at"].(float64)
				}
				stdout.WriteString(l["text"].(string))
				if l["timestamp"] == "" || l["timestamp"] == nil {
					t.Errorf("stdout line without a timestamp: %v", l)
				}
			case "stderr":
				stderr.WriteString(l["text"].(string))
			case "error":
				t.Errorf("error: %v", l)
			case "end_of_execution":
				end = l["_at"].(float64)
			}
		}
		if stdout.String() != "out\nlate\n" || !strings.Contains(stderr.String(), "err") {
			t.Errorf("stdout %q, stderr %q; want out, late and err", stdout.String(), stderr.String())
		}
		// The first line came as it was printed, not with the end.
		if end-outAt < 1 {
			t.Errorf("the first stdout line came %.2f s before the end, want the 1.5 s wait between", end-outAt)
		}
	})

	t.Run("error", func(t *testing.T) {
		e := find(t, execute(t, in(tc.fail)), "error")
		tb, _ := e["traceback"].(string)
		if e["name"] != tc.errName || e["value"] == "" || !strings.Contains(stripANSI(tb), tc.trace) {
			t.Errorf("error = %v, want name %s and %q in the traceback", e, tc.errName, tc.trace)
		}
		if got := text(execute(t, in(tc.get))); got != want {
			t.Errorf("after the error, %s gave %q, want %q", tc.get, got, want)
		}
	})

	if tc.value != "" {
		t.Run("result", func(t *testing.T) {
			r := find(t, execute(t, in(tc.value)), "result")
			var got string
			switch v := r[tc.mime].(type) {
			case string:
				got = v
			default:
				b, _ := json.Marshal(v)
				got = string(b)
			}
			if r["is_main_result"] != true || !strings.Contains(got, tc.mimeHas) {
				t.Errorf("result = %v, want a main result whose %s holds %s", r, tc.mime, tc.mimeHas)
			}
		})
	}

	t.Run("env_vars", func(t *testing.T) {
		// The language's default context, which the request names by
		// language alone; the variable is set for this run only.
		b, err := json.Marshal(map[string]any{"code": tc.env, "language": tc.lang, "env_vars": map[string]string{"A": `it's $(set) "x"`}})
		if err != nil {
			t.Fatal(err)
		}
		lines := execute(t, string(b))
		// Each language quotes a string result its own way; bash echoes
		// it as it is.
		got := strings.TrimSpace(text(lines))
		if !strings.Contains(got, "$(set)") || (tc.lang == "bash" && got != `it's $(set) "x"`) {
			t.Errorf("%s with env_vars gave %q (%v)", tc.env, got, lines)
		}
		b, err = json.Marshal(map[string]any{"code": tc.env, "language": tc.lang})
		if err != nil {
			t.Fatal(err)
		}
		after := strings.TrimSpace(text(execute(t, string(b))))
		if strings.Contains(after, "$(set)") {
			t.Errorf("env var A outlived its run: %q", after)
		}
	})

	t.Run("restart, list and delete", func(t *testing.T) {
		resp, err := http.Post(base+"/contexts/"+ctx.ID+"/restart", "application/json", nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("restart: %v %v", resp, err)
		}
		resp.Body.Close()
		if got := text(execute(t, in(tc.get))); got == want {
			t.Errorf("after a restart %s still gave %q", tc.get, got)
		}
		resp, err = http.Get(base + "/contexts")
		if err != nil {
			t.Fatal(err)
		}
		var list []struct{ ID, Language string }
		json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		listed := false
		for _, c := range list {
			listed = listed || (c.ID == ctx.ID && c.Language == tc.want)
		}
		if !listed {
			t.Errorf("GET /contexts = %+v, without %s", list, ctx.ID)
		}
		req, _ := http.NewRequest(http.MethodDelete, base+"/contexts/"+ctx.ID, nil)
		resp, err = http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("delete: %v %v", resp, err)
		}
		resp.Body.Close()
		resp, err = http.Post(base+"/execute", "application/json", strings.NewReader(in(tc.get)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("execute in the deleted context: %s, want 404", resp.Status)
		}
	})
}

// stripANSI drops the colour codes of Jupyter's tracebacks.
func stripANSI(s string) string {
	return ansi.ReplaceAllString(s, "")
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// syncBuffer is a bytes.Buffer that the server's output may be written
// to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// needLanguages makes sure the host has what the server's languages
// besides Python need: node, Debian's node-typescript and r-cran-irkernel
// (make unit installs them); without them the test is Lacking.
func needLanguages(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("node"); err != nil {
		missing = append(missing, "node (nodejs)")
	}
	for path, pkg := range map[string]string{
		"/usr/share/nodejs/typescript/package.json": "node-typescript",
		"/usr/share/jupyter/kernels/ir/kernel.json": "r-cran-irkernel",
	} {
		if _, err := os.Stat(path); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		testenv.Lacking(t, "the code interpreter's languages need %s (Debian: apt-get install nodejs node-typescript r-cran-irkernel)", strings.Join(missing, ", "))
	}
}

// jupyterPython returns a python3 that imports jupyter_client and
// ipykernel: the one on PATH, else Debian's; with neither the test is
// Lacking.
func jupyterPython(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		py, err := exec.LookPath(name)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		out, err := exec.Command(py, "-c", "import jupyter_client, ipykernel").CombinedOutput()
		if err == nil {
			return py
		}
		tried = append(tried, fmt.Sprintf("%s: %s", py, lastLine(out)))
	}
	testenv.Lacking(t, "no python3 with jupyter_client and ipykernel (Debian: apt-get install python3-jupyter-client python3-ipykernel): %s", strings.Join(tried, "; "))
	return ""
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
