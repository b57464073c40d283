package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestAPIFlow drives one sandbox through the whole API: create, commands
// with their streams, exec, files, archives, events, delete.
func TestAPIFlow(t *testing.T) {
	s := sharedServer(t)
	key := s.key
	sb := s.createSandbox(t, key, apiv1.CreateSandbox{
		Env: map[string]string{"GREETING": "hello"}, Metadata: map[string]string{"test": "flow"},
	})
	if sb.Template.Ref != "tiny:latest" || !strings.HasPrefix(sb.Template.Digest, "sha256:") || sb.VCPUs < 1 {
		t.Errorf("sandbox as created: %+v", sb)
	}

	// Listed, and found by its label.
	var list apiv1.List[apiv1.Sandbox]
	s.must(t, 200, "GET", "/v1/sandboxes?metadata.test=flow", key, nil, &list)
	if len(list.Items) != 1 || list.Items[0].ID != sb.ID {
		t.Errorf("list by label: %+v", list.Items)
	}
	s.must(t, 200, "GET", "/v1/sandboxes?metadata.test=other", key, nil, &list)
	if len(list.Items) != 0 {
		t.Errorf("list by another label found %d", len(list.Items))
	}

	t.Run("command stream", func(t *testing.T) {
		o := s.run(t, key, sb.ID, apiv1.CommandRequest{Cmd: "echo $GREETING from $(hostname); echo oops >&2; exit 3"})
		if o.stdout != "hello from "+sb.ID+"\n" || o.stderr != "oops\n" || o.exit.ExitCode != 3 {
			t.Errorf("stream: %+v", o)
		}
		if o.names[0] != "start" || o.names[len(o.names)-1] != "exit" {
			t.Errorf("events %v do not start with start and end with exit", o.names)
		}
	})

	t.Run("command state", func(t *testing.T) {
		var sess apiv1.CommandSession
		s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", key, apiv1.CommandRequest{Argv: []string{"sh", "-c", "exit 7"}}, &sess)
		var c apiv1.Command
		s.must(t, 200, "GET", "/v1/commands/"+sess.ID, key, nil, &c)
		if c.State != "created" || c.PID != nil {
			t.Errorf("before attach: %+v", c)
		}
		resp, r := s.attach(t, sess.ID, key, 0)
		o := readToExit(t, r)
		resp.Body.Close()
		s.must(t, 200, "GET", "/v1/commands/"+sess.ID, key, nil, &c)
		if c.State != "exited" || c.ExitCode == nil || *c.ExitCode != 7 || o.exit.ExitCode != 7 || c.PID == nil || c.FinishedAt == nil {
			t.Errorf("after exit: %+v", c)
		}
		var cl apiv1.List[apiv1.Command]
		s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/commands", key, nil, &cl)
		found := false
		for _, x := range cl.Items {
			found = found || x.ID == sess.ID
		}
		if !found {
			t.Errorf("command %s not in the sandbox's list", sess.ID)
		}
	})

	t.Run("stdin and signal", func(t *testing.T) {
		var sess apiv1.CommandSession
		s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", key, apiv1.CommandRequest{
			Cmd: "trap 'echo got TERM; exit 9' TERM; read line; echo \"read $line\"; while :; do sleep 0.1; done", Stdin: true}, &sess)
		resp, r := s.attach(t, sess.ID, key, 0)
		defer resp.Body.Close()
		s.must(t, 204, "POST", "/v1/commands/"+sess.ID+"/stdin", key, "typed\n", nil)
		readUntil(t, r, contains("read typed"))
		s.must(t, 204, "POST", "/v1/commands/"+sess.ID+"/signal", key, apiv1.Signal{Signal: "TERM"}, nil)
		o := readToExit(t, r)
		if o.exit.ExitCode != 9 || !strings.Contains(o.stdout, "got TERM") {
			t.Errorf("after TERM: %+v", o)
		}
	})

	t.Run("pty and resize", func(t *testing.T) {
		var sess apiv1.CommandSession
		s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", key, apiv1.CommandRequest{
			Cmd: "stty size; read x; stty size", Stdin: true, PTY: &apiv1.PTY{Rows: 24, Cols: 80}}, &sess)
		resp, r := s.attach(t, sess.ID, key, 0)
		defer resp.Body.Close()
		readUntil(t, r, contains("24 80"))
		s.must(t, 204, "POST", "/v1/commands/"+sess.ID+"/resize", key, map[string]int{"rows": 40, "cols": 120}, nil)
		s.must(t, 204, "POST", "/v1/commands/"+sess.ID+"/stdin", key, "\n", nil)
		o := readToExit(t, r)
		if !strings.Contains(o.stdout, "40 120") || o.exit.ExitCode != 0 {
			t.Errorf("after resize: %q exit %d", o.stdout, o.exit.ExitCode)
		}
	})

	t.Run("exec", func(t *testing.T) {
		var res apiv1.ExecResult
		s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", key, apiv1.CommandRequest{Cmd: "printf 'a\\377b'; echo e >&2; exit 4"}, &res)
		if res.ExitCode != 4 || res.Stdout != "a\uFFFDb" || res.Stderr != "e\n" || res.Truncated {
			t.Errorf("exec: %+v", res)
		}
		s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", key, apiv1.CommandRequest{Argv: []string{"no-such-program"}}, &res)
		if res.ExitCode != 127 {
			t.Errorf("exec of a missing program: %+v", res)
		}
		s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", key, apiv1.CommandRequest{Cmd: "sleep 30", TimeoutS: 1}, &res)
		if !res.TimedOut || res.Signal == nil || *res.Signal != "KILL" {
			t.Errorf("exec past its timeout: %+v", res)
		}
	})

	t.Run("files", func(t *testing.T) {
		content := bytes.Repeat([]byte("airlock\x00\xff"), 300000) // 2.7 MB, binary
		s.must(t, 204, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/root/a/b/data.bin&mode=0600", key, content, nil)
		status, got := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/root/a/b/data.bin", key, nil)
		if status != 200 || !bytes.Equal(got, content) {
			t.Fatalf("read back: status %d, %d bytes, equal %v", status, len(got), bytes.Equal(got, content))
		}
		var st apiv1.Stat
		s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/root/a/b/data.bin", key, nil, &st)
		if st.Type != "file" || st.SizeBytes != int64(len(content)) || st.Mode != "0600" {
			t.Errorf("stat: %+v", st)
		}
		s.must(t, 204, "POST", "/v1/sandboxes/"+sb.ID+"/fs/mkdir", key, apiv1.Path{Path: "/root/c"}, nil)
		s.must(t, 204, "POST", "/v1/sandboxes/"+sb.ID+"/fs/move", key, apiv1.Move{From: "/root/a/b/data.bin", To: "/root/c/moved.bin"}, nil)
		var ls struct{ Items []apiv1.Stat }
		s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/fs/list?path=/root&depth=2", key, nil, &ls)
		var names []string
		for _, it := range ls.Items {
			names = append(names, it.Path)
		}
		if !strings.Contains(strings.Join(names, ","), "/root/c/moved.bin") {
			t.Errorf("list after move: %v", names)
		}
		s.must(t, 404, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/root/a/b/data.bin", key, nil, nil)
		s.must(t, 400, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/root/c", key, nil, nil)
		s.must(t, 400, "DELETE", "/v1/sandboxes/"+sb.ID+"/files?path=/root/c", key, nil, nil)
		s.must(t, 204, "DELETE", "/v1/sandboxes/"+sb.ID+"/files?path=/root/c&recursive=true", key, nil, nil)
		s.must(t, 404, "GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/root/c", key, nil, nil)
	})

	t.Run("archive", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		files := map[string]string{"one.txt": "1", "sub/two.txt": "22"}
		for name, body := range files {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(body))
		}
		tw.Close()
		s.must(t, 204, "PUT", "/v1/sandboxes/"+sb.ID+"/archive?path=/srv/tree", key, buf.Bytes(), nil)
		status, out := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/archive?path=/srv/tree", key, nil)
		if status != 200 {
			t.Fatalf("archive out: %d %s", status, out)
		}
		tr := tar.NewReader(bytes.NewReader(out))
		got := map[string]string{}
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				b, _ := io.ReadAll(tr)
				got[strings.TrimPrefix(h.Name, "./")] = string(b)
			}
		}
		for name, body := range files {
			if got[name] != body {
				t.Errorf("archive round trip: %s = %q, want %q (all: %v)", name, got[name], body, got)
			}
		}
	})

	t.Run("templates", func(t *testing.T) {
		var tl apiv1.List[apiv1.Template]
		s.must(t, 200, "GET", "/v1/templates", key, nil, &tl)
		var tpl apiv1.Template
		s.must(t, 200, "GET", "/v1/templates/tiny", key, nil, &tpl)
		if tpl.Digest != sb.Template.Digest || tpl.Status != "ready" || len(tl.Items) < 1 {
			t.Errorf("template tiny: %+v of %d", tpl, len(tl.Items))
		}
		s.must(t, 200, "GET", "/v1/templates/"+tpl.Digest, key, nil, &tpl)
	})
}

