package vm

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/testenv"
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

// backingChain follows qcow2 backing files, relative ones from their
// image's directory, to the raw image at the bottom.
func TestBackingChain(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		testenv.Lacking(t, "qemu-img is not installed")
	}
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.ext4")
	os.WriteFile(raw, make([]byte, 1<<20), 0o444)
	mid := filepath.Join(dir, "layer.qcow2")
	top := filepath.Join(dir, "sub", "disk.qcow2")
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	for _, c := range [][]string{
		{"create", "-q", "-f", "qcow2", "-b", raw, "-F", "raw", mid},
		{"create", "-q", "-f", "qcow2", "-b", "../layer.qcow2", "-F", "qcow2", top},
	} {
		if out, err := exec.Command("qemu-img", c...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	chain, err := backingChain(top)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || filepath.Clean(chain[0]) != mid || chain[1] != raw {
		t.Errorf("chain %q, want [%s %s]", chain, mid, raw)
	}
	if chain, err := backingChain(raw); err != nil || len(chain) != 0 {
		t.Errorf("a raw image's chain: %q, %v", chain, err)
	}
}
