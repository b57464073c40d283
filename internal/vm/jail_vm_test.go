package vm

import (
	"errors"

	"context"
	"github.com/airlockhq/airlock/internal/errdefs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/testenv"
)

// jailTestUID is a user no one else has, for the jail tests.
const jailTestUID = 1999999001

// bootDir returns the set-up data directory's boot artifacts, or skips.
func bootDir(t *testing.T) datadir.Dir {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "the jail needs root")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Lacking(t, "qemu-system-x86_64 is not installed")
	}
	dd := datadir.Default()
	for _, f := range []string{dd.Kernel(), dd.Initramfs()} {
		if _, err := os.Stat(f); err != nil {
			testenv.Lacking(t, "boot artifacts are missing (run airlock setup): %v", err)
		}
	}
	return dd
}

// TestJailedVM boots a jailed VM: QEMU runs as the jail's user with no
// capabilities, no_new_privs and a seccomp filter, sees only the files
// it was given, and the guest boots far enough to write its console.
func TestJailedVM(t *testing.T) {
	dd := bootDir(t)
	dir, err := os.MkdirTemp("", "al-jail-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	secret := filepath.Join(dir, "gateway-ca.key")
	os.WriteFile(secret, []byte("secret"), 0o600)
	cfg := Config{Kernel: dd.Kernel(), Initramfs: dd.Initramfs(), Accel: AccelTCG, VCPUs: 1, MemoryMiB: 128, Dir: dir,
		NetMAC: "5a:94:ef:e4:0c:ee", Jail: &Jail{UID: jailTestUID, GID: jailTestUID}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(context.Background())
	st := testenv.ProcStatus(t, m.PID())
	for k, want := range map[string]string{
		"Uid": "1999999001\t1999999001\t1999999001\t1999999001", "Gid": "1999999001\t1999999001\t1999999001\t1999999001",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Groups": "",
		// airlock's allow-list, and QEMU's own -sandbox above it.
		"Seccomp_filters": "2",
	} {
		if st[k] != want {
			t.Errorf("qemu's %s is %q, want %q", k, st[k], want)
		}
	}
	// Namespaces of its own: no network but what it was handed, no host
	// process, no System V IPC or hostname shared with the host.
	for _, ns := range []string{"net", "ipc", "uts", "pid", "mnt"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, err := os.Readlink("/proc/" + strconv.Itoa(m.PID()) + "/ns/" + ns)
		if err != nil || its == mine {
			t.Errorf("qemu's %s namespace is %q (%v), the host's %q", ns, its, err, mine)
		}
	}
	// A process as QEMU's user in QEMU's namespaces, as code that escaped
	// into QEMU would be, reaches no listener on the host's loopback.
	probeLoopback(t, m.PID(), 1999999001)
	// QEMU's root holds only what it was given: outside /usr, the files
	// it needs and the directories leading to them.
	root := "/proc/" + strconv.Itoa(m.PID()) + "/root"
	want := map[string]bool{dd.Kernel(): true, dd.Initramfs(): true, "/dev/null": true, "/dev/urandom": true, "/etc/ld.so.cache": true}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		rel := strings.TrimPrefix(p, root)
		if err != nil || rel == "/usr" || rel == "/proc" {
			return filepath.SkipDir
		}
		if !fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 && !want[rel] {
			t.Errorf("the jailed qemu sees %s", rel)
		}
		return nil
	})
	if _, err := os.Stat(root + secret); err == nil {
		t.Errorf("the jailed qemu sees its directory's %s", secret)
	}
	for _, p := range []string{dd.Kernel(), "/usr/bin", "/dev/urandom"} {
		if _, err := os.Stat(root + p); err != nil {
			t.Errorf("the jailed qemu lacks %s: %v", p, err)
		}
	}
	if err := os.WriteFile(root+"/dropped", nil, 0o600); err == nil {
		t.Errorf("the jail's root is writable")
	}
	deadline := time.Now().Add(45 * time.Second)
	for m.ConsoleTail(4096) == "" && time.Now().Before(deadline) {
		if m.Exited() {
			t.Fatalf("qemu exited: %v; log: %s", m.ExitError(), m.qemuLogTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s, err := m.Status(ctx); err != nil || s != "running" {
		t.Errorf("status %q, %v", s, err)
	}
	if m.ConsoleTail(4096) == "" {
		t.Errorf("the guest wrote no console")
	}
}

// probeLoopback runs, as uid in the namespaces of process pid (nsenter,
// setpriv), a TCP connect to a listener on the host's 127.0.0.1, and
// fails the test if it gets through.
func probeLoopback(t *testing.T, pid, uid int) {
	t.Helper()
	port, accepted := listenLoopback(t)
	u := strconv.Itoa(uid)
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "-i", "-u", "--",
		"setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", "--no-new-privs",
		"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port+" && echo connected").CombinedOutput()
	if err == nil || strings.Contains(string(out), "connected") {
		t.Errorf("as the VM's user in its namespaces, a connect to the host's loopback got through: %v %s", err, out)
	}
	select {
	case <-accepted:
		t.Error("the host's loopback listener accepted a connection from the VM's namespaces")
	case <-time.After(100 * time.Millisecond):
	}
	// The same probe in the host's namespaces does get through: the
	// listener and the probe work, so the refusal above is the jail's.
	out, err = exec.Command("setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", "--no-new-privs",
		"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port+" && echo connected").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "connected") {
		t.Fatalf("the control probe in the host's namespaces failed: %v %s", err, out)
	}
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the control probe's connection never arrived")
	}
}

// Users are handed out one per directory, kept for it, and freed with it.
func TestAllocateUID(t *testing.T) {
	old := UIDRegistry
	UIDRegistry = t.TempDir()
	t.Cleanup(func() { UIDRegistry = old })
	r := UIDRange{First: 1999998000, Count: 3}
	a, b := t.TempDir(), t.TempDir()
	ua, err := r.AllocateUID(a, 0)
	if err != nil {
		t.Fatal(err)
	}
	ub, err := r.AllocateUID(b, 0)
	if err != nil || ub == ua {
		t.Fatalf("second directory got %d, %v (first %d)", ub, err, ua)
	}
	if again, _ := r.AllocateUID(a, 0); again != ua {
		t.Errorf("the same directory got %d, then %d", ua, again)
	}
	if got, _ := r.AllocateUID(a, ub); got == ub {
		t.Errorf("a directory was given a user another holds")
	}
	c := t.TempDir()
	if _, err := r.AllocateUID(c, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AllocateUID(t.TempDir(), 0); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("a full range: %v", err)
	}
	// A user whose directory is gone is free again, as is a released one.
	os.RemoveAll(c)
	d := t.TempDir()
	if _, err := r.AllocateUID(d, 0); err != nil {
		t.Errorf("the user of a removed directory is not reused: %v", err)
	}
	ReleaseUID(b)
	if got, err := r.AllocateUID(t.TempDir(), ub); err != nil || got != ub {
		t.Errorf("a released user: %d, %v", got, err)
	}
	if _, err := r.AllocateUID("relative", 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a relative directory: %v", err)
	}
}

func TestUIDRangeCheck(t *testing.T) {
	if err := DefaultUIDs.Check(); err != nil {
		t.Errorf("the default range on this host: %v", err)
	}
	for _, r := range []UIDRange{{0, 10}, {2147483000, 1000}, {5000, 0}} {
		if err := r.Check(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	// root's group and user are 0: a range over low ids collides with
	// the host's users (every host has some at 1000 or above, or daemon
	// users below, so take the whole low range).
	if err := (UIDRange{First: 1000, Count: 100000}).Check(); err == nil && hasUserAbove(1000) {
		t.Errorf("a range over the host's users passed")
	}
}

func hasUserAbove(n int) bool {
	found := false
	scanColonFile("/etc/passwd", func(f []string) error {
		if id, err := strconv.Atoi(f[2]); err == nil && id >= n && id < n+100000 {
			found = true
		}
		return nil
	})
	return found
}