// TestAPIEventsAndDelete watches a sandbox's events while it is deleted.
func TestAPIEventsAndDelete(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	resp, r := s.openEvents(t, sb.ID)
	defer resp.Body.Close()
	var res apiv1.SandboxOperation
	s.must(t, 202, "DELETE", "/v1/sandboxes/"+sb.ID, s.key, nil, &res)
	if res.Sandbox.State != "deleting" || res.Operation.Kind != "delete" {
		t.Errorf("delete answer: %+v", res)
	}
	var states []string
	for len(states) == 0 || states[len(states)-1] != "deleted" {
		ev, err := r.next()
		if err != nil {
			t.Fatalf("events ended after %v: %v", states, err)
		}
		var v apiv1.Sandbox
		if ev.name != "state" || json.Unmarshal([]byte(ev.data), &v) != nil || v.ID != sb.ID {
			t.Fatalf("event %+v", ev)
		}
		states = append(states, v.State)
	}
	if strings.Join(states, ",") != "deleting,deleted" {
		t.Errorf("states seen: %v", states)
	}
	op := s.waitOp(t, s.key, res.Operation.ID)
	if op.Status != "succeeded" || op.FinishedAt == nil {
		t.Errorf("delete operation: %+v", op)
	}
	var got apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &got)
	if got.State != "deleted" {
		t.Errorf("after delete: %s", got.State)
	}
	var list apiv1.List[apiv1.Sandbox]
	s.must(t, 200, "GET", "/v1/sandboxes", s.key, nil, &list)
	for _, x := range list.Items {
		if x.ID == sb.ID {
			t.Errorf("deleted sandbox listed without ?state=deleted")
		}
	}
	s.must(t, 200, "GET", "/v1/sandboxes?state=deleted", s.key, nil, &list)
	found := false
	for _, x := range list.Items {
		found = found || x.ID == sb.ID
	}
	if !found {
		t.Errorf("deleted sandbox not listed with ?state=deleted")
	}
	if _, err := os.Stat(filepath.Join(s.home, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Errorf("sandbox directory left: %v", err)
	}
}

