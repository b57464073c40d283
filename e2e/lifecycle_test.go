package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// lifecycle asks for a pause, suspend or wake and waits for its operation,
// which must succeed.
func (s *server) lifecycle(t *testing.T, id, kind string) apiv1.Operation {
	t.Helper()
	var res apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+id+"/"+kind, s.key, nil, &res)
	if res.Operation.Kind != kind {
		t.Fatalf("%s answered operation %+v", kind, res.Operation)
	}
	op := s.waitOp(t, s.key, res.Operation.ID)
	if op.Status != apiv1.OpSucceeded {
		t.Fatalf("%s of %s failed: %+v", kind, id, op.Error)
	}
	return op
}

func (s *server) state(t *testing.T, id string) apiv1.Sandbox {
	t.Helper()
	var sb apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
	return sb
}

// conflict checks that a request answers 409 naming the state.
func (s *server) conflict(t *testing.T, method, path, state string, body any) {
	t.Helper()
	status, b := s.call(t, method, path, s.key, body)
	var e apiv1.ErrorBody
	json.Unmarshal(b, &e)
	if status != 409 || e.Error.Code != "conflict" || !strings.Contains(e.Error.Message, state) {
		t.Errorf("%s %s in state %s: %d %s (want 409 naming the state)", method, path, state, status, b)
	}
}

func qemuPID(t *testing.T, s *server, id string) int {
	b, err := os.ReadFile(filepath.Join(s.home, "sandboxes", id, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// TestLifecycleTransitions walks a sandbox through every state and tries
// every request each state forbids.
func TestLifecycleTransitions(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	p := "/v1/sandboxes/" + sb.ID
	exec := apiv1.CommandRequest{Cmd: "true"}
	events, stop := s.watchStates(t, sb.ID)
	defer stop()

	s.conflict(t, "POST", p+"/wake", "running", nil)

	// While another one is creating, every lifecycle request but delete
	// and keep is refused, naming the state.
	var creating apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny"}, &creating)
	for _, kind := range []string{"pause", "suspend", "wake"} {
		s.conflict(t, "POST", "/v1/sandboxes/"+creating.Sandbox.ID+"/"+kind, "creating", nil)
	}
	s.deleteSandbox(t, s.key, creating.Sandbox.ID)

	s.lifecycle(t, sb.ID, "pause")
	if got := s.state(t, sb.ID).State; got != "paused" {
		t.Fatalf("after pause: %s", got)
	}
	s.conflict(t, "POST", p+"/pause", "paused", nil)
	s.conflict(t, "POST", p+"/exec", "paused", exec)
	s.conflict(t, "POST", p+"/commands", "paused", exec)
	s.conflict(t, "GET", p+"/fs/stat?path=/", "paused", nil)

	checkTimings(t, s.lifecycle(t, sb.ID, "wake"), "resume vm and refresh guest")
	if got := s.state(t, sb.ID).State; got != "running" {
		t.Fatalf("after wake from paused: %s", got)
	}

	pid := qemuPID(t, s, sb.ID)
	s.lifecycle(t, sb.ID, "suspend")
	if got := s.state(t, sb.ID).State; got != "suspended" {
		t.Fatalf("after suspend: %s", got)
	}
	if pid == 0 || testenv.ProcessAlive(pid) {
		t.Errorf("QEMU %d still runs after suspend", pid)
	}
	for _, kind := range []string{"pause", "suspend"} {
		s.conflict(t, "POST", p+"/"+kind, "suspended", nil)
	}
	s.conflict(t, "POST", p+"/exec", "suspended", exec)

	wake := s.lifecycle(t, sb.ID, "wake")
	checkTimings(t, wake, "wait for a start slot", "start vm", "restore state", "resume vm", "connect to agent", "refresh guest", "reattach commands")
	var res apiv1.ExecResult
	s.must(t, 200, "POST", p+"/exec", s.key, apiv1.CommandRequest{Cmd: "echo back"}, &res)
	if res.Stdout != "back\n" {
		t.Errorf("exec after wake: %+v", res)
	}

	// Paused, then suspended straight from paused.
	s.lifecycle(t, sb.ID, "pause")
	s.lifecycle(t, sb.ID, "suspend")
	s.lifecycle(t, sb.ID, "wake")

	want := "paused,running,suspending,suspended,waking,running,paused,suspending,suspended,waking,running"
	if got := events(); !strings.HasPrefix(got, want) {
		t.Errorf("state events:\n got %s\nwant %s", got, want)
	}
}

// watchStates follows a sandbox's state events; the returned function
// gives the states seen so far, comma-separated.
func (s *server) watchStates(t *testing.T, id string) (func() string, func()) {
	resp, r := s.openEvents(t, id)
	var seen safeBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := r.next()
			if err != nil {
				return
			}
			var v apiv1.Sandbox
			if json.Unmarshal([]byte(ev.data), &v) == nil {
				seen.Write([]byte(v.State + ","))
			}
		}
	}()
	return func() string {
			time.Sleep(200 * time.Millisecond)
			return strings.TrimSuffix(seen.String(), ",")
		}, func() {
			resp.Body.Close()
			<-done
		}
}

// TestSuspendWithRunningCommand suspends a sandbox while a command writes
// a file and its output stream is open, then wakes it: the stream goes on,
// the process finishes its file, nothing is lost, and the disk keeps what
// was written before.
func TestSuspendWithRunningCommand(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	p := "/v1/sandboxes/" + sb.ID
	s.must(t, 204, "PUT", p+"/files?path=/root/before.txt", s.key, "written before suspend", nil)

	// The command appends to a file and prints as it goes: 40 lines over
	// about 4 s, so the suspend lands in the middle.
	script := "i=1; while [ $i -le 40 ]; do echo line $i; echo $i >> /root/half.txt; i=$((i+1)); sleep 0.1; done"
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", p+"/commands", s.key, apiv1.CommandRequest{Cmd: script}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	defer resp.Body.Close()
	first, _ := readUntil(t, r, lines(5))

	s.lifecycle(t, sb.ID, "suspend")
	time.Sleep(2 * time.Second)
	s.lifecycle(t, sb.ID, "wake")

	// The same stream, open across the suspend, carries the rest.
	rest := readToExit(t, r)
	checkCounter(t, first+rest.stdout, 40)
	if rest.exit.ExitCode != 0 {
		t.Errorf("exit after wake: %+v", rest.exit)
	}
	var res apiv1.ExecResult
	s.must(t, 200, "POST", p+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /root/before.txt; echo; wc -l < /root/half.txt; tail -n1 /root/half.txt"}, &res)
	if res.Stdout != "written before suspend\n40\n40\n" {
		t.Errorf("files after wake: %q", res.Stdout)
	}
}

// TestClockAfterSuspend checks the guest's clock against the host's after
// a suspend long enough for a stale clock to show.
func TestClockAfterSuspend(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "base"}) // its date prints nanoseconds
	s.lifecycle(t, sb.ID, "suspend")
	time.Sleep(8 * time.Second)
	wake := s.lifecycle(t, sb.ID, "wake")
	checkTimings(t, wake, "wait for a start slot", "start vm", "restore state", "resume vm", "connect to agent", "refresh guest", "reattach commands")
	var res apiv1.ExecResult
	before := time.Now()
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "date +%s.%N"}, &res)
	after := time.Now()
	guest, err := strconv.ParseFloat(strings.TrimSpace(res.Stdout), 64)
	if err != nil {
		t.Fatalf("guest date %q", res.Stdout)
	}
	host := float64(before.UnixNano()+after.UnixNano()) / 2e9
	if d := guest - host; d > 1 || d < -1 {
		t.Errorf("guest clock is %.2f s off the host's after an 8 s suspend", d)
	}
}

