package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/vm"
)

// Each jailed VM's QEMU runs in a cgroup of its own (internal/cgroup),
// under a parent per data directory, "airlock/<hash of its path>", so
// that servers over different data directories never touch each other's
// groups. A sandbox's group is named by its ID, a template VM's by a hash
// of its build directory. The group is made before QEMU runs and removed
// once QEMU has ended: when the sandbox is destroyed, removed or
// suspended, or its VM exits on its own. Groups that outlive their VM (a
// server that died) are removed by the next runtime over the same data
// directory, as long as no process is left in them.

// cgroupParent is the parent of the groups of the VMs of dd.
func cgroupParent(dd datadir.Dir) string {
	abs, err := filepath.Abs(dd.Root)
	if err != nil {
		abs = dd.Root
	}
	sum := sha256.Sum256([]byte(abs))
	return "airlock/" + hex.EncodeToString(sum[:6])
}

// cgroupName is the name of the group of the VM whose files are in dir.
func cgroupName(dir string) string {
	if id := filepath.Base(dir); ValidID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(dir))
	return "vm-" + hex.EncodeToString(sum[:8])
}

// Limits are the cgroup limits of a VM of vcpus and memoryMiB, or nil
// when the runtime's VMs run unjailed and have none.
func (r *Runtime) Limits(vcpus, memoryMiB int) *cgroup.Resources {
	if r.cg == nil {
		return nil
	}
	res := cgroup.ForVM(vcpus, memoryMiB, r.accel == vm.AccelTCG)
	return &res
}

// vmCgroup makes the group of the VM of cfg and sets it to receive QEMU;
// nil when the runtime's VMs run unjailed.
func (r *Runtime) vmCgroup(cfg *vm.Config) (*cgroup.Group, error) {
	if r.cg == nil {
		return nil, nil
	}
	g, err := r.cg.Create(cgroupName(cfg.Dir), *r.Limits(cfg.VCPUs, cfg.MemoryMiB))
	if err != nil {
		return nil, err
	}
	cfg.Cgroup = g
	return g, nil
}

// Confine gives cfg, a VM outside any sandbox whose files are in
// cfg.Dir, the jail (its own user) and the cgroup this runtime's own VMs
// get, and nothing when the runtime runs them unjailed: so that a bare
// QEMU measured beside sandboxes (the bench's baselines) runs as theirs
// do, a clone of a template snapshot mapping the same sealed copy of the
// memory file. release frees the user and removes the group; call it once
// the VM has ended, whether or not it started.
func (r *Runtime) Confine(cfg *vm.Config) (release func(), err error) {
	j, err := r.jail(cfg.Dir, nil)
	if err != nil {
		return nil, err
	}
	cfg.Jail = j
	if j == nil {
		return func() {}, nil
	}
	dir := cfg.Dir
	g, err := r.vmCgroup(cfg)
	if err != nil {
		vm.ReleaseUID(dir)
		return nil, err
	}
	return func() {
		if g != nil {
			if err := g.Delete(); err != nil {
				r.log.Warn("remove a bare VM's cgroup", "dir", dir, "err", err)
			}
		}
		vm.ReleaseUID(dir)
	}, nil
}

// cgroupStep makes the sandbox's group before its VM starts.
func (r *Runtime) cgroupStep(sb *Sandbox, cfg *vm.Config) step {
	return step{"create cgroup", func(context.Context) error {
		g, err := r.vmCgroup(cfg)
		sb.cg = g
		return err
	}, func() { sb.dropCgroup() }}
}

// loadCgroup finds the group of the VM in dir, for an adopted sandbox;
// nil when there is none.
func (r *Runtime) loadCgroup(dir string) *cgroup.Group {
	if r.cg == nil {
		return nil
	}
	g, err := r.cg.Load(cgroupName(dir))
	if err != nil {
		return nil
	}
	return g
}

// dropCgroup removes the sandbox's group; its QEMU must have ended. A
// caller that finds the removal under way waits for it to end, so the
// group is gone when any call returns.
func (s *Sandbox) dropCgroup() {
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if s.cg == nil {
		return
	}
	if err := s.cg.Delete(); err != nil {
		s.log.Warn("remove the sandbox's cgroup", "err", err)
	}
	s.cg = nil
}

// VMMStats is what the sandbox's QEMU uses, read from its cgroup. A
// sandbox without a cgroup (the jail is off) is errdefs.ErrNotFound.
func (s *Sandbox) VMMStats() (cgroup.Stats, error) {
	s.cgMu.Lock()
	g := s.cg
	s.cgMu.Unlock()
	if g == nil {
		return cgroup.Stats{}, fmt.Errorf("sandbox %s has no cgroup: %w", s.ID, errdefs.ErrNotFound)
	}
	return g.Stats()
}

// sweepCgroups removes the groups under this data directory's parent
// that no process is in: their VM is gone.
func (r *Runtime) sweepCgroups() {
	names, err := r.cg.List()
	if err != nil {
		r.log.Warn("list cgroups", "err", err)
		return
	}
	for _, name := range names {
		g, err := r.cg.Load(name)
		if err != nil {
			continue
		}
		if pids, err := g.Processes(); err != nil || len(pids) > 0 {
			continue
		}
		if err := g.Delete(); err != nil {
			r.log.Warn("remove a cgroup whose VM is gone", "cgroup", g.Path(), "err", err)
		}
	}
}
