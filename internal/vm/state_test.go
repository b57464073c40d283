package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// qmpCall is one command a scriptedQMP received.
type qmpCall struct {
	Cmd  string
	Args map[string]any
	// File is the descriptor passed with the command, if any.
	File *os.File
}

// qmpReply is a scripted answer: a return value, or a QMP error when Err is
// set; Hangup closes the connection instead of answering.
type qmpReply struct {
	Return any
	Err    string
	Hangup bool
}

// scriptedQMP serves QMP on a unix socket to one client and answers every
// command with what its handler returns. Descriptors passed with a command
// (SCM_RIGHTS) are handed to the handler.
type scriptedQMP struct {
	mu    sync.Mutex // guards calls
	calls []string
}

func serveScriptedQMP(t *testing.T, path string, handle func(c qmpCall) qmpReply) *scriptedQMP {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedQMP{}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintln(conn, `{"QMP": {"version": {}, "capabilities": []}}`)
		var buf []byte
		var fds []int
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		b := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(4*4))
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(b, oob)
			if err != nil {
				return
			}
			buf = append(buf, b[:n]...)
			if oobn > 0 {
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				for _, m := range msgs {
					got, _ := unix.ParseUnixRights(&m)
					fds = append(fds, got...)
				}
			}
			for {
				i := bytes.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				line := buf[:i]
				buf = buf[i+1:]
				var req struct {
					Execute   string         `json:"execute"`
					Arguments map[string]any `json:"arguments"`
				}
				if err := json.Unmarshal(line, &req); err != nil {
					t.Errorf("fake QMP got %q: %v", line, err)
					return
				}
				c := qmpCall{Cmd: req.Execute, Args: req.Arguments}
				if len(fds) > 0 {
					c.File = os.NewFile(uintptr(fds[0]), "passed")
					fds = fds[1:]
				}
				s.mu.Lock()
				s.calls = append(s.calls, c.Cmd)
				s.mu.Unlock()
				var r qmpReply
				if c.Cmd != "qmp_capabilities" {
					r = handle(c)
				}
				if c.File != nil {
					c.File.Close()
				}
				if r.Hangup {
					return
				}
				msg := map[string]any{"return": r.Return}
				if r.Return == nil {
					msg["return"] = map[string]any{}
				}
				if r.Err != "" {
					msg = map[string]any{"error": map[string]any{"class": "GenericError", "desc": r.Err}}
				}
				out, _ := json.Marshal(msg)
				// An event first: the client must skip it.
				fmt.Fprintln(conn, `{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 0}}`)
				conn.Write(append(out, '\n'))
			}
		}
	}()
	return s
}

// commands returns the commands received so far, without the handshake,
// repeated polls collapsed into one.
func (s *scriptedQMP) commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		if c == "qmp_capabilities" {
			continue
		}
		if len(out) > 0 && out[len(out)-1] == c && strings.HasPrefix(c, "query-") {
			continue
		}
		out = append(out, c)
	}
	return out
}

// scriptedMachine is a Machine whose QEMU is this test process and whose
// QMP socket is served by handle.
func scriptedMachine(t *testing.T, handle func(c qmpCall) qmpReply) (*Machine, *scriptedQMP) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, QMPSocketName)
	s := serveScriptedQMP(t, path, handle)
	q, err := DialQMP(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	self, _ := os.FindProcess(os.Getpid())
	m := &Machine{cfg: Config{Dir: dir}, log: testLog(t), proc: self, qmp: q, done: make(chan struct{}), released: make(chan struct{})}
	return m, s
}

func statusReply(st string) qmpReply {
	return qmpReply{Return: map[string]any{"status": st, "running": st == StatusRunning}}
}

func TestPauseResumeStatus(t *testing.T) {
	st := StatusRunning
	m, s := scriptedMachine(t, func(c qmpCall) qmpReply {
		switch c.Cmd {
		case "stop":
			st = StatusPaused
		case "cont":
			st = StatusRunning
		case "query-status":
			return statusReply(st)
		}
		return qmpReply{}
	})
	ctx := t.Context()
	check := func(want string) {
		t.Helper()
		got, err := m.Status(ctx)
		if err != nil || got != want {
			t.Fatalf("Status = %q, %v; want %q", got, err, want)
		}
	}
	check(StatusRunning)
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	check(StatusPaused)
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	check(StatusRunning)
	if got, want := strings.Join(s.commands(), " "), "query-status stop query-status cont query-status"; got != want {
		t.Errorf("commands %q, want %q", got, want)
	}
}

