package mcp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/mcp"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// fixture is an API server over a sandbox runtime without VMs (its
// guests' commands run in this process's filesystem), with an admin and
// two user keys.
type fixture struct {
	url         string
	user, other string
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
	rt := sandboxtest.New(t, dir)
	if _, err := rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(rt), Store: st})
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
	var keys []string
	for _, name := range []string{"user", "other"} {
		k, err := svc.CreateKey(ctx, ap, apiv1.CreateKey{Name: name, Role: apiv1.RoleUser})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.Key)
	}
	srv := httptest.NewServer(api.New(api.Config{Service: svc, Store: st, Version: "test"}))
	t.Cleanup(srv.Close)
	return &fixture{url: srv.URL, user: keys[0], other: keys[1]}
}

// keyed adds an API key to every request.
type keyed struct{ key string }

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

// session connects an MCP client to the fixture's /v1/mcp with key.
func (f *fixture) session(t *testing.T, key string) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &sdk.StreamableClientTransport{
		Endpoint: f.url + "/v1/mcp", HTTPClient: &http.Client{Transport: keyed{key}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool and decodes its structured result into out (when
// not nil). It returns the result's text and whether it is an error.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args any, out any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if out != nil && !res.IsError {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured result %s: %v", tool, b, err)
		}
	}
	return text.String(), res.IsError
}

// mustCall is call that fails the test on a tool error.
func mustCall(t *testing.T, cs *sdk.ClientSession, tool string, args any, out any) {
	t.Helper()
	if text, isErr := call(t, cs, tool, args, out); isErr {
		t.Fatalf("%s %v: error %s", tool, args, text)
	}
}

