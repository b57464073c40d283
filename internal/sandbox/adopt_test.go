package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testRuntime is a Runtime over a data directory in a temp dir, for what
// needs no VM.
func testRuntime(t *testing.T) *Runtime {
	dir := datadir.Dir{Root: t.TempDir()}
	return &Runtime{cfg: Config{Dir: dir}, log: testLog(t), templates: template.Open(dir)}
}

// startFakeQEMU starts a long sleep whose command line names dir's agent
// socket as QEMU's does and records its pid in dir. The test's cleanup
// kills and reaps it.
func startFakeQEMU(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testenv.Lacking(t, "no sleep binary: %v", err)
	}
	argv0 := "socket,id=agent,path=" + filepath.Join(dir, vm.AgentSocketName) + ",server=on,wait=off"
	cmd := &exec.Cmd{Path: sleep, Args: []string{argv0, "1000"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if err := os.WriteFile(filepath.Join(dir, vm.PIDFileName), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The parent of a vfork'd child runs again before the kernel has set
	// up the new program's arguments: wait until its command line shows.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := vm.RunningPID(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fake QEMU's command line never showed")
		}
	}
	return cmd
}

// exited reports whether cmd's process has ended (it may be a zombie).
func exited(cmd *exec.Cmd) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(rest, "Z")
}

func TestValidID(t *testing.T) {
	tests := []struct {
		name string
		id   string
		want bool
	}{
		{"fresh", NewID(), true},
		{"short", "sbx1", true},
		{"longest", "sbx" + strings.Repeat("a", 60), true},
		{"too long", "sbx" + strings.Repeat("a", 61), false},
		{"prefix only", "sbx", false},
		{"no prefix", "abc123", false},
		{"upper case", "sbxABC", false},
		{"dash", "sbx-abc", false},
		{"path", "sbx/../x", false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ValidID(tc.id); got != tc.want {
				t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
			}
		})
	}
}

func TestIDRefused(t *testing.T) {
	r := testRuntime(t)
	ctx := t.Context()
	for _, id := range []string{"sbx-1", "../sbx1", "SBX1", "sbx" + strings.Repeat("0", 61)} {
		if _, err := r.Create(ctx, Spec{ID: id}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create with id %q: got %v, want invalid", id, err)
		}
		if _, err := r.Adopt(ctx, id, Spec{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Adopt %q: got %v, want invalid", id, err)
		}
		if err := r.Remove(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Remove %q: got %v, want invalid", id, err)
		}
	}
}

func TestAdoptRefuses(t *testing.T) {
	const console = "[    2.1] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100"
	tests := []struct {
		name       string
		setup      func(t *testing.T, dir string)
		wantClass  []error
		wantQuoted string
	}{
		{"directory gone", func(t *testing.T, dir string) {}, []error{vm.ErrNotRunning, ErrVMExited}, ""},
		{"qemu gone", func(t *testing.T, dir string) {
			mkdir(t, dir)
			os.WriteFile(filepath.Join(dir, vm.ConsoleLogName), []byte("booting\n"+console+"\n"), 0o600)
			cmd := startFakeQEMU(t, dir)
			cmd.Process.Kill()
			cmd.Wait()
		}, []error{vm.ErrNotRunning, ErrVMExited}, console},
		{"never started", func(t *testing.T, dir string) { mkdir(t, dir) }, []error{vm.ErrNotRunning, ErrVMExited}, ""},
		{"owned by another", func(t *testing.T, dir string) {
			mkdir(t, dir)
			startFakeQEMU(t, dir)
			lock, err := lockOwner(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lock.Close() })
		}, []error{errdefs.ErrConflict}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			id := NewID()
			tc.setup(t, r.cfg.Dir.Sandbox(id))
			sb, err := r.Adopt(t.Context(), id, Spec{Template: "sha256:" + strings.Repeat("0", 64)})
			if err == nil {
				sb.Release()
				t.Fatal("adopted a sandbox that cannot be adopted")
			}
			for _, class := range tc.wantClass {
				if !errors.Is(err, class) {
					t.Errorf("got %v, want it to be %v", err, class)
				}
			}
			if !strings.Contains(err.Error(), tc.wantQuoted) {
				t.Errorf("error does not quote %q: %v", tc.wantQuoted, err)
			}
		})
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name     string
		qemu     bool // a fake QEMU runs for the sandbox
		owned    bool // another holder has the owner lock
		noDir    bool
		wantErr  error
		wantGone bool
	}{
		{"running qemu", true, false, false, nil, true},
		{"no qemu", false, false, false, nil, true},
		{"already gone", false, false, true, nil, true},
		{"owned", true, true, false, errdefs.ErrConflict, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			id := NewID()
			dir := r.cfg.Dir.Sandbox(id)
			var cmd *exec.Cmd
			if !tc.noDir {
				mkdir(t, dir)
				os.WriteFile(filepath.Join(dir, "disk.qcow2"), []byte("x"), 0o600)
			}
			if tc.qemu {
				cmd = startFakeQEMU(t, dir)
			}
			if tc.owned {
				lock, err := lockOwner(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer lock.Close()
			}

			err := r.Remove(t.Context(), id)
			if tc.wantErr == nil && err != nil || !errors.Is(err, tc.wantErr) {
				t.Fatalf("Remove: got %v, want %v", err, tc.wantErr)
			}
			_, serr := os.Stat(dir)
			if gone := os.IsNotExist(serr); gone != tc.wantGone {
				t.Errorf("directory gone %v, want %v", gone, tc.wantGone)
			}
			if cmd != nil && exited(cmd) != tc.wantGone {
				t.Errorf("qemu exited %v, want %v", exited(cmd), tc.wantGone)
			}
			if tc.wantGone {
				if err := r.Remove(t.Context(), id); err != nil {
					t.Errorf("second Remove: %v", err)
				}
			}
		})
	}
}

