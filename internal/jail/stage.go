// Package jail is the stage that confines a process before it runs
// (docs/hardening.md): the server re-executes its own binary with Env
// holding a Spec, in namespaces of its own (Namespaces), and this
// package's init, which runs before any package that is not a dependency
// of it, mounts the process's root, drops its privileges, installs its
// system call filter and executes the program. The package depends on
// little, so that the stage starts in a millisecond or two however large
// the binary that carries it.
package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// Namespaces are the namespaces a jailed process gets of its own: a
// mount namespace that shows only what it needs, an empty network
// namespace (every socket QEMU uses is passed in as a descriptor, and the
// image tools use none), and IPC, UTS and PID namespaces, so that it sees
// no other process, shares no System V IPC and no abstract unix socket
// with the host.
const Namespaces = syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC |
	syscall.CLONE_NEWUTS | syscall.CLONE_NEWPID

// Env names the variable that makes a process the jail stage.
const Env = "AIRLOCK_VM_JAIL"

// Spec is what the jail stage is told, as JSON in Env.
type Spec struct {
	UID, GID int
	Groups   []int
	Root     string // an empty directory to mount the new root on
	Binds    []Bind
	Links    map[string]string // symbolic links to make in the new root, as /lib -> usr/lib
	Proc     bool              // mount a /proc that shows QEMU only its own processes
	Argv     []string
	// SyncFD is read for one byte before anything is done, so that the
	// parent can place the process in its cgroup first; 0 for none.
	SyncFD int
	// LifeFD is the read end of a pipe whose write end only the parent
	// holds, when the process is to die with its parent (vm.Config.Detach
	// false, and every tool); 0 otherwise. In a PID namespace of its own
	// the process cannot see its parent, so it checks the parent is alive
	// by the pipe not being hung up, after it set the parent-death signal
	// again.
	LifeFD int
	// Env is the environment the command runs with; QEMU's is empty.
	Env []string
	// Seccomp installs the image tools' system call filter (ToolDenied)
	// before the command runs.
	Seccomp bool
	// QEMUFilter installs QEMU's allow-list (QEMUSyscalls) before QEMU
	// runs, under QEMU's own deny-list (-sandbox): "enforce", or "log" to
	// measure; "" for none.
	QEMUFilter string
	// Rlimits are set before the command runs.
	Rlimits []Rlimit
	// KeepCaps are capabilities the command keeps (as ambient ones) when
	// it takes the jail's user; every other one is dropped. Only
	// CAP_DAC_READ_SEARCH is ever kept, by a tool that reads a tree whose
	// files keep their owners and modes (vm.Tool.ReadAnyFile).
	KeepCaps []int
}

// Rlimit is one resource limit, soft and hard alike.
type Rlimit struct {
	Resource int
	Max      uint64
}

// Bind is a host file or directory the jail shows at the same path.
type Bind struct {
	Path  string
	Write bool // read-write, else read-only
	Dev   bool // device nodes may be opened
}

func init() {
	if s, ok := os.LookupEnv(Env); ok {
		err := run(s)
		fmt.Fprintf(os.Stderr, "airlock: jail stage (%s): %v\n", filepath.Base(target(s)), err)
		os.Exit(126)
	}
}

// target is the program a jail stage's spec runs, for its error
// message; "" when the spec cannot be read.
func target(s string) string {
	var spec Spec
	if json.Unmarshal([]byte(s), &spec) != nil || len(spec.Argv) == 0 {
		return ""
	}
	return spec.Argv[0]
}

