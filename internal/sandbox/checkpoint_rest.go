package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/timings"
)

// CheckpointSuspended makes checkpoint id of suspended sandbox sbxID at
// rest, with no VM running: its saved state is the checkpoint's memory
// and devices (linked, not copied, then loaded into a memory file as
// Checkpoint does), and its disk becomes the checkpoint's layer while the
// sandbox goes on, once woken, in a new overlay above it. The sandbox
// stays suspended, its saved state whole. On failure nothing of the
// checkpoint is left, but for a disk the sandbox already stands on, which
// the directory keeps until RemoveCheckpoint finds nothing needs it.
func (r *Runtime) CheckpointSuspended(ctx context.Context, sbxID, id string) (Checkpoint, error) {
	if !ValidID(sbxID) {
		return Checkpoint{}, invalidID(sbxID)
	}
	if !ValidCheckpointID(id) {
		return Checkpoint{}, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	sdir := r.cfg.Dir.Sandbox(sbxID)
	// The owner lock keeps a wake out until the sandbox's record names
	// its new disk.
	lock, err := lockOwner(sdir)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, fmt.Errorf("sandbox %s does not exist: %w", sbxID, errdefs.ErrNotFound)
	}
	if err != nil {
		return Checkpoint{}, err
	}
	defer lock.Close()
	if !SuspendedState(sdir) {
		return Checkpoint{}, fmt.Errorf("sandbox %s has no saved state to checkpoint: %w", sbxID, errdefs.ErrConflict)
	}
	dir := r.cfg.Dir.Checkpoint(id)
	cp := Checkpoint{ID: id, Dir: dir, Sandbox: sbxID}
	rec, err := readRecord(sdir)
	if err != nil {
		return cp, err
	}
	if rec.VM.Disk == "" || len(rec.VM.Backing) == 0 {
		return cp, fmt.Errorf("sandbox %s has no recorded disk chain: %w", sbxID, errdefs.ErrPrecondition)
	}
	cp.Spec = rec.Spec
	// A Sandbox value for the names and the log the steps share with
	// Checkpoint's; it has no VM.
	sb := newSandbox(sbxID, sdir, rec.Spec, r.log)
	layer := filepath.Join(dir, checkpointDiskName)
	overlay := filepath.Join(sdir, "disk-"+id+".qcow2")
	switched := false // the sandbox stands on layer
	var memSteps timings.Timings
	steps := []step{
		r.checkpointDirStep(id, &switched),
		{"link saved state", func(context.Context) error {
			return os.Link(filepath.Join(sdir, StateName), filepath.Join(dir, checkpointLiveName))
		}, nil},
		{"switch disk", func(ctx context.Context) error {
			if err := qemuImgCreate(ctx, layer, "qcow2", overlay, int64(rec.Spec.DiskMiB)<<20); err != nil {
				return err
			}
			if j := rec.VM.Jail; j != nil {
				if err := os.Chown(overlay, j.UID, j.GID); err != nil {
					os.Remove(overlay)
					return err
				}
			}
			if err := os.Link(rec.VM.Disk, layer); err != nil {
				os.Remove(overlay)
				return err
			}
			switched = true
			return r.recordSwitch(sb, rec, overlay, layer)
		}, nil},
		{"write memory file", func(ctx context.Context) error {
			return r.materialise(ctx, dir, rec, append([]string{layer}, rec.VM.Backing...), sb, &memSteps)
		}, nil},
		{"record checkpoint", func(context.Context) error {
			return writeCheckpointRecord(dir, id, sbxID, rec, layer)
		}, nil},
	}
	err = runSteps(ctx, steps, &cp.Timings)
	cp.Timings.Split("write memory file", memSteps)
	if err != nil {
		return cp, fmt.Errorf("checkpoint sandbox %s: %w", sbxID, err)
	}
	cp.SizeBytes = dirSize(dir)
	sb.log.Info("checkpoint made of a suspended sandbox", "checkpoint", id, "bytes", cp.SizeBytes)
	return cp, nil
}
