package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

var (
	poolReady   = regexp.MustCompile(`(?m)^airlock_warm_pool_ready\{template="tiny"\} (\d+)$`)
	poolWaiting = regexp.MustCompile(`(?m)^airlock_warm_pool_waiting_for_room\{template="tiny"\} (\d+)$`)
)

// waitPoolReady waits until /metrics says the tiny pool holds want members.
func (s *server) waitPoolReady(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		status, body := s.call(t, "GET", "/metrics", "", nil)
		if m := poolReady.FindSubmatch(body); status == 200 && m != nil {
			last = string(m[1])
			if n, _ := strconv.Atoi(last); n == want {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the warm pool of tiny has %q ready, want %d", last, want)
}

// poolMembers lists the sandbox directories of s that are pool members.
func poolMembers(t *testing.T, s *server) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(s.home, "sandboxes"))
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(s.home, "sandboxes", e.Name(), "pool-member")); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestWarmPool serves with --warm 1:tiny: a create of tiny takes the
// pool's member (its steps say so, and start no VM), the sandbox is its
// own, the pool refills, and after the server is killed outright the
// next one removes the member it left and makes a new one. A create the
// pool cannot serve (other memory) is an ordinary clone.
func TestWarmPool(t *testing.T) {
	s := newServer(t, "--warm", "1:tiny")
	s.waitPoolReady(t, 1)
	member := poolMembers(t, s)
	if len(member) != 1 {
		t.Fatalf("pool members on disk: %v, want 1", member)
	}

	var res apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny", Env: map[string]string{"WHO": "me"}}, &res)
	if res.Sandbox.ID != member[0] {
		t.Errorf("the create did not take the pool member %s: sandbox %s", member[0], res.Sandbox.ID)
	}
	op := s.waitOp(t, s.key, res.Operation.ID)
	if op.Status != apiv1.OpSucceeded {
		t.Fatalf("create failed: %+v", op.Error)
	}
	t.Cleanup(func() { s.deleteSandbox(t, s.key, res.Sandbox.ID) })
	checkTimings(t, op, "take warm pool member", "reinit guest: clock, entropy, hostname", "register sandbox")
	if _, ok := op.Timings.Get("start vm"); ok {
		t.Errorf("a create from the pool started a VM: %v", op.Timings)
	}
	out := s.run(t, s.key, res.Sandbox.ID, apiv1.CommandRequest{Cmd: "hostname; echo $WHO"})
	if out.stdout != res.Sandbox.ID+"\nme\n" {
		t.Errorf("hostname and WHO: %q, want %q", out.stdout, res.Sandbox.ID+"\nme\n")
	}

	// Not what the pool holds: an ordinary clone.
	other := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 384})
	if other.ID == member[0] {
		t.Error("a create of other memory took the pool member")
	}

	s.waitPoolReady(t, 1)
	left := poolMembers(t, s)
	if len(left) != 1 || left[0] == member[0] {
		t.Fatalf("after the refill the pool members are %v", left)
	}
	s.stop(syscall.SIGKILL)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	s.waitPoolReady(t, 1)
	now := poolMembers(t, s)
	if len(now) != 1 || now[0] == left[0] {
		t.Errorf("after a restart the pool members are %v; the one left by the killed server was %s", now, left[0])
	}
	if _, err := os.Stat(filepath.Join(s.home, "sandboxes", left[0])); !os.IsNotExist(err) {
		t.Errorf("the member the killed server left is still there: %v", err)
	}
	// The sandbox made of the first member lives on.
	if out := s.run(t, s.key, res.Sandbox.ID, apiv1.CommandRequest{Cmd: "hostname"}); out.stdout != res.Sandbox.ID+"\n" {
		t.Errorf("after the restart: %q", out.stdout)
	}
}

// TestWarmPoolYieldsRoom: members count against --max-sandboxes, and a
// create the pool does not serve destroys the member it needs the room
// of; the pool makes none while the host is at its cap.
func TestWarmPoolYieldsRoom(t *testing.T) {
	s := newServer(t, "--warm", "1:tiny", "--max-sandboxes", "2")
	s.waitPoolReady(t, 1)
	s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 384})
	if m := poolMembers(t, s); len(m) != 1 {
		t.Fatalf("with one sandbox of two the pool members are %v, want 1", m)
	}
	s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 384})
	s.waitPoolReady(t, 0)
	// The fill loop looks, finds the host at its cap, and makes no member.
	testenv.Eventually(t, 30*time.Second, "the pool waiting for room", func() (bool, string) {
		_, body := s.call(t, "GET", "/metrics", "", nil)
		m := poolWaiting.FindSubmatch(body)
		return m != nil && string(m[1]) == "1", grepLines(string(body), "airlock_warm_pool")
	})
	if m := poolMembers(t, s); len(m) != 0 {
		t.Errorf("at the cap the pool members are %v, want none", m)
	}
	if status, body := s.call(t, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny"}); status != 429 {
		t.Errorf("a third create at a cap of 2: %d %s", status, body)
	}
}
