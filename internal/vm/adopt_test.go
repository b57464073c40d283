package vm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startFakeQEMU starts a long sleep whose command line names dir's agent
// socket as QEMU's does, and records its pid in dir.
func startFakeQEMU(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := fakeProcess(t, "socket,id=agent,path="+filepath.Join(dir, AgentSocketName)+",server=on,wait=off")
	writePID(t, dir, cmd.Process.Pid)
	// The parent of a vfork'd child runs again before the kernel has set
	// up the new program's arguments, so /proc/<pid>/cmdline can read
	// empty for a moment after Start returns.
	for deadline := time.Now().Add(5 * time.Second); !isQEMUOf(cmd.Process.Pid, dir); {
		if time.Now().After(deadline) {
			t.Fatal("the fake QEMU's command line never showed")
		}
		time.Sleep(time.Millisecond)
	}
	return cmd
}

// fakeProcess starts `sleep 1000` with argv0 as its argv[0]; the test's
// cleanup kills and reaps it.
func fakeProcess(t *testing.T, argv0 string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testenv.Lacking(t, "no sleep binary: %v", err)
	}
	cmd := &exec.Cmd{Path: sleep, Args: []string{argv0, "1000"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func writePID(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, PIDFileName), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitDone(t *testing.T, m *Machine, within time.Duration) {
	t.Helper()
	select {
	case <-m.Done():
	case <-time.After(within):
		t.Fatalf("Done did not close within %s of QEMU's exit", within)
	}
}

func TestAdoptWatchesExit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		usePidfd bool
	}{
		{"pidfd", true},
		{"polling /proc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := startFakeQEMU(t, dir)
			m, err := adopt(dir, testLog(t), tc.usePidfd)
			if err != nil {
				t.Fatal(err)
			}
			if tc.usePidfd && m.pidfd == nil {
				t.Fatal("adopt fell back to polling on a kernel with pidfd_open")
			}
			if m.PID() != cmd.Process.Pid {
				t.Errorf("PID %d, want %d", m.PID(), cmd.Process.Pid)
			}
			if got, want := m.AgentSocket(), filepath.Join(dir, AgentSocketName); got != want {
				t.Errorf("AgentSocket %s, want %s", got, want)
			}
			select {
			case <-m.Done():
				t.Fatal("Done closed while QEMU runs")
			case <-time.After(2 * pollInterval):
			}
			if m.Exited() {
				t.Fatal("Exited while QEMU runs")
			}

			cmd.Process.Kill() // not reaped: a zombie must count as exited
			waitDone(t, m, 5*time.Second)
			if !m.Exited() {
				t.Error("not Exited after Done closed")
			}
			if err := m.ExitError(); err == nil || !strings.Contains(err.Error(), "exited") {
				t.Errorf("ExitError %v, want one saying QEMU exited", err)
			}
		})
	}
}

func TestAdoptRefuses(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		console string
		want    string
	}{
		{"no pid file", func(*testing.T, string) {}, "", "no qemu process is recorded"},
		{"garbage pid file", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, PIDFileName), []byte("qemu\n"), 0o600)
		}, "", `holds "qemu"`},
		{"process exited", func(t *testing.T, dir string) {
			cmd := startFakeQEMU(t, dir)
			cmd.Process.Kill()
			cmd.Wait()
		}, "[    1.5] Kernel panic - not syncing: Attempted to kill init!\n", "has exited"},
		{"zombie", func(t *testing.T, dir string) {
			cmd := startFakeQEMU(t, dir)
			cmd.Process.Kill()
			waitZombie(t, cmd.Process.Pid)
		}, "", "has exited"},
		{"recycled pid", func(t *testing.T, dir string) {
			writePID(t, dir, fakeProcess(t, "sleep").Process.Pid)
		}, "", "has exited"},
		{"another VM's qemu", func(t *testing.T, dir string) {
			other := t.TempDir()
			writePID(t, dir, startFakeQEMU(t, other).Process.Pid)
		}, "", "has exited"},
		{"socket path prefix", func(t *testing.T, dir string) {
			writePID(t, dir, fakeProcess(t, "path="+filepath.Join(dir, AgentSocketName)+".old").Process.Pid)
		}, "", "has exited"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			if tc.console != "" {
				os.WriteFile(filepath.Join(dir, ConsoleLogName), []byte(tc.console), 0o600)
			}
			for _, usePidfd := range []bool{true, false} {
				m, err := adopt(dir, testLog(t), usePidfd)
				if err == nil {
					m.Release()
					t.Fatalf("pidfd %v: adopted a QEMU that is not running", usePidfd)
				}
				if !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("pidfd %v: got %v, want ErrNotRunning saying %q", usePidfd, err, tc.want)
				}
				if c := strings.TrimSpace(tc.console); c != "" && !strings.Contains(err.Error(), c) {
					t.Errorf("pidfd %v: error does not quote the console: %v", usePidfd, err)
				}
			}
			if _, err := RunningPID(dir); !errors.Is(err, ErrNotRunning) {
				t.Errorf("RunningPID: got %v, want ErrNotRunning", err)
			}
		})
	}
}

