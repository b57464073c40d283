// Package e2e holds the end-to-end tests: they boot real VMs from the set-up
// data directory and drive them through the runtime and the airlock binary.
// Nothing in them is faked. Run them with `make e2e` (which runs setup
// first); AIRLOCK_BIN names the directory holding the built binaries.
package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/testenv"
)

var (
	rtOnce sync.Once
	rt     *sandbox.Runtime
	rtErr  error
)

func dataDir() datadir.Dir { return datadir.Default() }

// TestMain clears what killed runs of earlier test sessions left, so that
// the checks for leftovers see only this session's.
func TestMain(m *testing.M) {
	sandbox.Sweep(dataDir(), slog.New(slog.DiscardHandler))
	code := m.Run()
	serversMu.Lock()
	for _, s := range allServers {
		s.cleanup()
	}
	serversMu.Unlock()
	for _, f := range laterCleanups {
		f()
	}
	testenv.StopSharedPostgres()
	os.Exit(code)
}

// runtime returns the runtime shared by all tests.
func runtime(t *testing.T) *sandbox.Runtime {
	t.Helper()
	rtOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rt, rtErr = sandbox.New(ctx, sandbox.Config{Dir: dataDir(), Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	})
	if rtErr != nil {
		t.Fatalf("runtime: %v (run `make setup` first)", rtErr)
	}
	return rt
}

// newSandbox boots a sandbox for one test and checks, when the test ends,
// that destroying it left no process or file behind.
func newSandbox(t *testing.T, spec sandbox.Spec) *sandbox.Sandbox {
	t.Helper()
	if spec.Template == "" {
		spec.Template = "tiny"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := runtime(t).Create(ctx, spec)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		pid := sb.Machine().PID()
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroy: %v", err)
		}
		checkGone(t, sb.Dir, pid)
	})
	return sb
}

// checkGone fails the test if the sandbox's directory or QEMU process
// survived.
func checkGone(t *testing.T, dir string, pid int) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox directory %s left behind (%v)", dir, err)
	}
	if pid > 0 && testenv.ProcessAlive(pid) {
		t.Errorf("QEMU process %d left running", pid)
	}
}

type result struct {
	stdout, stderr string
	exit           agentproto.Exit
}

func execIn(t *testing.T, sb *sandbox.Sandbox, req agentproto.ExecRequest, stdin io.Reader) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	p, err := sb.Exec(ctx, req, agentclient.Stdio{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %v: %v", req, err)
	}
	exit, err := sb.Wait(p)
	if err != nil {
		t.Fatalf("wait %v: %v", req, err)
	}
	return result{out.String(), errb.String(), exit}
}

func sh(t *testing.T, sb *sandbox.Sandbox, cmd string) string {
	t.Helper()
	r := execIn(t, sb, agentproto.ExecRequest{Cmd: cmd}, nil)
	if r.exit.ExitCode != 0 {
		t.Fatalf("%q exited %d: %s", cmd, r.exit.ExitCode, r.stderr)
	}
	return r.stdout
}

// --- the airlock binary ---

func airlockBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AIRLOCK_BIN")
	if dir == "" {
		dir = "../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, "airlock"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("airlock binary: %v (run `make build`)", err)
	}
	return p
}

type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the airlock binary and checks that it left no sandbox behind.
func runCLI(t *testing.T, env []string, stdin io.Reader, args ...string) cliResult {
	t.Helper()
	before := sandboxDirs(t)
	cmd := exec.Command(airlockBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run airlock: %v", err)
	}
	if after := sandboxDirs(t); after != before {
		t.Errorf("airlock %v left sandbox directories: before %q, after %q", args, before, after)
	}
	return cliResult{out.String(), errb.String(), code}
}

func sandboxDirs(t *testing.T) string {
	entries, err := os.ReadDir(dataDir().Sandboxes())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}

