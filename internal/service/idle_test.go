package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/testenv"
)

// idleSandbox creates a running sandbox with idle_s idleS and on_idle
// onIdle.
func (f *fixture) idleSandbox(t *testing.T, idleS int, onIdle string) string {
	t.Helper()
	so := f.create(t, apiv1.CreateSandbox{IdleS: &idleS, OnIdle: onIdle})
	if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("create: %s %+v", op.Status, op.Error)
	}
	return so.Sandbox.ID
}

// events returns the types of sandbox id's events of the given types.
func (f *fixture) events(t *testing.T, id string, types ...string) []string {
	t.Helper()
	evs, err := f.st.ListEvents(context.Background(), store.EventFilter{Types: types, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		if ev.SandboxID == id {
			out = append(out, ev.Type)
		}
	}
	return out
}

func TestIdleSettings(t *testing.T) {
	n := func(v int) *int { return &v }
	for _, tc := range []struct {
		name   string
		idleS  *int
		onIdle string
		want   string // part of the error; "" for none
	}{
		{"unset", nil, "", ""},
		{"pause", n(60), "pause", ""},
		{"negative", n(-1), "", "idle_s -1 is out of bounds"},
		{"over a year", n(maxIdle + 1), "", "out of bounds"},
		{"unknown on_idle", n(60), "sleep", `on_idle "sleep" is not`},
		{"control characters in on_idle", n(60), "a\x00b", "on_idle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			_, err := f.s.CreateSandbox(context.Background(), f.admin, apiv1.CreateSandbox{Template: "base", IdleS: tc.idleS, OnIdle: tc.onIdle})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want invalid, saying %q", err, tc.want)
			}
			// Nothing was created.
			if got, err := f.st.ListSandboxes(context.Background(), store.SandboxFilter{Limit: 10}); err != nil || len(got) != 0 {
				t.Fatalf("sandboxes after a refused create: %d, %v", len(got), err)
			}
		})
	}
}

// A sandbox nothing uses for its idle_s is suspended (or paused) with a
// sandbox.idle event, its lease untouched; its view shows the settings.
func TestIdleSuspends(t *testing.T) {
	for _, tc := range []struct {
		onIdle    string
		wantState string
		wantGuest string
		wantEvent string
	}{
		{"", apiv1.StateSuspended, sandboxtest.Suspended, apiv1.EventSandboxSuspended},
		{"pause", apiv1.StatePaused, sandboxtest.Running, apiv1.EventSandboxPaused}, // a paused guest keeps its VM
	} {
		t.Run("on_idle "+tc.onIdle, func(t *testing.T) {
			f := newFixture(t)
			lease := 3600
			so := f.create(t, apiv1.CreateSandbox{TimeoutS: &lease, IdleS: ptr(60), OnIdle: tc.onIdle})
			if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("create: %s %+v", op.Status, op.Error)
			}
			id := so.Sandbox.ID
			before := f.state(t, id)
			wantOnIdle := tc.onIdle
			if wantOnIdle == "" {
				wantOnIdle = "suspend"
			}
			if before.IdleS != 60 || before.OnIdle != wantOnIdle || !before.WakeOnRequest {
				t.Fatalf("view: idle_s %d, on_idle %q, wake_on_request %v", before.IdleS, before.OnIdle, before.WakeOnRequest)
			}
			f.clock.Advance(59 * time.Second)
			f.s.applyIdle()
			// Reads of its state are no use: they do not reset the count.
			f.state(t, id)
			if _, err := f.s.GetSandbox(context.Background(), f.admin, id); err != nil {
				t.Fatal(err)
			}
			if sb := f.state(t, id); sb.State != apiv1.StateRunning {
				t.Fatalf("before idle_s the sandbox is %s", sb.State)
			}
			f.clock.Advance(time.Second)
			f.s.applyIdle()
			f.waitState(t, id, tc.wantState)
			if g := f.rt.State(id); g != tc.wantGuest {
				t.Fatalf("guest %s, want %s", g, tc.wantGuest)
			}
			after := f.state(t, id)
			if after.ExpiresAt == nil || !after.ExpiresAt.Equal(*before.ExpiresAt) {
				t.Errorf("the lease moved: %v, was %v", after.ExpiresAt, before.ExpiresAt)
			}
			got := f.events(t, id, apiv1.EventSandboxIdle, tc.wantEvent)
			if !slices.Equal(got, []string{apiv1.EventSandboxIdle, tc.wantEvent}) {
				t.Errorf("events %v; want idle, then %s", got, tc.wantEvent)
			}
			// A GET does not wake it; another pass does nothing more.
			f.clock.Advance(time.Hour)
			f.s.applyIdle()
			if sb := f.state(t, id); sb.State != tc.wantState {
				t.Fatalf("after a GET the sandbox is %s", sb.State)
			}
			if got := f.events(t, id, apiv1.EventSandboxIdle); len(got) != 1 {
				t.Errorf("idle events %v; want one", got)
			}
		})
	}
}

