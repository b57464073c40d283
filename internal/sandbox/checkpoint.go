package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/timings"
	"github.com/airlockhq/airlock/internal/vm"
)

// A checkpoint is a running sandbox's memory, devices and disk at one
// instant, kept in a directory of its own (datadir.Dir.Checkpoint) apart
// from the sandbox, which runs on. Its files:
//
//   - checkpointDiskName: the sandbox's disk up to the instant. It was the
//     sandbox's own overlay; at the instant the sandbox went on in a new
//     overlay above it (vm.Machine.SwitchDisk), so nothing was copied. It
//     is never written again, and both the sandbox and every sandbox made
//     from the checkpoint stand on it.
//   - snapshotMemName and snapshotStateName, as a warm template snapshot
//     has them: the guest's RAM as a file that sandboxes made from the
//     checkpoint map private (pages none writes are shared by all), and the
//     device state without the RAM.
//   - checkpointRecordName: what it was made of (checkpointRecord).
//
// The RAM is saved live (vm.Machine.SaveLive): under KVM the vCPUs stop
// only for the pages written during the copy and for the devices, under
// TCG for the whole copy. The saved stream
// holds RAM as a stream, which a restore copies, so a helper QEMU that
// never runs the guest (materialise) loads it into the memory file, mapped
// shared, and saves the devices alone.
const (
	checkpointDiskName   = "disk.qcow2"
	checkpointLiveName   = "live.mig"
	checkpointRecordName = "checkpoint.json"
	checkpointWorkName   = "work"
)

// NewCheckpointID returns a fresh checkpoint ID: "chk" and 20 lowercase
// letters and digits.
func NewCheckpointID() string { return ids.New("chk") }

// ValidCheckpointID reports whether id can name a checkpoint, as
// ValidID does for sandboxes.
func ValidCheckpointID(id string) bool {
	return ValidID("sbx"+strings.TrimPrefix(id, "chk")) && strings.HasPrefix(id, "chk")
}

// Checkpoint is what Runtime.Checkpoint made.
type Checkpoint struct {
	ID  string
	Dir string
	// Sandbox is the ID of the sandbox it is of; Spec that sandbox's spec
	// (its template by digest).
	Sandbox string
	Spec    Spec
	// SizeBytes is the space its files take on the disk.
	SizeBytes int64
	// Stall is how long the sandbox's vCPUs stood still for it.
	Stall time.Duration
	// Timings break the making down, step by step.
	Timings timings.Timings
}

// checkpointRecord is what checkpointRecordName holds.
type checkpointRecord struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Spec    Spec   `json:"spec"`
	// VM is the configuration a sandbox made from the checkpoint starts
	// QEMU with, as TemplateSnapshot.VM: MemoryFile is the checkpoint's,
	// Dir, Disk and Jail are each sandbox's own.
	VM vm.Config `json:"vm"`
	// Backing is the chain under checkpointDiskName, nearest first.
	Backing []string  `json:"backing"`
	MadeAt  time.Time `json:"made_at"`
}

