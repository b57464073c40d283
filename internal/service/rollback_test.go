package service

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/sessions"
)

// checkpoint makes a checkpoint of sandbox id through the service and
// returns its ID.
func (f *fixture) checkpoint(t *testing.T, id string) string {
	t.Helper()
	chk := sandbox.NewCheckpointID()
	var made error
	op, err := f.s.CheckpointVM(context.Background(), f.admin, id, apiv1.OpCheckpoint, chk, func(_ sandbox.Checkpoint, err error) { made = err })
	if err != nil {
		t.Fatal(err)
	}
	if got := f.wait(t, op.ID); got.Status != apiv1.OpSucceeded || made != nil {
		t.Fatalf("checkpoint: %s %+v %v", got.Status, got.Error, made)
	}
	return chk
}

// rollback rolls sandbox id back to chk and returns how its operation
// ended.
func (f *fixture) rollback(t *testing.T, id, chk string) apiv1.Operation {
	t.Helper()
	so, err := f.s.RollbackVM(context.Background(), f.admin, id, chk)
	if err != nil {
		t.Fatal(err)
	}
	if so.Sandbox.State != apiv1.StateWaking || so.Operation.Kind != apiv1.OpRollback {
		t.Fatalf("rollback answer: %+v", so)
	}
	return f.wait(t, so.Operation.ID)
}

// A rollback through the service over the fake runtime: the sandbox gets
// a new VM under its ID and runs; the command it ran ends rolled back,
// with no exit code, on its stream and in its record; a rollback the
// runtime refuses leaves the sandbox and its command as they were; a
// suspended sandbox rolls back too.
func TestRollback(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	so := f.create(t, apiv1.CreateSandbox{})
	if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("create: %s %+v", op.Status, op.Error)
	}
	id := so.Sandbox.ID
	chk := f.checkpoint(t, id)

	gate := filepath.Join(t.TempDir(), "never")
	start := func() (string, func(until string) (string, *apiv1.ExitEvent)) {
		t.Helper()
		sess, err := f.s.Commands().CreateCommand(ctx, f.admin, id, apiv1.CommandRequest{
			Cmd: "echo one; while [ ! -e " + gate + " ]; do sleep 0.02; done"})
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.s.Commands().Attach(ctx, sessions.AttachAuth{Principal: &f.admin}, sess.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if out, _ := readEvents(t, st, "one\n"); out != "one\n" {
			t.Fatalf("the command's output: %q", out)
		}
		return sess.ID, func(until string) (string, *apiv1.ExitEvent) { return readEvents(t, st, until) }
	}

	// Refused by the runtime: nothing changes, the command runs on.
	cmd, read := start()
	f.rt.Fail(sandboxtest.StepRollback, fmt.Errorf("no room"))
	if op := f.rollback(t, id, chk); op.Status != apiv1.OpFailed {
		t.Fatalf("a refused rollback: %s", op.Status)
	}
	f.rt.Fail(sandboxtest.StepRollback, nil)
	if sb := f.state(t, id); sb.State != apiv1.StateRunning || sb.LastError != nil {
		t.Fatalf("after a refused rollback the sandbox is %+v", sb)
	}
	if c, err := f.s.Commands().GetCommand(ctx, f.admin, cmd); err != nil || c.State != apiv1.CommandRunning {
		t.Fatalf("after a refused rollback the command is %+v, %v", c, err)
	}
	if _, err := f.exec(t, id, "true"); err != nil {
		t.Fatalf("exec after a refused rollback: %v", err)
	}

	// Rolled back: a new guest, the command ended as rolled back.
	if op := f.rollback(t, id, chk); op.Status != apiv1.OpSucceeded {
		t.Fatalf("rollback: %s %+v", op.Status, op.Error)
	}
	if sb := f.state(t, id); sb.State != apiv1.StateRunning {
		t.Fatalf("after the rollback the sandbox is %s", sb.State)
	}
	_, exit := read("")
	if exit == nil || !exit.RolledBack {
		t.Fatalf("the command's exit after the rollback: %+v", exit)
	}
	if c, err := f.s.Commands().GetCommand(ctx, f.admin, cmd); err != nil || c.State != apiv1.CommandExited || c.ExitCode != nil {
		t.Fatalf("the command's record after the rollback: %+v, %v", c, err)
	}
	if out, err := f.exec(t, id, "echo here"); err != nil || out != "here\n" {
		t.Fatalf("exec after the rollback: %q, %v", out, err)
	}
	if n := f.rt.Calls(sandboxtest.StepRollback); n != 2 {
		t.Errorf("the runtime rolled back %d times, want 2", n)
	}

	// Suspended: rolled back from its saved state.
	ss, err := f.s.Suspend(ctx, f.admin, id)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, ss.Operation.ID)
	// Checkpointed at rest: it stays suspended.
	rest := f.checkpoint(t, id)
	if sb := f.state(t, id); sb.State != apiv1.StateSuspended {
		t.Fatalf("after a checkpoint at rest the sandbox is %s", sb.State)
	}
	if op := f.rollback(t, id, rest); op.Status != apiv1.OpSucceeded {
		t.Fatalf("rollback of a suspended sandbox: %s %+v", op.Status, op.Error)
	}
	if got := f.rt.State(id); got != sandboxtest.Running {
		t.Fatalf("after the rollback of a suspended sandbox its guest is %q", got)
	}

	// Another sandbox's checkpoint, even one the service was handed:
	// refused by the runtime, nothing changes.
	other := f.create(t, apiv1.CreateSandbox{})
	f.wait(t, other.Operation.ID)
	theirs := f.checkpoint(t, other.Sandbox.ID)
	so2, err := f.s.RollbackVM(ctx, f.admin, id, theirs)
	if err != nil {
		t.Fatal(err)
	}
	if op := f.wait(t, so2.Operation.ID); op.Status != apiv1.OpFailed || op.Error == nil || op.Error.Code != "invalid_argument" {
		t.Fatalf("rollback to another sandbox's checkpoint: %+v", op)
	}
	if sb := f.state(t, id); sb.State != apiv1.StateRunning {
		t.Fatalf("after a rollback to another's checkpoint the sandbox is %s", sb.State)
	}
	// An unknown sandbox is not found.
	if _, err := f.s.RollbackVM(ctx, f.admin, "sbxnone", chk); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("rollback of a missing sandbox: %v", err)
	}
}