func TestCLIExitCodesAndStreams(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantOut    string
		wantErr    string
		wantCode   int
		errMatches string
	}{
		{name: "success", args: []string{"--", "echo", "hello"}, wantOut: "hello\n"},
		{name: "exit code and separate streams", args: []string{"--", "sh", "-c", "echo out; echo err >&2; exit 42"}, wantOut: "out\n", wantErr: "err\n", wantCode: 42},
		{name: "killed by a signal", args: []string{"--", "sh", "-c", "kill -KILL $$"}, wantCode: 128 + 9},
		{name: "stdin", args: []string{"-i", "--", "sh", "-c", "tr a-z A-Z"}, stdin: "shout\n", wantOut: "SHOUT\n"},
		{name: "env and workdir", args: []string{"-e", "A=1", "-e", "B=two words", "-w", "/etc", "--", "sh", "-c", `echo "$A $B $(pwd)"`}, wantOut: "1 two words /etc\n"},
		{name: "user", args: []string{"-u", "nobody", "--", "id", "-u"}, wantOut: "65534\n"},
		{name: "timeout", args: []string{"--timeout", "1s", "--", "sleep", "60"}, wantCode: 128 + 9, errMatches: "timed out"},
		{name: "command not found", args: []string{"--", "no-such-command"}, wantCode: 127, errMatches: "command not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--template", "tiny"}, tc.args...)
			r := runCLI(t, nil, strings.NewReader(tc.stdin), args...)
			if r.code != tc.wantCode || r.stdout != tc.wantOut {
				t.Fatalf("got code %d stdout %q stderr %q; want code %d stdout %q", r.code, r.stdout, r.stderr, tc.wantCode, tc.wantOut)
			}
			if tc.errMatches != "" {
				if !strings.Contains(r.stderr, tc.errMatches) {
					t.Fatalf("stderr %q does not mention %q", r.stderr, tc.errMatches)
				}
			} else if r.stderr != tc.wantErr {
				t.Fatalf("stderr %q, want %q", r.stderr, tc.wantErr)
			}
		})
	}
}

func TestCLIBadInput(t *testing.T) {
	empty := t.TempDir()
	tests := []struct {
		name  string
		env   []string
		args  []string
		match string
	}{
		{"unknown template", nil, []string{"run", "--template", "nope", "--", "true"}, "not found"},
		{"malformed template", nil, []string{"run", "--template", "Bad Ref!", "--", "true"}, `template ref "Bad Ref!": name must be`},
		{"too many vcpus", nil, []string{"run", "--template", "tiny", "--vcpus", "1000", "--", "true"}, "vcpus 1000 is out of bounds"},
		{"too little memory", nil, []string{"run", "--template", "tiny", "--memory", "1", "--", "true"}, "memory 1 MiB is out of bounds"},
		{"disk smaller than the template", nil, []string{"run", "--template", "tiny", "--disk", "1", "--", "true"}, "disk 1 MiB is out of bounds"},
		{"no command", nil, []string{"run", "--template", "tiny"}, "give a command"},
		{"bad env", nil, []string{"run", "-e", "NOEQUALS", "--", "true"}, "KEY=VALUE"},
		{"bad accel", nil, []string{"run", "--accel", "warp", "--", "true"}, `accelerator "warp" is not kvm, tcg or auto`},
		{"unknown flag", nil, []string{"run", "--bogus", "--", "true"}, "bogus"},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command"},
		{"setup not run", []string{"AIRLOCK_HOME=" + empty}, []string{"run", "--", "true"}, "airlock setup"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, tc.env, nil, tc.args...)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != 2 || !strings.Contains(r.stderr, tc.match) || len(lines) != 1 {
				t.Fatalf("got code %d stderr %q; want code 2 and one line mentioning %q", r.code, r.stderr, tc.match)
			}
		})
	}
	if entries, _ := os.ReadDir(empty); len(entries) > 0 {
		t.Errorf("a failed run created files in an empty data directory: %v", entries)
	}
}

func TestCLIMissingArtifacts(t *testing.T) {
	// A copy of the data directory with one artifact removed.
	for name, remove := range map[string]string{"kernel": "boot/vmlinux", "template image": "templates/sha256-*.ext4"} {
		t.Run(name, func(t *testing.T) {
			home := shortTempDir(t)
			src := dataDir()
			for _, sub := range []string{"boot", "templates", "accel.json"} {
				if err := exec.Command("cp", "-a", filepath.Join(src.Root, sub), home).Run(); err != nil {
					t.Fatal(err)
				}
			}
			matches, _ := filepath.Glob(filepath.Join(home, remove))
			if len(matches) == 0 {
				t.Fatalf("nothing matches %s", remove)
			}
			for _, m := range matches {
				os.Remove(m)
			}
			r := runCLI(t, []string{"AIRLOCK_HOME=" + home}, nil, "run", "--template", "tiny", "--", "true")
			if r.code != 2 || !strings.Contains(r.stderr, "airlock setup") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("got code %d stderr %q", r.code, r.stderr)
			}
			if entries, _ := os.ReadDir(filepath.Join(home, "sandboxes")); len(entries) > 0 {
				t.Fatalf("a sandbox was left: %v", entries)
			}
		})
	}
}