func TestTools(t *testing.T) {
	f := newFixture(t)
	cs := f.session(t, f.user)

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.InputSchema == nil || tl.OutputSchema == nil {
			t.Errorf("tool %s lacks an input or output schema", tl.Name)
		}
	}
	for _, want := range []string{"create_sandbox", "run_command", "read_command_output", "write_file", "read_file", "list_files",
		"list_sandboxes", "delete_sandbox", "run_code", "checkpoint_sandbox", "fork_sandbox", "expose_port"} {
		if !slices.Contains(names, want) {
			t.Errorf("no tool %s among %v", want, names)
		}
	}

	var sb struct {
		SandboxID string `json:"sandbox_id"`
		State     string `json:"state"`
	}
	mustCall(t, cs, "create_sandbox", map[string]any{}, &sb)
	if sb.SandboxID == "" || sb.State != apiv1.StateRunning {
		t.Fatalf("create_sandbox: %+v", sb)
	}

	// A failing command is a result, not an error.
	var run struct {
		CommandID string `json:"command_id"`
		ExitCode  int    `json:"exit_code"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		Truncated bool   `json:"truncated"`
		Note      string `json:"note"`
		Bytes     int64  `json:"stdout_bytes"`
	}
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "echo out; echo err >&2; exit 3"}, &run)
	if run.ExitCode != 3 || run.Stdout != "out\n" || run.Stderr != "err\n" || run.Truncated {
		t.Fatalf("run_command: %+v", run)
	}
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "echo $A; pwd", "env": map[string]string{"A": "from-env"}, "cwd": "/"}, &run)
	if run.ExitCode != 0 || run.Stdout != "from-env\n/\n" {
		t.Fatalf("run_command with env and cwd: %+v", run)
	}

	// Long output is cut in the middle; read_command_output has it all.
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "seq 1 40000"}, &run)
	var want bytes.Buffer
	for i := 1; i <= 40000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if !run.Truncated || run.Bytes != int64(want.Len()) || !strings.Contains(run.Note, run.CommandID) ||
		!strings.HasPrefix(run.Stdout, "1\n2\n") || !strings.HasSuffix(run.Stdout, "39999\n40000\n") || len(run.Stdout) > mcp.MaxInlineOutput+100 {
		t.Fatalf("run_command of long output: truncated %v, %d bytes, note %q, %d bytes shown", run.Truncated, run.Bytes, run.Note, len(run.Stdout))
	}
	var got bytes.Buffer
	for off := int64(0); ; {
		var rd struct {
			Data       string `json:"data"`
			NextOffset int64  `json:"next_offset"`
			Size       int64  `json:"size"`
			Running    bool   `json:"running"`
			ExitCode   *int   `json:"exit_code"`
		}
		mustCall(t, cs, "read_command_output", map[string]any{"command_id": run.CommandID, "offset": off, "limit": 100000}, &rd)
		if rd.Running || rd.ExitCode == nil || *rd.ExitCode != 0 || rd.Size != int64(want.Len()) {
			t.Fatalf("read_command_output: running %v, exit %v, size %d", rd.Running, rd.ExitCode, rd.Size)
		}
		got.WriteString(rd.Data)
		if rd.NextOffset == off {
			break
		}
		off = rd.NextOffset
	}
	if got.String() != want.String() {
		t.Fatalf("read_command_output read %d bytes, not the %d written", got.Len(), want.Len())
	}

	// Files: text and binary, listed.
	dir := t.TempDir()
	text := filepath.Join(dir, "sub", "a.txt")
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": text, "content": "héllo\n"}, nil)
	var rf struct {
		Content  string `json:"content"`
		Encoding string `json:"encoding"`
		Bytes    int    `json:"bytes"`
	}
	mustCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.SandboxID, "path": text}, &rf)
	if rf.Content != "héllo\n" || rf.Encoding != "text" {
		t.Fatalf("read_file of text: %+v", rf)
	}
	bin := []byte{0, 0xff, 0xfe, 'x', 0x80}
	binPath := filepath.Join(dir, "b.bin")
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": binPath, "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}, nil)
	if b, err := os.ReadFile(binPath); err != nil || !bytes.Equal(b, bin) {
		t.Fatalf("the written binary file holds %x, %v", b, err)
	}
	mustCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.SandboxID, "path": binPath}, &rf)
	if d, _ := base64.StdEncoding.DecodeString(rf.Content); rf.Encoding != "base64" || !bytes.Equal(d, bin) {
		t.Fatalf("read_file of binary: %+v", rf)
	}
	var lf struct {
		Entries []apiv1.Stat `json:"entries"`
	}
	mustCall(t, cs, "list_files", map[string]any{"sandbox_id": sb.SandboxID, "path": dir, "depth": 2}, &lf)
	var paths []string
	for _, e := range lf.Entries {
		paths = append(paths, e.Path)
	}
	if !slices.Contains(paths, text) || !slices.Contains(paths, binPath) {
		t.Fatalf("list_files: %v", paths)
	}

	var ls struct {
		Sandboxes []struct {
			SandboxID string `json:"sandbox_id"`
		} `json:"sandboxes"`
	}
	mustCall(t, cs, "list_sandboxes", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].SandboxID != sb.SandboxID {
		t.Fatalf("list_sandboxes: %+v", ls)
	}
	var ep struct {
		URL string `json:"url"`
	}
	mustCall(t, cs, "expose_port", map[string]any{"sandbox_id": sb.SandboxID, "port": 8000}, &ep)
	if ep.URL != f.url+"/v1/sandboxes/"+sb.SandboxID+"/ports/8000/" {
		t.Fatalf("expose_port: %q", ep.URL)
	}

	// Another key sees none of it; the same calls are errors naming why.
	other := f.session(t, f.other)
	mustCall(t, other, "list_sandboxes", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 0 {
		t.Fatalf("another key lists %+v", ls)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "true"}},
		{"read_file", map[string]any{"sandbox_id": sb.SandboxID, "path": text}},
		{"delete_sandbox", map[string]any{"sandbox_id": sb.SandboxID}},
		{"expose_port", map[string]any{"sandbox_id": sb.SandboxID, "port": 80}},
		{"read_command_output", map[string]any{"command_id": run.CommandID}},
	} {
		if text, isErr := call(t, other, c.tool, c.args, nil); !isErr || !strings.Contains(text, "not_found") {
			t.Errorf("%s with another key's sandbox: error %v, %q", c.tool, isErr, text)
		}
	}

	mustCall(t, cs, "delete_sandbox", map[string]any{"sandbox_id": sb.SandboxID}, nil)
	mustCall(t, cs, "list_sandboxes", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 0 {
		t.Fatalf("list_sandboxes after delete: %+v", ls)
	}
}

// TestBadInput sends each tool what it must refuse: a tool result with
// isError and a message, never a protocol error or a crash, and nothing
// changed.
func TestBadInput(t *testing.T) {
	f := newFixture(t)
	cs := f.session(t, f.user)
	var sb struct {
		SandboxID string `json:"sandbox_id"`
	}
	mustCall(t, cs, "create_sandbox", map[string]any{}, &sb)
	id := sb.SandboxID
	dir := t.TempDir()
	huge := strings.Repeat("x", mcp.MaxWriteBytes+1)
	cases := []struct {
		name, tool string
		args       any
		want       string // in the error's text
	}{
		{"create: unknown template", "create_sandbox", map[string]any{"template": "nope"}, "nope"},
		{"create: template of the wrong type", "create_sandbox", map[string]any{"template": 7}, "template"},
		{"create: negative timeout", "create_sandbox", map[string]any{"timeout_s": -1}, "timeout_s"},
		{"create: bad network", "create_sandbox", map[string]any{"network": map[string]any{"egress": "sideways"}}, "egress"},
		{"create: unknown field", "create_sandbox", map[string]any{"templat": "base"}, "templat"},
		{"run: no sandbox", "run_command", map[string]any{"command": "true"}, "sandbox_id"},
		{"run: no command", "run_command", map[string]any{"sandbox_id": id}, "command"},
		{"run: empty command", "run_command", map[string]any{"sandbox_id": id, "command": " "}, "command"},
		{"run: command of the wrong type", "run_command", map[string]any{"sandbox_id": id, "command": []string{"ls"}}, "command"},
		{"run: timeout too long", "run_command", map[string]any{"sandbox_id": id, "command": "true", "timeout_s": 99999}, "timeout_s"},
		{"run: unknown sandbox", "run_command", map[string]any{"sandbox_id": "sbxnope", "command": "true"}, "not_found"},
		{"run: sandbox ID with ..", "run_command", map[string]any{"sandbox_id": "../keys", "command": "true"}, "not_found"},
		{"run: sandbox ID with NUL", "run_command", map[string]any{"sandbox_id": "sbx\x00", "command": "true"}, "sandbox"},
		{"run: very long sandbox ID", "run_command", map[string]any{"sandbox_id": strings.Repeat("a", 5000), "command": "true"}, "sandbox"},
		{"read output: unknown command", "read_command_output", map[string]any{"command_id": "cmdnope"}, "not_found"},
		{"read output: bad stream", "read_command_output", map[string]any{"command_id": "cmdnope", "stream": "stdin"}, "stream"},
		{"read output: negative offset", "read_command_output", map[string]any{"command_id": "cmdnope", "offset": -1}, "offset"},
		{"read output: limit too big", "read_command_output", map[string]any{"command_id": "cmdnope", "limit": mcp.MaxOutputRead + 1}, "limit"},
		{"write: no path", "write_file", map[string]any{"sandbox_id": id, "content": "x"}, "path"},
		{"write: path with NUL", "write_file", map[string]any{"sandbox_id": id, "path": dir + "/a\x00b", "content": "x"}, "NUL"},
		{"write: content too big", "write_file", map[string]any{"sandbox_id": id, "path": dir + "/big", "content": huge}, "more than write_file takes"},
		{"write: bad base64", "write_file", map[string]any{"sandbox_id": id, "path": dir + "/b", "content": "%%%", "encoding": "base64"}, "base64"},
		{"write: unknown encoding", "write_file", map[string]any{"sandbox_id": id, "path": dir + "/b", "content": "x", "encoding": "rot13"}, "encoding"},
		{"write: content of the wrong type", "write_file", map[string]any{"sandbox_id": id, "path": dir + "/b", "content": 5}, "content"},
		{"read: missing file", "read_file", map[string]any{"sandbox_id": id, "path": dir + "/nope"}, "not_found"},
		{"read: a directory", "read_file", map[string]any{"sandbox_id": id, "path": dir}, "directory"},
		{"read: path with NUL", "read_file", map[string]any{"sandbox_id": id, "path": "/etc/\x00passwd"}, "NUL"},
		{"list: no path", "list_files", map[string]any{"sandbox_id": id}, "path"},
		{"list: negative depth", "list_files", map[string]any{"sandbox_id": id, "path": dir, "depth": -2}, "depth"},
		{"delete: no sandbox", "delete_sandbox", map[string]any{}, "sandbox_id"},
		{"run_code: no code", "run_code", map[string]any{"sandbox_id": id}, "code"},
		{"run_code: code too big", "run_code", map[string]any{"sandbox_id": id, "code": strings.Repeat("#", mcp.MaxCodeBytes+1)}, "more than run_code takes"},
		{"fork: count too big", "fork_sandbox", map[string]any{"sandbox_id": id, "count": apiv1.MaxForks + 1}, "count"},
		{"fork: unknown sandbox", "fork_sandbox", map[string]any{"sandbox_id": "sbxnope"}, "not_found"},
		{"checkpoint: unknown sandbox", "checkpoint_sandbox", map[string]any{"sandbox_id": "sbxnope"}, "not_found"},
		{"expose: port 0", "expose_port", map[string]any{"sandbox_id": id, "port": 0}, "port"},
		{"expose: port too big", "expose_port", map[string]any{"sandbox_id": id, "port": 70000}, "port"},
		{"expose: port of the wrong type", "expose_port", map[string]any{"sandbox_id": id, "port": "80"}, "port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text, isErr := call(t, cs, c.tool, c.args, nil)
			if !isErr || !strings.Contains(text, c.want) {
				t.Errorf("%s %.200v: error %v, %q; want an error naming %q", c.tool, c.args, isErr, truncate(text), c.want)
			}
		})
	}
	// Nothing was made or written on the way.
	var ls struct {
		Sandboxes []struct {
			SandboxID string `json:"sandbox_id"`
		} `json:"sandboxes"`
	}
	mustCall(t, cs, "list_sandboxes", map[string]any{}, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].SandboxID != id {
		t.Fatalf("after the bad calls: %+v", ls)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("after the bad calls the directory holds %v (%v)", entries, err)
	}
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// TestHTTPAuth: /v1/mcp needs a key, answers a call without a session in
// JSON, and GET and DELETE (a stateless
// server has no sessions to stream or end) answer 405.
func TestHTTPAuth(t *testing.T) {
	f := newFixture(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, c := range []struct {
		method, key string
		want        int
	}{
		{"POST", "", 401},
		{"POST", "ak_wrong", 401},
		{"POST", f.user, 200}, // a bare tools/list, no initialize first: the server is stateless
		{"GET", f.user, 405},
		{"DELETE", f.user, 405},
	} {
		req, _ := http.NewRequest(c.method, f.url+"/v1/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s /v1/mcp with key %q: %d, want %d: %s", c.method, c.key, resp.StatusCode, c.want, b)
		}
		if c.want == 200 && (!strings.Contains(string(b), `"run_command"`) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")) {
			t.Errorf("tools/list answered %s: %s", resp.Header.Get("Content-Type"), b)
		}
	}
}