// requireVMHost skips the test under -short or when the host is not set up
// for VMs, and returns the set-up data directory.
func requireVMHost(t *testing.T) datadir.Dir {
	t.Helper()
	testenv.Short(t, "boots VMs")
	dd := datadir.Default()
	if err := guest.Check(dd); err != nil {
		testenv.Lacking(t, "host not set up for VMs (run airlock setup): %v", err)
	}
	return dd
}

// tinyRuntime returns a runtime over dd; it skips the test when the tiny
// template is missing.
func tinyRuntime(t *testing.T, ctx context.Context, dd datadir.Dir) *Runtime {
	t.Helper()
	rt, err := New(ctx, Config{Dir: dd, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Templates().Resolve("tiny"); err != nil {
		testenv.Lacking(t, "template tiny is missing: %v", err)
	}
	return rt
}

// hostRuntime returns a runtime over the set-up data directory, or skips
// the test (see requireVMHost and tinyRuntime).
func hostRuntime(t *testing.T, ctx context.Context) *Runtime {
	t.Helper()
	return tinyRuntime(t, ctx, requireVMHost(t))
}

// TestAdoptVM runs the restart of a server against real VMs: sandboxes
// created detached and released are adopted by a new runtime, which runs
// commands in the one whose VM lives and cleans up the one whose VM died.
func TestAdoptVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rt1 := hostRuntime(t, ctx)
	dd, log := datadir.Default(), testLog(t)

	// Two detached sandboxes, one with an ID of our choosing.
	liveID := "sbxadopt" + NewID()[3:15]
	live, err := rt1.Create(ctx, Spec{ID: liveID, Template: "tiny", Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			live.Destroy(context.Background())
		}
		rt1.Remove(context.Background(), liveID)
	})
	if live.ID != liveID || filepath.Base(live.Dir) != liveID {
		t.Fatalf("sandbox %s in %s, want ID %s", live.ID, live.Dir, liveID)
	}
	if _, err := rt1.Create(ctx, Spec{ID: liveID, Template: "tiny"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Create with a taken ID: got %v, want conflict", err)
	}
	dead, err := rt1.Create(ctx, Spec{Template: "tiny", Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !released {
			dead.Destroy(context.Background())
		}
		rt1.Remove(context.Background(), dead.ID)
	})

	sleep, err := live.Exec(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "1000"}}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	livePID, deadPID := live.Machine().PID(), dead.Machine().PID()
	tpl := live.Template
	live.Release()
	dead.Release()
	released = true

	// The new runtime sweeps at start: a released sandbox whose VM runs
	// stays, however old its directory.
	old := time.Now().Add(-2 * sweepGrace)
	os.Chtimes(live.Dir, old, old)
	rt2, err := New(ctx, Config{Dir: dd, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.Dir); err != nil {
		t.Fatalf("sweep removed a sandbox whose VM runs: %v", err)
	}

	t.Run("adopt running", func(t *testing.T) {
		sb, err := rt2.Adopt(ctx, liveID, Spec{Template: tpl.Digest})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		if sb.Machine().PID() != livePID || sb.Template.Digest != tpl.Digest || sb.Spec.ID != liveID {
			t.Errorf("adopted pid %d template %q id %q, want %d %q %q", sb.Machine().PID(), sb.Template.Digest, sb.Spec.ID, livePID, tpl.Digest, liveID)
		}
		if _, err := rt2.Adopt(ctx, liveID, Spec{}); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("second Adopt: got %v, want conflict", err)
		}
		if err := rt2.Remove(ctx, liveID); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Remove of an adopted sandbox: got %v, want conflict", err)
		}

		// The command started before the release still runs.
		var out bytes.Buffer
		exit := run(ctx, t, sb, &out, "sh", "-c", "kill -0 "+strconv.Itoa(sleep.PID)+" && echo adopted")
		if exit.ExitCode != 0 || strings.TrimSpace(out.String()) != "adopted" {
			t.Fatalf("command in adopted sandbox: exit %+v, output %q", exit, out.String())
		}

		// The new session can join that command and end it.
		p, err := sb.Attach(ctx, sleep.ID, 0, agentclient.Stdio{})
		switch {
		case err != nil && strings.Contains(err.Error(), `unknown operation "attach"`):
			t.Logf("the installed guest agent predates attach: %v", err)
		case err != nil:
			t.Fatalf("attach to the command: %v", err)
		default:
			if err := p.Signal(ctx, "KILL"); err != nil {
				t.Fatal(err)
			}
			exit, err := sb.Wait(p)
			if err != nil || exit.Signal != "KILL" {
				t.Fatalf("attached command ended with %+v, %v; want killed", exit, err)
			}
		}

		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
			t.Errorf("directory left after Destroy: %v", err)
		}
		waitGone(t, livePID)
	})

	t.Run("qemu died", func(t *testing.T) {
		if err := syscall.Kill(deadPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, deadPID)
		_, err := rt2.Adopt(ctx, dead.ID, dead.Spec)
		if !errors.Is(err, vm.ErrNotRunning) || !errors.Is(err, ErrVMExited) {
			t.Fatalf("Adopt of a dead VM: got %v, want not running", err)
		}
		t.Log(err)
		b, _ := os.ReadFile(filepath.Join(dead.Dir, vm.ConsoleLogName))
		if last := lastLine(string(b)); last != "" && !strings.Contains(err.Error(), last) {
			t.Errorf("error does not quote the console's %q: %v", last, err)
		}
		if err := rt2.Remove(ctx, dead.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dead.Dir); !os.IsNotExist(err) {
			t.Errorf("directory left after Remove: %v", err)
		}
	})
}

// run runs argv in sb and returns its exit, with stdout to out.
func run(ctx context.Context, t *testing.T, sb *Sandbox, out *bytes.Buffer, argv ...string) agentproto.Exit {
	t.Helper()
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: argv}, agentclient.Stdio{Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := sb.Wait(p)
	if err != nil {
		t.Fatal(err)
	}
	return exit
}

// waitGone waits until process pid is no longer a running process.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("qemu (pid %d) still runs", pid)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
