package guest

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

// TestExtractVmlinuxRealKernel decompresses a real Debian vmlinuz when one is
// named by AIRLOCK_TEST_VMLINUZ; the integration test covers it otherwise.
func TestExtractVmlinuxRealKernel(t *testing.T) {
	path := os.Getenv("AIRLOCK_TEST_VMLINUZ")
	if path == "" {
		t.Skip("AIRLOCK_TEST_VMLINUZ not set")
	}
	bz, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ExtractVmlinux(bz)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "vmlinux")
	if err := os.WriteFile(out, vm, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
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
