package vm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// toolTestUID is a user no one else has, for the tool jail's tests.
const toolTestUID = 1999999002

// probeScript runs in the tool jail as a hostile tool would: it reports
// who it is, what it can see and what it can reach.
const probeScript = `
grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
echo "netns $(readlink /proc/self/ns/net)"
echo "ipcns $(readlink /proc/self/ns/ipc)"
echo "utsns $(readlink /proc/self/ns/uts)"
echo "pidns $(readlink /proc/self/ns/pid)"
echo "mypid $$"
cat "$1" >/dev/null 2>&1 && echo "read-secret yes" || echo "read-secret no"
cat "$2" >/dev/null 2>&1 && echo "read-given yes" || echo "read-given no"
echo x >>"$3" 2>/dev/null && echo "write-given yes" || echo "write-given no"
echo x >"$4" 2>/dev/null && echo "write-dir yes" || echo "write-dir no"
(exec 3<>/dev/tcp/127.0.0.1/$5) 2>/dev/null && echo "tcp yes" || echo "tcp no"
ls /root /etc/shadow /var 2>/dev/null | head -1 | sed 's/^/host-files /'
echo done
`

// TestToolJail runs a probe in the tool jail and checks every wall from
// inside: its user, capabilities, no_new_privs and seccomp filter, its own
// network, IPC, UTS and PID namespaces (so no host process and no
// loopback listener), that it reads only the files it was given and
// writes only the one it was given write access to.
func TestToolJail(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "the tool jail needs root")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	secret := filepath.Join(dir, "secret")
	given := filepath.Join(dir, "given")
	out := filepath.Join(dir, "out")
	os.WriteFile(secret, []byte("secret"), 0o644)
	os.WriteFile(given, []byte("given"), 0o644)
	os.WriteFile(out, nil, 0o600)
	if err := os.Chown(out, toolTestUID, toolTestUID); err != nil {
		t.Fatal(err)
	}
	port, accepted := listenLoopback(t)
	tool := Tool{Path: "/bin/bash", Args: []string{"-c", probeScript, "probe", secret, given, out, filepath.Join(dir, "new"), port},
		UID: toolTestUID, GID: toolTestUID, Read: []string{given}, Write: []string{out}}
	b, err := tool.Output(context.Background())
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if f := strings.Fields(line); len(f) > 1 && strings.HasSuffix(f[0], ":") {
			k, v = strings.TrimSuffix(f[0], ":"), f[1]
		}
		got[k] = v
	}
	t.Logf("probe:\n%s", b)
	host := func(ns string) string { l, _ := os.Readlink("/proc/self/ns/" + ns); return l }
	for k, want := range map[string]string{
		"Uid": "1999999002", "Gid": "1999999002", "CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
		"read-secret": "no", "read-given": "yes", "write-given": "yes", "write-dir": "no", "tcp": "no", "done": "",
	} {
		if g, ok := got[k]; !ok || g != want {
			t.Errorf("%s = %q, want %q", k, g, want)
		}
	}
	for _, ns := range []string{"net", "ipc", "uts", "pid"} {
		if got[ns+"ns"] == "" || got[ns+"ns"] == host(ns) {
			t.Errorf("the tool's %s namespace is %q, the host's is %q", ns, got[ns+"ns"], host(ns))
		}
	}
	if got["mypid"] != "1" { // the first process of a PID namespace of its own
		t.Errorf("the tool's pid is %s", got["mypid"])
	}
	if v, ok := got["host-files"]; ok {
		t.Errorf("the tool sees host files: %s", v)
	}
	select {
	case <-accepted:
		t.Error("the tool reached a listener on the host's loopback")
	default:
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
		t.Error("the tool made a file in a directory it was not given")
	}
}

// listenLoopback listens on the host's 127.0.0.1 until the test ends, and
// returns its port and a channel that receives once a connection arrives.
func listenLoopback(t *testing.T) (port string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			ch <- struct{}{}
		}
	}()
	return strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:"), ch
}

