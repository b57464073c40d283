package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

// syncBuffer is a bytes.Buffer that one stream writes while the test
// reads.
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

// counterScript counts, ten times a second, into /counter on the disk and
// to stdout.
const counterScript = `i=0; while :; do i=$((i+1)); echo $i > /counter.new && mv /counter.new /counter; echo $i; sleep 0.1; done`

// TestPauseSuspendWakeVM drives a real sandbox through pause, resume, an
// adopt while paused, suspend and wake, with a process counting all along:
// it must not count while paused, must go on after the wake, and its
// output, joined again after each break, must have no gap or repeat.
func TestPauseSuspendWakeVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rt := hostRuntime(t, ctx)
	dd, log := datadir.Default(), testLog(t)

	sb, err := rt.Create(ctx, Spec{Template: "tiny", MemoryMiB: 256, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	id, dir := sb.ID, sb.Dir
	var cur *Sandbox = sb // the Sandbox this test owns now, if any
	t.Cleanup(func() {
		if cur != nil {
			cur.Destroy(context.Background())
		}
		rt.Remove(context.Background(), id)
	})

	rec, err := readRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Spec.ID != id || rec.Spec.Template != sb.Template.Digest || rec.VM.Dir != dir || rec.VM.MemoryMiB != 256 || !rec.VM.Detach {
		t.Errorf("record %+v does not describe sandbox %s", rec, id)
	}

	out := &syncBuffer{}
	proc, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: counterScript}, agentclient.Stdio{Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	shell(ctx, t, sb, "echo kept > /data.txt && sync")
	counter := func(sb *Sandbox) int {
		t.Helper()
		n, err := strconv.Atoi(shell(ctx, t, sb, "cat /counter"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for counter(sb) < 3 {
		time.Sleep(100 * time.Millisecond)
	}

	// Pause: the counter stands still.
	c1, t1 := counter(sb), time.Now()
	start := time.Now()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	pauseTook := time.Since(start)
	pausedAt := time.Now()
	if st, err := sb.Machine().Status(ctx); err != nil || st != vm.StatusPaused {
		t.Fatalf("status %q, %v after Pause; want paused", st, err)
	}
	if _, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, agentclient.Stdio{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Exec while paused: got %v, want a conflict", err)
	}
	// Longer than checkClock allows: without a refresh the guest's clock,
	// which stood still, would be off.
	time.Sleep(3 * time.Second)
	start = time.Now()
	paused := start.Sub(pausedAt)
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	resumeTook := time.Since(start)
	c2 := counter(sb)
	ran := time.Since(t1) - paused
	if limit := int(ran/(100*time.Millisecond)) + 2; c2-c1 > limit {
		t.Errorf("the counter went from %d to %d over %s of which %s paused: it counted while paused", c1, c2, time.Since(t1), paused)
	} else {
		t.Logf("the counter went from %d to %d over %s of which %s paused (at most %d allowed)", c1, c2, time.Since(t1).Round(time.Millisecond), paused.Round(time.Millisecond), limit)
	}
	checkClock(ctx, t, sb)

	// Pause, and let another owner adopt the paused VM and resume it.
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	sb.Release()
	cur = nil
	waitEnded(t, proc)
	sb, err = rt.Adopt(ctx, id, rec.Spec)
	if err != nil {
		t.Fatal(err)
	}
	cur = sb
	if !sb.Paused() || sb.Agent() != nil {
		t.Fatalf("adopted paused %v with agent %v; want paused without a session", sb.Paused(), sb.Agent())
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	proc = attach(ctx, t, sb, proc, out)

	// Suspend: QEMU goes, the state stays, nobody owns the sandbox.
	pid := sb.Machine().PID()
	start = time.Now()
	if err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	suspendTook := time.Since(start)
	cur = nil
	waitEnded(t, proc)
	waitGone(t, pid)
	fi, err := os.Stat(filepath.Join(dir, StateName))
	if err != nil {
		t.Fatalf("no saved state after Suspend: %v", err)
	}
	if !SuspendedState(dir) {
		t.Error("SuspendedState is false after Suspend")
	}
	if _, err := os.Stat(filepath.Join(dir, vm.PIDFileName)); !os.IsNotExist(err) {
		t.Errorf("pid file left after Suspend: %v", err)
	}
	lock, err := lockOwner(dir)
	if err != nil {
		t.Fatalf("the suspended sandbox is still owned: %v", err)
	}
	lock.Close()
	if err := sb.Pause(ctx); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Pause of a suspended Sandbox: got %v, want a conflict", err)
	}
	old := time.Now().Add(-2 * sweepGrace)
	os.Chtimes(dir, old, old)
	Sweep(dd, log)
	if !SuspendedState(dir) {
		t.Fatal("Sweep removed a suspended sandbox")
	}

	// Wake: the process goes on, the files are there, the clock is right
	// although the guest's stood still while it was suspended.
	time.Sleep(3 * time.Second)
	start = time.Now()
	sb, err = rt.Wake(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wakeTook := time.Since(start)
	cur = sb
	if SuspendedState(dir) {
		t.Error("the saved state is left after the wake")
	}
	if sb.ID != id || sb.Spec.MemoryMiB != 256 || sb.Template.Digest != rec.Spec.Template {
		t.Errorf("woken sandbox %s spec %+v template %q", sb.ID, sb.Spec, sb.Template.Digest)
	}
	c3 := counter(sb)
	testenv.Eventually(t, 10*time.Second, "the counter going on after the wake", func() (bool, string) {
		c4 := counter(sb)
		return c4 > c3, fmt.Sprintf("at %d, %d before", c4, c3)
	})
	if got := shell(ctx, t, sb, "cat /data.txt"); got != "kept" {
		t.Errorf("/data.txt holds %q after the wake", got)
	}
	checkClock(ctx, t, sb)
	proc = attach(ctx, t, sb, proc, out)
	if err := proc.Signal(ctx, "KILL"); err != nil {
		t.Fatal(err)
	}
	if exit, err := sb.Wait(proc); err != nil || exit.Signal != "KILL" {
		t.Fatalf("the counter ended with %+v, %v; want killed", exit, err)
	}
	checkSequence(t, out.String())

	// Two restores of one saved state read different random bytes.
	if err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	twin := rt.cloneSuspended(t, id)
	var random []string
	for _, wid := range []string{id, twin} {
		w, err := rt.Wake(ctx, wid)
		if err != nil {
			t.Fatal(err)
		}
		random = append(random, shell(ctx, t, w, "head -c 16 /dev/urandom | od -An -tx1"))
		if wid == id {
			cur = w
			sb = w
		} else if err := w.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if random[0] == random[1] {
		t.Errorf("two wakes of one saved state read the same random bytes: %s", random[0])
	}
	t.Logf("random bytes after two wakes of one state: %s / %s", random[0], random[1])

	// A state QEMU cannot load fails the wake, which keeps the state and
	// leaves no VM behind.
	if err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	broken := rt.cloneSuspended(t, id)
	brokenState := filepath.Join(rt.cfg.Dir.Sandbox(broken), StateName)
	if err := os.Truncate(brokenState, 1<<20); err != nil {
		t.Fatal(err)
	}
	if w, err := rt.Wake(ctx, broken); err == nil {
		w.Destroy(ctx)
		t.Fatal("woke from a truncated state")
	} else if !errors.Is(err, vm.ErrNotRunning) || !strings.Contains(err.Error(), "saved state is kept") {
		t.Errorf("wake from a truncated state: got %v, want the VM's exit, the state kept", err)
	} else {
		t.Log(err)
	}
	if !SuspendedState(rt.cfg.Dir.Sandbox(broken)) {
		t.Error("a failed wake removed the saved state")
	}
	if _, err := vm.RunningPID(rt.cfg.Dir.Sandbox(broken)); !errors.Is(err, vm.ErrNotRunning) {
		t.Errorf("a failed wake left its VM: %v", err)
	}
	if sb, err = rt.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	cur = sb

	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("directory left after Destroy: %v", err)
	}
	t.Logf("256 MiB tiny sandbox: pause %s, resume %s, suspend %s (state %d bytes), wake %s",
		pauseTook.Round(time.Millisecond), resumeTook.Round(time.Millisecond), suspendTook.Round(time.Millisecond),
		fi.Size(), wakeTook.Round(time.Millisecond))
}

// shell runs cmd in sb and returns its trimmed stdout; it must succeed.
func shell(ctx context.Context, t *testing.T, sb *Sandbox, cmd string) string {
	t.Helper()
	var out bytes.Buffer
	if exit := run(ctx, t, sb, &out, "sh", "-c", cmd); exit.ExitCode != 0 {
		t.Fatalf("%s: exit %+v, output %q", cmd, exit, out.String())
	}
	return strings.TrimSpace(out.String())
}

// checkClock checks that the guest's clock is within 2 s of the host's.
func checkClock(ctx context.Context, t *testing.T, sb *Sandbox) {
	t.Helper()
	guest, err := strconv.ParseInt(shell(ctx, t, sb, "date +%s"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if d := guest - time.Now().Unix(); d < -2 || d > 2 {
		t.Errorf("the guest's clock is %d s off the host's", d)
	}
}

// waitEnded waits for the stream of p, cut by a released or suspended
// session, to end.
func waitEnded(t *testing.T, p *agentclient.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the process's stream did not end with its session")
	}
	if _, err := p.Wait(); !errors.Is(err, agentclient.ErrDisconnected) {
		t.Fatalf("the stream ended with %v, want a disconnection", err)
	}
}

// attach joins the process of old again where its output stopped, writing
// on to out, and waits for some new output.
func attach(ctx context.Context, t *testing.T, sb *Sandbox, old *agentclient.Process, out *syncBuffer) *agentclient.Process {
	t.Helper()
	off := old.OutputOffset()
	if got := int64(len(out.String())); got != off {
		t.Fatalf("output offset %d, but %d bytes arrived", off, got)
	}
	p, err := sb.Attach(ctx, old.ID, off, agentclient.Stdio{Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	if p.Offset != off {
		t.Fatalf("attach resumed at %d, want %d", p.Offset, off)
	}
	deadline := time.Now().Add(10 * time.Second)
	for int64(len(out.String())) < off+6 {
		if time.Now().After(deadline) {
			t.Fatal("no output after attaching again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// checkSequence checks that out is the lines 1, 2, 3, ... without a gap or
// a repeat.
func checkSequence(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("output line %d is %q, want %d; output:\n%s", i+1, l, i+1, out)
		}
	}
	t.Logf("the counter's output: %d lines in order", len(lines))
}

// cloneSuspended copies suspended sandbox id, saved state and disk, to a
// new sandbox whose record names its own directory, as a template
// snapshot's clones are made, and returns the new ID.
func (r *Runtime) cloneSuspended(t *testing.T, id string) string {
	t.Helper()
	twin := "sbxtwin" + NewID()[3:15]
	src, dst := r.cfg.Dir.Sandbox(id), r.cfg.Dir.Sandbox(twin)
	mkdir(t, dst)
	t.Cleanup(func() { r.Remove(context.Background(), twin) })
	for _, name := range []string{StateName, "disk.qcow2"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := readRecord(src)
	if err != nil {
		t.Fatal(err)
	}
	rec.Spec.ID, rec.VM.Dir, rec.VM.Disk = twin, dst, filepath.Join(dst, "disk.qcow2")
	if err := writeRecord(dst, rec); err != nil {
		t.Fatal(err)
	}
	return twin
}
