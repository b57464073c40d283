package vm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The sealed copy of a memory file has its content, keeps its holes, can
// be mapped private and written there, and cannot be changed: not by
// write, truncate, hole punching or a shared writable mapping, not even
// reopened read-write through /proc as QEMU opens it.
func TestSealedMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mem")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	f.Truncate(size)
	f.WriteAt([]byte("page zero"), 0)
	f.WriteAt(bytes.Repeat([]byte{7}, 4096), 5<<20)
	f.Close()

	m, err := sealedMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ForgetMemory(path)
	if again, _ := sealedMemory(path); again != m {
		t.Errorf("a second clone of the same file got another copy")
	}
	got := make([]byte, 9)
	m.ReadAt(got, 0)
	page := make([]byte, 4096)
	m.ReadAt(page, 5<<20)
	if string(got) != "page zero" || !bytes.Equal(page, bytes.Repeat([]byte{7}, 4096)) {
		t.Errorf("the copy's content differs: %q", got)
	}
	var st unix.Stat_t
	unix.Fstat(int(m.Fd()), &st)
	if st.Size != size || st.Blocks*512 > 1<<20 {
		t.Errorf("copy of %d bytes uses %d: holes were filled", st.Size, st.Blocks*512)
	}

	if _, err := m.WriteAt([]byte("x"), 0); err == nil {
		t.Errorf("the sealed copy took a write")
	}
	if err := m.Truncate(size / 2); err == nil {
		t.Errorf("the sealed copy shrank")
	}
	if err := unix.Fallocate(int(m.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err == nil {
		t.Errorf("the sealed copy took a punched hole")
	}
	if _, err := unix.Mmap(int(m.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		t.Errorf("the sealed copy was mapped shared and writable")
	}
	rw, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(m.Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("reopen read-write as QEMU does: %v", err)
	}
	if _, err := rw.WriteAt([]byte("x"), 0); err == nil {
		t.Errorf("the reopened copy took a write")
	}
	priv, err := unix.Mmap(int(rw.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("map private and writable as a clone does: %v", err)
	}
	priv[0] = 'P'
	unix.Munmap(priv)
	rw.Close()
	m.ReadAt(got, 0)
	if string(got) != "page zero" {
		t.Errorf("a private write reached the copy: %q", got)
	}

	// A replaced file gets a fresh copy.
	os.Remove(path)
	os.WriteFile(path, bytes.Repeat([]byte{1}, 4096), 0o600)
	m2, err := sealedMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if m2 == m {
		t.Errorf("a replaced memory file kept its old copy")
	}
	if _, err := sealedMemory(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

// TestJailBindsRecordedChain: a jailed VM's root holds the images of its
// recorded chain (Config.Backing) and no other; a disk without one is
// refused rather than its qcow2 header read.
func TestJailBindsRecordedChain(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.ext4")
	layer := filepath.Join(dir, "layer.qcow2")
	for _, f := range []string{raw, layer, filepath.Join(dir, "kernel"), filepath.Join(dir, "initramfs")} {
		os.WriteFile(f, nil, 0o444)
	}
	cfg := Config{Kernel: filepath.Join(dir, "kernel"), Initramfs: filepath.Join(dir, "initramfs"), Dir: dir,
		Disk: filepath.Join(dir, "disk.qcow2"), Jail: &Jail{UID: jailTestUID, GID: jailTestUID}}
	if _, err := jailSpecFor(cfg, "/usr/bin/qemu-system-x86_64", nil); err == nil || !strings.Contains(err.Error(), "recorded backing chain") {
		t.Errorf("a disk without a recorded chain: %v", err)
	}
	cfg.Backing = []string{layer, raw}
	spec, err := jailSpecFor(cfg, "/usr/bin/qemu-system-x86_64", nil)
	if err != nil {
		t.Fatal(err)
	}
	binds := map[string]bool{}
	for _, b := range spec.Binds {
		binds[b.Path] = b.Write
	}
	if w, ok := binds[layer]; !ok || w {
		t.Errorf("the layer is bound %v (writable %v)", ok, w)
	}
	if w, ok := binds[raw]; !ok || w {
		t.Errorf("the template image is bound %v (writable %v)", ok, w)
	}
	if w := binds[cfg.Disk]; !w {
		t.Errorf("the disk is not bound writable")
	}
	cfg.Backing = []string{"relative.qcow2"}
	if _, err := jailSpecFor(cfg, "/usr/bin/qemu-system-x86_64", nil); err == nil {
		t.Errorf("a relative backing image was accepted")
	}
}
