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
	"strings"
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
	dir := t.TempDir()
	script := filepath.Join(dir, "server.py")
	if err := os.WriteFile(script, codeInterpreterServer, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script)
	cmd.Env = append(os.Environ(), fmt.Sprintf("AIRLOCK_CODE_INTERPRETER_PORT=%d", port), "HOME="+dir)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
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

	execute := func(body string) []map[string]any {
		t.Helper()
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
			lines = append(lines, m)
		}
		if len(lines) == 0 || lines[len(lines)-1]["type"] != "end_of_execution" {
			t.Fatalf("execute %s: stream does not end with end_of_execution: %v", body, lines)
		}
		return lines
	}
	find := func(lines []map[string]any, typ string) map[string]any {
		for _, l := range lines {
			if l["type"] == typ {
				return l
			}
		}
		t.Fatalf("no %s line in %v", typ, lines)
		return nil
	}

	lines := execute(`{"code":"print(1)\nx = 41\nx + 1"}`)
	if find(lines, "number_of_executions")["execution_count"] == nil {
		t.Error("no execution_count")
	}
	if out := find(lines, "stdout"); out["text"] != "1\n" || out["timestamp"] == "" {
		t.Errorf("stdout line = %v", out)
	}
	if r := find(lines, "result"); r["text"] != "42" || r["is_main_result"] != true {
		t.Errorf("result line = %v", r)
	}
	e := find(execute(`{"code":"1/0","env_vars":{"A":"b"}}`), "error")
	if e["name"] != "ZeroDivisionError" || !strings.Contains(e["traceback"].(string), "ZeroDivisionError") {
		t.Errorf("error line = %v", e)
	}
	// An expression that is None makes no result line, as in Jupyter.
	if r := find(execute(`{"code":"import os; os.environ.get('A', 'unset')","env_vars":{"A":"b"}}`), "result"); r["text"] != "b" {
		t.Errorf("env_vars not set: %v", r)
	}
	if r := find(execute(`{"code":"import os; os.environ.get('A', 'unset')","language":"python"}`), "result"); r["text"] != "unset" {
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
	execute(fmt.Sprintf(`{"code":"kept = 7","context_id":%q}`, ctx.ID))
	if r := find(execute(fmt.Sprintf(`{"code":"kept * 6","context_id":%q}`, ctx.ID)), "result"); r["text"] != "42" {
		t.Errorf("context state: %v", r)
	}
	req, _ := http.NewRequest(http.MethodDelete, base+"/contexts/"+ctx.ID, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("delete context: %v %v", resp, err)
	}
	resp, err = http.Post(base+"/contexts", "application/json", strings.NewReader(`{"language":"r"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "not supported") {
		t.Errorf("context for r = %s %s", resp.Status, b)
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
