package cli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestSandboxCreate(t *testing.T) {
	f := newFakeServer(t)
	stdout, _, err := f.run(t, "", "sandbox", "create", "--template", "tiny", "--memory", "256", "--timeout", "15m",
		"-e", "LANG=C.UTF-8", "-l", "owner=ci", "-l", "job=7")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != "sbx1\n" {
		t.Fatalf("stdout %q, want the ID", stdout)
	}
	f.mu.Lock()
	req := f.created[0]
	state := f.sandboxes["sbx1"].State
	f.mu.Unlock()
	if req.Template != "tiny" || req.MemoryMiB != 256 || req.TimeoutS == nil || *req.TimeoutS != 900 ||
		req.Env["LANG"] != "C.UTF-8" || req.Metadata["owner"] != "ci" || req.Metadata["job"] != "7" {
		t.Fatalf("request %+v", req)
	}
	if state != apiv1.StateRunning {
		t.Fatalf("create returned before the operation finished: state %s", state)
	}
}

func TestSandboxCreateJSON(t *testing.T) {
	f := newFakeServer(t)
	stdout, _, err := f.run(t, "", "sandbox", "create", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var so apiv1.SandboxOperation
	if err := json.Unmarshal([]byte(stdout), &so); err != nil {
		t.Fatalf("%v in %q", err, stdout)
	}
	if so.Sandbox.State != apiv1.StateRunning || so.Operation.Status != apiv1.OpSucceeded {
		t.Fatalf("sandbox %s, operation %s: want the state after the wait", so.Sandbox.State, so.Operation.Status)
	}
}

func TestSandboxCreateNoWait(t *testing.T) {
	f := newFakeServer(t)
	stdout, _, err := f.run(t, "", "sandbox", "create", "--no-wait")
	if err != nil || stdout != "sbx1\n" {
		t.Fatalf("%q %v", stdout, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.sandboxes["sbx1"].State; st != apiv1.StateCreating {
		t.Fatalf("state %s: --no-wait waited", st)
	}
}

func TestSandboxCreateFails(t *testing.T) {
	f := newFakeServer(t)
	stdout, _, err := f.run(t, "", "sandbox", "create", "--template", "broken")
	if ExitCode(err) != 1 || stdout != "" {
		t.Fatalf("exit %d, stdout %q: %v", ExitCode(err), stdout, err)
	}
	if want := "create sbx1 failed: template broken does not boot: kernel panic"; Message(err) != want {
		t.Fatalf("message %q, want %q", Message(err), want)
	}
}

func TestSandboxListFollowsPages(t *testing.T) {
	f := newFakeServer(t)
	now := time.Now()
	for i, id := range []string{"sbxa", "sbxb", "sbxc", "sbxd", "sbxe"} {
		f.addSandbox(id, now.Add(-time.Duration(i+1)*time.Hour))
	}
	f.mu.Lock()
	f.sandboxes["sbxe"].State = apiv1.StateDeleted
	f.sandboxes["sbxb"].Metadata = map[string]string{"owner": "ci"}
	f.mu.Unlock()

	stdout, _, err := f.run(t, "", "sandbox", "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "CREATED") {
		t.Fatalf("want a header and the 4 sandboxes not deleted, over 2 pages:\n%s", stdout)
	}
	if f := strings.Fields(lines[1]); len(f) != 5 || f[0] != "sbxa" || f[1] != "running" || f[2] != "base:latest" || f[3]+" "+f[4] != "1h ago" {
		t.Fatalf("row %q", lines[1])
	}

	stdout, _, err = f.run(t, "", "sandbox", "ls", "--all", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var all []apiv1.Sandbox
	if err := json.Unmarshal([]byte(stdout), &all); err != nil || len(all) != 5 {
		t.Fatalf("--all --json: %d sandboxes, %v:\n%s", len(all), err, stdout)
	}

	stdout, _, err = f.run(t, "", "sandbox", "ls", "-l", "owner=ci", "--json")
	if err != nil || !strings.Contains(stdout, `"sbxb"`) || strings.Contains(stdout, `"sbxa"`) {
		t.Fatalf("-l owner=ci: %v\n%s", err, stdout)
	}

	_, _, err = f.run(t, "", "sandbox", "ls", "--state", "sleeping")
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad state: %v", err)
	}
}

func TestSandboxGet(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx9", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	stdout, _, err := f.run(t, "", "sandbox", "get", "sbx9")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID:", "sbx9", "State:", "running", "Created:", "2026-01-02T03:04:05Z", "Expires:", "never"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	// A flag after the ID works too.
	stdout, _, err = f.run(t, "", "sandbox", "get", "sbx9", "--json")
	var sb apiv1.Sandbox
	if err != nil || json.Unmarshal([]byte(stdout), &sb) != nil || sb.ID != "sbx9" {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	_, _, err = f.run(t, "", "sandbox", "get", "sbxnone")
	if ExitCode(err) != 2 || Message(err) != "no sandbox sbxnone" {
		t.Fatalf("missing sandbox: exit %d, %v", ExitCode(err), err)
	}
}

func TestSandboxRemove(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	f.addSandbox("sbx2", time.Now())
	stdout, stderr, err := f.run(t, "", "sandbox", "rm", "sbx1", "sbxnone", "sbx2")
	if stdout != "sbx1\nsbx2\n" {
		t.Fatalf("stdout %q", stdout)
	}
	if ExitCode(err) != 2 || !strings.Contains(stderr, "sandbox rm sbxnone: no sandbox sbxnone") {
		t.Fatalf("exit %d, stderr %q", ExitCode(err), stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range []string{"sbx1", "sbx2"} {
		if st := f.sandboxes[id].State; st != apiv1.StateDeleted {
			t.Errorf("%s is %s", id, st)
		}
	}
}

func TestSandboxUsage(t *testing.T) {
	f := newFakeServer(t)
	_, _, err := f.run(t, "", "sandbox", "frobnicate")
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown subcommand: %v", err)
	}
	_, _, err = f.run(t, "", "sandbox", "rm")
	if ExitCode(err) != 2 {
		t.Fatalf("rm without IDs: %v", err)
	}
}
