package sandbox

import (
	"context"
	"fmt"
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
	sb := newSandbox(spec.ID, r.cfg.Dir.Sandbox(spec.ID), spec, r.log)
	sb.Template = tpl
	overlay := filepath.Join(sb.Dir, diskName)
	var held heldSnapshot
	release := func() {}
	var cfg vm.Config
	var layer string  // the warm snapshot's disk layer
	var snapErr error // what is wrong with the snapshot, if anything
	steps := []step{
		{"take template snapshot", func(ctx context.Context) error {
			var err error
			if held, err = r.acquireSnapshot(ctx, tpl, spec); err != nil {
				return err
			}
			release = sync.OnceFunc(held.release)
			cfg = held.snap.VM
			cfg.Dir, cfg.Disk, cfg.Detach = sb.Dir, overlay, spec.Detach
			cfg.MemoryFile, cfg.MemoryShared, cfg.Incoming = held.snap.MemFile, false, false
			sb.Snapshot, sb.Warm, layer = held.snap.Dir, held.snap.Warm, held.snap.Disk
			return nil
		}, func() { release() }},
		r.dirStep(sb),
		r.jailStep(sb, &cfg),
		r.cgroupStep(sb, &cfg),
		{"create disk", func(ctx context.Context) error {
			// At the size the snapshot's guest saw its disk; it grows to
			// the sandbox's size after the restore.
			if layer != "" {
				return createLayeredOverlay(ctx, layer, overlay)
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
		{"grow disk", func(ctx context.Context) error {
			// The guest learns the new size from a virtio configuration
			// change, handled once it runs; "check disk" confirms it.
			return sb.vm.ResizeDisk(ctx, int64(spec.DiskMiB)<<20)
		}, nil},
		{"resume vm", func(ctx context.Context) error {
			return sb.vm.Resume(ctx)
		}, nil},
		{"connect to agent", func(ctx context.Context) error {
			c, err := ConnectAgent(ctx, sb.vm, wakeAgentTimeout)
			sb.agent = c
			return err
		}, func() { sb.agent.Close() }},
	}
	if startsWarm(spec, tpl) {
		steps = append(steps, reinitStep(sb), step{"check template's server", func(ctx context.Context) error {
			err := r.checkServer(ctx, sb)
			snapErr = err
			return err
		}, nil})
	} else {
		steps = append(steps, initStep(sb))
	}
	steps = append(steps, step{"check disk", func(context.Context) error {
		if want := int64(spec.DiskMiB) << 20; sb.Init.DiskBytes != want {
			return fmt.Errorf("the guest found a root disk of %d bytes, not %d", sb.Init.DiskBytes, want)
		}
		return nil
	}, nil})
	if err := runSteps(ctx, steps, &sb.Timings); err != nil {
		if snapErr != nil && ctx.Err() == nil {
			r.breakSnapshot(held, snapErr)
			if held.snap.Warm {
				// Made again now, it would likely fail the same way:
				// creates boot for a while instead.
				r.buildFailed(held.key, snapErr)
			}
		}
		return nil, err
	}
	sb.Timings.Split("init guest", sb.Init.Timings)
	sb.Timings.Split("reinit guest", sb.Init.Timings)
	go sb.watch()
	sb.log.Debug("sandbox cloned from template snapshot", "snapshot", held.snap.Dir, "warm", sb.Warm, "pid", sb.vm.PID())
	return sb, nil
}
