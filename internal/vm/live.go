package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// livePollInterval is how often a live save's progress is asked for: the
// moment QEMU stops the vCPUs is seen within it, and so is the end of the
// save, after which they run again; each wait for that end is stall.
const livePollInterval = time.Millisecond

// SaveLive writes the machine's state (RAM and devices) to path as
// SaveState does, but while the guest runs on: under KVM, QEMU copies the
// RAM with the vCPUs running (precopy), then stops them for what the guest
// wrote meanwhile and for the device state. Under TCG the vCPUs stop for
// the whole copy (precopy says why). With the vCPUs stopped, before the
// last of the state is written, atStop runs: whatever it does (cutting the
// disk, SwitchDisk) happens at the instant the saved state describes. An
// error from atStop cancels the save. A machine that ran before runs
// again afterwards; a paused one stays paused.
//
// It returns how long the vCPUs stood still. path is absent or whole, as
// with SaveState.
func (m *Machine) SaveLive(ctx context.Context, path string, atStop func(context.Context) error) (stall time.Duration, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("save vm state live: %w", err)
		}
	}()
	q, err := m.control()
	if err != nil {
		return 0, err
	}
	st, err := status(ctx, q)
	if err != nil {
		return 0, err
	}
	if st == StatusInMigrate {
		return 0, fmt.Errorf("the vm is waiting for a restore: %w", errdefs.ErrConflict)
	}
	ran := st == StatusRunning
	caps := map[string]any{"capabilities": []map[string]any{
		{"capability": "x-ignore-shared", "state": false},
		{"capability": "pause-before-switchover", "state": true},
	}}
	if err := q.Execute(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return 0, err
	}
	defer func() {
		// A later SaveState must not stop at the switchover.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		off := map[string]any{"capabilities": []map[string]any{{"capability": "pause-before-switchover", "state": false}}}
		if cerr := q.Execute(cctx, "migrate-set-capabilities", off, nil); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return 0, err
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if err := q.executeFile(ctx, "getfd", map[string]any{"fdname": migrationFD}, f, nil); err != nil {
		return 0, err
	}
	// Under TCG the vCPUs stop for the whole copy (precopy).
	var stoppedAt time.Time
	if ran && !m.precopy() {
		stoppedAt = time.Now()
		if err := q.Execute(ctx, "stop", nil, nil); err != nil {
			return 0, err
		}
	}
	if err := q.Execute(ctx, "migrate", map[string]any{"uri": "fd:" + migrationFD}, nil); err != nil {
		if cerr := q.Execute(ctx, "closefd", map[string]any{"fdname": migrationFD}, nil); cerr != nil {
			m.log.Warn("close the migration descriptor after a failed save", "err", cerr)
		}
		return 0, err
	}
	// Whatever goes wrong from here, a machine that ran runs again.
	defer func() {
		if err != nil && ran && !m.Exited() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if rerr := m.Resume(cctx); rerr != nil {
				err = fmt.Errorf("%w; and resuming the vm failed: %w", err, rerr)
			}
		}
	}()
	stopped, err := m.waitSwitchover(ctx, q)
	if err != nil {
		return 0, err
	}
	if !stoppedAt.IsZero() {
		stopped = stoppedAt
	}
	if err := atStop(ctx); err != nil {
		m.cancelMigration(q)
		return 0, err
	}
	if err := q.Execute(ctx, "migrate-continue", map[string]any{"state": "pre-switchover"}, nil); err != nil {
		m.cancelMigration(q)
		return 0, err
	}
	if err := m.waitMigration(ctx, q, livePollInterval); err != nil {
		return 0, err
	}
	if ran {
		if err := m.Resume(ctx); err != nil {
			return 0, err
		}
	}
	stall = time.Since(stopped)
	if err := f.Sync(); err != nil {
		return stall, err
	}
	if err := f.Close(); err != nil {
		return stall, err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return stall, err
	}
	return stall, nil
}

// SaveDowntime is how long, by QEMU's own clock, the vCPUs stood still
// for the last save that completed (SaveLive, SaveState): query-migrate's
// downtime, from just before QEMU stopped them to the end of the state it
// wrote, without the resume that follows. It fails when no save has
// completed on this machine's QEMU since its last one began.
func (m *Machine) SaveDowntime(ctx context.Context) (time.Duration, error) {
	q, err := m.control()
	if err != nil {
		return 0, fmt.Errorf("save downtime: %w", err)
	}
	var info migrationInfo
	if err := q.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return 0, fmt.Errorf("save downtime: %w", err)
	}
	if info.Status != "completed" || info.Downtime == nil {
		return 0, fmt.Errorf("save downtime: no completed save (migration status %q): %w", info.Status, errdefs.ErrPrecondition)
	}
	return time.Duration(*info.Downtime) * time.Millisecond, nil
}

