package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/vm"
)

// adoptTimeout bounds reaching the agent of an adopted VM. The agent is
// already up, but a busy host under TCG can be slow to answer.
const adoptTimeout = 30 * time.Second

// invalidID is the error for an ID that cannot name a sandbox.
func invalidID(id string) error {
	return fmt.Errorf("sandbox id %q: must be \"sbx\" and lowercase letters and digits, at most %d bytes: %w", id, maxIDLen, errdefs.ErrInvalid)
}

// Adopt takes over sandbox id, whose VM was started with Spec.Detach by a
// process that has since released it or died (a restarted server, say),
// and returns it as Create would have: watched, with a fresh session with
// its agent, ready for Exec, Release and Destroy. Processes running in the
// sandbox keep running. spec is what the sandbox was created with; its
// Template (best given as the "sha256:..." digest) fills Sandbox.Template
// if the template still exists. Sandbox.Init is left empty: the guest was
// initialised by its creator.
//
// A VM found paused is adopted paused (Sandbox.Paused): the agent of a
// paused guest cannot answer, so the session with it is opened by
// Sandbox.Resume, and Sandbox.Agent is nil until then.
//
// If another live process owns the sandbox, the error is
// errdefs.ErrConflict. If its VM is gone (or its directory is), the error
// wraps vm.ErrNotRunning and ErrVMExited and its message quotes the VM's
// console; the directory is left for the caller to Remove, or, when it
// holds a saved state (SuspendedState), to Wake. A VM that runs but whose
// agent does not answer, or whose guest was never initialised, is a plain
// error and is left running.
//
// A VM that outlived the writing of a saved state (its suspend was
// interrupted) is adopted, paused, and the state, which holds nothing the
// VM does not, is removed. A VM still waiting for a restore (its wake was
// interrupted) holds nothing: it is killed, and the error wraps
// ErrVMExited.
func (r *Runtime) Adopt(ctx context.Context, id string, spec Spec) (*Sandbox, error) {
	if !ValidID(id) {
		return nil, invalidID(id)
	}
	dir := r.cfg.Dir.Sandbox(id)
	lock, err := lockOwner(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("adopt sandbox %s: %w: its directory is gone: %w", id, ErrVMExited, vm.ErrNotRunning)
	}
	if err != nil {
		return nil, fmt.Errorf("adopt sandbox %s: %w", id, err)
	}
	spec.ID, spec.Detach = id, true
	sb := newSandbox(id, dir, spec, r.log)
	m, err := vm.Adopt(dir, sb.log)
	if err != nil {
		lock.Close()
		if errors.Is(err, vm.ErrNotRunning) {
			if SuspendedState(dir) {
				return nil, fmt.Errorf("adopt sandbox %s: %w: it is suspended (its state is saved): wake it: %w", id, ErrVMExited, err)
			}
			return nil, fmt.Errorf("adopt sandbox %s: %w: %w", id, ErrVMExited, err)
		}
		return nil, fmt.Errorf("adopt sandbox %s: %w", id, err)
	}
	sb.vm, sb.owner, sb.cg = m, lock, r.loadCgroup(dir)
	var netMAC string // the VM's network device, when it has one
	if rec, err := readRecord(dir); err == nil {
		sb.Snapshot, sb.Warm = rec.snapshot(), rec.Layer != ""
		netMAC = rec.VM.NetMAC
	}
	// A suspend whose process died may have left its save running, or
	// the VM stopped by it: the save is never used (its state is not in
	// place, or is removed below), so the VM runs on as before it.
	if found, err := m.SettleSave(ctx); found {
		sb.log.Warn("the adopted VM was being saved by a suspend that never finished: it runs on", "err", err)
	}
	st, err := m.Status(ctx)
	if err != nil {
		// Without QMP the agent decides, as before pause existed.
		sb.log.Warn("cannot ask the adopted VM for its status", "err", err)
	}
	switch st {
	case vm.StatusInMigrate:
		m.Kill()
		select {
		case <-m.Done():
		case <-time.After(5 * time.Second):
		}
		m.Release()
		lock.Close()
		why := "its VM was waiting for a restore that never finished, and was killed"
		if SuspendedState(dir) {
			why += "; its saved state remains: wake it"
		}
		return nil, fmt.Errorf("adopt sandbox %s: %s: %w: %w", id, why, ErrVMExited, vm.ErrNotRunning)
	case vm.StatusPaused, vm.StatusPostMigrate:
		sb.paused = true
	}
	if SuspendedState(dir) {
		sb.log.Warn("the sandbox's VM outlived the saving of its state: keeping the VM, removing the state")
		if err := os.Remove(filepath.Join(dir, StateName)); err != nil {
			m.Release()
			lock.Close()
			return nil, fmt.Errorf("adopt sandbox %s: remove its stale saved state: %w", id, err)
		}
	}
	if spec.Template != "" {
		if tpl, err := r.templates.Resolve(spec.Template); err != nil {
			sb.log.Warn("the adopted sandbox's template is gone", "template", spec.Template, "err", err)
		} else {
			sb.Template = tpl
		}
	}
	err = r.startGateway(ctx, sb, netMAC)
	if err == nil {
		err = sb.linkUp(ctx)
	}
	if err != nil {
		sb.closeGateway()
		sb.vm.Release()
		lock.Close()
		return nil, fmt.Errorf("adopt sandbox %s: %w", id, err)
	}
	if sb.paused {
		go sb.watch()
		sb.log.Info("sandbox adopted paused", "pid", m.PID(), "status", st)
		return sb, nil
	}
	if err := sb.connect(ctx); err != nil {
		failure := sb.Failure() // read before Release, which stops watching the VM
		sb.closeGateway()
		sb.vm.Release()
		lock.Close()
		if failure != nil {
			return nil, fmt.Errorf("adopt sandbox %s: %w: %w", id, vm.ErrNotRunning, failure)
		}
		return nil, fmt.Errorf("adopt sandbox %s: %w", id, err)
	}
	go sb.watch()
	sb.log.Info("sandbox adopted", "pid", m.PID())
	return sb, nil
}