// shortTempDir is a temporary directory with a short path, as unix socket
// paths are limited to 107 bytes.
func shortTempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestCLISignalIsForwarded(t *testing.T) {
	cmd, stdout := startReady(t, "trap 'echo got TERM; exit 5' TERM; echo ready; while :; do sleep 0.1; done")
	cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(stdout)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 || !strings.Contains(string(rest), "got TERM") {
		t.Fatalf("after SIGTERM: err %v output %q", err, rest)
	}
}

func TestCLIKeep(t *testing.T) {
	cmd := exec.Command(airlockBin(t), "run", "--template", "tiny", "--keep", "--", "sh", "-c", "echo kept > /root/mark")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run --keep: %v: %s", err, out)
	}
	var id string
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "airlock: kept sandbox %s (VM pid %d,", &id, &pid); err != nil {
		t.Fatalf("parse %q: %v", out, err)
	}
	dir := dataDir().Sandbox(id)
	defer func() {
		syscall.Kill(pid, syscall.SIGKILL)
		testenv.Eventually(t, 10*time.Second, "the kept VM gone", func() (bool, string) {
			return !testenv.ProcessAlive(pid), fmt.Sprintf("QEMU %d is alive", pid)
		})
		os.RemoveAll(dir)
	}()
	if !testenv.ProcessAlive(pid) {
		t.Fatalf("kept VM %d is not running", pid)
	}
	// The kept sandbox still answers, with what the command left in it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := net.Dial("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentclient.Handshake(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mark bytes.Buffer
	if _, err := c.ReadFile(ctx, "/root/mark", &mark); err != nil || mark.String() != "kept\n" {
		t.Fatalf("read /root/mark of the kept sandbox: %q %v", mark.String(), err)
	}
}

// --- the runtime, on real VMs ---

func TestOutputOrderAndSeparation(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	// A 1 MiB file of numbered lines, then 50 numbered copies of it on
	// stdout, and 5 on stderr, interleaved.
	var block bytes.Buffer
	for i := 0; block.Len() < 1<<20-16; i++ {
		fmt.Fprintf(&block, "%07d abcdefghijklmnopqrstuvwxyz\n", i)
	}
	if err := sb.Agent().WriteFile(ctx, "/root/block", 0o644, bytes.NewReader(block.Bytes())); err != nil {
		t.Fatal(err)
	}
	r := execIn(t, sb, agentproto.ExecRequest{Cmd: `for i in $(seq 1 50); do echo "block $i"; cat /root/block; if [ $((i % 10)) = 0 ]; then echo "err $i" >&2; cat /root/block >&2; fi; done`}, nil)
	var wantOut, wantErr bytes.Buffer
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&wantOut, "block %d\n", i)
		wantOut.Write(block.Bytes())
		if i%10 == 0 {
			fmt.Fprintf(&wantErr, "err %d\n", i)
			wantErr.Write(block.Bytes())
		}
	}
	if r.exit.ExitCode != 0 || len(r.stdout) != wantOut.Len() || r.stdout != wantOut.String() || r.stderr != wantErr.String() {
		t.Fatalf("exit %+v: stdout %d bytes (want %d, equal %v), stderr %d bytes (want %d, equal %v)",
			r.exit, len(r.stdout), wantOut.Len(), r.stdout == wantOut.String(), len(r.stderr), wantErr.Len(), r.stderr == wantErr.String())
	}
}