// counterScript prints numbered lines: "line N" for N = 1..n, sleeping
// between them, so every byte of output can be checked.
func counterScript(n int, sleep string) string {
	return fmt.Sprintf("i=1; while [ $i -le %d ]; do echo line $i; i=$((i+1)); sleep %s; done", n, sleep)
}

func checkCounter(t *testing.T, out string, n int) {
	t.Helper()
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if out != want.String() {
		t.Errorf("output is not lines 1..%d in order:\n%s", n, out)
	}
}

// TestAPIReplayAfterDisconnect drops an attach stream halfway and
// reconnects with Last-Event-ID: every event after it comes again, in
// order, and pings arrive while the stream is idle.
func TestAPIReplayAfterDisconnect(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	var sess apiv1.CommandSession
	// The counter also writes its last line's number to /tmp/at, so that
	// the test sees it write on while nobody is attached.
	cmd := "i=1; while [ $i -le 20 ]; do echo line $i; echo $i >/tmp/at; i=$((i+1)); sleep 0.1; done; sleep 2.5; echo done"
	s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", s.key, apiv1.CommandRequest{Cmd: cmd}, &sess)

	resp, r := s.attach(t, sess.ID, sess.Attach.Token, 0)
	first, lastID := readUntil(t, r, lines(5))
	resp.Body.Close() // the client goes away; the command goes on

	testenv.Eventually(t, 30*time.Second, "the command writing line 8 with nobody attached", func() (bool, string) {
		var res apiv1.ExecResult
		s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /tmp/at"}, &res)
		n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
		return n >= 8, "at line " + res.Stdout
	})
	resp, r = s.attach(t, sess.ID, sess.Attach.Token, lastID)
	defer resp.Body.Close()
	rest := readToExit(t, r)
	if rest.exit.ExitCode != 0 {
		t.Errorf("exit %+v", rest.exit)
	}
	all := strings.TrimSuffix(first+rest.stdout, "done\n")
	checkCounter(t, all, 20)
	if r.pings == 0 {
		t.Errorf("no ': ping' during 2.5 s of silence with a 1 s ping interval")
	}
	// A full replay from the start gives the same bytes.
	resp2, r2 := s.attach(t, sess.ID, s.key, 0)
	defer resp2.Body.Close()
	again := readToExit(t, r2)
	if again.stdout != first+rest.stdout || again.names[0] != "start" {
		t.Errorf("full replay differs: %q", again.stdout)
	}
}