// TestWakeAfterServerRestart suspends a sandbox and a paused one, restarts
// the server, and wakes both.
func TestWakeAfterServerRestart(t *testing.T) {
	s := newServer(t)
	suspended := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	paused := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	s.must(t, 204, "PUT", "/v1/sandboxes/"+suspended.ID+"/files?path=/root/keep.txt", s.key, "kept", nil)
	s.lifecycle(t, suspended.ID, "suspend")
	s.lifecycle(t, paused.ID, "pause")

	s.stop(syscall.SIGTERM)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	if got := s.state(t, suspended.ID).State; got != "suspended" {
		t.Errorf("suspended sandbox after restart: %s", got)
	}
	if got := s.state(t, paused.ID).State; got != "paused" {
		t.Errorf("paused sandbox after restart: %s", got)
	}
	s.lifecycle(t, suspended.ID, "wake")
	s.lifecycle(t, paused.ID, "wake")
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+suspended.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /root/keep.txt"}, &res)
	if res.Stdout != "kept" {
		t.Errorf("file after wake across a restart: %q", res.Stdout)
	}
	s.must(t, 200, "POST", "/v1/sandboxes/"+paused.ID+"/exec", s.key, apiv1.CommandRequest{Cmd: "echo ok"}, &res)
	if res.Stdout != "ok\n" {
		t.Errorf("exec in the woken paused sandbox: %+v", res)
	}
}

