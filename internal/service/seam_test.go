package service

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// The fake stands in for the runtime the service drives.
var (
	_ VMRuntime[*sandboxtest.VM] = (*sandboxtest.Runtime)(nil)
	_ Clock                      = (*sandboxtest.Clock)(nil)
)

// fixture is a service over a store and a fake runtime that outlive it,
// as a server's data directory and VMs outlive the server.
type fixture struct {
	dir   datadir.Dir
	st    *store.Store
	rt    *sandboxtest.Runtime
	clock *sandboxtest.Clock
	s     *Service
	admin Principal
	// configure, if set, changes the service's Config before each start:
	// the role it plays, say.
	configure func(*Config)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith is newFixture with a service whose Config configure
// changes.
func newFixtureWith(t *testing.T, configure func(*Config)) *fixture {
	t.Helper()
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
	f := &fixture{dir: dir, st: st, rt: rt, clock: sandboxtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		admin: Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}, configure: configure}
	f.start(t)
	return f
}

// start starts a service; the one before must be closed.
func (f *fixture) start(t *testing.T) {
	t.Helper()
	cfg := Config{Dir: f.dir, Runtime: RuntimeOf(f.rt), Store: f.st, Clock: f.clock,
		ShutdownGrace: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	if f.configure != nil {
		f.configure(&cfg)
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	t.Cleanup(s.Close)
}

// restart closes the service and starts another over the same store and
// runtime, as a server restart does.
func (f *fixture) restart(t *testing.T) {
	t.Helper()
	f.s.Close()
	f.start(t)
}

// testWriter writes a service's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// wait waits for operation id to end.
func (f *fixture) wait(t *testing.T, id string) apiv1.Operation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		op, err := f.s.GetOperation(context.Background(), f.admin, id, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s (%s) still %s", id, op.Kind, op.Status)
		}
	}
}

func (f *fixture) create(t *testing.T, req apiv1.CreateSandbox) apiv1.SandboxOperation {
	t.Helper()
	if req.Template == "" {
		req.Template = "base"
	}
	so, err := f.s.CreateSandbox(context.Background(), f.admin, req)
	if err != nil {
		t.Fatal(err)
	}
	return so
}

func (f *fixture) state(t *testing.T, id string) apiv1.Sandbox {
	t.Helper()
	sb, err := f.s.GetSandbox(context.Background(), f.admin, id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// waitState waits for sandbox id to be in state.
func (f *fixture) waitState(t *testing.T, id, state string) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, "sandbox "+id+" "+state, func() (bool, string) {
		sb, err := f.s.GetSandbox(context.Background(), f.admin, id)
		if errors.Is(err, errdefs.ErrNotFound) && state == apiv1.StateDeleted {
			return true, ""
		}
		return err == nil && sb.State == state, sb.State
	})
}

// exec runs cmd in sandbox id and returns its stdout.
func (f *fixture) exec(t *testing.T, id, cmd string) (string, error) {
	t.Helper()
	out, err := f.s.Commands().Exec(context.Background(), f.admin, id, apiv1.CommandRequest{Cmd: cmd})
	if err != nil {
		return "", err
	}
	defer out.Close()
	stdout, _, err := out.Text()
	return stdout, err
}

// An action is a step of a lifecycle case: a call on the service (or a
// restart of it, or a crash of the VM) and what it must leave.
type action struct {
	do string
	// fail makes a step of the runtime fail during the action.
	fail sandboxtest.Step
	// wantOp is how the action's operation ends ("" for none).
	wantOp string
	// wantState is the sandbox's state afterwards.
	wantState string
	// wantGuest is what the runtime holds of it afterwards.
	wantGuest string
	// wantCode is the code of the sandbox's last error, if any.
	wantCode string
}