// TestAPIServerRestart restarts the server while a command runs: the VM is
// adopted, the command keeps running, and a client that re-attaches with
// Last-Event-ID misses nothing. A VM killed while the server is down fails
// its sandbox with the reason, and a create cut short fails its operation.
func TestAPIServerRestart(t *testing.T) {
	s := newServer(t)
	keep := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	doomed := s.createSandbox(t, s.key, apiv1.CreateSandbox{})

	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+keep.ID+"/commands", s.key, apiv1.CommandRequest{Cmd: counterScript(40, "0.1")}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	seen, lastID := readUntil(t, r, lines(3))

	s.stop(syscall.SIGTERM)
	resp.Body.Close()
	if !strings.Contains(s.output(), "sandboxes keep running") {
		t.Errorf("no graceful shutdown line in the server's output:\n%s", s.output())
	}
	// While the server is down: kill one VM.
	b, err := os.ReadFile(filepath.Join(s.home, "sandboxes", doomed.ID, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	syscall.Kill(pid, syscall.SIGKILL)
	testenv.Eventually(t, 10*time.Second, "the killed QEMU gone", func() (bool, string) {
		return !testenv.ProcessAlive(pid), fmt.Sprintf("QEMU %d is alive", pid)
	})

	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	resp, r = s.attach(t, sess.ID, s.key, lastID)
	defer resp.Body.Close()
	rest := readToExit(t, r)
	checkCounter(t, seen+rest.stdout, 40)
	if rest.exit.ExitCode != 0 {
		t.Errorf("exit after restart: %+v", rest.exit)
	}

	var got apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+doomed.ID, s.key, nil, &got)
	if got.State != "failed" || got.LastError == nil || !strings.Contains(got.LastError.Message, "while the server was down") {
		t.Errorf("sandbox whose VM died while the server was down: %+v %+v", got.State, got.LastError)
	}
	s.must(t, 200, "GET", "/v1/sandboxes/"+keep.ID, s.key, nil, &got)
	if got.State != "running" {
		t.Errorf("adopted sandbox is %s", got.State)
	}
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+keep.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "echo still here"}, &res)
	if res.Stdout != "still here\n" {
		t.Errorf("exec in the adopted sandbox: %+v", res)
	}

	// A create in flight when the server dies hard is failed, with the
	// reason, by the next start; nothing of it is left.
	// A memory size no other test uses, whose template snapshot is removed
	// first, makes the create build one, so it is still in flight when the
	// server dies.
	old, _ := filepath.Glob(filepath.Join(dataDir().Snapshots(), "*-1c-320m"))
	for _, d := range old {
		os.RemoveAll(d)
	}
	var cr apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 320}, &cr)
	// The server is killed once the create is making the snapshot, in its
	// build directory.
	testenv.Eventually(t, 30*time.Second, "the create making its template snapshot", func() (bool, string) {
		made, _ := filepath.Glob(filepath.Join(dataDir().Snapshots(), ".build-*-1c-320m-*"))
		return len(made) > 0, "no .build-*-1c-320m-* in the snapshots"
	})
	s.stop(syscall.SIGKILL)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	op := s.waitOp(t, s.key, cr.Operation.ID)
	if op.Status != "failed" || op.Error == nil || !strings.Contains(op.Error.Message, "restarted") {
		t.Errorf("create cut short by a crash: %+v %+v", op.Status, op.Error)
	}
	s.must(t, 200, "GET", "/v1/sandboxes/"+cr.Sandbox.ID, s.key, nil, &got)
	if got.State != "failed" {
		t.Errorf("its sandbox is %s", got.State)
	}
	s.deleteSandbox(t, s.key, cr.Sandbox.ID)
}