func TestPTYAndResize(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	var out safeBuffer
	p, err := sb.Exec(ctx, agentproto.ExecRequest{
		Cmd:   `tty; stty size; trap 'stty size; exit 9' WINCH; echo ready; read line; echo "read: $line"; while :; do sleep 0.1; done`,
		PTY:   &agentproto.PTY{Rows: 24, Cols: 80},
		Stdin: true,
	}, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if err := p.WriteStdin([]byte("typed\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "read: typed") })
	if err := p.Resize(ctx, 40, 120); err != nil {
		t.Fatal(err)
	}
	exit, err := sb.Wait(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if exit.ExitCode != 9 || !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "24 80") || !strings.Contains(got, "40 120") {
		t.Fatalf("exit %+v output %q", exit, got)
	}
}

func TestSignalsAndTimeout(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	var out safeBuffer
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: `sleep 300 & echo ready; wait`}, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if err := p.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	exit, err := sb.Wait(p)
	if err != nil || exit.Signal != "TERM" || exit.ExitCode != 128+15 {
		t.Fatalf("after TERM: %+v %v", exit, err)
	}
	// The signal went to the whole group: the background sleep is gone too.
	if ps := sh(t, sb, "ps -o comm | grep -c '^sleep' || true"); strings.TrimSpace(ps) != "0" {
		t.Fatalf("sleep survived the group signal: %q", ps)
	}

	start := time.Now()
	r := execIn(t, sb, agentproto.ExecRequest{Cmd: "sleep 300 & sleep 300", TimeoutMS: 1500}, nil)
	if !r.exit.TimedOut || r.exit.Signal != "KILL" {
		t.Fatalf("timeout: %+v", r.exit)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	if ps := sh(t, sb, "ps -o comm | grep -c '^sleep' || true"); strings.TrimSpace(ps) != "0" {
		t.Fatalf("a process of the timed-out group survived: %q", ps)
	}
}

func TestGuestIdentityAndClock(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{Env: map[string]string{"SANDBOX_VAR": "set"}})
	out := sh(t, sb, `hostname; date +%s; echo $SANDBOX_VAR; cat /proc/sys/kernel/random/uuid; mount | grep -c -E ' on /(proc|sys|dev|tmp) '`)
	f := strings.Fields(out)
	if len(f) != 5 {
		t.Fatalf("output %q", out)
	}
	if f[0] != sb.ID {
		t.Errorf("hostname %q, want %q", f[0], sb.ID)
	}
	guestNow, _ := strconv.ParseInt(f[1], 10, 64)
	if d := time.Now().Unix() - guestNow; d < -2 || d > 5 {
		t.Errorf("guest clock is %d s off", d)
	}
	if f[2] != "set" {
		t.Errorf("default env: %q", f[2])
	}
	if f[4] != "4" {
		t.Errorf("mounts of /proc /sys /dev /tmp: %q", f[4])
	}
}

func TestFileRoundTrips(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{DiskMiB: 512})
	ctx := context.Background()
	c := sb.Agent()

	// Every byte value, in a name with spaces and non-ASCII letters.
	bin := make([]byte, 256*1024)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	name := "/root/dïr with space/fïlé ✓.bin"
	if err := c.WriteFile(ctx, name, 0o640, bytes.NewReader(bin)); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	st, err := c.ReadFile(ctx, name, &got)
	if err != nil || !bytes.Equal(got.Bytes(), bin) || st.Mode != "0640" {
		t.Fatalf("binary round trip: %v, mode %s, equal %v", err, st.Mode, bytes.Equal(got.Bytes(), bin))
	}
	if sum := sh(t, sb, fmt.Sprintf("md5sum %q | cut -d' ' -f1", name)); strings.TrimSpace(sum) != md5hex(bin) {
		t.Fatalf("the guest sees other bytes: %s", sum)
	}

	// 100 MiB, streamed both ways.
	const big = 100 << 20
	if err := c.WriteFile(ctx, "/root/big", 0o644, &patternReader{n: big}); err != nil {
		t.Fatal(err)
	}
	check := &patternChecker{}
	if _, err := c.ReadFile(ctx, "/root/big", check); err != nil {
		t.Fatal(err)
	}
	if check.n != big || check.bad >= 0 {
		t.Fatalf("100 MiB read back: %d bytes, first difference at %d", check.n, check.bad)
	}

	// stat, list, mkdir, move, remove, tar.
	if err := c.Mkdir(ctx, "/root/a/b"); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(ctx, name, "/root/a/b/moved.bin"); err != nil {
		t.Fatal(err)
	}
	items, err := c.List(ctx, "/root/a", 2)
	if err != nil || len(items) != 2 || items[1].Path != "/root/a/b/moved.bin" || items[1].SizeBytes != int64(len(bin)) {
		t.Fatalf("list: %+v %v", items, err)
	}
	var tarball bytes.Buffer
	if err := c.TarOut(ctx, "/root/a", &tarball); err != nil {
		t.Fatal(err)
	}
	if err := c.TarIn(ctx, "/tmp/copy", &tarball); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, sb, "cmp /tmp/copy/b/moved.bin /root/a/b/moved.bin && echo same"); out != "same\n" {
		t.Fatalf("tar round trip: %q", out)
	}
	if err := c.Remove(ctx, "/root/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "/root/a"); err == nil {
		t.Fatal("removed directory still there")
	}
}

func TestDiskFull(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{DiskMiB: 64})
	r := execIn(t, sb, agentproto.ExecRequest{Cmd: "dd if=/dev/zero of=/fill bs=1M count=200"}, nil)
	if r.exit.ExitCode == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("filling the disk: %+v %q", r.exit, r.stderr)
	}
	// A file write through the agent reports the full disk as such.
	err := sb.Agent().WriteFile(context.Background(), "/more", 0o644, &patternReader{n: 8 << 20})
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("write on a full disk: %v", err)
	}
	// The host's copy of the disk stays within the sandbox's size.
	fi, err := os.Stat(filepath.Join(sb.Dir, "disk.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 80<<20 {
		t.Fatalf("overlay grew to %d bytes for a 64 MiB disk", fi.Size())
	}
	// And the sandbox still works once space is freed.
	if out := sh(t, sb, "rm /fill && echo ok > /ok && cat /ok"); out != "ok\n" {
		t.Fatalf("after freeing space: %q", out)
	}
}

