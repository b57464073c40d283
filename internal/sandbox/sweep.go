package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/datadir"
)

// Files that mark who owns a sandbox directory.
const (
	// ownerLockName is flocked by the process that created the sandbox for
	// as long as it runs; the kernel drops the lock when that process dies.
	ownerLockName = "owner.lock"
	// pidFileName holds the QEMU process ID.
	pidFileName = "qemu.pid"
)

// sweepGrace protects a directory that is being created right now, before
// its owner took the lock.
const sweepGrace = time.Minute

// lockOwner takes the owner lock of a sandbox directory. The returned file
// must stay open while the sandbox is owned.
func lockOwner(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// Sweep removes the directories of sandboxes that nobody owns any more and
// whose VM is not running: what a host process killed outright (SIGKILL,
// power loss) left behind. Kept sandboxes, whose VM runs on, stay.
func Sweep(dir datadir.Dir, log *slog.Logger) {
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
		if vmRunning(p) {
			continue
		}
		lock, err := lockOwner(p)
		if err != nil {
			continue // owned by a live process
		}
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove abandoned sandbox", "dir", p, "err", err)
		} else {
			log.Info("removed abandoned sandbox", "id", e.Name())
		}
		lock.Close()
	}
}

// vmRunning reports whether the QEMU process recorded in dir still runs.
func vmRunning(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, pidFileName))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmd), dir)
}
