package sessions

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tenancy"
	"github.com/airlockhq/airlock/internal/testenv"
)

// A command runs on a VM of the fake runtime, through Commands alone, and
// the service's lifecycle calls do what it counts on: across a suspend
// and wake (Wait, then Resume on the new VM) its output reaches a new
// reader whole and once; when its VM dies (Lost) the reader still on it
// gets the reason and an exit of -1, and its record says so.
func TestLifecycleCalls(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cut is what happens to sandbox id's VM, vm, while the command
		// waits; the gate opens after it. It returns the stream to read
		// on: nil for a new attach from the first event, or st, which
		// has read "one".
		cut        func(t *testing.T, f *fixture, rt *sandboxtest.Runtime, id string, vm *sandboxtest.VM, st *command.Stream) *command.Stream
		wantOut    string
		wantErr    string
		wantExit   int
		wantRecord int
	}{
		{"suspend and wake", func(t *testing.T, f *fixture, rt *sandboxtest.Runtime, id string, vm *sandboxtest.VM, st *command.Stream) *command.Stream {
			st.Close()
			// As the service suspends: the VM's context ends, the VM
			// saves and stops, the pumps end; the wake gives a new VM.
			f.sb.setVM(id, nil)
			if err := vm.Suspend(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.c.Wait(id)
			woken, err := rt.Wake(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { woken.Destroy(context.Background()) })
			f.sb.setVM(id, woken)
			f.c.Resume(id)
			return nil
		}, "one\ntwo\n", "", 3, 3},
		{"VM lost", func(t *testing.T, f *fixture, rt *sandboxtest.Runtime, id string, vm *sandboxtest.VM, st *command.Stream) *command.Stream {
			// As the service's watch does: the server lets go of the
			// sandbox, then ends its commands.
			rt.Kill(id, "crashed")
			f.sb.let(id)
			f.c.Lost(id, "the sandbox VM exited")
			return st
		}, "", "airlock: the sandbox VM exited\n", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t)
			rt := sandboxtest.New(t, f.dir)
			if _, err := rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
				t.Fatal(err)
			}
			spec, _, err := rt.Resolve(sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			vm, err := rt.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			id := vm.SandboxID()
			admin := tenancy.Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
			sb := store.Sandbox{ID: id, Owner: admin.KeyID, State: apiv1.StateRunning, TemplateRef: "base:latest",
				VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Metadata: map[string]string{}}
			if err := f.st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: id, Owner: admin.KeyID, Status: apiv1.OpSucceeded}); err != nil {
				t.Fatal(err)
			}
			f.sb.look(id, vm)
			t.Cleanup(func() { f.sb.let(id); f.c.Close(id, time.Second); vm.Destroy(ctx) })

			gate := filepath.Join(t.TempDir(), "go")
			sess, err := f.c.CreateCommand(ctx, admin, id, apiv1.CommandRequest{
				Cmd: "echo one; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo two; exit 3"})
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.c.Attach(ctx, AttachAuth{Principal: &admin}, sess.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			if out, _, _ := read(t, st, "one\n"); out != "one\n" {
				t.Fatalf("before the cut: %q", out)
			}

			if next := tc.cut(t, f, rt, id, vm, st); next != nil {
				st = next
			} else if st, err = f.c.Attach(ctx, AttachAuth{Principal: &admin}, sess.ID, 0); err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			out, errOut, exit := read(t, st, "")
			if out != tc.wantOut || errOut != tc.wantErr || exit == nil || exit.ExitCode != tc.wantExit {
				t.Fatalf("after the cut: stdout %q, stderr %q, exit %+v; want %q, %q, exit %d", out, errOut, exit, tc.wantOut, tc.wantErr, tc.wantExit)
			}
			// The pump records the exit after it logs it.
			testenv.Eventually(t, 5*time.Second, "the command's record of its exit", func() (bool, string) {
				rec, err := f.c.GetCommand(ctx, admin, sess.ID)
				if err != nil {
					t.Fatal(err)
				}
				code := "none"
				if rec.ExitCode != nil {
					code = strconv.Itoa(*rec.ExitCode)
				}
				return rec.State == apiv1.CommandExited && rec.ExitCode != nil && *rec.ExitCode == tc.wantRecord, rec.State + ", exit " + code
			})
		})
	}
}