// waitSwitchover polls a live save until QEMU has stopped the vCPUs and
// waits before the switchover; it returns when it saw that. A save that
// fails or is cancelled first is an error; so is ctx's end, which cancels
// the save.
func (m *Machine) waitSwitchover(ctx context.Context, q *QMP) (time.Time, error) {
	t := time.NewTicker(livePollInterval)
	defer t.Stop()
	for {
		var info migrationInfo
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := q.Execute(qctx, "query-migrate", nil, &info)
		cancel()
		if err != nil {
			return time.Time{}, err
		}
		switch info.Status {
		case "pre-switchover":
			return time.Now(), nil
		case "completed":
			return time.Time{}, fmt.Errorf("the migration completed without stopping before the switchover")
		case "failed", "cancelled":
			return time.Time{}, fmt.Errorf("migration %s: %s", info.Status, orUnknown(info.ErrorDesc))
		}
		select {
		case <-ctx.Done():
			m.cancelMigration(q)
			return time.Time{}, fmt.Errorf("migration %s: %w", info.Status, ctx.Err())
		case <-m.done:
			return time.Time{}, fmt.Errorf("qemu exited during the migration: %w", ErrNotRunning)
		case <-t.C:
		}
	}
}

// cancelMigration cancels an outgoing migration and waits, a little, for
// QEMU to have ended it.
func (m *Machine) cancelMigration(q *QMP) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Execute(ctx, "migrate_cancel", nil, nil); err != nil {
		return
	}
	for ctx.Err() == nil {
		var info migrationInfo
		if q.Execute(ctx, "query-migrate", nil, &info) != nil {
			return
		}
		if info.Status == "cancelled" || info.Status == "failed" || info.Status == "completed" {
			return
		}
		time.Sleep(statePollInterval)
	}
}

// overlaySeq names the block nodes SwitchDisk adds.
var overlaySeq atomic.Int64

// SwitchDisk puts overlay, a qcow2 image without a backing file open or
// recorded, on top of the root disk (an external snapshot): the image the
// guest wrote so far becomes its backing file and is no longer written,
// and the guest's writes go to overlay. QEMU gets the file by descriptor,
// so a jailed QEMU needs no path to it. Call it with the vCPUs stopped
// (SaveLive's atStop), so that the image below holds the disk at that
// instant.
func (m *Machine) SwitchDisk(ctx context.Context, overlay *os.File) error {
	q, err := m.control()
	if err != nil {
		return fmt.Errorf("switch disk: %w", err)
	}
	var fd struct {
		FdsetID int `json:"fdset-id"`
	}
	if err := q.executeFile(ctx, "add-fd", map[string]any{"opaque": "airlock overlay"}, overlay, &fd); err != nil {
		return fmt.Errorf("switch disk: %w", err)
	}
	// Once the node has its own copy of the descriptor, the set's goes.
	defer func() {
		if err := q.Execute(context.WithoutCancel(ctx), "remove-fd", map[string]any{"fdset-id": fd.FdsetID}, nil); err != nil {
			m.log.Warn("remove the overlay's descriptor set", "fdset", fd.FdsetID, "err", err)
		}
	}()
	node := fmt.Sprintf("overlay%d", overlaySeq.Add(1))
	add := map[string]any{
		"driver": "qcow2", "node-name": node, "backing": nil,
		// Without image locks: the overlay is this QEMU's alone while it
		// writes it, and once the next SwitchDisk makes it a backing file
		// (a checkpoint's layer) others open it too. QEMU cannot reopen
		// a descriptor it was given read-only, so a lock taken for
		// writing would stay and shut them out.
		"file": map[string]any{"driver": "file", "filename": fmt.Sprintf("/dev/fdset/%d", fd.FdsetID), "locking": "off"},
	}
	if err := q.Execute(ctx, "blockdev-add", add, nil); err != nil {
		return fmt.Errorf("switch disk: %w", err)
	}
	if err := q.Execute(ctx, "blockdev-snapshot", map[string]any{"node": rootDrive, "overlay": node}, nil); err != nil {
		if derr := q.Execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node}, nil); derr != nil {
			m.log.Warn("remove the overlay's block node after a failed switch", "node", node, "err", derr)
		}
		return fmt.Errorf("switch disk: %w", err)
	}
	return nil
}

// precopy reports whether SaveLive copies the RAM while the guest runs:
// under KVM only, whose dirty log the kernel keeps. Under TCG (QEMU 7.2)
// pages the guest wrote during the copy were found missing from it: of 17
// sandboxes made from checkpoints of a busy guest copied live, 2 crashed
// (a kernel fault in an interrupt, a hang), and none of 16 copied with
// the vCPUs stopped, as suspend copies them.
func (m *Machine) precopy() bool { return m.cfg.Accel == AccelKVM }