// TestLifecycle drives the state machine through the service over the
// fake runtime: each case a list of actions on one sandbox.
func TestLifecycle(t *testing.T) {
	const (
		running   = apiv1.StateRunning
		paused    = apiv1.StatePaused
		suspended = apiv1.StateSuspended
		failed    = apiv1.StateFailed
		deleted   = apiv1.StateDeleted
		ok        = apiv1.OpSucceeded
		refused   = apiv1.OpFailed
	)
	created := action{do: "create", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running}
	for _, tc := range []struct {
		name    string
		actions []action
	}{
		{"create to running and delete", []action{
			created,
			{do: "exec"},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"create fails", []action{
			{do: "create", fail: sandboxtest.StepCreate, wantOp: refused, wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeInternal},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"boot fails", []action{
			{do: "create", fail: sandboxtest.StepBoot, wantOp: refused, wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeInternal},
		}},
		{"pause and resume", []action{
			created,
			{do: "pause", wantOp: ok, wantState: paused, wantGuest: sandboxtest.Running},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
		}},
		{"pause fails", []action{
			created,
			{do: "pause", fail: sandboxtest.StepPause, wantOp: refused, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
		}},
		{"resume fails", []action{
			created,
			{do: "pause", wantOp: ok, wantState: paused, wantGuest: sandboxtest.Running},
			{do: "wake", fail: sandboxtest.StepResume, wantOp: refused, wantState: paused, wantGuest: sandboxtest.Running},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
		}},
		{"suspend and wake", []action{
			created,
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"suspend a paused sandbox", []action{
			created,
			{do: "pause", wantOp: ok, wantState: paused, wantGuest: sandboxtest.Running},
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
		}},
		{"suspend fails", []action{
			created,
			{do: "suspend", fail: sandboxtest.StepSuspend, wantOp: refused, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
		}},
		{"wake fails and is retried", []action{
			created,
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "wake", fail: sandboxtest.StepWake, wantOp: refused, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
		}},
		{"delete a suspended sandbox", []action{
			created,
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"removing a suspended sandbox fails", []action{
			created,
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "delete", fail: sandboxtest.StepRemove, wantOp: refused, wantState: failed, wantGuest: sandboxtest.Suspended, wantCode: apiv1.CodeInternal},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"destroy fails", []action{
			created,
			{do: "delete", fail: sandboxtest.StepDestroy, wantOp: refused, wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeInternal},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"the VM crashes", []action{
			created,
			{do: "kill", wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeUnavailable},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"a restart adopts a running sandbox", []action{
			created,
			{do: "restart", wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
			{do: "delete", wantOp: ok, wantState: deleted, wantGuest: sandboxtest.Gone},
		}},
		{"a restart adopts a paused sandbox", []action{
			created,
			{do: "pause", wantOp: ok, wantState: paused, wantGuest: sandboxtest.Running},
			{do: "restart", wantState: paused, wantGuest: sandboxtest.Running},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
		}},
		{"a restart keeps a suspended sandbox", []action{
			created,
			{do: "suspend", wantOp: ok, wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "restart", wantState: suspended, wantGuest: sandboxtest.Suspended},
			{do: "wake", wantOp: ok, wantState: running, wantGuest: sandboxtest.Running},
			{do: "exec"},
		}},
		{"the VM dies while the server is down", []action{
			created,
			{do: "kill and restart", wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeUnavailable},
		}},
		{"adoption fails", []action{
			created,
			{do: "restart", fail: sandboxtest.StepAdopt, wantState: failed, wantGuest: sandboxtest.Gone, wantCode: apiv1.CodeUnavailable},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			id := ""
			for i, a := range tc.actions {
				if a.fail != "" {
					f.rt.Fail(a.fail, errors.New("injected"))
				}
				var so apiv1.SandboxOperation
				var err error
				switch a.do {
				case "create":
					so = f.create(t, apiv1.CreateSandbox{})
					id = so.Sandbox.ID
				case "exec":
					out, err := f.exec(t, id, "echo hello $((6*7))")
					if err != nil || out != "hello 42\n" {
						t.Fatalf("action %d: exec: %q, %v", i, out, err)
					}
				case "pause":
					so, err = f.s.Pause(ctx, f.admin, id)
				case "suspend":
					so, err = f.s.Suspend(ctx, f.admin, id)
				case "wake":
					so, err = f.s.Wake(ctx, f.admin, id)
				case "delete":
					so, err = f.s.DeleteSandbox(ctx, f.admin, id)
				case "kill":
					f.rt.Kill(id, "killed by the test")
					f.waitState(t, id, a.wantState)
				case "restart":
					f.restart(t)
				case "kill and restart":
					f.s.Close()
					f.rt.Kill(id, "killed by the test")
					f.start(t)
				default:
					t.Fatalf("unknown action %q", a.do)
				}
				if err != nil {
					t.Fatalf("action %d: %s: %v", i, a.do, err)
				}
				if a.wantOp != "" {
					op := f.wait(t, so.Operation.ID)
					if op.Status != a.wantOp {
						t.Fatalf("action %d: %s ended %s (%+v), want %s", i, a.do, op.Status, op.Error, a.wantOp)
					}
				}
				if a.fail != "" {
					f.rt.Fail(a.fail, nil)
				}
				if a.do == "exec" {
					continue
				}
				sb, err := f.s.GetSandbox(ctx, f.admin, id)
				switch {
				case a.wantState == deleted && errors.Is(err, errdefs.ErrNotFound):
				case err != nil:
					t.Fatalf("action %d: %s: get: %v", i, a.do, err)
				case sb.State != a.wantState:
					t.Fatalf("action %d: %s left the sandbox %s (%+v), want %s", i, a.do, sb.State, sb.LastError, a.wantState)
				case a.wantCode != "" && (sb.LastError == nil || sb.LastError.Code != a.wantCode):
					t.Fatalf("action %d: %s left the error %+v, want code %s", i, a.do, sb.LastError, a.wantCode)
				}
				if got := f.rt.State(id); got != a.wantGuest {
					t.Fatalf("action %d: %s left the guest %q, want %q", i, a.do, got, a.wantGuest)
				}
				saved := sandbox.SuspendedState(f.dir.Sandbox(id))
				if saved != (a.wantGuest == sandboxtest.Suspended) {
					t.Fatalf("action %d: %s: saved state on disk %t, guest %q", i, a.do, saved, a.wantGuest)
				}
				if a.wantState == deleted {
					if _, err := os.Stat(f.dir.Sandbox(id)); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("action %d: %s left the directory: %v", i, a.do, err)
					}
				}
			}
		})
	}
}

// A delete while the create waits for its VM cancels the create, whose
// operation then fails as a conflict, and leaves nothing behind.
func TestDeleteWhileCreating(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	entered, release := f.rt.Hold(sandboxtest.StepBoot)
	defer release()
	so := f.create(t, apiv1.CreateSandbox{})
	<-entered
	if got := f.state(t, so.Sandbox.ID).State; got != apiv1.StateCreating {
		t.Fatalf("a sandbox whose VM boots is %s", got)
	}
	del, err := f.s.DeleteSandbox(ctx, f.admin, so.Sandbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if op := f.wait(t, del.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("delete: %s %+v", op.Status, op.Error)
	}
	op := f.wait(t, so.Operation.ID)
	if op.Status != apiv1.OpFailed || op.Error == nil || op.Error.Code != apiv1.CodeConflict {
		t.Fatalf("the create ended %s %+v, want a conflict", op.Status, op.Error)
	}
	if g := f.rt.State(so.Sandbox.ID); g != sandboxtest.Gone {
		t.Fatalf("the guest is %q", g)
	}
	f.waitState(t, so.Sandbox.ID, apiv1.StateDeleted)
}

// A create in flight when the server stops fails at the next start, and
// what it made is removed.
func TestRestartDuringCreate(t *testing.T) {
	f := newFixture(t)
	entered, release := f.rt.Hold(sandboxtest.StepBoot)
	defer release()
	so := f.create(t, apiv1.CreateSandbox{})
	<-entered
	f.restart(t)
	op := f.wait(t, so.Operation.ID)
	if op.Status != apiv1.OpFailed || op.Error == nil || op.Error.Code != apiv1.CodeUnavailable {
		t.Fatalf("the create ended %s %+v, want unavailable", op.Status, op.Error)
	}
	if sb := f.state(t, so.Sandbox.ID); sb.State != apiv1.StateFailed {
		t.Fatalf("the sandbox is %s", sb.State)
	}
	if _, err := os.Stat(f.dir.Sandbox(so.Sandbox.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's directory: %v", err)
	}
}

// A lease ends by the service's clock: the sandbox is then deleted or
// suspended, as it asked; before then nothing happens.
func TestLeaseExpiry(t *testing.T) {
	for _, tc := range []struct {
		onTimeout string
		wantState string
		wantGuest string
	}{
		{"delete", apiv1.StateDeleted, sandboxtest.Gone},
		{"suspend", apiv1.StateSuspended, sandboxtest.Suspended},
	} {
		t.Run(tc.onTimeout, func(t *testing.T) {
			f := newFixture(t)
			lease := 60
			so := f.create(t, apiv1.CreateSandbox{TimeoutS: &lease, OnTimeout: tc.onTimeout})
			if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("create: %s %+v", op.Status, op.Error)
			}
			id := so.Sandbox.ID
			sb := f.state(t, id)
			if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(f.clock.Now().Add(time.Minute)) {
				t.Fatalf("the lease ends at %v, want a minute from %v", sb.ExpiresAt, f.clock.Now())
			}
			f.clock.Advance(59 * time.Second)
			f.s.applyLeases()
			if sb := f.state(t, id); sb.State != apiv1.StateRunning {
				t.Fatalf("before its lease ends the sandbox is %s", sb.State)
			}
			f.clock.Advance(time.Second)
			f.s.applyLeases()
			f.waitState(t, id, tc.wantState)
			testenv.Eventually(t, 5*time.Second, "the guest "+tc.wantGuest, func() (bool, string) {
				g := f.rt.State(id)
				return g == tc.wantGuest, g
			})
			if tc.onTimeout == "suspend" {
				if sb := f.state(t, id); sb.ExpiresAt != nil {
					t.Errorf("a sandbox suspended by its lease keeps the lease %v", sb.ExpiresAt)
				}
			}
		})
	}
}

// A command's output reaches its reader whole and once across the
// sandbox's suspend and wake and across a server restart: the new
// session attaches to the process where the old one stopped.
func TestCommandReplay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cut   func(t *testing.T, f *fixture, id string)
		state string
	}{
		{"server restart", func(t *testing.T, f *fixture, id string) { f.restart(t) }, apiv1.StateRunning},
		{"suspend and wake", func(t *testing.T, f *fixture, id string) {
			ctx := context.Background()
			so, err := f.s.Suspend(ctx, f.admin, id)
			if err != nil {
				t.Fatal(err)
			}
			if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("suspend: %s %+v", op.Status, op.Error)
			}
			if so, err = f.s.Wake(ctx, f.admin, id); err != nil {
				t.Fatal(err)
			}
			if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("wake: %s %+v", op.Status, op.Error)
			}
		}, apiv1.StateRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			so := f.create(t, apiv1.CreateSandbox{})
			if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("create: %s %+v", op.Status, op.Error)
			}
			id := so.Sandbox.ID
			// The command waits for a file the test writes after the cut.
			gate := filepath.Join(t.TempDir(), "go")
			sess, err := f.s.Commands().CreateCommand(ctx, f.admin, id, apiv1.CommandRequest{
				Cmd: "echo one; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo two; exit 3"})
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.s.Commands().Attach(ctx, sessions.AttachAuth{Principal: &f.admin}, sess.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := readEvents(t, st, "one\n")
			st.Close()
			if out != "one\n" {
				t.Fatalf("before the cut: %q", out)
			}

			tc.cut(t, f, id)
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			st, err = f.s.Commands().Attach(ctx, sessions.AttachAuth{Principal: &f.admin}, sess.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			out, exit := readEvents(t, st, "")
			if out != "one\ntwo\n" || exit == nil || exit.ExitCode != 3 {
				t.Fatalf("after the cut: output %q, exit %+v; want one and two once, exit 3", out, exit)
			}
			if got := f.state(t, id).State; got != tc.state {
				t.Fatalf("the sandbox is %s", got)
			}
		})
	}
}

// readEvents reads a command's stdout until it has until (or, with until
// empty, until the exit) and returns it and the exit event, if read.
func readEvents(t *testing.T, st *command.Stream, until string) (string, *apiv1.ExitEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	for {
		ev, err := st.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			t.Fatalf("after %q: %v", out.String(), err)
		}
		switch ev.Kind {
		case command.Stdout:
			out.Write(ev.Data)
		case command.Exit:
			return out.String(), ev.Exit
		case command.Gap:
			t.Fatalf("a gap in the output: %+v", ev.Dropped)
		}
		if until != "" && out.String() == until {
			return out.String(), nil
		}
	}
}

// Files written through the service reach the guest's filesystem and are
// read back.
func TestFilesThroughTheFake(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	so := f.create(t, apiv1.CreateSandbox{})
	if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("create: %s %+v", op.Status, op.Error)
	}
	path := filepath.Join(t.TempDir(), "greeting")
	if err := f.s.WriteFile(ctx, f.admin, so.Sandbox.ID, path, 0o644, strings.NewReader("hi there")); err != nil {
		t.Fatal(err)
	}
	if out, err := f.exec(t, so.Sandbox.ID, "cat "+path); err != nil || out != "hi there" {
		t.Fatalf("cat: %q, %v", out, err)
	}
	st, read, err := f.s.OpenFile(ctx, f.admin, so.Sandbox.ID, path)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := read(&b); err != nil || b.String() != "hi there" || st.SizeBytes != 8 {
		t.Fatalf("read back %q (size %d), %v", b.String(), st.SizeBytes, err)
	}
}