// read reads a command's stream until its stdout is until (or, with
// until empty, to the exit) and returns its stdout, its stderr and the
// exit event, if read.
func read(t *testing.T, st *command.Stream, until string) (string, string, *apiv1.ExitEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut strings.Builder
	for {
		ev, err := st.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out.String(), errOut.String(), nil
		}
		if err != nil {
			t.Fatalf("after %q: %v", out.String(), err)
		}
		switch ev.Kind {
		case command.Stdout:
			out.Write(ev.Data)
		case command.Stderr:
			errOut.Write(ev.Data)
		case command.Exit:
			return out.String(), errOut.String(), ev.Exit
		case command.Gap:
			t.Fatalf("a gap in the output: %+v", ev.Dropped)
		}
		if until != "" && out.String() == until {
			return out.String(), errOut.String(), nil
		}
	}
}

// A sandbox is in use, never idle, while a command runs in it, while a
// stream of a command is open and while an exec runs; each of these lets
// go when it ends (docs/api.md, "Idle sandboxes").
func TestUseOfSandbox(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	rt := sandboxtest.New(t, f.dir)
	if _, err := rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	spec, _, err := rt.Resolve(sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	id := vm.SandboxID()
	admin := tenancy.Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
	other := tenancy.Principal{KeyID: "keyother", Role: apiv1.RoleUser}
	sb := store.Sandbox{ID: id, Owner: admin.KeyID, State: apiv1.StateRunning, TemplateRef: "base:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Metadata: map[string]string{}}
	if err := f.st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: id, Owner: admin.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
	}
	f.sb.look(id, vm)
	t.Cleanup(func() { f.sb.let(id); f.c.Close(id, time.Second); vm.Destroy(ctx) })

	// Another key's call neither uses nor wakes the sandbox.
	if _, err := f.c.Exec(ctx, other, id, apiv1.CommandRequest{Cmd: "true"}); err == nil {
		t.Fatal("another key's exec ran")
	}
	if n := f.sb.uses[id]; n != 0 {
		t.Fatalf("another key's exec used the sandbox %d times", n)
	}

	gate := filepath.Join(t.TempDir(), "go")
	sess, err := f.c.CreateCommand(ctx, admin, id, apiv1.CommandRequest{
		Cmd: "echo one; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo two"})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.sb.held(id); n != 0 {
		t.Fatalf("a command created, not started, holds the sandbox %d times", n)
	}
	st, err := f.c.Attach(ctx, AttachAuth{Principal: &admin}, sess.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := read(t, st, "one\n"); out != "one\n" {
		t.Fatalf("stdout %q", out)
	}
	if n := f.sb.held(id); n != 2 {
		t.Fatalf("a running command and its open stream hold the sandbox %d times, want 2", n)
	}
	st.Close()
	if n := f.sb.held(id); n != 1 {
		t.Fatalf("with the stream closed, the running command holds the sandbox %d times, want 1", n)
	}

	// An exec holds it while it runs.
	done := make(chan error, 1)
	gate2 := filepath.Join(t.TempDir(), "go")
	go func() {
		out, err := f.c.Exec(ctx, admin, id, apiv1.CommandRequest{Cmd: "while [ ! -e " + gate2 + " ]; do sleep 0.02; done"})
		if err == nil {
			err = out.Close()
		}
		done <- err
	}()
	testenv.Eventually(t, 5*time.Second, "the exec's hold", func() (bool, string) {
		n := f.sb.held(id)
		return n == 2, strconv.Itoa(n)
	})
	if err := os.WriteFile(gate2, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := f.sb.held(id); n != 1 {
		t.Fatalf("after the exec, the sandbox is held %d times, want 1", n)
	}

	// The command's end lets go of the sandbox.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "no hold once the command exits", func() (bool, string) {
		n := f.sb.held(id)
		return n == 0, strconv.Itoa(n)
	})
}
