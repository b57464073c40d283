package e2e

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// freeSpace is how a refusal names the free space and the limit.
var freeSpace = regexp.MustCompile(`has [0-9.]+ [MGT]iB free, less than the 1048576\.0 TiB `)

// TestMinFreeDisk runs a server that must keep more disk free than any
// disk has (--min-free-disk 1048576TiB): creates, wakes, template builds
// and sandbox saves answer 429 resource_exhausted naming the free space
// and the flag, and record nothing; the sandbox made before is untouched,
// and once the server runs with the default again it wakes, and creates
// work.
func TestMinFreeDisk(t *testing.T) {
	s := newServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	var op apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/pause", s.key, nil, &op)
	if done := s.waitOp(t, s.key, op.Operation.ID); done.Status != apiv1.OpSucceeded {
		t.Fatalf("pause: %+v", done.Error)
	}

	s.stop(syscall.SIGTERM)
	s.args = []string{"--min-free-disk", "1048576TiB"}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	refused := func(what, method, path string, body any) {
		t.Helper()
		status, b := s.call(t, method, path, s.key, body)
		var e apiv1.ErrorBody
		json.Unmarshal(b, &e)
		if status != 429 || e.Error.Code != apiv1.CodeResourceExhausted || !strings.Contains(e.Error.Message, "--min-free-disk") ||
			!freeSpace.MatchString(e.Error.Message) {
			t.Errorf("%s on a disk under --min-free-disk: %d %s", what, status, b)
		}
	}
	refused("create", "POST", "/v1/sandboxes", apiv1.CreateSandbox{Template: "tiny"})
	refused("wake", "POST", "/v1/sandboxes/"+sb.ID+"/wake", nil)
	refused("save", "POST", "/v1/sandboxes/"+sb.ID+"/template", apiv1.SaveTemplate{Name: "diskfull-saved"})
	refused("build", "POST", "/v1/templates", apiv1.CreateTemplate{Name: "diskfull-built", From: "tiny",
		Steps: []apiv1.BuildStep{{Run: "true"}}})
	r := serverCLI(t, s, "", "sandbox", "create", "--template", "tiny")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "--min-free-disk") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("sandbox create on a disk under --min-free-disk: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// Nothing was recorded: no new sandbox in any state, no template, no
	// directory; the paused sandbox is as it was.
	for _, state := range append([]string{""}, apiv1.States...) {
		var list apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes?state="+state, s.key, nil, &list)
		for _, got := range list.Items {
			if got.ID != sb.ID {
				t.Errorf("a refused create left sandbox %s (%s)", got.ID, got.State)
			}
		}
	}
	for _, name := range []string{"diskfull-saved", "diskfull-built"} {
		if status, b := s.call(t, "GET", "/v1/templates/"+name, s.key, nil); status != 404 {
			t.Errorf("template %s after its refused build: %d %s", name, status, b)
		}
	}
	if dirs, _ := filepath.Glob(filepath.Join(s.home, "sandboxes", "*")); len(dirs) != 1 || filepath.Base(dirs[0]) != sb.ID {
		t.Errorf("sandbox directories %q, want only %s's", dirs, sb.ID)
	}
	var cur apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &cur)
	if cur.State != apiv1.StatePaused || cur.LastError != nil {
		t.Errorf("the paused sandbox after a refused wake: %s %+v", cur.State, cur.LastError)
	}

	// With the disk check as it is by default, the sandbox wakes with its
	// files and a create works.
	s.stop(syscall.SIGTERM)
	s.args = nil
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/wake", s.key, nil, &op)
	if done := s.waitOp(t, s.key, op.Operation.ID); done.Status != apiv1.OpSucceeded {
		t.Fatalf("wake after the refusals: %+v", done.Error)
	}
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /etc/hostname >/dev/null && echo ok"}, &res)
	if res.ExitCode != 0 || res.Stdout != "ok\n" {
		t.Errorf("exec in the woken sandbox: %+v", res)
	}
	s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
}