// waitZombie waits until pid has exited but is not reaped.
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d did not become a zombie", pid)
}

// fakeQMP serves QEMU's machine protocol on dir's QMP socket to one client
// at a time: it answers every command, and on "quit" runs quit. Commands
// received are sent to cmds; a client's disconnection to closed.
type fakeQMP struct {
	cmds   chan string
	closed chan struct{}
}

func serveFakeQMP(t *testing.T, dir string, quit func()) *fakeQMP {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, QMPSocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f := &fakeQMP{cmds: make(chan string, 16), closed: make(chan struct{}, 4)}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(conn, `{"QMP": {"version": {}, "capabilities": []}}`)
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				var req struct {
					Execute string `json:"execute"`
				}
				json.Unmarshal(sc.Bytes(), &req)
				f.cmds <- req.Execute
				fmt.Fprintln(conn, `{"return": {}}`)
				if req.Execute == "quit" {
					quit()
				}
			}
			conn.Close()
			f.closed <- struct{}{}
		}
	}()
	return f
}

func TestAdoptStop(t *testing.T) {
	tests := []struct {
		name     string
		qmp      bool
		wantQuit bool
	}{
		{"quit over QMP", true, true},
		{"kill without QMP", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := startFakeQEMU(t, dir)
			var q *fakeQMP
			if tc.qmp {
				q = serveFakeQMP(t, dir, func() { cmd.Process.Signal(os.Interrupt) })
			}
			m, err := Adopt(dir, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			if err := m.Stop(t.Context()); err != nil {
				t.Fatal(err)
			}
			if !m.Exited() {
				t.Error("Stop returned before QEMU exited")
			}
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if !errors.As(err, &ee) {
					t.Fatalf("fake QEMU: %v", err)
				}
				sig := ee.Sys().(syscall.WaitStatus).Signal()
				if quit := sig == syscall.SIGINT; quit != tc.wantQuit {
					t.Errorf("QEMU ended by %v; want quit over QMP %v", sig, tc.wantQuit)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("QEMU still runs after Stop")
			}
			if q != nil {
				if got := drain(q.cmds); strings.Join(got, " ") != "qmp_capabilities quit" {
					t.Errorf("QMP commands %q, want capabilities then quit", got)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, PIDFileName)); !os.IsNotExist(err) {
				t.Errorf("pid file left after Stop: %v", err)
			}
		})
	}
}

func drain(c chan string) []string {
	var out []string
	for {
		select {
		case s := <-c:
			out = append(out, s)
		default:
			return out
		}
	}
}

func TestAdoptRelease(t *testing.T) {
	dir := t.TempDir()
	cmd := startFakeQEMU(t, dir)
	q := serveFakeQMP(t, dir, func() {})
	m, err := Adopt(dir, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	m.Release()
	select {
	case <-q.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Release did not close the QMP connection")
	}
	// A later process can adopt the VM in turn.
	m2, err := Adopt(dir, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if m2.qmp == nil {
		t.Fatal("the second adopter got no QMP connection")
	}
	// The released machine watches no more; the new one sees the exit.
	cmd.Process.Kill()
	waitDone(t, m2, 5*time.Second)
	select {
	case <-m.Done():
		t.Error("a released machine's Done closed")
	case <-time.After(2 * pollInterval):
	}
}