// run is the jail stage. It only returns on failure.
func run(s string) error {
	var spec Spec
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
func buildRoot(spec Spec) error {
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
func bindInto(root string, b Bind) error {
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
func dropPrivileges(spec Spec) error {
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

// QEMUSyscalls are the system calls a jailed QEMU may make: the
// allow-list airlock puts under QEMU's own deny-list (-sandbox). It was
// measured, not guessed (docs/hardening.md, "QEMU's system calls"): the
// VM tests and the attack suite ran with the filter logging instead of
// refusing, and every call logged joined the list. Under KVM QEMU also
// needs what its KVM ioctls and vCPU threads use, which these calls
// cover; KVM could not be measured on the machines this was made on.
var QEMUSyscalls = []string{
	// Files and descriptors: the disk, the memory file, the passed sockets.
	"read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
	"openat", "open", "close", "close_range", "dup", "dup2", "dup3", "fcntl", "lseek",
	"fstat", "newfstatat", "stat", "lstat", "statx", "fstatfs", "statfs", "access", "faccessat", "faccessat2",
	"readlink", "readlinkat", "getdents64", "getcwd", "ioctl", "flock",
	"fsync", "fdatasync", "ftruncate", "fallocate", "fadvise64",
	// QEMU calls unlink as it runs (measured); in its jail every path is
	// read-only but its disk and memory file, which are mount points and
	// cannot be unlinked.
	"unlink", "unlinkat",
	"pipe", "pipe2", "eventfd2", "signalfd4", "timerfd_create", "timerfd_settime", "timerfd_gettime",
	"epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "poll", "ppoll", "select", "pselect6",
	// Sockets handed in as descriptors: no socket(), connect() or bind();
	// listen() is called on the passed listening sockets.
	"listen", "sendmsg", "recvmsg", "sendto", "recvfrom", "shutdown", "accept", "accept4",
	"getsockopt", "setsockopt", "getsockname", "getpeername",
	// Memory.
	"mmap", "munmap", "mprotect", "mremap", "madvise", "brk", "mlock", "munlock", "mbind", "get_mempolicy",
	"set_mempolicy", "membarrier", "memfd_create",
	// Threads, signals and time.
	"clone", "clone3", "futex", "set_robust_list", "get_robust_list", "set_tid_address", "rseq",
	"exit", "exit_group", "gettid", "getpid", "getppid", "tgkill", "tkill", "kill",
	"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigtimedwait", "sigaltstack", "restart_syscall",
	"nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "times",
	"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_getscheduler",
	"setitimer", "getitimer",
	// Identity and limits, read only.
	"getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid",
	"uname", "getrlimit", "prlimit64", "getrusage", "sysinfo", "getrandom", "prctl", "arch_prctl",
	// QEMU installs its own filter on top of this one (a further filter
	// can only refuse more).
	"seccomp",
	// The jail stage executes QEMU under this filter; QEMU's own filter
	// (spawn=deny) then refuses every later execve.
	"execve",
}

// loadQEMUFilter installs the allow-list on this thread before it
// executes QEMU: a call not on it fails with EPERM and is logged, or in
// "log" mode is allowed and logged.
func loadQEMUFilter(mode string) error {
	def := seccomp.ActionErrno
	if mode == "log" {
		def = seccomp.ActionLog
	}
	f := seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagLog,
		Policy: seccomp.Policy{
			DefaultAction: def,
			Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionAllow, Names: QEMUSyscalls}},
		},
	}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("install QEMU's seccomp filter: %w", err)
	}
	return nil
}

// ToolDenied are the system calls an image tool never needs and an
// exploit of one would: the network, other processes' memory, the kernel's
// rarer interfaces (BPF, io_uring, userfaultfd, perf, keyrings), mounts
// and namespaces, modules, and anything that changes the machine.
// Denied calls fail with EPERM; the tools handle that as any failure.
var ToolDenied = []string{
	"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
	"sendto", "sendmsg", "sendmmsg", "recvfrom", "recvmsg", "recvmmsg",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"keyctl", "add_key", "request_key",
	"mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
	"move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"open_by_handle_at", "name_to_handle_at",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "personality",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
	"iopl", "ioperm", "mknod", "mknodat", "vhangup", "lookup_dcookie", "fanotify_init",
}

// loadToolFilter installs the tools' filter on this thread, whose
// no_new_privs is set, before it executes the tool.
func loadToolFilter() error {
	f := seccomp.Filter{
		NoNewPrivs: true,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: ToolDenied}},
		},
	}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("install the tools' seccomp filter: %w", err)
	}
	return nil
}
