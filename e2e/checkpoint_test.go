package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestCheckpointsAndForks checkpoints a real sandbox while a command
// counts in it with its output stream open, then makes a sandbox from the
// checkpoint and forks the source twice: the source's count and stream go
// on through each; every sandbox made has the disk of its instant, the
// counting process running on, its own hostname and random bytes; another
// key finds none of it; the source rolled back to the checkpoint has its
// disk and counter again, new random bytes, and its stream ends rolled
// back; and once the sandboxes are gone, deleting the checkpoints
// removes their files.
func TestCheckpointsAndForks(t *testing.T) {
	s := sharedServer(t)
	src := s.createSandbox(t, s.key, apiv1.CreateSandbox{})
	p := "/v1/sandboxes/" + src.ID
	script := "i=1; while [ $i -le 600 ]; do echo line $i; echo $i > /root/count.new; mv /root/count.new /root/count; i=$((i+1)); sleep 0.1; done"
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", p+"/commands", s.key, apiv1.CommandRequest{Cmd: script}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	defer resp.Body.Close()
	out, _ := readUntil(t, r, lines(3))
	s.must(t, 204, "PUT", p+"/files?path=/root/state.txt", s.key, "at the checkpoint", nil)

	var co apiv1.CheckpointOperation
	s.must(t, 202, "POST", p+"/checkpoints", s.key, map[string]string{"name": "e2e"}, &co)
	if op := s.waitOp(t, s.key, co.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("checkpoint failed: %+v", op.Error)
	}
	chk := co.Checkpoint.ID
	var c apiv1.Checkpoint
	s.must(t, 200, "GET", "/v1/checkpoints/"+chk, s.key, nil, &c)
	if c.State != apiv1.CheckpointReady || c.SizeBytes <= 0 || c.SandboxID != src.ID {
		t.Fatalf("checkpoint %+v", c)
	}
	// The source's stream carries on, without a gap or a repeat.
	more, _ := readUntil(t, r, lines(10))
	out += more
	n := strings.Count(out, "\n")
	checkCounter(t, out, n)
	if st := s.state(t, src.ID); st.State != apiv1.StateRunning {
		t.Fatalf("the source is %s after its checkpoint", st.State)
	}
	s.must(t, 204, "PUT", p+"/files?path=/root/state.txt", s.key, "after the checkpoint", nil)

	random := map[string]string{src.ID: s.run(t, s.key, src.ID, apiv1.CommandRequest{Cmd: "head -c 16 /dev/urandom | od -An -tx1"}).stdout}
	// check looks at a sandbox made from a checkpoint whose file says want.
	check := func(id, want string) {
		t.Helper()
		got := s.run(t, s.key, id, apiv1.CommandRequest{Cmd: "cat /root/state.txt; echo; hostname; cat /root/count"})
		f := strings.Split(strings.TrimSpace(got.stdout), "\n")
		if len(f) != 3 || f[0] != want || f[1] != id {
			t.Fatalf("sandbox %s: file, hostname and count %q; want %q and its ID", id, got.stdout, want)
		}
		at, _ := strconv.Atoi(f[2])
		waitFor(t, func() bool {
			now, _ := strconv.Atoi(strings.TrimSpace(s.run(t, s.key, id, apiv1.CommandRequest{Cmd: "cat /root/count"}).stdout))
			return now > at
		})
		rb := s.run(t, s.key, id, apiv1.CommandRequest{Cmd: "head -c 16 /dev/urandom | od -An -tx1"}).stdout
		for other, o := range random {
			if o == rb {
				t.Errorf("sandboxes %s and %s drew the same random bytes", other, id)
			}
		}
		random[id] = rb
	}

	child := s.createSandbox(t, s.key, apiv1.CreateSandbox{Checkpoint: chk})
	if child.Template.Digest != src.Template.Digest || child.MemoryMiB != src.MemoryMiB {
		t.Errorf("a sandbox from the checkpoint: %+v", child)
	}
	check(child.ID, "at the checkpoint")

	var f apiv1.Forked
	s.must(t, 202, "POST", p+"/fork", s.key, apiv1.Fork{Count: 2}, &f)
	for _, sb := range f.Sandboxes {
		t.Cleanup(func() { s.deleteSandbox(t, s.key, sb.ID) })
	}
	if op := s.waitOp(t, s.key, f.Operation.ID); op.Status != apiv1.OpSucceeded || len(f.Sandboxes) != 2 {
		t.Fatalf("fork: %+v (%+v), %d sandboxes", op, op.Error, len(f.Sandboxes))
	}
	for _, sb := range f.Sandboxes {
		if got := s.waitState(t, sb.ID, 2*time.Minute, apiv1.StateRunning, apiv1.StateFailed); got.State != apiv1.StateRunning {
			t.Fatalf("fork child %s: %+v", sb.ID, got.LastError)
		}
		check(sb.ID, "after the checkpoint")
	}
	// The source counted on through all of it.
	more, _ = readUntil(t, r, lines(strings.Count(out, "\n")+5))
	out += more
	checkCounter(t, out, strings.Count(out, "\n"))

	// The source rolls back to the checkpoint under its own ID: the disk
	// and the counting process of that instant, fresh random bytes, and
	// its command's stream ends rolled back, with no exit code.
	var rb apiv1.SandboxOperation
	s.must(t, 202, "POST", p+"/rollback", s.key, apiv1.Rollback{Checkpoint: chk}, &rb)
	if op := s.waitOp(t, s.key, rb.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("rollback failed: %+v", op.Error)
	}
	for {
		ev, err := r.next()
		if err != nil {
			t.Fatalf("the source's stream ended without an exit after the rollback: %v", err)
		}
		if ev.name == "exit" {
			if !strings.Contains(ev.data, `"exit_code":null`) || !strings.Contains(ev.data, `"rolled_back":true`) {
				t.Fatalf("the exit after the rollback: %s", ev.data)
			}
			break
		}
	}
	check(src.ID, "at the checkpoint")
	other := userKey(t, s, "checkpoint-other")
	s.must(t, 404, "POST", p+"/rollback", other, apiv1.Rollback{Checkpoint: chk}, nil)
	s.must(t, 400, "POST", "/v1/sandboxes/"+child.ID+"/rollback", s.key, apiv1.Rollback{Checkpoint: chk}, nil)

	// Another key finds nothing of it.
	s.must(t, 404, "GET", "/v1/checkpoints/"+chk, other, nil, nil)
	s.must(t, 404, "POST", "/v1/sandboxes", other, apiv1.CreateSandbox{Checkpoint: chk}, nil)
	s.must(t, 404, "POST", p+"/fork", other, apiv1.Fork{Count: 1}, nil)
	s.must(t, 404, "DELETE", "/v1/checkpoints/"+chk, other, nil, nil)

	// Once no sandbox stands on them, deleting the checkpoints removes
	// their files.
	for _, id := range []string{child.ID, f.Sandboxes[0].ID, f.Sandboxes[1].ID, src.ID} {
		s.deleteSandbox(t, s.key, id)
	}
	for _, id := range []string{chk, f.Checkpoint} {
		s.must(t, 204, "DELETE", "/v1/checkpoints/"+id, s.key, nil, nil)
		if _, err := os.Stat(filepath.Join(s.home, "checkpoints", id)); !os.IsNotExist(err) {
			t.Errorf("checkpoint %s's files are still there (%v)", id, err)
		}
	}
}
