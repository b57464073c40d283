package vm

import (
	"fmt"
	"os"

	seccomp "github.com/elastic/go-seccomp-bpf"
)

// qemuSyscalls are the system calls a jailed QEMU may make: the
// allow-list airlock puts under QEMU's own deny-list (-sandbox). It was
// measured, not guessed (docs/hardening.md, "QEMU's system calls"): the
// VM tests and the attack suite ran with the filter logging instead of
// refusing, and every call logged joined the list. Under KVM QEMU also
// needs what its KVM ioctls and vCPU threads use, which these calls
// cover; KVM could not be measured on the machines this was made on.
var qemuSyscalls = []string{
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

// qemuSeccompEnv set to "log" makes the filter log the calls it does not
// allow instead of refusing them (to the kernel's audit log, dmesg), to
// measure what QEMU needs; anything else, or unset, enforces it.
const qemuSeccompEnv = "AIRLOCK_QEMU_SECCOMP"

// qemuFilterMode is the mode the jail stage is told: "log" to measure,
// else "enforce".
func qemuFilterMode() string {
	if os.Getenv(qemuSeccompEnv) == "log" {
		return "log"
	}
	return "enforce"
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
			Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionAllow, Names: qemuSyscalls}},
		},
	}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("install QEMU's seccomp filter: %w", err)
	}
	return nil
}
