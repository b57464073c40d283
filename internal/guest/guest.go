// Package guest builds the boot artifacts every sandbox VM starts from: the
// uncompressed kernel (vmlinux) taken from Debian's cloud kernel package and
// an initramfs whose /init is the airlock guest agent, with the few virtio
// modules the agent loads. The artifacts live in the data directory's boot/
// directory next to a manifest that makes rebuilding idempotent.
package guest

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// DefaultKernelPackage is the Debian metapackage that names the guest kernel.
const DefaultKernelPackage = "linux-image-cloud-amd64"

// manifestFormat changes whenever the layout of the artifacts changes, so
// that artifacts built by an older airlock are rebuilt.
const manifestFormat = 1

// BuildConfig says what to build the boot artifacts from.
type BuildConfig struct {
	// Dir is the data directory; the artifacts go to its boot/ directory and
	// the downloaded kernel package to its cache/ directory.
	Dir datadir.Dir
	// AgentPath is the guest agent binary on the host, copied to /init. It
	// must be statically linked to run as PID 1; a dynamic one only earns a
	// warning. Required.
	AgentPath string
	// KernelPackage is the Debian metapackage whose dependency is the kernel
	// image package. Default DefaultKernelPackage.
	KernelPackage string
	// Modules are the kernel modules to load, in order; their dependencies
	// are added. Default DefaultModules().
	Modules []string
	// Force rebuilds even when the manifest says the artifacts are current.
	Force bool
	// Out receives one line per stage of the build. Nil discards them.
	Out io.Writer
}

// Manifest records what the boot artifacts were built from. It is written to
// boot/manifest.json after the artifacts, so its presence means they are whole.
type Manifest struct {
	// Format is the layout version of the artifacts.
	Format int `json:"format"`
	// KernelPackage and KernelVersion name the Debian kernel image package.
	KernelPackage string `json:"kernel_package"`
	KernelVersion string `json:"kernel_version"`
	// KernelRelease is the kernel's release string (uname -r).
	KernelRelease string `json:"kernel_release"`
	// Modules are the module paths inside the initramfs, in load order.
	Modules []string `json:"modules"`
	// AgentSHA256, KernelSHA256 and InitramfsSHA256 are hex sha256 digests
	// of the agent binary, the vmlinux and the initramfs.
	AgentSHA256     string `json:"agent_sha256"`
	KernelSHA256    string `json:"kernel_sha256"`
	InitramfsSHA256 string `json:"initramfs_sha256"`
	// BuiltAt is when the artifacts were built.
	BuiltAt time.Time `json:"built_at"`
	// UpToDate is set by Build when it found the artifacts current and left
	// them alone. It is not stored.
	UpToDate bool `json:"-"`
}

// ManifestPath is the file the manifest of the boot artifacts is stored in.
func ManifestPath(dir datadir.Dir) string {
	return filepath.Join(dir.Boot(), "manifest.json")
}

// ReadManifest returns the stored manifest of the boot artifacts.
func ReadManifest(dir datadir.Dir) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(ManifestPath(dir))
	if err != nil {
		return m, fmt.Errorf("read boot manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("read boot manifest %s: %w", ManifestPath(dir), err)
	}
	return m, nil
}

// Check reports whether the boot artifacts exist. It does not hash them.
func Check(dir datadir.Dir) error {
	for _, p := range []string{dir.Kernel(), dir.Initramfs(), ManifestPath(dir)} {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
			return fmt.Errorf("boot artifacts missing: run `airlock setup` (as root): %w", errdefs.ErrPrecondition)
		}
	}
	return nil
}