// TestAPIConcurrentClients runs 20 clients at once on a few sandboxes:
// each runs commands and writes and reads its own files, and checks that
// it got back exactly its own.
func TestAPIConcurrentClients(t *testing.T) {
	s := sharedServer(t)
	boxes := []apiv1.Sandbox{s.createSandbox(t, s.key, apiv1.CreateSandbox{}), s.createSandbox(t, s.key, apiv1.CreateSandbox{})}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for c := 0; c < 20; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			sb := boxes[c%len(boxes)]
			for i := 0; i < 3; i++ {
				want := fmt.Sprintf("client %d round %d", c, i)
				body, _ := json.Marshal(apiv1.CommandRequest{Cmd: "echo " + want})
				req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+sb.ID+"/exec", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+s.key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				var res apiv1.ExecResult
				json.NewDecoder(resp.Body).Decode(&res)
				resp.Body.Close()
				if resp.StatusCode != 200 || res.Stdout != want+"\n" {
					errs <- fmt.Errorf("client %d: exec %d %+v", c, resp.StatusCode, res)
				}
				path := fmt.Sprintf("/tmp/client%d-%d", c, i)
				req, _ = http.NewRequest("PUT", s.url+"/v1/sandboxes/"+sb.ID+"/files?path="+path, strings.NewReader(want))
				req.Header.Set("Authorization", "Bearer "+s.key)
				resp, err = http.DefaultClient.Do(req)
				if err != nil || resp.StatusCode != 204 {
					errs <- fmt.Errorf("client %d: put %v %v", c, err, resp)
					return
				}
				resp.Body.Close()
				req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/"+sb.ID+"/files?path="+path, nil)
				req.Header.Set("Authorization", "Bearer "+s.key)
				resp, err = http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(got) != want {
					errs <- fmt.Errorf("client %d: read %q, want %q", c, got, want)
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestAPILimits fills a server capped at one sandbox: the next create is
// refused with 429 naming the limit, and nothing is recorded for it.
func TestAPILimits(t *testing.T) {
	s := newServer(t, "--max-sandboxes", "1")
	s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	status, body := s.call(t, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny"})
	var e apiv1.ErrorBody
	json.Unmarshal(body, &e)
	if status != 429 || e.Error.Code != "resource_exhausted" || !strings.Contains(e.Error.Message, "max_sandboxes=1") {
		t.Errorf("past the cap: %d %s", status, body)
	}
	var list apiv1.List[apiv1.Sandbox]
	s.must(t, 200, "GET", "/v1/sandboxes", s.key, nil, &list)
	if len(list.Items) != 1 {
		t.Errorf("%d sandboxes recorded, want 1", len(list.Items))
	}
	status, body = s.call(t, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 1 << 30})
	if status != 400 || !strings.Contains(string(body), "memory") {
		t.Errorf("memory past the per-sandbox bound: %d %s", status, body)
	}
}

// TestAPIMetrics checks that the counters move with the work done.
func TestAPIMetrics(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	s.run(t, s.key, sb.ID, apiv1.CommandRequest{Cmd: "echo metrics"})
	status, body := s.call(t, "GET", "/metrics", "", nil)
	if status != 200 {
		t.Fatalf("metrics: %d", status)
	}
	text := string(body)
	for _, want := range []string{
		`airlock_sandboxes{state="running"}`,
		`airlock_operations_total{kind="create",result="succeeded"}`,
		`airlock_operation_duration_seconds_bucket{kind="create",result="succeeded"`,
		`airlock_commands_total{result="exited"}`,
		`airlock_streamed_bytes_total`,
		`airlock_http_requests_total{method="POST",route="/v1/sandboxes",status="202"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(text, `airlock_sandboxes{state="running"} 0`) {
		t.Errorf("running sandboxes gauge is 0 with a sandbox running")
	}
}

// TestPythonExample runs examples/python/first_sandbox.py against a real
// server.
func TestPythonExample(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed for the example (airlock setup installs it)")
	}
	s := sharedServer(t)
	cmd := exec.Command(python, "../examples/python/first_sandbox.py")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url, "AIRLOCK_API_KEY="+s.key, "AIRLOCK_TEMPLATE=tiny")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("example failed: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("%s", stdout.String())
	if stderr.Len() > 0 {
		t.Errorf("the example wrote to stderr:\n%s", stderr.String())
	}
	// Its steps, in order, with what each saw; the sandbox's ID comes
	// from the first.
	out := stdout.String()
	id := regexp.MustCompile(`(?m)^   sandbox (\S+), operation \S+$`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("the example printed no sandbox ID:\n%s", out)
	}
	q := regexp.QuoteMeta
	steps := []string{
		`1\. create a sandbox from template 'tiny' at ` + q(s.url),
		`   sandbox ` + q(id[1]) + `, operation \S+`,
		`2\. wait for it to run`,
		`   state running after [0-9.]+ s`,
		`3\. create a command session`,
		`   command \S+, attach until \S+`,
		`4\. attach and read its output`,
		`    start: pid \d+`,
		`    stdout: 'hello from ` + q(id[1]) + `\\n'`,
		`    stderr: 'err\\n'`,
		`    exit: \{'exit_code': 3, .*\}`,
		`   exit code 3, stdout and stderr as expected`,
		`5\. write a file and read it back`,
		fmt.Sprintf(`   %d bytes match`, len("hello, file: \u00e9\u4e16\n")+256),
		`6\. delete the sandbox`,
		`   sandbox ` + q(id[1]) + ` deleted`,
		`OK`,
	}
	rest := out
	for _, step := range steps {
		loc := regexp.MustCompile(`(?m)^` + step + `$`).FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("after %q, the example's output lacks a line matching %q:\n%s", out[:len(out)-len(rest)], step, out)
		}
		rest = rest[loc[1]:]
	}
	if strings.TrimSpace(rest) != "" {
		t.Errorf("the example printed more after OK: %q", rest)
	}
	// The sandbox it made is gone.
	var sb apiv1.Sandbox
	if status, body := s.call(t, "GET", "/v1/sandboxes/"+id[1], s.key, nil); status != 404 {
		if status != 200 || json.Unmarshal(body, &sb) != nil || sb.State != apiv1.StateDeleted {
			t.Errorf("the example's sandbox after it ended: %d %s", status, body)
		}
	}
}

// TestAPIVMDies kills a sandbox's QEMU under a running server: the
// sandbox fails with the reason, its running command ends, and a delete
// still removes everything.
func TestAPIVMDies(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", s.key, apiv1.CommandRequest{Cmd: "echo up; sleep 600"}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	defer resp.Body.Close()
	if ev, err := r.next(); err != nil || ev.name != "start" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	b, err := os.ReadFile(filepath.Join(s.home, "sandboxes", sb.ID, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	syscall.Kill(pid, syscall.SIGKILL)

	o := readToExit(t, r)
	if o.exit.ExitCode != -1 || !strings.Contains(o.stderr, "VM exited") {
		t.Errorf("the command's end: %+v", o)
	}
	var got apiv1.Sandbox
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &got)
		if got.State == "failed" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got.State != "failed" || got.LastError == nil || !strings.Contains(got.LastError.Message, "exited") {
		t.Errorf("after its VM was killed: %s %+v", got.State, got.LastError)
	}
	status, body := s.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "true"})
	if status != 409 || !strings.Contains(string(body), "failed") {
		t.Errorf("exec in a failed sandbox: %d %s", status, body)
	}
	// The cleanup deletes it and checks nothing is left.
}

// TestAPIMetricsCommandsRunning checks that the gauge of followed command
// processes goes up while one runs and back down after it exits.
func TestAPIMetricsCommandsRunning(t *testing.T) {
	s := newServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	gauge := func() string {
		_, body := s.call(t, "GET", "/metrics", "", nil)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "airlock_commands_running ") {
				return strings.TrimPrefix(line, "airlock_commands_running ")
			}
		}
		return "missing"
	}
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", s.key, apiv1.CommandRequest{Cmd: "echo up; sleep 2"}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	defer resp.Body.Close()
	readUntil(t, r, contains("up"))
	if g := gauge(); g != "1" {
		t.Errorf("commands running while one runs: %s", g)
	}
	readToExit(t, r)
	testenv.Eventually(t, 10*time.Second, "commands running back to 0 after it exited", func() (bool, string) {
		g := gauge()
		return g == "0", g
	})
}

// TestExecMemoryBounded runs 8 unary execs at once, each writing 16 MiB of
// NUL bytes to stdout and to stderr (96 MiB a stream once JSON-escaped):
// all complete whole, and the server's peak RSS rises by at most 256 MiB,
// since the output waits on disk and is escaped a piece at a time.
func TestExecMemoryBounded(t *testing.T) {
	s := newServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	const stream = 16 << 20
	cmd := fmt.Sprintf("head -c %d /dev/zero; head -c %d /dev/zero >&2", stream, stream)
	status := func(field string) int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10
			}
		}
		t.Fatalf("no %s in /proc/%d/status", field, s.pid())
		return 0
	}
	// Warm the exec path, then start the peak from now (clear_refs 5
	// resets VmHWM to the current RSS).
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "head -c 1048576 /dev/zero"}, nil)
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.pid()), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	before := status("VmRSS")
	body, _ := json.Marshal(apiv1.CommandRequest{Cmd: cmd})
	want := int64(len(`{"exit_code":0,"signal":null,"timed_out":false,"stdout":"","stderr":"","truncated":false}`+"\n")) + 2*stream*int64(len(`\u0000`))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+sb.ID+"/exec", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+s.key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			head := make([]byte, 64)
			n, _ := io.ReadFull(resp.Body, head)
			rest, err := io.Copy(io.Discard, resp.Body)
			switch {
			case err != nil:
				errs <- err
			case resp.StatusCode != 200 || !bytes.HasPrefix(head[:n], []byte(`{"exit_code":0,"signal":null,"timed_out":false,"stdout":"\u0000`)):
				errs <- fmt.Errorf("answer %d %q", resp.StatusCode, head[:n])
			case int64(n)+rest != want:
				errs <- fmt.Errorf("answer of %d bytes, want %d", int64(n)+rest, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := status("VmHWM")
	t.Logf("server RSS %d MiB before, peak %d MiB during 8 execs of 2 x 16 MiB", before>>20, peak>>20)
	if peak-before > 256<<20 {
		t.Errorf("the server's peak RSS rose by %d MiB, want at most 256", (peak-before)>>20)
	}
}
