package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/vm"
)

func TestRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := record{
		Spec: Spec{ID: "sbxrec", Template: "sha256:" + strings.Repeat("a", 64), VCPUs: 2, MemoryMiB: 256, DiskMiB: 1024,
			Env: map[string]string{"A": "b"}, Detach: true},
		VM: vm.Config{Kernel: "/b/vmlinux", Initramfs: "/b/initramfs.cpio", Accel: vm.AccelTCG, VCPUs: 2, MemoryMiB: 256,
			Disk: dir + "/disk.qcow2", Dir: dir, Detach: true, TSCKHz: 2100000},
	}
	if err := writeRecord(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, want)
	}
	if a, b := strings.Join(vm.Args(got.VM), " "), strings.Join(vm.Args(want.VM), " "); a != b {
		t.Errorf("the recorded VM's command line changed:\n%s\n%s", a, b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != RecordName {
		t.Errorf("directory holds %v, want %s alone", entries, RecordName)
	}
}

func TestRecordRefused(t *testing.T) {
	tests := []struct {
		name    string
		content string // "" writes no record
		class   error
		say     string
	}{
		{"missing", "", errdefs.ErrPrecondition, "no record of its VM"},
		{"garbage", "{", nil, "read vm.json"},
		{"invalid config", `{"spec": {}, "vm": {"accel": "tcg"}}`, errdefs.ErrInvalid, "kernel and initramfs are required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				os.WriteFile(filepath.Join(dir, RecordName), []byte(tc.content), 0o600)
			}
			_, err := readRecord(dir)
			if err == nil || !strings.Contains(err.Error(), tc.say) || tc.class != nil && !errors.Is(err, tc.class) {
				t.Errorf("got %v, want %v saying %q", err, tc.class, tc.say)
			}
		})
	}
}

func TestSuspendedState(t *testing.T) {
	dir := t.TempDir()
	if SuspendedState(dir) {
		t.Fatal("an empty directory holds a saved state")
	}
	// A half-written state is under a temporary name: it does not count.
	os.WriteFile(filepath.Join(dir, "."+StateName+".tmp-123"), []byte("QEVM"), 0o600)
	if SuspendedState(dir) {
		t.Fatal("a temporary state file counts as a saved state")
	}
	os.WriteFile(filepath.Join(dir, StateName), []byte("QEVM"), 0o600)
	if !SuspendedState(dir) {
		t.Fatal("the saved state is not seen")
	}
}

func TestWakeRefuses(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(t *testing.T, dir string)
		class     error
		say       string
		keepState bool
	}{
		{"no directory", func(*testing.T, string) {}, errdefs.ErrNotFound, "does not exist", false},
		{"no saved state", func(t *testing.T, dir string) {
			mkdir(t, dir)
		}, errdefs.ErrPrecondition, "has no saved state to wake from", false},
		{"no record", func(t *testing.T, dir string) {
			mkdir(t, dir)
			os.WriteFile(filepath.Join(dir, StateName), []byte("QEVM"), 0o600)
		}, errdefs.ErrPrecondition, "no record of its VM", true},
		{"owned", func(t *testing.T, dir string) {
			mkdir(t, dir)
			os.WriteFile(filepath.Join(dir, StateName), []byte("QEVM"), 0o600)
			lock, err := lockOwner(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lock.Close() })
		}, errdefs.ErrConflict, "owned by another live process", true},
		{"boot artifacts gone", func(t *testing.T, dir string) {
			mkdir(t, dir)
			os.WriteFile(filepath.Join(dir, StateName), []byte("QEVM"), 0o600)
			writeRecord(dir, record{Spec: Spec{ID: filepath.Base(dir)}, VM: vm.Config{
				Kernel: dir + "/none", Initramfs: dir + "/none", Accel: vm.AccelTCG, VCPUs: 1, MemoryMiB: 128, Dir: dir}})
		}, errdefs.ErrPrecondition, "saved state is kept", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			id := NewID()
			dir := r.cfg.Dir.Sandbox(id)
			tc.setup(t, dir)
			sb, err := r.Wake(t.Context(), id)
			if err == nil {
				sb.Destroy(t.Context())
				t.Fatal("woke a sandbox that cannot be woken")
			}
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.say) {
				t.Errorf("got %v, want %v saying %q", err, tc.class, tc.say)
			}
			if SuspendedState(dir) != tc.keepState {
				t.Errorf("saved state present %v after the failed wake, want %v", SuspendedState(dir), tc.keepState)
			}
			// The lock was let go.
			if _, err := os.Stat(dir); err == nil {
				lock, err := lockOwner(dir)
				if tc.name != "owned" && err != nil {
					t.Errorf("the failed wake kept the owner lock: %v", err)
				}
				if lock != nil {
					lock.Close()
				}
			}
		})
	}
}