func ptr(v int) *int { return &v }

// Any use resets the count: a keep, an exec, a file call.
func TestIdleUseResets(t *testing.T) {
	f := newFixture(t)
	id := f.idleSandbox(t, 60, "")
	ctx := context.Background()
	uses := []struct {
		name string
		use  func() error
	}{
		{"keep", func() error { _, err := f.s.Keep(ctx, f.admin, id, ptr(0)); return err }},
		{"exec", func() error { _, err := f.exec(t, id, "true"); return err }},
		{"file stat", func() error { _, err := f.s.Stat(ctx, f.admin, id, "/"); return err }},
	}
	for _, u := range uses {
		f.clock.Advance(59 * time.Second)
		if err := u.use(); err != nil {
			t.Fatalf("%s: %v", u.name, err)
		}
		f.clock.Advance(59 * time.Second)
		f.s.applyIdle()
		if sb := f.state(t, id); sb.State != apiv1.StateRunning {
			t.Fatalf("59 s after a %s the sandbox is %s", u.name, sb.State)
		}
	}
	f.clock.Advance(time.Second)
	f.s.applyIdle()
	f.waitState(t, id, apiv1.StateSuspended)
}

// A sandbox with a running command, or with an open stream of one, is
// never idle; once the command ends and the stream closes, it is.
func TestIdleNotWhileInUse(t *testing.T) {
	f := newFixture(t)
	id := f.idleSandbox(t, 10, "")
	ctx := context.Background()
	gate := filepath.Join(t.TempDir(), "go")
	sess, err := f.s.Commands().CreateCommand(ctx, f.admin, id, apiv1.CommandRequest{
		Cmd: "while [ ! -e " + gate + " ]; do sleep 0.02; done"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.s.Commands().Attach(ctx, sessions.AttachAuth{Principal: &f.admin}, sess.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the command running", func() (bool, string) {
		c, err := f.s.Commands().GetCommand(ctx, f.admin, sess.ID)
		return err == nil && c.State == apiv1.CommandRunning, c.State
	})
	// The command runs, with no stream open.
	st.Close()
	f.clock.Advance(24 * time.Hour)
	f.s.applyIdle()
	if sb := f.state(t, id); sb.State != apiv1.StateRunning {
		t.Fatalf("with a running command the sandbox is %s", sb.State)
	}
	// The command ends; a stream of it is open.
	if st, err = f.s.Commands().Attach(ctx, sessions.AttachAuth{Principal: &f.admin}, sess.ID, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the command's exit", func() (bool, string) {
		c, err := f.s.Commands().GetCommand(ctx, f.admin, sess.ID)
		return err == nil && c.State == apiv1.CommandExited, c.State
	})
	f.clock.Advance(24 * time.Hour)
	f.s.applyIdle()
	if sb := f.state(t, id); sb.State != apiv1.StateRunning {
		t.Fatalf("with a stream open the sandbox is %s", sb.State)
	}
	st.Close()
	f.clock.Advance(10 * time.Second)
	f.s.applyIdle()
	f.waitState(t, id, apiv1.StateSuspended)
}

