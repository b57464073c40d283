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
// initialised as a booted one is. A snapshot that QEMU could not restore
// is marked broken, so that its next use makes it again.
func (r *Runtime) clone(ctx context.Context, spec Spec, tpl template.Template) (*Sandbox, error) {
	sb := newSandbox(spec.ID, r.cfg.Dir.Sandbox(spec.ID), spec, r.log)
	sb.Template = tpl
	overlay := filepath.Join(sb.Dir, diskName)
	var held heldSnapshot
	release := func() {}
	var cfg vm.Config
	var restoreErr error
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
			sb.Snapshot = held.snap.Dir
			return nil
		}, func() { release() }},
		r.dirStep(sb),
		{"create disk", func(ctx context.Context) error {
			// At the template's size, as the snapshot's guest saw its
			// disk; it grows to the sandbox's size after the restore.
			return createOverlay(ctx, tpl.Image, overlay, 0)
		}, nil},
		recordStep(sb, &cfg),
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
			restoreErr = err
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
		initStep(sb),
		{"check disk", func(context.Context) error {
			if want := int64(spec.DiskMiB) << 20; sb.Init.DiskBytes != want {
				return fmt.Errorf("the guest found a root disk of %d bytes, not %d", sb.Init.DiskBytes, want)
			}
			return nil
		}, nil},
	}
	if err := runSteps(ctx, steps); err != nil {
		if restoreErr != nil && ctx.Err() == nil {
			r.breakSnapshot(held, restoreErr)
		}
		return nil, err
	}
	go sb.watch()
	sb.log.Debug("sandbox cloned from template snapshot", "snapshot", held.snap.Dir, "pid", sb.vm.PID())
	return sb, nil
}