// serveStatusQMP answers QMP on dir's socket, one client after another:
// query-status with status, everything else with an empty return.
func serveStatusQMP(t *testing.T, dir, status string) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, vm.QMPSocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				fmt.Fprintln(conn, `{"QMP": {"version": {}, "capabilities": []}}`)
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					var req struct {
						Execute string `json:"execute"`
					}
					json.Unmarshal(sc.Bytes(), &req)
					if req.Execute == "query-status" {
						fmt.Fprintf(conn, `{"return": {"status": %q, "running": false}}`+"\n", status)
						continue
					}
					fmt.Fprintln(conn, `{"return": {}}`)
				}
			}()
		}
	}()
}

func TestAdoptPaused(t *testing.T) {
	tests := []struct {
		name       string
		status     string
		stateFile  bool
		wantPaused bool
		wantErr    []error
		wantKilled bool
	}{
		{"paused", vm.StatusPaused, false, true, nil, false},
		{"saved but not stopped", vm.StatusPostMigrate, true, true, nil, false},
		{"waiting for a restore", vm.StatusInMigrate, true, false, []error{ErrVMExited, vm.ErrNotRunning}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			id := NewID()
			dir := r.cfg.Dir.Sandbox(id)
			mkdir(t, dir)
			cmd := startFakeQEMU(t, dir)
			serveStatusQMP(t, dir, tc.status)
			if tc.stateFile {
				os.WriteFile(filepath.Join(dir, StateName), []byte("QEVM"), 0o600)
			}
			sb, err := r.Adopt(t.Context(), id, Spec{})
			if tc.wantErr != nil {
				if err == nil {
					sb.Release()
					t.Fatal("adopted")
				}
				for _, class := range tc.wantErr {
					if !errors.Is(err, class) {
						t.Errorf("got %v, want %v", err, class)
					}
				}
				if tc.stateFile && !strings.Contains(err.Error(), "saved state remains") {
					t.Errorf("error does not say the saved state remains: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			waitGoneOrNot(t, cmd, tc.wantKilled)
			if tc.wantErr != nil {
				if SuspendedState(dir) != tc.stateFile {
					t.Errorf("saved state present %v, want %v", SuspendedState(dir), tc.stateFile)
				}
				return
			}
			defer sb.Release()
			if sb.Paused() != tc.wantPaused {
				t.Errorf("Paused %v, want %v", sb.Paused(), tc.wantPaused)
			}
			if sb.Agent() != nil {
				t.Error("a paused sandbox was adopted with an agent session")
			}
			if SuspendedState(dir) {
				t.Error("the stale saved state of a live VM was kept")
			}
			_, err = sb.Exec(t.Context(), agentproto.ExecRequest{Argv: []string{"true"}}, agentclient.Stdio{})
			if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "paused") {
				t.Errorf("Exec in a paused sandbox: got %v, want a conflict saying it is paused", err)
			}
			if _, err := sb.Attach(t.Context(), "p1", 0, agentclient.Stdio{}); !errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("Attach in a paused sandbox: got %v, want a conflict", err)
			}
		})
	}
}

// waitGoneOrNot checks whether the fake QEMU was killed.
func waitGoneOrNot(t *testing.T, cmd *exec.Cmd, wantKilled bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for wantKilled && !exited(cmd) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if exited(cmd) != wantKilled {
		t.Errorf("qemu killed %v, want %v", exited(cmd), wantKilled)
	}
}