// TestLeases checks keep and both lease endings.
func TestLeases(t *testing.T) {
	s := sharedServer(t)
	three := 3
	sus := s.createSandbox(t, s.key, apiv1.CreateSandbox{TimeoutS: &three, OnTimeout: "suspend"})
	kept := s.createSandbox(t, s.key, apiv1.CreateSandbox{TimeoutS: &three})
	var got apiv1.Sandbox
	s.must(t, 200, "POST", "/v1/sandboxes/"+kept.ID+"/keep", s.key, map[string]int{"timeout_s": 0}, &got)
	if got.ExpiresAt != nil {
		t.Errorf("keep 0 left expires_at %v", got.ExpiresAt)
	}
	s.must(t, 400, "POST", "/v1/sandboxes/"+kept.ID+"/keep", s.key, map[string]int{"timeout_s": -1}, nil)
	s.must(t, 400, "POST", "/v1/sandboxes/"+kept.ID+"/keep", s.key, map[string]any{}, nil)
	// del's lease, begun after kept's first one, ends after it: once del
	// is deleted, the lease passes have gone past kept's first end.
	del := s.createSandbox(t, s.key, apiv1.CreateSandbox{TimeoutS: &three, OnTimeout: "delete"})
	if del.ExpiresAt == nil || time.Until(*del.ExpiresAt) > 3*time.Second || !del.ExpiresAt.After(*kept.ExpiresAt) {
		t.Errorf("expires_at %v for a 3 s lease that started when the sandbox ran (kept's first: %v)", del.ExpiresAt, kept.ExpiresAt)
	}

	waitState := func(id, want string) apiv1.Sandbox {
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if sb := s.state(t, id); sb.State == want {
				return sb
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Fatalf("sandbox %s never became %s (is %s)", id, want, s.state(t, id).State)
		return apiv1.Sandbox{}
	}
	waitState(del.ID, "deleted")
	if sb := waitState(sus.ID, "suspended"); sb.ExpiresAt != nil {
		t.Errorf("a lease applied by suspending is not cleared: %v", sb.ExpiresAt)
	}
	if st := s.state(t, kept.ID).State; st != "running" {
		t.Errorf("a sandbox kept without a lease is %s", st)
	}
	// A woken sandbox has no lease until kept again.
	s.lifecycle(t, sus.ID, "wake")
	if sb := s.state(t, sus.ID); sb.State != "running" || sb.ExpiresAt != nil {
		t.Errorf("woken sandbox is %s with expires_at %v", sb.State, sb.ExpiresAt)
	}
}

// TestLeaseEndsWhileServerDown: a lease that ends while the server is down
// is applied when it starts.
func TestLeaseEndsWhileServerDown(t *testing.T) {
	s := newServer(t)
	two := 2
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{TimeoutS: &two, OnTimeout: "delete"})
	pid := qemuPID(t, s, sb.ID)
	s.stop(syscall.SIGTERM)
	time.Sleep(time.Until(*sb.ExpiresAt) + 500*time.Millisecond) // the lease ends while the server is down
	if !testenv.ProcessAlive(pid) {
		t.Fatal("the VM did not outlive the server")
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && s.state(t, sb.ID).State != "deleted" {
		time.Sleep(200 * time.Millisecond)
	}
	if st := s.state(t, sb.ID).State; st != "deleted" {
		t.Fatalf("lease that ended while the server was down: %s", st)
	}
	checkGone(t, filepath.Join(s.home, "sandboxes", sb.ID), pid)
}

// TestDeleteFromEveryState deletes a paused and a suspended sandbox: no
// file, process or socket is left.
func TestDeleteFromEveryState(t *testing.T) {
	s := sharedServer(t)
	for _, kind := range []string{"pause", "suspend"} {
		t.Run(kind, func(t *testing.T) {
			sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
			pid := qemuPID(t, s, sb.ID)
			s.lifecycle(t, sb.ID, kind)
			s.deleteSandbox(t, s.key, sb.ID)
			if st := s.state(t, sb.ID).State; st != "deleted" {
				t.Errorf("after delete: %s", st)
			}
			checkGone(t, filepath.Join(s.home, "sandboxes", sb.ID), pid)
			p := "/v1/sandboxes/" + sb.ID
			for _, kind := range []string{"pause", "suspend", "wake"} {
				s.conflict(t, "POST", p+"/"+kind, "deleted", nil)
			}
			s.conflict(t, "POST", p+"/keep", "deleted", map[string]int{"timeout_s": 60})
			s.conflict(t, "DELETE", p, "deleted", nil)
		})
	}
}

// TestClonesHaveTheirOwnIdentity creates two sandboxes, both clones of the
// template's snapshot: each has its own hostname, kernel randomness and a
// clock set from the host.
func TestClonesHaveTheirOwnIdentity(t *testing.T) {
	s := sharedServer(t)
	a := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	b := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	probe := "hostname; cat /proc/sys/kernel/random/uuid; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s"
	read := func(id string) []string {
		var res apiv1.ExecResult
		s.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", s.key, apiv1.CommandRequest{Cmd: probe}, &res)
		f := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(f) != 4 {
			t.Fatalf("probe in %s: %q", id, res.Stdout)
		}
		return f
	}
	fa, fb := read(a.ID), read(b.ID)
	if fa[0] != a.ID || fb[0] != b.ID {
		t.Errorf("hostnames %q and %q, want the sandbox IDs", fa[0], fb[0])
	}
	if fa[1] == fb[1] {
		t.Errorf("both clones read uuid %s", fa[1])
	}
	if fa[2] == fb[2] || len(fa[2]) != 64 {
		t.Errorf("both clones read random bytes %s", fa[2])
	}
	for _, f := range [][]string{fa, fb} {
		guest, _ := strconv.ParseInt(f[3], 10, 64)
		if d := guest - time.Now().Unix(); d > 1 || d < -2 {
			t.Errorf("a clone's clock is %d s off the host's", d)
		}
	}
}