// TestToolJailLimits: a tool that runs past its deadline is killed and
// the run says so; one that needs more memory than its limit fails; and
// the seccomp filter refuses a call it names even where the namespaces
// would have allowed it.
func TestToolJailLimits(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "the tool jail needs root")
	}
	start := time.Now()
	_, err := Tool{Path: "/bin/sleep", Args: []string{"60"}, UID: toolTestUID, GID: toolTestUID, Timeout: 500 * time.Millisecond}.Output(context.Background())
	if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("a tool past its deadline: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the deadline took %s to end the tool", d)
	}
	// 64 MiB of address space cannot hold a 256 MiB allocation.
	_, err = Tool{Path: "/usr/bin/python3", Args: []string{"-c", "b = bytearray(256 << 20)"}, UID: toolTestUID, GID: toolTestUID,
		MemoryBytes: 64 << 20}.Output(context.Background())
	if err == nil {
		t.Fatal("a tool allocated past its memory limit")
	}
	// unshare(2) is denied by the filter: a user namespace would be
	// allowed to an unprivileged user otherwise.
	b, err := Tool{Path: "/usr/bin/unshare", Args: []string{"--user", "true"}, UID: toolTestUID, GID: toolTestUID}.Output(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Operation not permitted") {
		t.Fatalf("unshare in the tool jail: %v %s", err, b)
	}
}

// TestToolJailReadAnyFile: a tool that keeps CAP_DAC_READ_SEARCH reads a
// root-only file it was shown, and nothing more: no other capability, no
// write to that file, no file it was not shown, and no
// open_by_handle_at (the call that capability would otherwise open).
func TestToolJailReadAnyFile(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "the tool jail needs root")
	}
	dir := t.TempDir()
	shown := filepath.Join(dir, "shown")
	hidden := filepath.Join(dir, "hidden")
	os.WriteFile(shown, []byte("root only\n"), 0o600)
	os.WriteFile(hidden, []byte("hidden\n"), 0o600)
	script := `grep -E '^(CapEff|CapPrm|CapAmb|CapBnd):' /proc/self/status
cat "$1" && echo "read-shown yes"
echo x >>"$1" 2>/dev/null && echo "write-shown yes" || echo "write-shown no"
cat "$2" 2>/dev/null && echo "read-hidden yes" || echo "read-hidden no"`
	b, err := Tool{Path: "/bin/bash", Args: []string{"-c", script, "probe", shown, hidden},
		UID: toolTestUID, GID: toolTestUID, Read: []string{shown}, ReadAnyFile: true}.Output(context.Background())
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	out := string(b)
	t.Logf("probe:\n%s", out)
	for _, want := range []string{"CapEff:\t0000000000000004", "CapPrm:\t0000000000000004", "CapAmb:\t0000000000000004",
		"CapBnd:\t0000000000000004", "root only\nread-shown yes", "write-shown no", "read-hidden no"} {
		if !strings.Contains(out, want) {
			t.Errorf("the probe did not say %q", want)
		}
	}
	// open_by_handle_at (304 on x86-64) is refused by the filter (EPERM),
	// before the kernel would look at its arguments (EBADF).
	b, err = Tool{Path: "/usr/bin/python3", Args: []string{"-c",
		"import ctypes; l = ctypes.CDLL(None, use_errno=True); l.syscall(304, -1, 0, 0); print(ctypes.get_errno())"},
		UID: toolTestUID, GID: toolTestUID, ReadAnyFile: true}.Output(context.Background())
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("open_by_handle_at in the jail: errno %s, %v; want 1 (EPERM)", b, err)
	}
	// Without ReadAnyFile the same file cannot be read.
	if b, err := (Tool{Path: "/bin/cat", Args: []string{shown}, UID: toolTestUID, GID: toolTestUID, Read: []string{shown}}).Output(context.Background()); err == nil {
		t.Errorf("a tool without ReadAnyFile read a root-only file: %s", b)
	}
}
