package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/timings"
	"github.com/airlockhq/airlock/internal/vm"
)

// Rollback returns sandbox id to chkID, one of its own checkpoints: its
// memory, devices and disk as they were at the checkpoint, under the same
// ID, directory, jail and gateway CA, with the guest's clock and random
// state renewed (reinit), as a sandbox made from the checkpoint has them.
// cur is the sandbox's VM when it has one (running or paused): that VM
// ends. A suspended sandbox (cur nil) loses its saved state.
//
// It returns the sandbox's new VM, running and watched. A checkpoint that
// is not valid or not the sandbox's is errdefs.ErrInvalid, one not on
// this host errdefs.ErrNotFound, and both change nothing. Once the old VM
// ended or the saved state went, a failure loses the sandbox: the error
// wraps ErrVMExited.
func (r *Runtime) Rollback(ctx context.Context, id string, cur *Sandbox, chkID string) (*Sandbox, error) {
	if !ValidID(id) {
		return nil, invalidID(id)
	}
	r.chkUse.RLock()
	defer r.chkUse.RUnlock()
	crec, err := r.readCheckpoint(chkID)
	if err != nil {
		return nil, fmt.Errorf("roll back sandbox %s: %w", id, err)
	}
	if crec.Sandbox != id {
		return nil, fmt.Errorf("roll back sandbox %s: checkpoint %s is of another sandbox: a sandbox rolls back only to its own checkpoints: %w", id, chkID, errdefs.ErrInvalid)
	}
	dir := r.cfg.Dir.Sandbox(id)
	rec, err := readRecord(dir)
	if err != nil {
		return nil, fmt.Errorf("roll back sandbox %s: %w", id, err)
	}
	if cur != nil {
		cur.life.Lock()
		defer cur.life.Unlock()
		if err := cur.usable(); err != nil {
			return nil, err
		}
	}
	log := r.log.With("sandbox", id)
	chkDir := r.cfg.Dir.Checkpoint(chkID)
	overlay := filepath.Join(dir, "disk-"+ids.New("rb")+".qcow2")
	sb := newSandbox(id, dir, rec.Spec, r.log)
	sb.Snapshot, sb.Warm = chkDir, true
	var m *vm.Machine
	ended := false // the old VM or saved state is gone: a failure loses the sandbox
	cfg := crec.VM
	steps := []step{
		{"end the current vm", func(ctx context.Context) error {
			if cur != nil {
				cur.end(ctx)
				ended = true
			}
			l, err := lockOwner(dir)
			if err != nil {
				return err
			}
			sb.owner = l
			ended = true
			if err := clearLeftovers(ctx, dir, log); err != nil {
				return err
			}
			if err := os.Remove(filepath.Join(dir, StateName)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}, func() { sb.owner.Close() }},
		{"create disk", func(ctx context.Context) error {
			return createLayeredOverlay(ctx, crec.Backing[0], overlay, crec.Spec.DiskMiB)
		}, func() { os.Remove(overlay) }},
		{"record vm config", func(context.Context) error {
			var err error
			cfg.Dir, cfg.Disk, cfg.Backing, cfg.Detach = dir, overlay, crec.Backing, rec.VM.Detach
			if cfg.Jail, err = r.jail(dir, rec.VM.Jail); err != nil {
				return err
			}
			next := rec
			next.VM, next.Layer = cfg, crec.Backing[0]
			return writeRecord(dir, next)
		}, nil},
		{"start vm", func(ctx context.Context) error {
			c := cfg
			c.Incoming = true
			cg, err := r.vmCgroup(&c)
			if err != nil {
				return err
			}
			m, err = vm.Start(ctx, c, log)
			if err != nil {
				if cg != nil {
					if derr := cg.Delete(); derr != nil {
						log.Warn("remove the cgroup of a VM that did not start", "err", derr)
					}
				}
				return err
			}
			sb.vm, sb.cg = m, cg
			return nil
		}, func() {
			if err := m.Stop(context.Background()); err != nil {
				log.Warn("stop the vm of a failed rollback", "err", err)
			}
			sb.dropCgroup()
		}},
		{"start gateway", func(ctx context.Context) error {
			return r.startGateway(ctx, sb, cfg.NetMAC)
		}, func() { sb.closeGateway() }},
		{"restore checkpoint", func(ctx context.Context) error {
			return m.RestoreState(ctx, filepath.Join(chkDir, snapshotStateName), true)
		}, nil},
		linkStep(sb),
		growStep(sb),
		{"resume vm", func(ctx context.Context) error { return m.Resume(ctx) }, nil},
		{"connect to agent", func(ctx context.Context) error {
			c, err := ConnectAgent(ctx, m, wakeAgentTimeout)
			sb.agent = c
			return err
		}, func() { sb.closeAgent() }},
		reinitStep(sb),
		checkDiskStep(sb),
	}
	var took timings.Timings
	if err := runSteps(ctx, steps, &took); err != nil {
		if ended {
			err = fmt.Errorf("%w: %w", err, ErrVMExited)
		}
		return nil, fmt.Errorf("roll back sandbox %s to %s: %w", id, chkID, err)
	}
	if old := rec.VM.Disk; old != "" && old != overlay {
		// The disk written since the checkpoint; what a later checkpoint
		// kept of it is in that checkpoint's directory.
		if err := os.Remove(old); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove the disk rolled back from", "err", err)
		}
	}
	if t, err := r.templates.Resolve(rec.Spec.Template); err != nil {
		log.Warn("the rolled back sandbox's template is gone", "template", rec.Spec.Template, "err", err)
	} else {
		sb.Template = t
	}
	sb.Timings = took
	go sb.watch()
	log.Info("sandbox rolled back", "checkpoint", chkID, "pid", m.PID())
	return sb, nil
}

// end ends the sandbox's VM for a rollback, which replaces it: its agent
// session, gateway, QEMU and cgroup go, and the directory's owner lock
// with them; the Sandbox is spent. The caller holds s.life.
func (s *Sandbox) end(ctx context.Context) {
	s.mu.Lock()
	s.replaced = true
	s.mu.Unlock()
	s.releaseOnce.Do(func() { close(s.released) })
	s.closeAgent()
	s.closeGateway()
	if err := s.vm.Stop(ctx); err != nil {
		s.log.Warn("stop the vm rolled back from", "err", err)
	}
	s.dropCgroup()
	s.owner.Close()
}