func TestResizeDisk(t *testing.T) {
	var got map[string]any
	m, s := scriptedMachine(t, func(c qmpCall) qmpReply {
		if c.Cmd == "block_resize" {
			got = c.Args
		}
		return qmpReply{}
	})
	ctx := t.Context()
	if err := m.ResizeDisk(ctx, 100<<20); err != nil {
		t.Fatal(err)
	}
	if got["device"] != rootDrive || got["size"] != float64(100<<20) {
		t.Errorf("block_resize %v, want device %q size %d", got, rootDrive, 100<<20)
	}
	if err := m.ResizeDisk(ctx, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("resize to 0: got %v, want invalid", err)
	}
	if got, want := strings.Join(s.commands(), " "), "block_resize"; got != want {
		t.Errorf("commands %q, want %q", got, want)
	}
}

func TestControlRefused(t *testing.T) {
	self, _ := os.FindProcess(os.Getpid())
	noQMP := &Machine{proc: self, done: make(chan struct{})}
	exited := &Machine{proc: self, done: make(chan struct{})}
	close(exited.done)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		m    *Machine
		want error
	}{
		{"no QMP", noQMP, errdefs.ErrUnavailable},
		{"exited", exited, ErrNotRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for op, err := range map[string]error{
				"pause":   tc.m.Pause(ctx),
				"resume":  tc.m.Resume(ctx),
				"save":    tc.m.SaveState(ctx, filepath.Join(t.TempDir(), "state"), false),
				"restore": tc.m.RestoreState(ctx, filepath.Join(t.TempDir(), "state"), false),
				"resize":  tc.m.ResizeDisk(ctx, 1<<20),
			} {
				if !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want %v", op, err, tc.want)
				}
			}
			if _, err := tc.m.Status(ctx); !errors.Is(err, tc.want) {
				t.Errorf("status: got %v, want %v", err, tc.want)
			}
		})
	}
}

// migrateScript answers a save: the VM starts in status start; getfd's
// descriptor receives the stream, written when migrate runs; query-migrate
// reports polls times "active" and then final.
type migrateScript struct {
	start      string
	polls      int
	final      map[string]any
	stream     string
	ignoreSeen []bool
	cancelled  bool
}

