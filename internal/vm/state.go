package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Run states that Status reports: QEMU's RunState names, of which these
// are the ones airlock meets.
const (
	StatusRunning = "running"
	StatusPaused  = "paused"
	// StatusInMigrate is a machine started with Config.Incoming that is
	// waiting for, or in the middle of, RestoreState.
	StatusInMigrate = "inmigrate"
	// StatusPostMigrate is a machine whose state SaveState wrote: paused,
	// its disk handed over (QEMU takes it back on Resume).
	StatusPostMigrate = "postmigrate"
)

// migrationFD is the name the migration's file descriptor is passed under.
const migrationFD = "airlock-migration"

// statePollInterval is how often a migration's progress is asked for.
const statePollInterval = 10 * time.Millisecond

// control returns the machine's QMP connection, or why there is none.
func (m *Machine) control() (*QMP, error) {
	if m.Exited() {
		return nil, fmt.Errorf("qemu (pid %d) has exited: %w", m.PID(), ErrNotRunning)
	}
	if m.qmp == nil {
		return nil, fmt.Errorf("qemu (pid %d) has no QMP connection: %w", m.PID(), errdefs.ErrUnavailable)
	}
	return m.qmp, nil
}

// Pause stops the guest's vCPUs (QMP stop). QEMU and the guest's memory
// stay; devices see no time pass. Pausing a paused machine does nothing.
func (m *Machine) Pause(ctx context.Context) error {
	q, err := m.control()
	if err != nil {
		return fmt.Errorf("pause vm: %w", err)
	}
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause vm: %w", err)
	}
	return nil
}

// Resume runs the guest's vCPUs again (QMP cont), after Pause, SaveState
// or RestoreState. Resuming a running machine does nothing.
func (m *Machine) Resume(ctx context.Context) error {
	q, err := m.control()
	if err != nil {
		return fmt.Errorf("resume vm: %w", err)
	}
	if err := q.Execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume vm: %w", err)
	}
	return nil
}

// SetLink sets the link state of the network device (QMP set_link), as
// its guest sees it: a restored guest keeps the state it was saved with,
// and a NIC whose stream had no peer when the VM started shows no
// carrier, so the caller sets it up once its peer is connected. The
// machine may be paused.
func (m *Machine) SetLink(ctx context.Context, up bool) error {
	q, err := m.control()
	if err != nil {
		return fmt.Errorf("set network link: %w", err)
	}
	if err := q.Execute(ctx, "set_link", map[string]any{"name": netDev, "up": up}, nil); err != nil {
		return fmt.Errorf("set network link: %w", err)
	}
	return nil
}

// ResizeDisk sets the size of the root disk (Config.Disk) to bytes (QMP
// block_resize): its image grows or shrinks, and the guest is told by a
// virtio configuration change, which its kernel handles once its vCPUs
// run. The machine may be paused; it needs a root disk.
func (m *Machine) ResizeDisk(ctx context.Context, bytes int64) error {
	q, err := m.control()
	if err != nil {
		return fmt.Errorf("resize root disk: %w", err)
	}
	if bytes <= 0 {
		return fmt.Errorf("resize root disk to %d bytes: %w", bytes, errdefs.ErrInvalid)
	}
	if err := q.Execute(ctx, "block_resize", map[string]any{"device": rootDrive, "size": bytes}, nil); err != nil {
		return fmt.Errorf("resize root disk to %d bytes: %w", bytes, err)
	}
	return nil
}

// Status is QEMU's run state (query-status): StatusRunning, StatusPaused,
// StatusInMigrate, StatusPostMigrate, or another of QEMU's RunState names.
func (m *Machine) Status(ctx context.Context) (string, error) {
	q, err := m.control()
	if err != nil {
		return "", fmt.Errorf("query vm status: %w", err)
	}
	return status(ctx, q)
}

func status(ctx context.Context, q *QMP) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		return "", fmt.Errorf("query vm status: %w", err)
	}
	return st.Status, nil
}

// migrationInfo is the part of query-migrate's answer that is read.
type migrationInfo struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
	// Downtime is how long, in ms by QEMU's clock, the vCPUs stood still
	// for a migration that completed; absent before it completes.
	Downtime *int64 `json:"downtime"`
}

// setIgnoreShared sets the migration capability x-ignore-shared: RAM that
// is mapped shared from a file (Config.MemoryShared) is neither written by
// a save nor read by a restore, because the file holds it.
func setIgnoreShared(ctx context.Context, q *QMP, on bool) error {
	return q.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}},
	}, nil)
}

// SaveState writes the machine's state (device state, and RAM unless
// ignoreShared leaves out what its shared memory file holds) to path, as
// QEMU's migration stream. It stops the vCPUs first if they run, and the
// machine stays paused (StatusPostMigrate) afterwards: the caller Stops it
// (a suspend) or Resumes it.
//
// The state goes to a temporary file beside path, which is synced and
// renamed to path once QEMU reports the migration complete, so path is
// either absent or whole. ctx bounds the whole save; when it ends, the
// migration is cancelled. A failed save leaves the machine paused.
func (m *Machine) SaveState(ctx context.Context, path string, ignoreShared bool) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("save vm state: %w", err)
		}
	}()
	q, err := m.control()
	if err != nil {
		return err
	}
	st, err := status(ctx, q)
	if err != nil {
		return err
	}
	switch st {
	case StatusRunning:
		if err := q.Execute(ctx, "stop", nil, nil); err != nil {
			return err
		}
	case StatusInMigrate:
		return fmt.Errorf("the vm is waiting for a restore: %w", errdefs.ErrConflict)
	}
	if err := setIgnoreShared(ctx, q, ignoreShared); err != nil {
		return err
	}
	// QEMU throttles a migration to 32 MiB/s by default, which is meant
	// for a network while the guest runs; a paused guest to a local file
	// goes as fast as the disk takes it.
	if err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	// QEMU writes the stream to the file itself, through a descriptor
	// passed over QMP: all of it is written when QEMU says "completed",
	// which a pipe to a helper process could not promise.
	if err := q.executeFile(ctx, "getfd", map[string]any{"fdname": migrationFD}, f, nil); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate", map[string]any{"uri": "fd:" + migrationFD}, nil); err != nil {
		q.Execute(ctx, "closefd", map[string]any{"fdname": migrationFD}, nil)
		return err
	}
	if err := m.waitMigration(ctx, q, statePollInterval); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// waitMigration polls an outgoing migration, every interval, until it