// Build makes the kernel and initramfs under cfg.Dir.Boot() unless the
// manifest shows they were built from the same kernel package version and
// agent binary and the files still hash as recorded; then it returns the
// stored manifest with UpToDate set. Each file is replaced atomically and
// the manifest is written last.
func Build(ctx context.Context, cfg BuildConfig) (Manifest, error) {
	if cfg.AgentPath == "" {
		return Manifest{}, fmt.Errorf("build boot artifacts: no agent binary given: %w", errdefs.ErrInvalid)
	}
	if cfg.KernelPackage == "" {
		cfg.KernelPackage = DefaultKernelPackage
	}
	if len(cfg.Modules) == 0 {
		cfg.Modules = DefaultModules()
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	agentSum, _, err := digest.File(ctx, cfg.AgentPath)
	if err != nil {
		return Manifest{}, fmt.Errorf("build boot artifacts: agent binary: %w", errors.Join(err, errdefs.ErrInvalid))
	}
	pkg, err := resolveKernelPackage(ctx, cfg.KernelPackage)
	if err != nil {
		return Manifest{}, err
	}
	if !cfg.Force {
		if m, err := ReadManifest(cfg.Dir); err == nil && current(cfg.Dir, m, pkg, agentSum, cfg.Modules) {
			m.UpToDate = true
			return m, nil
		}
	}
	if warn := staticCheck(cfg.AgentPath); warn != "" {
		fmt.Fprintf(out, "warning: %s\n", warn)
	}

	fmt.Fprintf(out, "kernel package %s %s\n", pkg.Name, pkg.Version)
	deb, err := fetchDeb(ctx, pkg, filepath.Join(cfg.Dir.Cache(), "debs"))
	if err != nil {
		return Manifest{}, err
	}
	tree, err := os.MkdirTemp(cfg.Dir.Cache(), "kernel-")
	if err != nil {
		return Manifest{}, fmt.Errorf("unpack %s: %w", pkg.Name, err)
	}
	defer os.RemoveAll(tree)
	fmt.Fprintf(out, "unpacking %s\n", filepath.Base(deb))
	if _, err := runOutput(ctx, "", "dpkg", "-x", deb, tree); err != nil {
		return Manifest{}, fmt.Errorf("unpack %s: %w", pkg.Name, err)
	}
	release, err := kernelRelease(tree)
	if err != nil {
		return Manifest{}, err
	}
	mods, err := ResolveModules(filepath.Join(tree, "lib", "modules", release, "kernel"), cfg.Modules)
	if err != nil {
		return Manifest{}, fmt.Errorf("choose modules: %w", err)
	}

	if err := os.MkdirAll(cfg.Dir.Boot(), 0o755); err != nil {
		return Manifest{}, fmt.Errorf("create boot directory: %w", err)
	}
	fmt.Fprintf(out, "decompressing vmlinuz-%s\n", release)
	bz, err := os.ReadFile(filepath.Join(tree, "boot", "vmlinuz-"+release))
	if err != nil {
		return Manifest{}, fmt.Errorf("read kernel image: %w", err)
	}
	vmlinux, err := ExtractVmlinux(bz)
	if err != nil {
		return Manifest{}, err
	}
	m := Manifest{
		Format:        manifestFormat,
		KernelPackage: pkg.Name,
		KernelVersion: pkg.Version,
		KernelRelease: release,
		AgentSHA256:   agentSum,
		BuiltAt:       time.Now().UTC(),
	}
	for _, mod := range mods {
		m.Modules = append(m.Modules, modulePath(mod.Name))
	}
	m.KernelSHA256, err = atomicfile.Write(cfg.Dir.Kernel(), 0o644, func(w io.Writer) error {
		_, err := w.Write(vmlinux)
		return err
	})
	if err != nil {
		return Manifest{}, err
	}
	fmt.Fprintf(out, "writing initramfs with %d modules\n", len(mods))
	m.InitramfsSHA256, err = atomicfile.Write(cfg.Dir.Initramfs(), 0o644, func(w io.Writer) error {
		return writeInitramfs(w, cfg.AgentPath, mods)
	})
	if err != nil {
		return Manifest{}, err
	}
	// The agent may have changed while it was copied; the manifest must
	// describe what the initramfs holds.
	if again, _, err := digest.File(ctx, cfg.AgentPath); err != nil || again != agentSum {
		return Manifest{}, fmt.Errorf("build boot artifacts: agent binary changed during the build: %w", errdefs.ErrConflict)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("encode boot manifest: %w", err)
	}
	if _, err := atomicfile.Write(ManifestPath(cfg.Dir), 0o644, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// current reports whether stored manifest m describes artifacts built from
// pkg, the agent with sha256 agentSum and the modules wanted, and whether
// the artifact files still have the recorded hashes.
func current(dir datadir.Dir, m Manifest, pkg debPackage, agentSum string, wanted []string) bool {
	if m.Format != manifestFormat || m.KernelPackage != pkg.Name || m.KernelVersion != pkg.Version ||
		m.AgentSHA256 != agentSum {
		return false
	}
	// Every wanted module must be in the list; dependencies come on top.
	for _, w := range wanted {
		if !slices.Contains(m.Modules, modulePath(canonical(w))) {
			return false
		}
	}
	for path, want := range map[string]string{dir.Kernel(): m.KernelSHA256, dir.Initramfs(): m.InitramfsSHA256} {
		if got, _, err := digest.File(context.Background(), path); err != nil || got != want {
			return false
		}
	}
	return true
}

// kernelRelease returns the release string of the one kernel in an unpacked
// kernel image package, from its lib/modules/<release> directory.
func kernelRelease(tree string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(tree, "lib", "modules"))
	if err != nil {
		return "", fmt.Errorf("find kernel release: %w", err)
	}
	var rels []string
	for _, e := range ents {
		if e.IsDir() {
			rels = append(rels, e.Name())
		}
	}
	if len(rels) != 1 {
		return "", fmt.Errorf("find kernel release: want one directory in lib/modules, found %q", rels)
	}
	return rels[0], nil
}

// staticCheck returns a warning when the agent binary is not a statically
// linked ELF executable, and "" when it is.
func staticCheck(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Sprintf("agent %s is not an ELF binary; the guest cannot run it as /init", path)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Sprintf("agent %s is dynamically linked; the guest cannot run it as /init", path)
		}
	}
	return ""
}