// Checkpoint makes checkpoint id of sandbox sb, which runs on (a paused
// one stays paused). On failure nothing of the checkpoint is left, but
// for a disk the sandbox already stands on, which the directory keeps
// until RemoveCheckpoint finds nothing needs it.
func (r *Runtime) Checkpoint(ctx context.Context, sb *Sandbox, id string) (Checkpoint, error) {
	if !ValidCheckpointID(id) {
		return Checkpoint{}, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	sb.life.Lock()
	defer sb.life.Unlock()
	if err := sb.usable(); err != nil {
		return Checkpoint{}, err
	}
	dir := r.cfg.Dir.Checkpoint(id)
	cp := Checkpoint{ID: id, Dir: dir, Sandbox: sb.ID}
	rec, err := readRecord(sb.Dir)
	if err != nil {
		return cp, err
	}
	if rec.VM.Disk == "" || len(rec.VM.Backing) == 0 {
		return cp, fmt.Errorf("sandbox %s has no recorded disk chain: %w", sb.ID, errdefs.ErrPrecondition)
	}
	cp.Spec = rec.Spec
	layer := filepath.Join(dir, checkpointDiskName)
	overlay := filepath.Join(sb.Dir, "disk-"+id+".qcow2")
	var ovl *os.File
	var memSteps timings.Timings // the breakdown of "write memory file"
	switched := false            // the sandbox stands on layer
	steps := []step{
		r.checkpointDirStep(id, &switched),
		{"create overlay", func(ctx context.Context) error {
			if err := qemuImgCreate(ctx, layer, "qcow2", overlay, int64(rec.Spec.DiskMiB)<<20); err != nil {
				return err
			}
			if j := rec.VM.Jail; j != nil {
				if err := os.Chown(overlay, j.UID, j.GID); err != nil {
					return err
				}
			}
			var err error
			ovl, err = os.OpenFile(overlay, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			// The same file under the checkpoint's name, from now on.
			return os.Link(rec.VM.Disk, layer)
		}, func() {
			ovl.Close()
			if !switched {
				os.Remove(overlay)
			}
		}},
		{"save state live", func(ctx context.Context) error {
			var err error
			cp.Stall, err = sb.vm.SaveLive(ctx, filepath.Join(dir, checkpointLiveName), func(ctx context.Context) error {
				if err := sb.vm.SwitchDisk(ctx, ovl); err != nil {
					return err
				}
				switched = true
				return nil
			})
			if switched {
				// Whatever else failed, the sandbox writes the new overlay.
				if rerr := r.recordSwitch(sb, rec, overlay, layer); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			if err == nil && sb.Paused() {
				// A finished save leaves the disk handed over, as for a
				// migration: QEMU takes it back when the vCPUs run, so
				// they run for a moment.
				if err = sb.vm.Resume(ctx); err == nil {
					err = sb.vm.Pause(ctx)
				}
			}
			return sb.vmErr(err)
		}, nil},
		{"write memory file", func(ctx context.Context) error {
			return r.materialise(ctx, dir, rec, append([]string{layer}, rec.VM.Backing...), sb, &memSteps)
		}, nil},
		{"record checkpoint", func(context.Context) error {
			return writeCheckpointRecord(dir, id, sb.ID, rec, layer)
		}, nil},
	}
	err = runSteps(ctx, steps, &cp.Timings)
	cp.Timings.Split("write memory file", memSteps)
	if err != nil {
		return cp, fmt.Errorf("checkpoint sandbox %s: %w", sb.ID, err)
	}
	cp.SizeBytes = dirSize(dir)
	sb.log.Info("checkpoint made", "checkpoint", id, "stall", cp.Stall, "bytes", cp.SizeBytes)
	return cp, nil
}

// checkpointDirStep makes checkpoint id's directory (a conflict if it
// exists); its undo removes it unless the sandbox already stands on the
// disk in it (*switched).
func (r *Runtime) checkpointDirStep(id string, switched *bool) step {
	dir := r.cfg.Dir.Checkpoint(id)
	return step{"create checkpoint directory", func(context.Context) error {
		if err := os.MkdirAll(r.cfg.Dir.Checkpoints(), 0o755); err != nil {
			return err
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("checkpoint %s exists: %w", id, errdefs.ErrConflict)
			}
			return err
		}
		return nil
	}, func() {
		if !*switched {
			os.RemoveAll(dir)
		}
	}}
}

// writeCheckpointRecord writes the record of checkpoint id in dir, of
// sandbox sbID whose record was rec until its disk became layer.
func writeCheckpointRecord(dir, id, sbID string, rec record, layer string) error {
	vmc := rec.VM
	vmc.Dir, vmc.Disk, vmc.Jail, vmc.Backing = dir, "", nil, nil
	vmc.MemoryFile, vmc.MemoryShared, vmc.Incoming, vmc.Detach = filepath.Join(dir, snapshotMemName), false, false, false
	crec := checkpointRecord{ID: id, Sandbox: sbID, Spec: rec.Spec, VM: vmc, Backing: append([]string{layer}, rec.VM.Backing...), MadeAt: time.Now().UTC()}
	b, err := json.MarshalIndent(crec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, checkpointRecordName), append(b, '\n'), 0o600)
}

// recordSwitch records that sandbox sb's disk is now overlay, over layer
// (the disk it wrote until now, under the checkpoint's name) and the
// chain below: the record is the one place the chain is read from, so it
// is written before the old name goes. The layer is the server's from
// now on, read-only.
func (r *Runtime) recordSwitch(sb *Sandbox, rec record, overlay, layer string) error {
	old := rec.VM.Disk
	rec.VM.Disk = overlay
	rec.VM.Backing = append([]string{layer}, rec.VM.Backing...)
	if err := writeRecord(sb.Dir, rec); err != nil {
		return fmt.Errorf("record the sandbox's new disk: %w", err)
	}
	if err := os.Remove(old); err != nil {
		sb.log.Warn("remove the old name of the checkpoint's disk", "err", err)
	}
	if err := os.Chown(layer, 0, 0); err != nil {
		return err
	}
	return os.Chmod(layer, 0o444)
}

// materialise turns the stream that SaveLive wrote in checkpoint dir into
// a memory file and a device state, as a warm template snapshot has them:
// a QEMU of the sandbox's command line, its RAM mapped shared from the
// memory file, loads the stream without the guest ever running, and saves
// its devices alone. The helper is jailed and confined as the sandbox's
// VM is: the stream is the guest's. It records its parts in steps.
func (r *Runtime) materialise(ctx context.Context, dir string, rec record, chain []string, sb *Sandbox, steps *timings.Timings) error {
	clk := timings.Start()
	defer func() { *steps = clk.T }()
	work := filepath.Join(dir, checkpointWorkName)
	if err := os.Mkdir(work, 0o700); err != nil {
		return err
	}
	defer func() {
		if err := removeDir(work); err != nil {
			sb.log.Warn("remove the checkpoint helper's directory", "dir", work, "err", err)
		}
	}()
	cfg := rec.VM
	cfg.Dir, cfg.Detach, cfg.Incoming = work, false, true
	cfg.MemoryFile, cfg.MemoryShared = filepath.Join(dir, snapshotMemName), true
	// A throwaway overlay: the device must be there, nothing writes it.
	cfg.Disk, cfg.Backing = filepath.Join(work, diskName), chain
	if err := qemuImgCreate(ctx, chain[0], "qcow2", cfg.Disk, int64(rec.Spec.DiskMiB)<<20); err != nil {
		return err
	}
	mem, err := os.OpenFile(cfg.MemoryFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = mem.Truncate(int64(cfg.MemoryMiB) << 20)
	mem.Close()
	if err != nil {
		return err
	}
	if cfg.Jail, err = r.jail(work, nil); err != nil {
		return err
	}
	cg, err := r.vmCgroup(&cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cg != nil {
			if err := cg.Delete(); err != nil {
				sb.log.Warn("remove the checkpoint helper's cgroup", "err", err)
			}
		}
	}()
	clk.Lap("prepare helper")
	m, err := vm.Start(ctx, cfg, sb.log.With("helper", "checkpoint"))
	if err != nil {
		return err
	}
	clk.Lap("start helper")
	defer func() {
		if err := m.Stop(context.WithoutCancel(ctx)); err != nil {
			sb.log.Warn("stop the checkpoint helper", "err", err)
		}
	}()
	live := filepath.Join(dir, checkpointLiveName)
	if err := m.RestoreState(ctx, live, false); err != nil {
		return err
	}
	clk.Lap("load state")
	if err := m.SaveState(ctx, filepath.Join(dir, snapshotStateName), true); err != nil {
		return err
	}
	clk.Lap("save devices")
	if err := m.Stop(ctx); err != nil {
		return err
	}
	clk.Lap("stop helper")
	if cfg.Jail != nil {
		if err := os.Chown(cfg.MemoryFile, 0, 0); err != nil {
			return err
		}
	}
	if err := syncFile(cfg.MemoryFile); err != nil {
		return err
	}
	clk.Lap("sync memory file")
	return os.Remove(live)
}

// readCheckpoint reads the record of checkpoint id.
func (r *Runtime) readCheckpoint(id string) (checkpointRecord, error) {
	var rec checkpointRecord
	if !ValidCheckpointID(id) {
		return rec, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	b, err := os.ReadFile(filepath.Join(r.cfg.Dir.Checkpoint(id), checkpointRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, fmt.Errorf("checkpoint %s is not on this host: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read checkpoint %s: %w", id, err)
	}
	if len(rec.Backing) == 0 || rec.Spec.DiskMiB <= 0 {
		return rec, fmt.Errorf("checkpoint %s has no disk chain", id)
	}
	return rec, nil
}

// CheckpointSpec is the spec a sandbox made from checkpoint id starts
// from: the checkpointed sandbox's, whose template, vCPUs, memory and
// disk it keeps (its disk may be made larger).
func (r *Runtime) CheckpointSpec(id string) (Spec, error) {
	rec, err := r.readCheckpoint(id)
	return rec.Spec, err
}

// checkpointSnapshot is checkpoint id as the template snapshot cloneVM
// clones: warm, its disk the checkpoint's layer over the chain below.
func (r *Runtime) checkpointSnapshot(id string) (TemplateSnapshot, error) {
	rec, err := r.readCheckpoint(id)
	if err != nil {
		return TemplateSnapshot{}, err
	}
	dir := r.cfg.Dir.Checkpoint(id)
	return TemplateSnapshot{
		Dir: dir, MemFile: filepath.Join(dir, snapshotMemName), StateFile: filepath.Join(dir, snapshotStateName),
		VM: rec.VM, Warm: true, Disk: rec.Backing[0], DiskMiB: rec.Spec.DiskMiB, Backing: rec.Backing[1:],
	}, nil
}

// RemoveCheckpoint removes checkpoint id's directory unless a sandbox on
// this host still stands on it (its disk chain or memory file is in it)
// or a sandbox is being made from a checkpoint (or rolled back to one)
// right now; it reports whether it removed it. One that is kept is
// removed by a later call, once nothing needs it.
func (r *Runtime) RemoveCheckpoint(id string) (bool, error) {
	if !ValidCheckpointID(id) {
		return false, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	dir := r.cfg.Dir.Checkpoint(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if !r.chkUse.TryLock() {
		return false, nil // a sandbox is being made from a checkpoint
	}
	defer r.chkUse.Unlock()
	used, err := r.checkpointsInUse()
	if err != nil {
		return false, err
	}
	if used[id] {
		return false, nil
	}
	vm.ForgetMemory(filepath.Join(dir, snapshotMemName))
	if err := os.RemoveAll(dir); err != nil {
		return false, err
	}
	return true, nil
}

// Checkpoints lists the checkpoint directories on this host.
func (r *Runtime) Checkpoints() ([]string, error) {
	ents, err := os.ReadDir(r.cfg.Dir.Checkpoints())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && ValidCheckpointID(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// checkpointsInUse returns the IDs of the checkpoints that sandboxes on
// this host stand on, as their records say.
func (r *Runtime) checkpointsInUse() (map[string]bool, error) {
	ents, err := os.ReadDir(r.cfg.Dir.Sandboxes())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	root := r.cfg.Dir.Checkpoints() + string(filepath.Separator)
	used := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		var rec struct {
			VM vm.Config `json:"vm"`
		}
		b, err := os.ReadFile(filepath.Join(r.cfg.Dir.Sandboxes(), e.Name(), RecordName))
		if err != nil || json.Unmarshal(b, &rec) != nil {
			continue
		}
		for _, p := range slices.Concat(rec.VM.Backing, []string{rec.VM.MemoryFile}) {
			if rest, ok := strings.CutPrefix(p, root); ok {
				used[strings.SplitN(rest, string(filepath.Separator), 2)[0]] = true
			}
		}
	}
	return used, nil
}

// fromCheckpoint creates the sandbox of spec as a clone of its checkpoint.
func (r *Runtime) fromCheckpoint(ctx context.Context, spec Spec) (*Sandbox, error) {
	r.chkUse.RLock()
	defer r.chkUse.RUnlock()
	want, err := r.CheckpointSpec(spec.Checkpoint)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if spec.Template == "" {
		spec.Template = want.Template
	}
	if spec.VCPUs == 0 {
		spec.VCPUs = want.VCPUs
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = want.MemoryMiB
	}
	if spec.DiskMiB == 0 {
		spec.DiskMiB = want.DiskMiB
	}
	spec, tpl, err := r.Resolve(spec)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if tpl.Digest != want.Template || spec.VCPUs != want.VCPUs || spec.MemoryMiB != want.MemoryMiB || spec.DiskMiB < want.DiskMiB {
		return nil, fmt.Errorf("create sandbox: checkpoint %s is of template %s with %d vCPUs, %d MiB of memory and a %d MiB disk: a sandbox made from it has those (its disk may be larger): %w",
			spec.Checkpoint, want.Template, want.VCPUs, want.MemoryMiB, want.DiskMiB, errdefs.ErrInvalid)
	}
	sb, err := r.clone(ctx, spec, tpl)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	return sb, nil
}
