package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
)

func newRuntime(t *testing.T) (*Runtime, datadir.Dir) {
	t.Helper()
	dir := datadir.Dir{Root: t.TempDir()}
	r := New(t, dir)
	if _, err := r.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	return r, dir
}

func run(t *testing.T, vm *VM, cmd string) string {
	t.Helper()
	var out bytes.Buffer
	p, err := vm.Exec(context.Background(), agentproto.ExecRequest{Cmd: cmd}, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Wait(p); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// A guest outlives its VM: a released one is adopted, a suspended one
// woken, and a process started before either is still there to attach to.
func TestGuestOutlivesItsVM(t *testing.T) {
	r, dir := newRuntime(t)
	ctx := context.Background()
	spec, _, err := r.Resolve(sandbox.Spec{ID: "sbxfake", Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if out := run(t, vm, "echo $GREETING"); out != "hi\n" {
		t.Fatalf("exec: %q", out)
	}
	gate := filepath.Join(t.TempDir(), "go")
	p, err := vm.Exec(ctx, agentproto.ExecRequest{Cmd: "echo one; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo two"}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	procID := p.ID

	vm.Release()
	if s := r.State("sbxfake"); s != Released {
		t.Fatalf("after release: %q", s)
	}
	if vm, err = r.Adopt(ctx, "sbxfake", spec); err != nil {
		t.Fatal(err)
	}
	if err := vm.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if s := r.State("sbxfake"); s != Suspended || !sandbox.SuspendedState(dir.Sandbox("sbxfake")) || !vm.Exited() {
		t.Fatalf("after suspend: %q, saved %t, exited %t", s, sandbox.SuspendedState(dir.Sandbox("sbxfake")), vm.Exited())
	}
	if vm, err = r.Wake(ctx, "sbxfake"); err != nil {
		t.Fatal(err)
	}
	if sandbox.SuspendedState(dir.Sandbox("sbxfake")) {
		t.Fatal("the saved state outlived the wake")
	}
	os.WriteFile(gate, nil, 0o644)
	var out bytes.Buffer
	p, err = vm.Attach(ctx, procID, 0, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Wait(p); err != nil || out.String() != "one\ntwo\n" {
		t.Fatalf("attached after wake: %q, %v", out.String(), err)
	}

	if err := vm.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir.Sandbox("sbxfake")); !errors.Is(err, os.ErrNotExist) || r.State("sbxfake") != Gone {
		t.Fatalf("after destroy: %v, %q", err, r.State("sbxfake"))
	}
}

// Injected failures and holds stop a step, and a failed create leaves
// nothing behind.
func TestFailAndHold(t *testing.T) {
	r, dir := newRuntime(t)
	ctx := context.Background()
	r.Fail(StepBoot, errdefs.ErrExhausted)
	if _, err := r.Create(ctx, sandbox.Spec{ID: "sbxfail"}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("create with a failing boot: %v", err)
	}
	if _, err := os.Stat(dir.Sandbox("sbxfail")); !errors.Is(err, os.ErrNotExist) || r.State("sbxfail") != Gone {
		t.Fatalf("a failed create left %v, %q", err, r.State("sbxfail"))
	}
	r.Fail(StepBoot, nil)

	entered, release := r.Hold(StepCreate)
	hctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := r.Create(hctx, sandbox.Spec{ID: "sbxheld"}); errc <- err }()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("a held create whose context ends: %v", err)
	}
	release()
	if _, err := r.Create(ctx, sandbox.Spec{ID: "sbxheld"}); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if n := r.Calls(StepCreate); n != 3 {
		t.Errorf("%d creates counted, want 3", n)
	}
}

// Kill ends a VM as a crash does, and a released VM's killed guest is not
// adopted.
func TestKill(t *testing.T) {
	r, _ := newRuntime(t)
	ctx := context.Background()
	vm, err := r.Create(ctx, sandbox.Spec{ID: "sbxkill"})
	if err != nil {
		t.Fatal(err)
	}
	r.Kill("sbxkill", "out of memory")
	select {
	case <-vm.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not close")
	}
	if err := vm.Failure(); !errors.Is(err, sandbox.ErrVMExited) {
		t.Fatalf("failure %v", err)
	}
	if _, err := vm.Exec(ctx, agentproto.ExecRequest{Cmd: "true"}, agentclient.Stdio{}); !errors.Is(err, sandbox.ErrVMExited) {
		t.Fatalf("exec on a killed VM: %v", err)
	}

	vm, err = r.Create(ctx, sandbox.Spec{ID: "sbxgone"})
	if err != nil {
		t.Fatal(err)
	}
	vm.Release()
	r.Kill("sbxgone", "host reboot")
	if _, err := r.Adopt(ctx, "sbxgone", sandbox.Spec{ID: "sbxgone"}); !errors.Is(err, sandbox.ErrVMExited) {
		t.Fatalf("adopt a killed guest: %v", err)
	}
}
