package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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

// jailEnv names the variable that makes a process the jail stage.
const jailEnv = "AIRLOCK_VM_JAIL"

// jailRootName is the directory in the VM's directory that the jail's
// root is mounted on, inside the jail stage's mount namespace only.
const jailRootName = ".jail"

// jailSpec is what the jail stage is told, as JSON in jailEnv.
type jailSpec struct {
	UID, GID int
	Groups   []int
	Root     string // an empty directory to mount the new root on
	Binds    []jailBind
	Links    map[string]string // symbolic links to make in the new root, as /lib -> usr/lib
	Proc     bool              // mount a /proc that shows QEMU only its own processes
	Argv     []string
	// SyncFD is read for one byte before anything is done, so that the
	// parent can place the process in its cgroup first; 0 for none.
	SyncFD int
	// LifeFD is the read end of a pipe whose write end only the parent
	// holds, when the process is to die with its parent (Config.Detach
	// false, and every tool); 0 otherwise. In a PID namespace of its own
	// the process cannot see its parent, so it checks the parent is alive
	// by the pipe not being hung up, after it set the parent-death signal
	// again.
	LifeFD int
	// Env is the environment the command runs with; QEMU's is empty.
	Env []string
	// Seccomp installs the image tools' system call filter (toolDenied)
	// before the command runs.
	Seccomp bool
	// QEMUFilter installs QEMU's allow-list (qemuSyscalls) before QEMU
	// runs, under QEMU's own deny-list (-sandbox): "enforce", or "log" to
	// measure; "" for none.
	QEMUFilter string
	// Rlimits are set before the command runs.
	Rlimits []jailRlimit
	// KeepCaps are capabilities the command keeps (as ambient ones) when
	// it takes the jail's user; every other one is dropped. Only
	// CAP_DAC_READ_SEARCH is ever kept, by a tool that reads a tree whose
	// files keep their owners and modes (Tool.ReadAnyFile).
	KeepCaps []int
}

// jailRlimit is one resource limit, soft and hard alike.
type jailRlimit struct {
	Resource int
	Max      uint64
}

// jailBind is a host file or directory the jail shows at the same path.
type jailBind struct {
	Path  string
	Write bool // read-write, else read-only
	Dev   bool // device nodes may be opened
}

func init() {
	if s, ok := os.LookupEnv(jailEnv); ok {
		err := runJail(s)
		fmt.Fprintf(os.Stderr, "airlock: jail stage (%s): %v\n", filepath.Base(jailTarget(s)), err)
		os.Exit(126)
	}
}

// jailTarget is the program a jail stage's spec runs, for its error
// message; "" when the spec cannot be read.
func jailTarget(s string) string {
	var spec jailSpec
	if json.Unmarshal([]byte(s), &spec) != nil || len(spec.Argv) == 0 {
		return ""
	}
	return spec.Argv[0]
}

// runJail is the jail stage. It only returns on failure.
func runJail(s string) error {
	var spec jailSpec
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		return fmt.Errorf("read the jail's spec: %w", err)
	}
	if len(spec.Argv) == 0 || spec.UID <= 0 || spec.GID <= 0 || spec.Root == "" {
		return errors.New("the jail's spec names no command, root or unprivileged user")
	}
	// Capabilities' bounding set and no_new_privs are per thread; the
	// thread that drops them is the one that executes QEMU.
	runtime.LockOSThread()
	if spec.SyncFD > 0 {
		f := os.NewFile(uintptr(spec.SyncFD), "sync")
		var b [1]byte
		if n, _ := f.Read(b[:]); n != 1 {
			return errors.New("the server went away before the VM started")
		}
		f.Close()
	}
	if err := buildRoot(spec); err != nil {
		return err
	}
	if err := dropPrivileges(spec); err != nil {
		return err
	}
	if spec.LifeFD > 0 {
		// A change of user clears the parent-death signal: set it again,
		// and make sure the parent did not die before that.
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return fmt.Errorf("set the parent-death signal: %w", err)
		}
		if !parentAlive(spec.LifeFD) {
			return errors.New("the server went away before the jailed process started")
		}
		unix.Close(spec.LifeFD)
	}
	for _, l := range spec.Rlimits {
		if err := unix.Setrlimit(l.Resource, &unix.Rlimit{Cur: l.Max, Max: l.Max}); err != nil {
			return fmt.Errorf("set resource limit %d: %w", l.Resource, err)
		}
	}
	if spec.Seccomp {
		if err := loadToolFilter(); err != nil {
			return err
		}
	}
	if spec.QEMUFilter != "" {
		if err := loadQEMUFilter(spec.QEMUFilter); err != nil {
			return err
		}
	}
	env := spec.Env
	if env == nil {
		env = []string{}
	}
	return syscall.Exec(spec.Argv[0], spec.Argv, env)
}

// parentAlive reports whether the write end of the life pipe whose read
// end is fd is still open: the parent that holds it is alive. A signal
// (the Go runtime's preemption among them) may interrupt the poll: it is
// asked again.
func parentAlive(fd int) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && (n == 0 || fds[0].Revents&(unix.POLLHUP|unix.POLLERR) == 0)
	}
}

