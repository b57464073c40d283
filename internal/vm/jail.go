package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/jail"
)

// Jail confines a VM's QEMU (docs/hardening.md). Start runs QEMU through
// a jail stage: this same binary, started in a mount namespace of its own,
// which mounts a root holding only what that QEMU needs (the system's
// /usr read-only, the kernel, initramfs and disk images at their usual
// paths, a /dev with null, urandom and, under KVM, kvm), pivots into it,
// drops every capability from its bounding set, sets no_new_privs, takes
// the jail's user and groups, and executes QEMU with QEMU's own seccomp
// sandbox on. The VM's sockets and console are passed in as descriptors
// made by this process, so QEMU writes no file but its disk (and a
// template VM its memory file).
type Jail struct {
	// UID and GID are the user and group QEMU runs as: the VM's own, from
	// the range AllocateUID hands out.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Groups are supplementary groups: under KVM the group that may open
	// /dev/kvm.
	Groups []int `json:"groups,omitempty"`
}

// seccompArgs is QEMU's seccomp sandbox with every optional class of
// system call denied.
var seccompArgs = []string{"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}

// jailRootName is the directory in the VM's directory that the jail's
// root is mounted on, inside the jail stage's mount namespace only.
const jailRootName = ".jail"

// jailSpecFor is the jail of cfg, whose QEMU is bin run with argv.
func jailSpecFor(cfg Config, bin string, argv []string) (jail.Spec, error) {
	j := cfg.Jail
	spec := jail.Spec{
		UID: j.UID, GID: j.GID, Groups: j.Groups,
		Root: filepath.Join(cfg.Dir, jailRootName), Links: map[string]string{},
		Proc: cfg.MemoryFile != "" && !cfg.MemoryShared, Argv: argv, QEMUFilter: qemuFilterMode(),
	}
	add := func(path string, write, dev bool) { addBind(&spec, path, write, dev) }
	// The system: QEMU, its libraries and data.
	if err := addSystem(&spec, bin); err != nil {
		return spec, err
	}
	if cfg.Accel == AccelKVM {
		add("/dev/kvm", true, true)
	}
	for _, f := range []string{cfg.Kernel, cfg.Initramfs} {
		if err := readableByJail(f); err != nil {
			return spec, err
		}
		add(f, false, false)
	}
	if cfg.Disk != "" {
		if len(cfg.Backing) == 0 {
			return spec, fmt.Errorf("the disk %s has no recorded backing chain: a jailed VM sees only the images the server made it from", cfg.Disk)
		}
		for _, f := range cfg.Backing {
			if !filepath.IsAbs(f) {
				return spec, fmt.Errorf("backing image %q is not an absolute path", f)
			}
			if err := readableByJail(f); err != nil {
				return spec, err
			}
			add(f, false, false)
		}
		add(cfg.Disk, true, false)
	}
	if cfg.MemoryShared {
		add(cfg.MemoryFile, true, false)
	}
	slices.SortFunc(spec.Binds, func(a, b jail.Bind) int { return strings.Compare(a.Path, b.Path) })
	return spec, nil
}

// readableByJail checks that a file QEMU only reads is readable by every
// user: the jail binds it in, but its mode still applies.
func readableByJail(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o004 == 0 {
		return fmt.Errorf("%s (mode %o) is not readable by a jailed VM: make it readable by others (its directory may stay private)", path, fi.Mode().Perm())
	}
	return nil
}

// ownByJail gives the files QEMU writes to the jail's user.
func ownByJail(cfg Config) error {
	files := []string{}
	if cfg.Disk != "" {
		files = append(files, cfg.Disk)
	}
	if cfg.MemoryShared {
		files = append(files, cfg.MemoryFile)
	}
	for _, f := range files {
		if err := os.Chown(f, cfg.Jail.UID, cfg.Jail.GID); err != nil {
			return fmt.Errorf("give %s to the VM's user: %w", f, err)
		}
	}
	return nil
}