// connect opens the adopted (or resumed) sandbox's session with its agent
// and checks that the guest is one its creator initialised.
func (s *Sandbox) connect(ctx context.Context) error {
	c, err := ConnectAgent(ctx, s.vm, adoptTimeout)
	if err != nil {
		return err
	}
	pong, err := c.Ping(ctx)
	switch {
	case err != nil:
	case !pong.Initialized:
		err = errors.New("its guest was never initialised: its creation did not finish")
	case pong.Placeholder:
		err = errors.New("its guest still has its template snapshot's identity: its creation did not finish")
	}
	if err != nil {
		c.Close()
		return fmt.Errorf("agent: %w", err)
	}
	s.mu.Lock()
	s.agent = c
	s.mu.Unlock()
	return nil
}

// Remove clears away sandbox id, which no live process owns (one left
// mid-create or mid-delete by a process that crashed, or one that failed
// to adopt): its QEMU is killed if it still runs, and its directory is
// removed. A sandbox that is already gone is not an error; one that
// another live process (or a Sandbox in this one) owns is
// errdefs.ErrConflict. A warm pool member that Claim took for id, and no
// create used, is destroyed.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if !ValidID(id) {
		return invalidID(id)
	}
	if sb, _ := r.takeClaimed(id); sb != nil {
		// A warm pool member a create took and never used.
		return sb.Destroy(ctx)
	}
	dir := r.cfg.Dir.Sandbox(id)
	lock, err := lockOwner(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	defer lock.Close()
	log := r.log.With("sandbox", id)
	m, err := vm.Adopt(dir, log)
	switch {
	case err == nil:
		m.Kill()
		select {
		case <-m.Done():
			m.Release()
		case <-ctx.Done():
			m.Release()
			return fmt.Errorf("remove sandbox %s: wait for its VM to exit: %w", id, ctx.Err())
		}
		log.Info("killed the VM of a removed sandbox", "pid", m.PID())
	case !errors.Is(err, vm.ErrNotRunning):
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	if g := r.loadCgroup(dir); g != nil {
		if err := g.Delete(); err != nil {
			log.Warn("remove the sandbox's cgroup", "err", err)
		}
	}
	if err := removeDir(dir); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	return nil
}