func TestGuestPanicIsReported(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: "echo c > /proc/sysrq-trigger; sleep 30"}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Wait(p)
	if !errors.Is(err, sandbox.ErrVMExited) || !strings.Contains(err.Error(), "panic") || !strings.Contains(err.Error(), "sysrq") {
		t.Fatalf("got %v, want a VM-exited error quoting the panic", err)
	}
}

func TestQEMUKilled(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: "sleep 60"}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(sb.Machine().PID(), syscall.SIGKILL)
	_, err = sb.Wait(p)
	if !errors.Is(err, sandbox.ErrVMExited) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("got %v, want a VM-exited error saying QEMU was killed", err)
	}
	// newSandbox's cleanup checks that nothing is left.
}

func TestAgentSurvivesReconnect(t *testing.T) {
	sb := newSandbox(t, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sh(t, sb, "echo before > /root/state")
	// A second host connection replaces the first session.
	if err := sb.Reconnect(ctx); err != nil {
		t.Fatal(err)
	}
	c := sb.Agent()
	var out bytes.Buffer
	p, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "cat /root/state"}, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 || out.String() != "before\n" {
		t.Fatalf("exec over the new session: %+v %v %q", exit, err, out.String())
	}
}

// --- helpers ---

func md5hex(b []byte) string {
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}

type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// patternReader yields n bytes of a position-dependent pattern.
type patternReader struct{ n, off int }

func patternByte(i int) byte { return byte(i*31 + i>>11) }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if len(b) > p.n-p.off {
		b = b[:p.n-p.off]
	}
	for i := range b {
		b[i] = patternByte(p.off + i)
	}
	p.off += len(b)
	return len(b), nil
}

// patternChecker verifies that what it is written is patternReader's output.
type patternChecker struct{ n, bad int }

func (c *patternChecker) Write(b []byte) (int, error) {
	if c.n == 0 {
		c.bad = -1
	}
	for i, v := range b {
		if c.bad < 0 && v != patternByte(c.n+i) {
			c.bad = c.n + i
		}
	}
	c.n += len(b)
	return len(b), nil
}

func TestCLITerminal(t *testing.T) {
	script, err := exec.LookPath("script")
	if err != nil {
		testenv.Lacking(t, "script(1) is not installed (Debian: bsdutils)")
	}
	// script gives airlock a real terminal; the command inside sees one too,
	// of the same size.
	inner := airlockBin(t) + ` run -t --template tiny -- sh -c 'test -t 0 && test -t 1 && echo tty-ok; stty size'`
	cmd := exec.Command(script, "-qec", "stty rows 33 cols 99; "+inner, "/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "tty-ok") || !strings.Contains(string(out), "33 99") {
		t.Fatalf("output %q", out)
	}
}

func TestCLIKilledTakesVMAlong(t *testing.T) {
	cmd, _ := startReady(t, "echo ready; sleep 300")
	vms := qemuChildren(cmd.Process.Pid)
	if len(vms) != 1 {
		t.Fatalf("QEMU children of airlock: %v", vms)
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for testenv.ProcessAlive(vms[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU %d outlived the airlock process that ran it", vms[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its directory is left for the next runtime to sweep once it is older
	// than a minute; remove it here so later tests see a clean state.
	for _, name := range strings.Split(sandboxDirs(t), ",") {
		if name != "" {
			if b, _ := os.ReadFile(filepath.Join(dataDir().Sandbox(name), "qemu.pid")); strings.TrimSpace(string(b)) == strconv.Itoa(vms[0]) {
				os.RemoveAll(dataDir().Sandbox(name))
			}
		}
	}
}

// startReady starts `airlock run` of a shell script that prints "ready"
// first, and returns once that line arrived, with the rest of stdout.
func startReady(t *testing.T, script string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(airlockBin(t), "run", "--template", "tiny", "--", "sh", "-c", script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("ready\n"))
	if _, err := io.ReadFull(stdout, buf); err != nil || string(buf) != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no ready line: %q %v", buf, err)
	}
	return cmd, stdout
}

func qemuChildren(ppid int) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		// pid (comm) state ppid ...
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) && strings.Contains(s[:i], "qemu") {
			pids = append(pids, pid)
		}
	}
	return pids
}
