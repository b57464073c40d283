package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/vm"
)

// clone creates the sandbox of a resolved spec as a clone of its
// template's snapshot: a QEMU started with the snapshot's command line but
// the sandbox's directory and disk, its RAM mapped private from the
// snapshot's memory file, restores the snapshot's device state and runs
// on from where the template's agent waited for init. The guest is then
// initialised as a booted one is. A clone of a warm snapshot (startsWarm)
// runs on with the guest initialised and the template's server up: its
// disk is an overlay of the snapshot's disk layer, the guest is given the
// sandbox's identity (reinit) and the server is checked once. A snapshot
// that QEMU could not restore, or whose server is not ready in the clone,
// is marked broken, so that its next use makes it again.
func (r *Runtime) clone(ctx context.Context, spec Spec, tpl template.Template) (*Sandbox, error) {
	return r.cloneVM(ctx, spec, tpl, false)
}

// cloneVM is clone; with pooled, it stops once the agent session is up,
// for a warm pool's member (pool.go): the disk is not grown and the guest
// not given its identity, which finishPooled does when a create takes it.
func (r *Runtime) cloneVM(ctx context.Context, spec Spec, tpl template.Template, pooled bool) (*Sandbox, error) {
	sb := newSandbox(spec.ID, r.cfg.Dir.Sandbox(spec.ID), spec, r.log)
	sb.Template = tpl
	overlay := filepath.Join(sb.Dir, diskName)
	var held heldSnapshot
	release := func() {}
	var cfg vm.Config
	var layer string // the warm snapshot's disk layer
	// What is wrong with the snapshot, if anything: QEMU could not restore
	// it, or the server it came with is not ready.
	var snapErr, serverErr error
	steps := []step{
		{"take template snapshot", func(ctx context.Context) error {
			var err error
			if spec.Checkpoint != "" {
				held.snap, err = r.checkpointSnapshot(spec.Checkpoint)
			} else if held, err = r.acquireSnapshot(ctx, tpl, spec); err == nil {
				release = sync.OnceFunc(held.release)
			}
			if err != nil {
				return err
			}
			cfg = held.snap.VM
			cfg.Dir, cfg.Disk, cfg.Detach = sb.Dir, overlay, spec.Detach
			cfg.MemoryFile, cfg.MemoryShared, cfg.Incoming = held.snap.MemFile, false, false
			sb.Snapshot, sb.Warm, layer = held.snap.Dir, held.snap.Warm, held.snap.Disk
			cfg.Backing = held.snap.chain(tpl.Image)
			return nil
		}, func() { release() }},
		r.dirStep(sb),
		r.jailStep(sb, &cfg),
		r.cgroupStep(sb, &cfg),
		{"create disk", func(ctx context.Context) error {
			// At the size the snapshot's guest saw its disk; it grows to
			// the sandbox's size after the restore.
			if layer != "" {
				return createLayeredOverlay(ctx, layer, overlay, held.snap.DiskMiB)
			}
			return createOverlay(ctx, tpl.Image, overlay, 0)
		}, nil},
		recordStep(sb, &cfg, &layer),
		{"start vm", func(ctx context.Context) error {
			c := cfg
			c.Incoming = true
			m, err := vm.Start(ctx, c, sb.log)
			if err != nil {
				return err
			}
			sb.vm = m
			return nil
		}, func() { sb.vm.Stop(context.Background()) }},
		r.gatewayStep(sb, &cfg),
		{"restore template snapshot", func(ctx context.Context) error {
			err := sb.vm.RestoreState(ctx, held.snap.StateFile, true)
			// The clone has mapped the memory file and read the state:
			// the snapshot may be replaced from here on.
			release()
			snapErr = err
			return err
		}, nil},
		linkStep(sb),
	}
	if !pooled {
		steps = append(steps, growStep(sb))
	}
	steps = append(steps,
		step{"resume vm", func(ctx context.Context) error {
			return sb.vm.Resume(ctx)
		}, nil},
		step{"connect to agent", func(ctx context.Context) error {
			c, err := ConnectAgent(ctx, sb.vm, wakeAgentTimeout)
			sb.agent = c
			return err
		}, func() { sb.agent.Close() }},
	)
	if pooled {
		steps = append(steps, step{"mark pool member", func(context.Context) error {
			return os.WriteFile(filepath.Join(sb.Dir, poolMarkName), nil, 0o600)
		}, nil}, warmUpStep(sb))
	} else if spec.Checkpoint != "" {
		// The checkpointed sandbox's processes come as they were; the
		// guest becomes this sandbox.
		steps = append(steps, reinitStep(sb), checkDiskStep(sb))
	} else if startsWarm(spec, tpl) {
		steps = append(steps, r.identitySteps(sb, &serverErr)...)
	} else {
		steps = append(steps, initStep(sb), checkDiskStep(sb))
	}
	if err := runSteps(ctx, steps, &sb.Timings); err != nil {
		if serverErr != nil {
			snapErr = serverErr
		}
		if snapErr != nil && ctx.Err() == nil && spec.Checkpoint == "" {
			r.breakSnapshot(held, snapErr)
			if serverErr != nil {
				// Made again now, it would likely fail the same way:
				// creates boot for a while instead.
				r.buildFailed(held.key, snapErr)
			}
		}
		return nil, err
	}
	sb.Timings.Split("init guest", sb.Init.Timings)
	sb.Timings.Split("reinit guest", sb.Init.Timings)
	if pooled {
		return sb, nil // watched once a create takes it
	}
	go sb.watch()
	sb.log.Debug("sandbox cloned from template snapshot", "snapshot", held.snap.Dir, "warm", sb.Warm, "pid", sb.vm.PID())
	return sb, nil
}

// growStep grows the disk of a clone, restored at the snapshot's size, to
// the sandbox's. The guest learns the new size from a virtio
// configuration change, handled once it runs; checkDiskStep confirms it.
func growStep(sb *Sandbox) step {
	return step{"grow disk", func(ctx context.Context) error {
		return sb.vm.ResizeDisk(ctx, int64(sb.Spec.DiskMiB)<<20)
	}, nil}
}

// identitySteps make a running clone of a warm snapshot the sandbox sb:
// reinit, one check of the template's server (whose failure is the
// snapshot's, recorded in serverErr), and the disk's size.
func (r *Runtime) identitySteps(sb *Sandbox, serverErr *error) []step {
	return []step{
		reinitStep(sb),
		{"check template's server", func(ctx context.Context) error {
			err := r.checkServer(ctx, sb)
			*serverErr = err
			return err
		}, nil},
		checkDiskStep(sb),
	}
}

// checkDiskStep checks that the guest found its root disk at the
// sandbox's size.
func checkDiskStep(sb *Sandbox) step {
	return step{"check disk", func(context.Context) error {
		if want := int64(sb.Spec.DiskMiB) << 20; sb.Init.DiskBytes != want {
			return fmt.Errorf("the guest found a root disk of %d bytes, not %d", sb.Init.DiskBytes, want)
		}
		return nil
	}, nil}
}
