package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/vm"
)

// ownerLockName is flocked by the process that owns the sandbox (the one
// that created or adopted it) for as long as it runs; the kernel drops the
// lock when that process dies. QEMU's pid file (vm.PIDFileName) tells
// whether the sandbox's VM still runs.
const ownerLockName = "owner.lock"

// sweepGrace protects a directory that is being created right now, before
// its owner took the lock.
const sweepGrace = time.Minute

// lockOwner takes the owner lock of a sandbox directory. The returned file
// must stay open while the sandbox is owned. A lock that another open file
// holds (in this process or another) is errdefs.ErrConflict.
func lockOwner(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("sandbox %s is owned by another live process: %w", filepath.Base(dir), errdefs.ErrConflict)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// Sweep removes the directories of sandboxes that nobody owns any more and
// whose VM is not running: what a host process killed outright (SIGKILL,
// power loss) left behind. A directory whose QEMU is alive (a detached VM
// waiting for Runtime.Adopt or Runtime.Remove), that holds a saved state
// (a suspended sandbox, waiting for Runtime.Wake or Runtime.Remove), whose
// owner lock is held, or that is younger than a minute (being created)
// stays. It also removes what builds of template snapshots left when
// their process died; snapshots themselves stay.
func Sweep(dir datadir.Dir, log *slog.Logger) {
	sweepSnapshots(dir, log)
	entries, err := os.ReadDir(dir.Sandboxes())
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "sbx") {
			continue
		}
		p := filepath.Join(dir.Sandboxes(), e.Name())
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < sweepGrace {
			continue
		}
		if vmRunning(p) || SuspendedState(p) {
			continue
		}
		lock, err := lockOwner(p)
		if err != nil {
			continue // owned by a live process
		}
		if vmRunning(p) || SuspendedState(p) { // its owner ran, suspended it and died since the first look
			lock.Close()
			continue
		}
		if err := removeDir(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove abandoned sandbox", "dir", p, "err", err)
		} else {
			log.Info("removed abandoned sandbox", "id", e.Name())
		}
		lock.Close()
	}
}

// vmRunning reports whether the QEMU process recorded in dir still runs.
func vmRunning(dir string) bool {
	_, err := vm.RunningPID(dir)
	return err == nil
}
