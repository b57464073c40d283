package guest

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestExtractVmlinuxRealKernel decompresses the real Debian kernel that
// airlock setup booted this host's VMs with, from the package setup kept in
// the data directory's cache, and checks that the result is an ELF file and
// the very vmlinux setup wrote (its sha256 is in the boot manifest).
// AIRLOCK_HOME names the data directory, as for airlock itself.
func TestExtractVmlinuxRealKernel(t *testing.T) {
	dd := datadir.Default()
	m, err := ReadManifest(dd)
	if err != nil {
		testenv.Lacking(t, "the host is not set up (run airlock setup): %v", err)
	}
	deb := filepath.Join(dd.Cache(), "debs", debPackage{Name: m.KernelPackage, Version: m.KernelVersion}.debFile())
	if _, err := os.Stat(deb); err != nil {
		testenv.Lacking(t, "the kernel package setup used is not in its cache (run airlock setup --force): %v", err)
	}
	tree := t.TempDir()
	if out, err := exec.Command("dpkg", "-x", deb, tree).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -x %s: %v\n%s", deb, err, out)
	}
	bz, err := os.ReadFile(filepath.Join(tree, "boot", "vmlinuz-"+m.KernelRelease))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ExtractVmlinux(bz)
	if err != nil {
		t.Fatal(err)
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(vm)); sum != m.KernelSHA256 {
		t.Errorf("vmlinux from vmlinuz-%s has sha256 %s, the boot manifest %s", m.KernelRelease, sum, m.KernelSHA256)
	}
	f, err := elf.NewFile(bytes.NewReader(vm))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("vmlinux is an ELF %s %s, want an x86-64 executable", f.Machine, f.Type)
	}
	t.Logf("vmlinux: %d bytes, entry %#x", len(vm), f.Entry)
}

func TestExtractVmlinuxRejectsGarbage(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"no magic", []byte("MZ not a kernel")},
		{"magic then junk", append([]byte{0x02, 0x21, 0x4c, 0x18}, 1, 0, 0, 0, 0xff)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ExtractVmlinux(tt.in); err == nil {
				t.Fatal("ExtractVmlinux succeeded on garbage")
			}
		})
	}
}