func (ms *migrateScript) handle(t *testing.T) func(c qmpCall) qmpReply {
	var fd *os.File
	return func(c qmpCall) qmpReply {
		switch c.Cmd {
		case "query-status":
			return statusReply(ms.start)
		case "stop":
			ms.start = StatusPaused
		case "migrate-set-capabilities":
			caps := c.Args["capabilities"].([]any)
			cp := caps[0].(map[string]any)
			if cp["capability"] != "x-ignore-shared" {
				t.Errorf("capability %v, want x-ignore-shared", cp["capability"])
			}
			ms.ignoreSeen = append(ms.ignoreSeen, cp["state"].(bool))
		case "getfd":
			if c.Args["fdname"] != migrationFD || c.File == nil {
				t.Errorf("getfd %v with file %v", c.Args, c.File)
				return qmpReply{Err: "no fd"}
			}
			f, err := dupFile(c.File)
			if err != nil {
				t.Error(err)
			}
			fd = f
		case "migrate":
			if c.Args["uri"] != "fd:"+migrationFD {
				t.Errorf("migrate to %v", c.Args["uri"])
			}
			if fd != nil {
				io.WriteString(fd, ms.stream)
				fd.Close()
			}
		case "query-migrate":
			if ms.polls > 0 {
				ms.polls--
				return qmpReply{Return: map[string]any{"status": "active"}}
			}
			return qmpReply{Return: ms.final}
		case "migrate_cancel":
			ms.cancelled = true
		}
		return qmpReply{}
	}
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func TestSaveState(t *testing.T) {
	completed := map[string]any{"status": "completed"}
	tests := []struct {
		name         string
		script       migrateScript
		ignoreShared bool
		timeout      time.Duration
		wantCmds     string
		wantErr      string
		wantClass    error
	}{
		{
			name:     "running",
			script:   migrateScript{start: StatusRunning, polls: 3, final: completed, stream: "QEVM state"},
			wantCmds: "query-status stop migrate-set-capabilities migrate-set-parameters getfd migrate query-migrate",
		},
		{
			name:         "paused, shared memory left out",
			script:       migrateScript{start: StatusPaused, final: completed, stream: "QEVM small"},
			ignoreShared: true,
			wantCmds:     "query-status migrate-set-capabilities migrate-set-parameters getfd migrate query-migrate",
		},
		{
			name:     "migration fails",
			script:   migrateScript{start: StatusPaused, polls: 1, final: map[string]any{"status": "failed", "error-desc": "Unable to write to file: No space left on device"}, stream: "QEVM half"},
			wantCmds: "query-status migrate-set-capabilities migrate-set-parameters getfd migrate query-migrate",
			wantErr:  "No space left on device",
		},
		{
			name:     "deadline",
			script:   migrateScript{start: StatusPaused, polls: 1 << 30, stream: "QEVM half"},
			timeout:  200 * time.Millisecond,
			wantCmds: "query-status migrate-set-capabilities migrate-set-parameters getfd migrate query-migrate migrate_cancel",
			wantErr:  "context deadline exceeded",
		},
		{
			name:      "waiting for a restore",
			script:    migrateScript{start: StatusInMigrate},
			wantCmds:  "query-status",
			wantClass: errdefs.ErrConflict,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := tc.script
			m, s := scriptedMachine(t, ms.handle(t))
			dir := t.TempDir()
			path := filepath.Join(dir, "state.mig")
			ctx := t.Context()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			err := m.SaveState(ctx, path, tc.ignoreShared)
			if got := strings.Join(s.commands(), " "); got != tc.wantCmds {
				t.Errorf("commands %q,\nwant     %q", got, tc.wantCmds)
			}
			entries, _ := os.ReadDir(dir)
			if tc.wantErr == "" && tc.wantClass == nil {
				if err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(path)
				if err != nil || string(b) != ms.stream {
					t.Errorf("state file holds %q, %v; want %q", b, err, ms.stream)
				}
				if len(entries) != 1 {
					t.Errorf("directory holds %d files, want the state alone", len(entries))
				}
				if want := []bool{tc.ignoreShared}; fmt.Sprint(ms.ignoreSeen) != fmt.Sprint(want) {
					t.Errorf("x-ignore-shared set to %v, want %v", ms.ignoreSeen, want)
				}
				return
			}
			if err == nil {
				t.Fatal("SaveState succeeded")
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
			if tc.wantClass != nil && !errors.Is(err, tc.wantClass) {
				t.Errorf("error %v, want %v", err, tc.wantClass)
			}
			if len(entries) != 0 {
				t.Errorf("a failed save left %s", entries[0].Name())
			}
			if tc.timeout > 0 && !ms.cancelled {
				t.Error("the migration was not cancelled")
			}
		})
	}
}

// restoreScript answers a restore: query-status says start until
// migrate-incoming, which reads the stream from getfd's descriptor; then
// inmigrate polls times, then after; query-migrate reports final. exit
// makes QEMU die at migrate-incoming, with exit in its log file.
type restoreScript struct {
	start string
	polls int
	after string
	final map[string]any
	exit  string
	read  string
}

func TestRestoreState(t *testing.T) {
	completed := map[string]any{"status": "completed"}
	tests := []struct {
		name      string
		script    restoreScript
		wantCmds  string
		wantErr   string
		wantClass error
	}{
		{
			name:     "restored",
			script:   restoreScript{start: StatusInMigrate, polls: 3, after: StatusPaused, final: completed},
			wantCmds: "query-status migrate-set-capabilities getfd migrate-incoming query-status query-migrate",
		},
		{
			name:      "not incoming",
			script:    restoreScript{start: StatusRunning},
			wantCmds:  "query-status",
			wantClass: errdefs.ErrConflict,
		},
		{
			name:     "migration failed",
			script:   restoreScript{start: StatusInMigrate, after: StatusPaused, final: map[string]any{"status": "failed", "error-desc": "bad section"}},
			wantCmds: "query-status migrate-set-capabilities getfd migrate-incoming query-status query-migrate",
			wantErr:  "bad section",
		},
		{
			name:      "qemu exits",
			script:    restoreScript{start: StatusInMigrate, polls: 1 << 30, exit: "qemu-system-x86_64: Length mismatch: mem: 0x10000000 in != 0x20000000: Invalid argument"},
			wantCmds:  "query-status migrate-set-capabilities getfd migrate-incoming",
			wantErr:   "Length mismatch",
			wantClass: ErrNotRunning,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := tc.script
			var m *Machine
			var fd *os.File
			incoming := false
			handle := func(c qmpCall) qmpReply {
				switch c.Cmd {
				case "query-status":
					if !incoming {
						return statusReply(rs.start)
					}
					if rs.polls > 0 {
						rs.polls--
						return statusReply(StatusInMigrate)
					}
					return statusReply(rs.after)
				case "getfd":
					if c.Args["fdname"] != migrationFD || c.File == nil {
						t.Errorf("getfd %v with file %v", c.Args, c.File)
					}
					f, err := dupFile(c.File)
					if err != nil {
						t.Error(err)
					}
					fd = f
				case "migrate-incoming":
					if c.Args["uri"] != "fd:"+migrationFD {
						t.Errorf("migrate-incoming from %v", c.Args["uri"])
					}
					incoming = true
					b, _ := io.ReadAll(fd)
					fd.Close()
					rs.read = string(b)
					if rs.exit != "" {
						os.WriteFile(filepath.Join(m.cfg.Dir, QEMULogName), []byte(rs.exit+"\n"), 0o600)
						close(m.done)
						return qmpReply{Hangup: true}
					}
				case "query-migrate":
					return qmpReply{Return: rs.final}
				}
				return qmpReply{}
			}
			m, s := scriptedMachine(t, handle)
			path := filepath.Join(t.TempDir(), "state.mig")
			os.WriteFile(path, []byte("QEVM saved"), 0o600)
			err := m.RestoreState(t.Context(), path, false)
			if got := strings.Join(s.commands(), " "); got != tc.wantCmds {
				t.Errorf("commands %q,\nwant     %q", got, tc.wantCmds)
			}
			if tc.wantErr == "" && tc.wantClass == nil {
				if err != nil {
					t.Fatal(err)
				}
				if rs.read != "QEVM saved" {
					t.Errorf("QEMU read %q from the passed file", rs.read)
				}
				return
			}
			if err == nil {
				t.Fatal("RestoreState succeeded")
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
			if tc.wantClass != nil && !errors.Is(err, tc.wantClass) {
				t.Errorf("error %v, want %v", err, tc.wantClass)
			}
		})
	}
}

// SettleSave cancels a save another process left running and lets the
// machine run again; it resumes one a finished save left in postmigrate;
// and it leaves alone a machine no save touched, paused or not, and one
// waiting for a restore.
func TestSettleSave(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    string // the run state found
		migration string // query-migrate's status found
		found     bool
		commands  string
	}{
		{"save under way", StatusPaused, "active", true, "query-status query-migrate migrate_cancel query-migrate query-status cont"},
		{"save finished", StatusPostMigrate, "completed", true, "query-status query-migrate query-status cont"},
		{"paused by its user", StatusPaused, "", false, "query-status query-migrate"},
		{"a clone restored long ago", StatusPaused, "completed", false, "query-status query-migrate"},
		{"running", StatusRunning, "", false, "query-status query-migrate"},
		{"waiting for a restore", StatusInMigrate, "active", false, "query-status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, mig := tc.status, tc.migration
			m, s := scriptedMachine(t, func(c qmpCall) qmpReply {
				switch c.Cmd {
				case "query-status":
					return statusReply(st)
				case "query-migrate":
					if mig == "" {
						return qmpReply{Return: map[string]any{}}
					}
					return qmpReply{Return: map[string]any{"status": mig}}
				case "migrate_cancel":
					mig = "cancelled"
				case "cont":
					st = StatusRunning
				}
				return qmpReply{}
			})
			found, err := m.SettleSave(t.Context())
			if err != nil || found != tc.found {
				t.Errorf("SettleSave = %v, %v; want %v", found, err, tc.found)
			}
			if got := strings.Join(s.commands(), " "); got != tc.commands {
				t.Errorf("commands %q, want %q", got, tc.commands)
			}
		})
	}
}