// Calls that need the sandbox running wake an idle one and wait for it:
// a burst of them wakes it once.
func TestWakeOnRequest(t *testing.T) {
	for _, onIdle := range []string{"suspend", "pause"} {
		t.Run(onIdle, func(t *testing.T) {
			f := newFixture(t)
			id := f.idleSandbox(t, 10, onIdle)
			want := apiv1.StateSuspended
			if onIdle == "pause" {
				want = apiv1.StatePaused
			}
			f.clock.Advance(10 * time.Second)
			f.s.applyIdle()
			f.waitState(t, id, want)

			const n = 8
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := f.exec(t, id, fmt.Sprintf("echo %d", i))
					if err == nil && out != fmt.Sprintf("%d\n", i) {
						err = fmt.Errorf("exec %d: stdout %q", i, out)
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if sb := f.state(t, id); sb.State != apiv1.StateRunning {
				t.Fatalf("after the execs the sandbox is %s", sb.State)
			}
			if got := f.events(t, id, apiv1.EventSandboxWoken, apiv1.EventSandboxRunning); len(got) != 2 {
				// running (the create), then one woken or running (a resume from paused).
				t.Fatalf("events %v; want the create's and one wake", got)
			}
			ops, err := f.st.ListOperations(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			wakes := 0
			for _, op := range ops {
				if op.Kind == apiv1.OpWake && op.TargetID == id {
					wakes++
				}
			}
			if wakes != 1 {
				t.Fatalf("%d wake operations; want 1", wakes)
			}
			// And it goes idle again.
			f.clock.Advance(10 * time.Second)
			f.s.applyIdle()
			f.waitState(t, id, want)
			if got := f.events(t, id, apiv1.EventSandboxIdle); len(got) != 2 {
				t.Fatalf("idle events %v; want two", got)
			}
		})
	}
}

// A sandbox without idle_s is not woken by a call: it answers 409, as
// before.
func TestNoWakeWithoutIdle(t *testing.T) {
	f := newFixture(t)
	so := f.create(t, apiv1.CreateSandbox{})
	if op := f.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("create: %s %+v", op.Status, op.Error)
	}
	id := so.Sandbox.ID
	po, err := f.s.Suspend(context.Background(), f.admin, id)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, po.Operation.ID)
	if _, err := f.exec(t, id, "true"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("exec on a suspended sandbox without idle_s: %v; want a conflict", err)
	}
	if sb := f.state(t, id); sb.State != apiv1.StateSuspended || sb.WakeOnRequest {
		t.Fatalf("the sandbox is %s (wake on request %v)", sb.State, sb.WakeOnRequest)
	}
}

// A use that comes after applyIdle found the sandbox due, but before its
// suspend begins, stops the suspend: the operation's begin looks again.
func TestIdleUseBeforeBegin(t *testing.T) {
	f := newFixture(t)
	id := f.idleSandbox(t, 10, "")
	f.clock.Advance(10 * time.Second)
	lv := f.s.getLive(id)
	if lv == nil || !f.s.idle.Due(id, lv.idleS) {
		t.Fatal("the sandbox is not due")
	}
	release, err := f.s.use(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := f.s.goIdle(lv); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("idle suspend of a sandbox in use: %v; want a conflict", err)
	}
	if sb := f.state(t, id); sb.State != apiv1.StateRunning {
		t.Fatalf("the sandbox in use is %s", sb.State)
	}
	if got := f.events(t, id, apiv1.EventSandboxIdle); len(got) != 0 {
		t.Fatalf("idle events %v for a suspend that did not begin", got)
	}
}
