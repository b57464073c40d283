package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// The freeze ioctls of linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int).
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// freezer freezes and thaws the root filesystem, and thaws it on its own
// when a freeze outlives its deadline.
//
// While the root is frozen the agent itself writes nothing to it: its
// logs go to the console and its sockets, pipes and ptys live on other
// filesystems, and the root is mounted noatime, so reading and running
// programs write nothing either. Requests that write files (write, mkdir,
// tar_in, ...) wait in the kernel like any writer until the thaw; they
// hold no lock that a thaw needs. mu is never held across such a write.
type freezer struct {
	system bool // freeze for real; false in tests on a host, which only keep the state
	log    *slog.Logger

	mu      sync.Mutex  // guards the fields below
	frozen  bool        // a freeze holds
	root    *os.File    // the frozen root, open while frozen (system only)
	timer   *time.Timer // ends the freeze at its deadline
	gen     uint64      // counts freezes, so that a late timer leaves a later freeze alone
	expired bool        // the last freeze ended at its deadline, and no thaw was asked since
}

// freeze freezes the root filesystem until thaw, or until timeout has
// passed.
func (f *freezer) freeze(timeout time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		return &agentproto.Error{Code: agentproto.CodeState, Message: "the root filesystem is already frozen: thaw it first"}
	}
	if f.system {
		root, err := os.Open("/")
		if err != nil {
			return fmt.Errorf("open the root filesystem: %w", err)
		}
		// FIFREEZE writes the dirty data and the journal out, then blocks
		// new writers; it returns once the filesystem is clean on disk.
		if err := ioctlInt(root, ioctlFIFREEZE); err != nil {
			root.Close()
			if errors.Is(err, unix.EBUSY) {
				return &agentproto.Error{Code: agentproto.CodeState, Message: "the root filesystem is already frozen by a process in the sandbox"}
			}
			return fmt.Errorf("freeze the root filesystem: %w", err)
		}
		f.root = root
	}
	f.frozen, f.expired = true, false
	f.gen++
	gen := f.gen
	f.timer = time.AfterFunc(timeout, func() { f.expire(gen, timeout) })
	return nil
}

// thaw ends a freeze, if one holds.
func (f *freezer) thaw() (agentproto.ThawResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		res := agentproto.ThawResult{Expired: f.expired}
		f.expired = false
		return res, nil
	}
	f.timer.Stop()
	if err := f.unfreeze(); err != nil {
		return agentproto.ThawResult{}, err
	}
	return agentproto.ThawResult{Thawed: true}, nil
}

// expire ends freeze number gen at its deadline.
func (f *freezer) expire(gen uint64, timeout time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen || f.gen != gen {
		return
	}
	if err := f.unfreeze(); err != nil {
		f.log.Error("thaw the root filesystem at the freeze's deadline", "err", err)
		return
	}
	f.expired = true
	f.log.Warn("the root filesystem was thawed at the freeze's deadline: no thaw came", "timeout", timeout)
}

// unfreeze thaws the frozen root. The caller holds mu.
func (f *freezer) unfreeze() error {
	if f.root != nil {
		// EINVAL: something in the sandbox thawed it already.
		if err := ioctlInt(f.root, ioctlFITHAW); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("thaw the root filesystem: %w", err)
		}
		f.root.Close()
		f.root = nil
	}
	f.frozen = false
	return nil
}

func ioctlInt(f *os.File, req uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, 0); e != 0 {
		return e
	}
	return nil
}

func (a *Agent) handleFreeze(st net.Conn, req *agentproto.FreezeRequest) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "freeze request without parameters")
		return
	}
	if err := req.Validate(); err != nil {
		replyErr(st, agentproto.CodeInvalid, err.Error())
		return
	}
	if !a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
		return
	}
	if err := a.freezer.freeze(time.Duration(req.TimeoutMS) * time.Millisecond); err != nil {
		reply(st, agentproto.Result{Error: toProtoError(err)})
		return
	}
	reply(st, agentproto.Result{})
}

func (a *Agent) handleThaw(st net.Conn) {
	res, err := a.freezer.thaw()
	if err != nil {
		replyErr(st, agentproto.CodeInternal, err.Error())
		return
	}
	reply(st, agentproto.Result{Thaw: &res})
}

func (a *Agent) handleSync(st net.Conn) {
	if !a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
		return
	}
	if a.cfg.System {
		unix.Sync()
	}
	reply(st, agentproto.Result{})
}
