package guest

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadOrder(t *testing.T) {
	tests := []struct {
		name    string
		wanted  []string
		deps    map[string][]string
		want    []string
		wantErr string
	}{
		{
			name:   "chain, dependencies first",
			wanted: []string{"virtio_blk"},
			deps:   map[string][]string{"virtio_blk": {"virtio", "virtio_ring"}, "virtio": nil, "virtio_ring": nil},
			want:   []string{"virtio", "virtio_ring", "virtio_blk"},
		},
		{
			name:   "wanted order kept when it is already valid",
			wanted: []string{"virtio_ring", "virtio", "virtio_mmio"},
			deps:   map[string][]string{"virtio_ring": nil, "virtio": nil, "virtio_mmio": {"virtio", "virtio_ring"}},
			want:   []string{"virtio_ring", "virtio", "virtio_mmio"},
		},
		{
			name:   "dependency wanted later is pulled forward once",
			wanted: []string{"virtio_net", "failover", "net_failover"},
			deps: map[string][]string{
				"virtio_net": {"net_failover"}, "net_failover": {"failover"}, "failover": nil,
			},
			want: []string{"failover", "net_failover", "virtio_net"},
		},
		{
			name:   "diamond loads shared dependency once",
			wanted: []string{"a"},
			deps:   map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": nil},
			want:   []string{"d", "b", "c", "a"},
		},
		{
			name:   "dash and underscore are one name",
			wanted: []string{"virtio-rng"},
			deps:   map[string][]string{"virtio_rng": {"virtio"}, "virtio": nil},
			want:   []string{"virtio", "virtio_rng"},
		},
		{
			name:    "cycle",
			wanted:  []string{"a"},
			deps:    map[string][]string{"a": {"b"}, "b": {"a"}},
			wantErr: "cycle: a -> b -> a",
		},
		{
			name:    "unknown dependency",
			wanted:  []string{"a"},
			deps:    map[string][]string{"a": {"zz"}},
			wantErr: "zz: unknown",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadOrder(tt.wanted, tt.deps)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("loadOrder error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("loadOrder = %q, want %q", got, tt.want)
			}
		})
	}
}

// fakeModule writes a minimal ELF relocatable file whose only content is a
// .modinfo section with the given key=value entries.
func fakeModule(t *testing.T, path string, modinfo ...string) {
	t.Helper()
	info := []byte(strings.Join(modinfo, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	infoOff := ehsize
	shstrOff := infoOff + len(info)
	shOff := (shstrOff + len(shstr) + 7) &^ 7

	var b bytes.Buffer
	le := binary.LittleEndian
	ident := [16]byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* LE */, 1 /* version */}
	b.Write(ident[:])
	binary.Write(&b, le, uint16(1))  // ET_REL
	binary.Write(&b, le, uint16(62)) // EM_X86_64
	binary.Write(&b, le, uint32(1))
	binary.Write(&b, le, uint64(0)) // entry
	binary.Write(&b, le, uint64(0)) // phoff
	binary.Write(&b, le, uint64(shOff))
	binary.Write(&b, le, uint32(0)) // flags
	binary.Write(&b, le, uint16(ehsize))
	binary.Write(&b, le, uint16(0)) // phentsize
	binary.Write(&b, le, uint16(0)) // phnum
	binary.Write(&b, le, uint16(shentsize))
	binary.Write(&b, le, uint16(3)) // shnum
	binary.Write(&b, le, uint16(2)) // shstrndx
	b.Write(info)
	b.Write(shstr)
	b.Write(make([]byte, shOff-b.Len()))
	section := func(name, typ uint32, off, size int) {
		binary.Write(&b, le, name)
		binary.Write(&b, le, typ)
		binary.Write(&b, le, uint64(0)) // flags
		binary.Write(&b, le, uint64(0)) // addr
		binary.Write(&b, le, uint64(off))
		binary.Write(&b, le, uint64(size))
		binary.Write(&b, le, uint32(0)) // link
		binary.Write(&b, le, uint32(0)) // info
		binary.Write(&b, le, uint64(1)) // addralign
		binary.Write(&b, le, uint64(0)) // entsize
	}
	section(0, 0, 0, 0)
	section(1, 1 /* PROGBITS */, infoOff, len(info))
	section(10, 3 /* STRTAB */, shstrOff, len(shstr))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveModules(t *testing.T) {
	root := t.TempDir()
	mods := map[string][]string{
		"drivers/virtio/virtio_ring.ko":        {"license=GPL", "depends="},
		"drivers/virtio/virtio.ko":             {"license=GPL", "depends="},
		"drivers/virtio/virtio_mmio.ko":        {"depends=virtio,virtio_ring", "alias=of:N*T*Cvirtio,mmio"},
		"drivers/block/virtio_blk.ko":          {"depends=virtio,virtio_ring"},
		"drivers/char/hw_random/virtio-rng.ko": {"depends=virtio_ring,virtio"},
		"net/core/failover.ko":                 {"depends="},
		"drivers/net/net_failover.ko":          {"depends=failover"},
		"drivers/net/virtio_net.ko":            {"depends=net_failover,virtio_ring,virtio"},
		"drivers/net/unrelated.ko":             {"depends="},
	}
	for p, info := range mods {
		fakeModule(t, filepath.Join(root, p), info...)
	}
	got, err := ResolveModules(root, []string{"virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range got {
		names = append(names, m.Name)
		if _, err := os.Stat(m.Path); err != nil {
			t.Errorf("module %s: path %s: %v", m.Name, m.Path, err)
		}
	}
	want := []string{"virtio", "virtio_ring", "virtio_mmio", "virtio_blk", "failover", "net_failover", "virtio_net", "virtio_rng"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("ResolveModules = %q, want %q", names, want)
	}

	if _, err := ResolveModules(root, []string{"nosuch"}); err == nil || !strings.Contains(err.Error(), "module nosuch not found") {
		t.Errorf("ResolveModules(nosuch) error = %v", err)
	}
}

func TestKernelDependency(t *testing.T) {
	tests := []struct {
		depends string
		want    debPackage
		ok      bool
	}{
		{"linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)", debPackage{"linux-image-6.1.0-57-cloud-amd64", "6.1.192-3"}, true},
		{"initramfs-tools, linux-image-6.1.0-9-cloud-amd64 (= 1:6.1.27-1)", debPackage{"linux-image-6.1.0-9-cloud-amd64", "1:6.1.27-1"}, true},
		{"linux-image-6.1.0-57-cloud-amd64", debPackage{}, false},
		{"", debPackage{}, false},
	}
	for _, tt := range tests {
		got, ok := kernelDependency(tt.depends)
		if got != tt.want || ok != tt.ok {
			t.Errorf("kernelDependency(%q) = %v, %v, want %v, %v", tt.depends, got, ok, tt.want, tt.ok)
		}
	}
}
