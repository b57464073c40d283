package guest

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestBuild fetches the real Debian cloud kernel with apt and builds the
// boot artifacts twice: the second build must find them up to date.
func TestBuild(t *testing.T) {
	testenv.Short(t, "downloads the kernel package")
	if _, err := exec.LookPath("apt-get"); err != nil {
		testenv.Lacking(t, "apt-get not found: the kernel comes from Debian's archive")
	}
	dir := datadir.Dir{Root: t.TempDir()}
	if err := Check(dir); !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "airlock setup") {
		t.Fatalf("Check before build = %v, want ErrPrecondition naming airlock setup", err)
	}
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out bytes.Buffer
	m, err := Build(ctx, BuildConfig{Dir: dir, AgentPath: agent, Out: &out})
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, out.String())
	}
	t.Logf("build output:\n%s", out.String())
	if m.UpToDate {
		t.Error("first build reported up to date")
	}
	if err := Check(dir); err != nil {
		t.Fatalf("Check after build: %v", err)
	}
	for _, want := range []string{"/lib/modules/virtio_mmio.ko", "/lib/modules/virtio_net.ko", "/lib/modules/virtio_rng.ko"} {
		if !slices.Contains(m.Modules, want) {
			t.Errorf("manifest modules %q lack %s", m.Modules, want)
		}
	}
	f, err := elf.Open(dir.Kernel())
	if err != nil {
		t.Fatalf("vmlinux: %v", err)
	}
	f.Close()

	ir, err := os.Open(dir.Initramfs())
	if err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, ir)
	ir.Close()
	if got["init"].data != "#!/bin/true\n" {
		t.Errorf("/init = %q", got["init"].data)
	}
	if list := strings.Fields(got["etc/airlock/modules"].data); !slices.Equal(list, m.Modules) {
		t.Errorf("module list %q, manifest %q", list, m.Modules)
	}

	again, err := Build(ctx, BuildConfig{Dir: dir, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	if !again.UpToDate || again.InitramfsSHA256 != m.InitramfsSHA256 {
		t.Errorf("second build: up to date %v, initramfs %s (first %s)", again.UpToDate, again.InitramfsSHA256, m.InitramfsSHA256)
	}

	// Anything that differs from the manifest makes the artifacts stale.
	pkg := debPackage{Name: m.KernelPackage, Version: m.KernelVersion}
	stale := []struct {
		name    string
		pkg     debPackage
		agent   string
		modules []string
		tamper  bool
	}{
		{name: "new kernel version", pkg: debPackage{pkg.Name, pkg.Version + "+1"}, agent: m.AgentSHA256},
		{name: "new agent", pkg: pkg, agent: strings.Repeat("0", 64)},
		{name: "new module", pkg: pkg, agent: m.AgentSHA256, modules: []string{"vsock"}},
		{name: "initramfs changed on disk", pkg: pkg, agent: m.AgentSHA256, tamper: true},
	}
	if !current(dir, m, pkg, m.AgentSHA256, DefaultModules()) {
		t.Fatal("current() = false for the artifacts just built")
	}
	for _, tt := range stale {
		if tt.tamper {
			if err := os.WriteFile(dir.Initramfs(), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if current(dir, m, tt.pkg, tt.agent, append(DefaultModules(), tt.modules...)) {
			t.Errorf("%s: current() = true", tt.name)
		}
	}
	if ents, _ := filepath.Glob(filepath.Join(dir.Boot(), ".*tmp*")); len(ents) > 0 {
		t.Errorf("temporary files left in boot/: %q", ents)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir.Cache(), "kernel-*")); len(ents) > 0 {
		t.Errorf("unpacked trees left in cache/: %q", ents)
	}
}