// buildRoot makes the jail's root and pivots into it.
func buildRoot(spec jailSpec) error {
	root := spec.Root
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mount namespace private: %w", err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount the jail's root on %s: %w", root, err)
	}
	for _, b := range spec.Binds {
		if err := bindInto(root, b); err != nil {
			return err
		}
	}
	for name, target := range spec.Links {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			return fmt.Errorf("link %s in the jail: %w", name, err)
		}
	}
	if spec.Proc {
		dir := filepath.Join(root, "proc")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// Every jailed QEMU has a user of its own, so hidepid leaves it
		// only its own processes; subset=pid hides the rest of /proc.
		if err := unix.Mount("proc", dir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible,subset=pid"); err != nil {
			return fmt.Errorf("mount the jail's /proc: %w", err)
		}
	}
	old := filepath.Join(root, ".old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot into the jail's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := os.Remove("/.old"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make the jail's root read-only: %w", err)
	}
	return nil
}

// bindInto shows b.Path at the same path under root.
func bindInto(root string, b jailBind) error {
	fi, err := os.Stat(b.Path)
	if err != nil {
		return fmt.Errorf("the jail needs %s: %w", b.Path, err)
	}
	target := filepath.Join(root, b.Path)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("make a mount point for %s: %w", b.Path, err)
	}
	if err := unix.Mount(b.Path, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s into the jail: %w", b.Path, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID)
	if !b.Write {
		flags |= unix.MS_RDONLY
	}
	if !b.Dev {
		flags |= unix.MS_NODEV
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("restrict %s in the jail: %w", b.Path, err)
	}
	return nil
}

// dropPrivileges empties the capability bounding set, sets no_new_privs
// and becomes the jail's user. The change of user clears the permitted,
// effective and ambient capabilities.
func dropPrivileges(spec jailSpec) error {
	for c := 0; ; c++ {
		if slices.Contains(spec.KeepCaps, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) && c > 0 {
				break // past the last capability this kernel knows
			}
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if len(spec.KeepCaps) > 0 {
		if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("keep capabilities: %w", err)
		}
	}
	if err := syscall.Setgroups(spec.Groups); err != nil {
		return fmt.Errorf("set groups: %w", err)
	}
	if err := syscall.Setresgid(spec.GID, spec.GID, spec.GID); err != nil {
		return fmt.Errorf("set group %d: %w", spec.GID, err)
	}
	if err := syscall.Setresuid(spec.UID, spec.UID, spec.UID); err != nil {
		return fmt.Errorf("set user %d: %w", spec.UID, err)
	}
	if len(spec.KeepCaps) == 0 {
		return nil
	}
	// The change of user kept the permitted set (PR_SET_KEEPCAPS) but
	// emptied the effective one: make the kept capabilities the only ones
	// in every set, and ambient, so that they survive the execve of a
	// program without file capabilities.
	var data [2]unix.CapUserData
	for _, c := range spec.KeepCaps {
		data[c/32].Effective |= 1 << (c % 32)
		data[c/32].Permitted |= 1 << (c % 32)
		data[c/32].Inheritable |= 1 << (c % 32)
	}
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	for _, c := range spec.KeepCaps {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c), 0, 0); err != nil {
			return fmt.Errorf("raise ambient capability %d: %w", c, err)
		}
	}
	return unix.Prctl(unix.PR_SET_KEEPCAPS, 0, 0, 0, 0)
}

// jailSpecFor is the jail of cfg, whose QEMU is bin run with argv.
func jailSpecFor(cfg Config, bin string, argv []string) (jailSpec, error) {
	j := cfg.Jail
	spec := jailSpec{
		UID: j.UID, GID: j.GID, Groups: j.Groups,
		Root: filepath.Join(cfg.Dir, jailRootName), Links: map[string]string{},
		Proc: cfg.MemoryFile != "" && !cfg.MemoryShared, Argv: argv, QEMUFilter: qemuFilterMode(),
	}
	add := func(path string, write, dev bool) {
		for i, b := range spec.Binds {
			if b.Path == path {
				spec.Binds[i].Write = b.Write || write
				return
			}
		}
		spec.Binds = append(spec.Binds, jailBind{Path: path, Write: write, Dev: dev})
	}
	// The system: QEMU, its libraries and data. Merged-/usr systems link
	// /bin, /lib and friends into /usr.
	add("/usr", false, false)
	for _, name := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(name)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(name)
			if err != nil {
				return spec, err
			}
			spec.Links[name] = target
		case fi.IsDir():
			add(name, false, false)
		}
	}
	if !strings.HasPrefix(bin, "/usr/") {
		add(filepath.Dir(bin), false, false)
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		add("/etc/ld.so.cache", false, false)
	}
	add("/dev/null", true, true)
	add("/dev/urandom", false, true)
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
	slices.SortFunc(spec.Binds, func(a, b jailBind) int { return strings.Compare(a.Path, b.Path) })
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
