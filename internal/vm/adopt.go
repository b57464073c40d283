package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// ErrNotRunning marks a VM that was expected to run but whose QEMU is gone
// (or was never recorded). The error's message says why, and quotes the
// end of the guest's console when there is one.
var ErrNotRunning = errors.New("vm not running")

// adoptQMPTimeout bounds connecting to an adopted QEMU's QMP socket. A
// running QEMU answers at once.
const adoptQMPTimeout = 5 * time.Second

// pollInterval is how often an adopted QEMU is checked for when the kernel
// offers no pidfd to wait on.
const pollInterval = 250 * time.Millisecond

// Adopt returns a Machine for a QEMU that another process started (with
// Config.Detach) and that is still running with its files in dir, so that
// this process can watch, use and stop it as if it had started it. The
// process recorded in dir's pid file must be alive and be that VM's QEMU:
// its command line must name dir's agent socket, so that a recycled
// process ID is never mistaken for it. When it is not, the error wraps
// ErrNotRunning and quotes the guest's console.
//
// Adopt connects to QEMU's QMP socket, which QEMU serves to one client at a
// time: whoever held it before must have closed it (Machine.Release, or by
// exiting). A QMP socket that does not answer is logged and leaves Stop to
// kill QEMU.
func Adopt(dir string, log *slog.Logger) (*Machine, error) {
	return adopt(dir, log, true)
}

// adopt is Adopt; usePidfd false watches the process by polling /proc, as
// on kernels without pidfd_open.
func adopt(dir string, log *slog.Logger, usePidfd bool) (*Machine, error) {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	pid, err := RunningPID(dir)
	if err != nil {
		return nil, err
	}
	m := &Machine{
		cfg: Config{Dir: dir, Detach: true}, log: log,
		done: make(chan struct{}), released: make(chan struct{}),
	}
	if usePidfd {
		f, err := openPidfd(pid)
		switch {
		case errors.Is(err, unix.ESRCH):
			return nil, notRunning(dir, fmt.Sprintf("qemu (pid %d) has exited", pid))
		case err != nil:
			log.Debug("no pidfd for qemu: polling /proc instead", "pid", pid, "err", err)
		default:
			m.pidfd = f
		}
	}
	// The pid was checked before the pidfd was opened: check again, so
	// that a QEMU that exited in between, its pid reused, is not taken for
	// the process the pidfd refers to.
	if _, err := RunningPID(dir); err != nil {
		m.closePidfd()
		return nil, err
	}
	proc, err := os.FindProcess(pid)
	if err == nil {
		err = proc.Signal(syscall.Signal(0))
	}
	if errors.Is(err, syscall.EPERM) {
		m.closePidfd()
		return nil, fmt.Errorf("qemu (pid %d) in %s belongs to another user: %w", pid, dir, errdefs.ErrPrecondition)
	}
	if err != nil {
		m.closePidfd()
		return nil, notRunning(dir, fmt.Sprintf("qemu (pid %d): %v", pid, err))
	}
	m.proc, m.pid, m.adopted = proc, pid, true
	m.releaseProc = sync.OnceFunc(func() { proc.Release() })
	if m.pidfd != nil {
		go m.watchPidfd(pid)
	} else {
		go m.pollProc(pid)
	}

	m.console, m.consoleDone = dialConsole(dir)
	qmpPath := filepath.Join(dir, QMPSocketName)
	if _, err := os.Stat(qmpPath); err != nil {
		log.Warn("adopted qemu has no QMP socket: stop will kill it", "pid", pid, "err", err)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), adoptQMPTimeout)
		q, err := DialQMP(ctx, qmpPath)
		cancel()
		if err != nil {
			log.Warn("adopted qemu's QMP socket does not answer: stop will kill it", "pid", pid, "err", err)
		}
		m.qmp = q
	}
	log.Debug("vm adopted", "pid", pid)
	return m, nil
}

// RunningPID returns the process ID of the QEMU running with its files in
// dir: the one its pid file records, if that process is alive and its
// command line names dir's agent socket. Otherwise the error wraps
// ErrNotRunning and says why.
func RunningPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, PIDFileName))
	if errors.Is(err, os.ErrNotExist) {
		return 0, notRunning(dir, "no qemu process is recorded in "+dir)
	}
	if err != nil {
		return 0, notRunning(dir, fmt.Sprintf("read qemu pid: %v", err))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, notRunning(dir, fmt.Sprintf("%s holds %q, not a process ID", PIDFileName, strings.TrimSpace(string(b))))
	}
	if !isQEMUOf(pid, dir) {
		return 0, notRunning(dir, fmt.Sprintf("qemu (pid %d) has exited", pid))
	}
	return pid, nil
}

// isQEMUOf reports whether process pid is alive and its command line names
// dir, as QEMU's does (Args: its -name; a QEMU started before sockets were
// passed as descriptors names dir's agent socket instead). A zombie's
// command line is empty, so an exited but unreaped QEMU does not count.
func isQEMUOf(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	want := "path=" + filepath.Join(dir, AgentSocketName)
	for _, arg := range strings.Split(string(b), "\x00") {
		if arg == "guest="+optValue(dir) {
			return true
		}
		i := strings.Index(arg, want)
		if i < 0 {
			continue
		}
		if rest := arg[i+len(want):]; rest == "" || rest[0] == ',' {
			return true
		}
	}
	return false
}

// notRunning is the ErrNotRunning error for the VM in dir, quoting its
// console.
func notRunning(dir, why string) error {
	if t := strings.TrimSpace(consoleTail(dir, 2000)); t != "" {
		return fmt.Errorf("%s: %w; console tail:\n%s", why, ErrNotRunning, t)
	}
	return fmt.Errorf("%s: %w", why, ErrNotRunning)
}

// openPidfd returns a non-blocking pidfd for pid, registered with the
// runtime's poller.
func openPidfd(pid int) (*os.File, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid)), nil
}

func (m *Machine) closePidfd() {
	if m.pidfd != nil {
		m.pidfd.Close()
	}
}

// watchPidfd closes done when the adopted QEMU exits: its pidfd becomes
// readable then. It returns then, or when Release closes the pidfd. Should
// the runtime be unable to poll the pidfd, it falls back to pollProc.
func (m *Machine) watchPidfd(pid int) {
	rc, err := m.pidfd.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool {
			n, perr := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return perr == nil && n > 0
		})
	}
	select {
	case <-m.released:
		return
	default:
	}
	if err != nil {
		m.log.Debug("cannot wait on qemu's pidfd: polling /proc instead", "pid", pid, "err", err)
		m.pollProc(pid)
		return
	}
	m.pidfd.Close()
	m.exited(pid)
}

// pollProc closes done when the adopted QEMU is no longer alive, checking
// /proc every pollInterval. It returns then, or when the machine is
// released.
func (m *Machine) pollProc(pid int) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for isQEMUOf(pid, m.cfg.Dir) {
		select {
		case <-m.released:
			return
		case <-t.C:
		}
	}
	m.exited(pid)
}

// exited records the end of an adopted QEMU, whose exit status only its
// parent learns, and closes done.
func (m *Machine) exited(pid int) {
	m.exitErr = fmt.Errorf("qemu (pid %d, adopted) exited; only the process that started it learns how", pid)
	// os.FindProcess holds a pidfd of its own: let go of it now rather
	// than when the collector finds it.
	m.releaseProc()
	close(m.done)
}
