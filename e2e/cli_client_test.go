package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// serverCLI runs the airlock binary as a client of s.
func serverCLI(t *testing.T, s *server, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(binPath(), args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url, "AIRLOCK_API_KEY="+s.key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cliResult{out.String(), errb.String(), code}
}

// TestCLIClient drives a server through the CLI's client commands.
func TestCLIClient(t *testing.T) {
	s := sharedServer(t)
	r := serverCLI(t, s, "", "sandbox", "create", "--template", "tiny", "-l", "from=cli", "-e", "WHO=cli")
	if r.code != 0 {
		t.Fatalf("sandbox create: %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { s.deleteSandbox(t, s.key, id) })

	if r = serverCLI(t, s, "", "sandbox", "ls", "-l", "from=cli"); r.code != 0 || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "running") {
		t.Errorf("sandbox ls: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r = serverCLI(t, s, "", "sandbox", "get", "--json", id); r.code != 0 || !strings.Contains(r.stdout, `"state": "running"`) && !strings.Contains(r.stdout, `"state":"running"`) {
		t.Errorf("sandbox get: %d %q", r.code, r.stdout)
	}

	r = serverCLI(t, s, "", "exec", id, "--", "sh", "-c", "echo out $WHO; echo err >&2; exit 6")
	if r.code != 6 || r.stdout != "out cli\n" || r.stderr != "err\n" {
		t.Errorf("exec: code %d out %q err %q", r.code, r.stdout, r.stderr)
	}
	r = serverCLI(t, s, "piped input\n", "exec", "-i", id, "--", "cat")
	if r.code != 0 || r.stdout != "piped input\n" {
		t.Errorf("exec -i: code %d out %q err %q", r.code, r.stdout, r.stderr)
	}

	// cp both ways, a file and a directory.
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "f.txt"), []byte("file body"), 0o640)
	os.MkdirAll(filepath.Join(local, "tree", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "tree", "sub", "g.txt"), []byte("deep"), 0o644)
	for _, args := range [][]string{
		{"cp", filepath.Join(local, "f.txt"), id + ":/root/f.txt"},
		{"cp", filepath.Join(local, "tree"), id + ":/root/tree"},
		{"cp", id + ":/root/f.txt", filepath.Join(local, "back.txt")},
		{"cp", id + ":/root/tree", filepath.Join(local, "treeback")},
	} {
		if r = serverCLI(t, s, "", args...); r.code != 0 {
			t.Fatalf("%v: %d %s", args, r.code, r.stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(local, "back.txt")); string(b) != "file body" {
		t.Errorf("file round trip: %q", b)
	}
	if fi, err := os.Stat(filepath.Join(local, "back.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("file mode after round trip: %v %v", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "treeback", "sub", "g.txt")); string(b) != "deep" {
		t.Errorf("directory round trip: %q", b)
	}
	if r = serverCLI(t, s, "", "exec", id, "--", "cat", "/root/tree/sub/g.txt"); r.stdout != "deep" {
		t.Errorf("the directory in the sandbox: %q %s", r.stdout, r.stderr)
	}

	// Bad input: one line, exit 2, nothing changed.
	for _, args := range [][]string{
		{"exec", "sbxnosuchsandbox00000000", "--", "true"},
		{"cp", "a", "b"},
		{"sandbox", "create", "--template", "no-such-template"},
		{"op", "get", "op!!"},
	} {
		r = serverCLI(t, s, "", args...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || r.stderr == "" {
			t.Errorf("%v: code %d, stderr %q (want 2 and one line)", args, r.code, r.stderr)
		}
	}
	var list apiv1.List[apiv1.Sandbox]
	s.must(t, 200, "GET", "/v1/sandboxes?metadata.from=cli", s.key, nil, &list)
	if len(list.Items) != 1 {
		t.Errorf("%d sandboxes with the label after bad input, want 1", len(list.Items))
	}

	// rm waits for the delete; op get shows a finished operation.
	if r = serverCLI(t, s, "", "sandbox", "rm", id); r.code != 0 {
		t.Fatalf("sandbox rm: %d %s", r.code, r.stderr)
	}
	var sb apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
	if sb.State != "deleted" {
		t.Errorf("after rm: %s", sb.State)
	}
	var res apiv1.SandboxOperation
	s2 := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	s.must(t, 202, "DELETE", "/v1/sandboxes/"+s2.ID, s.key, nil, &res)
	if r = serverCLI(t, s, "", "op", "get", "--wait", res.Operation.ID); r.code != 0 || !strings.Contains(r.stdout, "succeeded") {
		t.Errorf("op get --wait: %d %q %s", r.code, r.stdout, r.stderr)
	}
}

// TestCLILifecycle pauses, suspends, wakes and keeps a sandbox through the
// CLI.
func TestCLILifecycle(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	for _, step := range []struct {
		args  []string
		state string
	}{
		{[]string{"sandbox", "pause", sb.ID}, "paused"},
		{[]string{"sandbox", "suspend", sb.ID}, "suspended"},
		{[]string{"sandbox", "wake", sb.ID}, "running"},
	} {
		r := serverCLI(t, s, "", step.args...)
		if r.code != 0 || strings.TrimSpace(r.stdout) != sb.ID {
			t.Fatalf("%v: %d %q %s", step.args, r.code, r.stdout, r.stderr)
		}
		if got := s.state(t, sb.ID).State; got != step.state {
			t.Fatalf("after %v: %s, want %s", step.args, got, step.state)
		}
	}
	r := serverCLI(t, s, "", "sandbox", "wake", sb.ID)
	if r.code != 2 || !strings.Contains(r.stderr, "running") {
		t.Errorf("waking a running sandbox: %d %q", r.code, r.stderr)
	}
	r = serverCLI(t, s, "", "sandbox", "keep", "--timeout", "1h", sb.ID)
	if r.code != 0 || !strings.Contains(r.stdout, "expires at") {
		t.Errorf("keep: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if sb := s.state(t, sb.ID); sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 59*time.Minute {
		t.Errorf("lease after keep --timeout 1h: %v", sb.ExpiresAt)
	}
}