// completes, fails or ctx ends; then it cancels the migration.
func (m *Machine) waitMigration(ctx context.Context, q *QMP, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// The poll itself is not cut by ctx: a deadline that fell in the
		// middle of it would close the QMP connection and leave the
		// migration running, where it must be cancelled below.
		var info migrationInfo
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := q.Execute(qctx, "query-migrate", nil, &info)
		cancel()
		if err != nil {
			return err
		}
		switch info.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", info.Status, orUnknown(info.ErrorDesc))
		}
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			q.Execute(cctx, "migrate_cancel", nil, nil)
			cancel()
			return fmt.Errorf("migration %s: %w", info.Status, ctx.Err())
		case <-m.done:
			return fmt.Errorf("qemu exited during the migration: %w", ErrNotRunning)
		case <-t.C:
		}
	}
}

// SettleSave ends what a SaveState that another process began and never
// finished (it died) left in the machine: a migration still under way is
// cancelled and waited out, and a machine that such a save stopped
// (paused by it, or past it in StatusPostMigrate, its disk handed over)
// runs again. It reports whether it found such a save. A machine waiting
// for a restore is left alone.
func (m *Machine) SettleSave(ctx context.Context) (bool, error) {
	q, err := m.control()
	if err != nil {
		return false, err
	}
	st, err := status(ctx, q)
	if err != nil || st == StatusInMigrate {
		return false, err
	}
	var info migrationInfo
	if err := q.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return false, err
	}
	switch info.Status {
	case "setup", "active", "device", "pre-switchover", "wait-unplug", "cancelling":
		if err := q.Execute(ctx, "migrate_cancel", nil, nil); err != nil {
			return true, err
		}
		t := time.NewTicker(statePollInterval)
		defer t.Stop()
		for info.Status != "completed" && info.Status != "failed" && info.Status != "cancelled" {
			select {
			case <-ctx.Done():
				return true, fmt.Errorf("wait for a cancelled save to end: %w", ctx.Err())
			case <-t.C:
			}
			if err := q.Execute(ctx, "query-migrate", nil, &info); err != nil {
				return true, err
			}
		}
	default:
		// No save under way. One that completed left the machine in
		// postmigrate, which only an outgoing migration leads to.
		if st != StatusPostMigrate {
			return false, nil
		}
	}
	if st, err = status(ctx, q); err != nil {
		return true, err
	}
	if st != StatusRunning {
		return true, m.Resume(ctx)
	}
	return true, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "qemu gave no reason"
	}
	return s
}

// RestoreState loads a state that SaveState wrote into a machine started
// with Config.Incoming, whose devices must be those the state was saved
// with. ignoreShared must match the save's: with it, RAM that the machine
// maps from its memory file is taken from the file, not the state. The
// machine is left paused; the caller Resumes it.
//
// A state QEMU cannot load makes it exit; the error then quotes its log.
func (m *Machine) RestoreState(ctx context.Context, path string, ignoreShared bool) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("restore vm state from %s: %w", path, err)
		}
	}()
	q, err := m.control()
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := status(ctx, q)
	if err != nil {
		return err
	}
	if st != StatusInMigrate {
		return fmt.Errorf("the vm is %s, not waiting for a restore (start it with Incoming): %w", st, errdefs.ErrConflict)
	}
	if err := setIgnoreShared(ctx, q, ignoreShared); err != nil {
		return m.exitReason(err)
	}
	if err := q.executeFile(ctx, "getfd", map[string]any{"fdname": migrationFD}, f, nil); err != nil {
		return m.exitReason(err)
	}
	if err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + migrationFD}, nil); err != nil {
		q.Execute(ctx, "closefd", map[string]any{"fdname": migrationFD}, nil)
		return m.exitReason(err)
	}
	t := time.NewTicker(statePollInterval)
	defer t.Stop()
	for {
		st, err := status(ctx, q)
		if err != nil {
			return m.exitReason(err)
		}
		if st != StatusInMigrate {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the restore did not finish: %w", ctx.Err())
		case <-m.done:
			return m.exitReason(errors.New("qemu exited"))
		case <-t.C:
		}
	}
	var info migrationInfo
	if err := q.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return m.exitReason(err)
	}
	switch info.Status {
	case "completed":
		return nil
	case "failed", "cancelled":
		return fmt.Errorf("migration %s: %s", info.Status, orUnknown(info.ErrorDesc))
	default:
		return fmt.Errorf("the vm left the restore with the migration %s", orUnknown(info.Status))
	}
}

// exitReason explains err with QEMU's exit, when QEMU exits within a
// moment: a failed incoming migration ends QEMU, which says why in its log.
func (m *Machine) exitReason(err error) error {
	select {
	case <-m.done:
	case <-time.After(2 * time.Second):
		return err
	}
	if tail := m.qemuLogTail(); tail != "" {
		return fmt.Errorf("qemu exited%s: %w", tail, ErrNotRunning)
	}
	return fmt.Errorf("qemu exited (%v): %w", err, ErrNotRunning)
}
