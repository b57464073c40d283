package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/timings"
	"github.com/airlockhq/airlock/internal/vm"
)

// Files in a sandbox's directory that pause, suspend and wake use.
const (
	// RecordName records how the sandbox's VM was started (JSON), so that
	// Wake starts it again with the same command line: a saved state
	// restores only into the device set it was saved from.
	RecordName = "vm.json"
	// StateName is the sandbox's saved state while it is suspended: the
	// VM's RAM and device state as QEMU's migration stream. It is whole
	// or absent: it is written under a temporary name and renamed.
	StateName = "state.mig"
)

// record is what RecordName holds.
type record struct {
	// Spec is the sandbox's spec, its Template the template's digest.
	Spec Spec `json:"spec"`
	// VM is the configuration the VM was started with.
	VM vm.Config `json:"vm"`
	// Layer is the disk layer (TemplateSnapshot.Disk) of the warm
	// snapshot the VM is a clone of, which its disk is an overlay of; ""
	// for a clone of a cold snapshot or a booted VM.
	Layer string `json:"layer,omitempty"`
	// Limits are the cgroup limits the VM runs with; absent when unjailed.
	Limits *cgroup.Resources `json:"limits,omitempty"`
}

// snapshot is the directory of the template snapshot the VM is a clone
// of, or "" for a VM that booted: a clone maps the snapshot's memory file
// private.
func (rec record) snapshot() string {
	if rec.VM.MemoryFile == "" || rec.VM.MemoryShared {
		return ""
	}
	return filepath.Dir(rec.VM.MemoryFile)
}

// backing is the chain of images under the VM's disk, nearest first, as
// the server made it: the recorded one, or for a record written before
// chains were recorded, the warm layer it names and its template's image.
// It is never read from the disk's qcow2 header, which the VM's user can
// rewrite.
func (r *Runtime) backing(rec record) ([]string, error) {
	if len(rec.VM.Backing) > 0 {
		return rec.VM.Backing, nil
	}
	tpl, err := r.templates.Resolve(rec.Spec.Template)
	if err != nil {
		return nil, fmt.Errorf("the template the disk stands on: %w", err)
	}
	return rec.chainOver(tpl.Image), nil
}

// chainOver is the chain a record written before chains were recorded
// stands for: the warm layer it names, if any, over the template image.
func (rec record) chainOver(image string) []string {
	if rec.Layer != "" {
		return []string{rec.Layer, image}
	}
	return []string{image}
}

func writeRecord(dir string, rec record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, RecordName), append(b, '\n'), 0o600)
}

func readRecord(dir string) (record, error) {
	var rec record
	b, err := os.ReadFile(filepath.Join(dir, RecordName))
	if errors.Is(err, os.ErrNotExist) {
		return rec, fmt.Errorf("%s has no record of its VM (%s): it was created by an older airlock: %w", dir, RecordName, errdefs.ErrPrecondition)
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read %s: %w", RecordName, err)
	}
	if err := rec.VM.Validate(); err != nil {
		return rec, fmt.Errorf("read %s: %w", RecordName, err)
	}
	return rec, nil
}

// SuspendedState reports whether the sandbox directory dir holds a saved
// state (Suspend wrote it and no Wake has used it): the sandbox lives on
// in its directory, with no VM and no owner, until Wake or Remove.
func SuspendedState(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, StateName))
	return err == nil
}

// usable refuses a sandbox that was suspended or rolled back: its Sandbox
// is spent.
func (s *Sandbox) usable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.suspended {
		return fmt.Errorf("sandbox %s is suspended: wake it: %w", s.ID, errdefs.ErrConflict)
	}
	if s.replaced {
		return fmt.Errorf("sandbox %s was rolled back: its VM is another now: %w", s.ID, errdefs.ErrConflict)
	}
	return nil
}

// Paused reports whether the sandbox's vCPUs are stopped.
func (s *Sandbox) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// vmErr explains an error from the VM with its exit, if it exited.
func (s *Sandbox) vmErr(err error) error {
	if f := s.Failure(); f != nil {
		return f
	}
	return err
}

// Pause stops the sandbox's vCPUs. Its memory stays resident and its
// processes stay as they are; agent requests wait until Resume (Exec and
// Attach refuse with errdefs.ErrConflict meanwhile).
func (s *Sandbox) Pause(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.vm.Pause(ctx); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", s.ID, s.vmErr(err))
	}
	s.mu.Lock()
	s.paused = true
	s.mu.Unlock()
	return nil
}

// Resume runs a paused sandbox again and brings its guest up to date: the
// guest's clock is set from the host's and fresh entropy reseeds its
// random generator. A sandbox adopted while paused gets its agent session
// here. Resuming a running sandbox only refreshes it.
func (s *Sandbox) Resume(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.vm.Resume(ctx); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", s.ID, s.vmErr(err))
	}
	s.mu.Lock()
	s.paused = false
	noAgent := s.agent == nil
	s.mu.Unlock()
	if noAgent {
		if err := s.connect(ctx); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", s.ID, s.vmErr(err))
		}
	}
	if err := s.refresh(ctx); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", s.ID, err)
	}
	return nil
}

// refresh sets the guest's clock from the host's and reseeds its random
// generator with fresh entropy.
func (s *Sandbox) refresh(ctx context.Context) error {
	entropy := make([]byte, 64)
	rand.Read(entropy)
	err := s.Agent().Refresh(ctx, agentproto.RefreshRequest{TimeUnixNano: time.Now().UnixNano(), Entropy: entropy})
	if unknownOp(err, agentproto.OpRefresh) {
		// A guest booted before its agent learnt refresh: it runs on with
		// a clock that lags by the pause.
		s.log.Warn("the guest agent predates refresh: its clock and random state were not renewed")
		return nil
	}
	return s.explain(err)
}

// unknownOp reports whether err is an agent's answer that it does not
// know operation op: it predates it.
func unknownOp(err error, op string) bool {
	var ae *agentclient.Error
	return errors.As(err, &ae) && ae.Code == agentproto.CodeInvalid && strings.Contains(ae.Message, `"`+op+`"`)
}

// syncTimeout bounds the guest's writing out of its dirty data before a
// suspend.
const syncTimeout = time.Minute

// syncGuest has the guest write its dirty data to its disk, so that the
// disk of the suspended sandbox holds what was written before the suspend
// (Runtime.SaveSuspendedDisk copies it): otherwise the last writes live
// only in the saved RAM. A paused guest runs for it and is paused again.
// A guest whose agent predates sync is saved as it is.
func (s *Sandbox) syncGuest(ctx context.Context, status string) error {
	if status != vm.StatusRunning && status != vm.StatusPaused {
		return nil // not a guest that can run: nothing is written either
	}
	return s.inGuest(ctx, status == vm.StatusPaused, nil, func(ctx context.Context, c *agentclient.Client) error {
		ctx, cancel := context.WithTimeout(ctx, syncTimeout)
		defer cancel()
		err := c.Sync(ctx)
		if unknownOp(err, agentproto.OpSync) {
			s.log.Warn("the guest agent predates sync: the suspended disk may lack the last writes")
			return nil
		}
		return err
	})
}

// Suspend saves the sandbox's whole state (RAM and devices) to StateName in
// its directory and ends its VM: the QEMU process goes, its memory is
// freed, the agent session is closed and the owner lock released. The
// directory (disk, saved state, logs, record) stays for Runtime.Wake,
// which can run in another process, or Runtime.Remove. The Sandbox must
// not be used afterwards.
//
// The guest first writes its dirty data out (a paused one runs briefly
// for that), so that the disk at rest holds what was written before.
//
// A running or paused sandbox can be suspended. If the save fails, the
// sandbox is left as it was (running again if it ran) and the error says
// why; no partial state is ever left under StateName.
func (s *Sandbox) Suspend(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(s.Dir, RecordName)); err != nil {
		return fmt.Errorf("suspend sandbox %s: it has no record of its VM (%s), so it could not be woken: it was created by an older airlock: %w", s.ID, RecordName, errdefs.ErrPrecondition)
	}
	was, err := s.vm.Status(ctx)
	if err != nil {
		return fmt.Errorf("suspend sandbox %s: %w", s.ID, s.vmErr(err))
	}
	if err := s.syncGuest(ctx, was); err != nil {
		return fmt.Errorf("suspend sandbox %s: write out the guest's data: %w", s.ID, err)
	}
	if err := s.vm.SaveState(ctx, filepath.Join(s.Dir, StateName), false); err != nil {
		err = s.vmErr(err)
		if was == vm.StatusRunning && !s.vm.Exited() {
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if rerr := s.vm.Resume(rctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume after the failed save: %w", rerr))
			}
			cancel()
		} else if was != vm.StatusRunning {
			s.mu.Lock()
			s.paused = true
			s.mu.Unlock()
		}
		return fmt.Errorf("suspend sandbox %s: %w", s.ID, err)
	}
	// The state is saved: from here on the sandbox lives in its directory.
	s.mu.Lock()
	s.suspended = true
	s.mu.Unlock()
	s.releaseOnce.Do(func() { close(s.released) })
	s.closeAgent()
	s.closeGateway()
	s.vm.Stop(ctx)
	s.dropCgroup()
	s.owner.Close()
	s.log.Info("sandbox suspended")
	return nil
}

// wakeAgentTimeout bounds reaching the agent of a restored guest, which is
// already up.
const wakeAgentTimeout = 30 * time.Second

// Wake restores suspended sandbox id from the state Suspend saved and
// returns it as Create would: running, watched, with a fresh session with
// its agent, its guest's clock and random state renewed. Its processes go
// on where they stopped; commands are joined again with Sandbox.Attach.
// The saved state is used up.
//
// A sandbox without a saved state is errdefs.ErrPrecondition; one that
// does not exist errdefs.ErrNotFound; one another live process owns
// errdefs.ErrConflict. If the wake fails, what it started is stopped and,
// as long as the guest has not run, the saved state stays so that Wake can
// be retried; once the guest ran, the state it reached is saved again.
// Should that fail too, the error wraps ErrVMExited: the sandbox is lost,
// and SuspendedState is false.
func (r *Runtime) Wake(ctx context.Context, id string) (*Sandbox, error) {
	if !ValidID(id) {
		return nil, invalidID(id)
	}
	dir := r.cfg.Dir.Sandbox(id)
	state := filepath.Join(dir, StateName)
	log := r.log.With("sandbox", id)
	var sb *Sandbox
	var m *vm.Machine
	var lock *os.File
	var rec record
	used := false // the saved state was removed for the guest to run
	steps := []step{
		{"lock sandbox", func(context.Context) error {
			l, err := lockOwner(dir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("sandbox %s does not exist: %w", id, errdefs.ErrNotFound)
			}
			lock = l
			return err
		}, func() { lock.Close() }},
		{"read saved state", func(ctx context.Context) error {
			if !SuspendedState(dir) {
				return fmt.Errorf("sandbox %s has no saved state to wake from: %w", id, errdefs.ErrPrecondition)
			}
			var err error
			if rec, err = readRecord(dir); err != nil {
				return err
			}
			return clearLeftovers(ctx, dir, log)
		}, nil},
		{"start vm", func(ctx context.Context) error {
			cfg := rec.VM
			cfg.Incoming = true
			var err error
			if cfg.Disk != "" {
				if cfg.Backing, err = r.backing(rec); err != nil {
					return err
				}
			}
			if cfg.Jail, err = r.jail(dir, rec.VM.Jail); err != nil {
				return err
			}
			cg, err := r.vmCgroup(&cfg)
			if err != nil {
				return err
			}
			m, err = vm.Start(ctx, cfg, log)
			if err != nil {
				if cg != nil {
					cg.Delete()
				}
				return err
			}
			sb = newSandbox(id, dir, rec.Spec, r.log)
			sb.vm, sb.owner, sb.cg = m, lock, cg
			sb.Snapshot, sb.Warm = rec.snapshot(), rec.Layer != ""
			return nil
		}, func() { m.Stop(context.Background()); sb.dropCgroup() }},
		{"start gateway", func(ctx context.Context) error {
			// Flows the guest had open end: the new gateway knows none
			// of them, and resets them when the guest sends on them.
			return r.startGateway(ctx, sb, rec.VM.NetMAC)
		}, func() { sb.closeGateway() }},
		{"restore state", func(ctx context.Context) error {
			return m.RestoreState(ctx, state, false)
		}, nil},
		{"network link up", func(ctx context.Context) error {
			return sb.linkUp(ctx) // sb is made by "start vm"
		}, nil},
		{"resume vm", func(ctx context.Context) error {
			// Once the guest runs, its disk moves past the saved state,
			// which must then never be restored: it goes first.
			if err := os.Remove(state); err != nil {
				return err
			}
			used = true
			if err := m.Resume(ctx); err != nil {
				saveAgain(m, state, log)
				return err
			}
			return nil
		}, func() { saveAgain(m, state, log) }},
		{"connect to agent", func(ctx context.Context) error {
			c, err := ConnectAgent(ctx, m, wakeAgentTimeout)
			if err != nil {
				return err
			}
			sb.agent = c
			return nil
		}, func() { sb.closeAgent() }},
		{"refresh guest", func(ctx context.Context) error {
			return sb.refresh(ctx)
		}, nil},
	}
	var took timings.Timings
	if err := runSteps(ctx, steps, &took); err != nil {
		switch {
		case lock == nil:
		case SuspendedState(dir):
			err = fmt.Errorf("%w (its saved state is kept)", err)
		case used:
			err = fmt.Errorf("%w: %w (its saved state is lost)", err, ErrVMExited)
		}
		return nil, fmt.Errorf("wake sandbox %s: %w", id, err)
	}
	if tpl := rec.Spec.Template; tpl != "" {
		if t, err := r.templates.Resolve(tpl); err != nil {
			sb.log.Warn("the woken sandbox's template is gone", "template", tpl, "err", err)
		} else {
			sb.Template = t
		}
	}
	sb.Timings = took
	go sb.watch()
	sb.log.Info("sandbox woken", "pid", m.PID())
	return sb, nil
}

// saveAgain saves the state of a woken VM whose wake failed after its
// guest ran, so the sandbox can be woken again from where it got to.
func saveAgain(m *vm.Machine, state string, log *slog.Logger) {
	if m.Exited() {
		log.Error("the sandbox's VM exited during its wake: its saved state is lost")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.SaveState(ctx, state, false); err != nil {
		log.Error("save the state of a failed wake: the sandbox's saved state is lost", "err", err)
	}
}

// clearLeftovers removes what an interrupted suspend or wake left in dir
// beside a saved state: a temporary state file, and a QEMU that is still
// there. That QEMU never ran the guest past the saved state (a suspend
// saves before it ends QEMU; a wake removes the state before the guest
// runs), so the state is the truth and the QEMU goes.
func clearLeftovers(ctx context.Context, dir string, log *slog.Logger) error {
	if tmps, _ := filepath.Glob(filepath.Join(dir, "."+StateName+".tmp-*")); len(tmps) > 0 {
		for _, p := range tmps {
			os.Remove(p)
		}
	}
	if _, err := vm.RunningPID(dir); err != nil {
		return nil
	}
	m, err := vm.Adopt(dir, log)
	if errors.Is(err, vm.ErrNotRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("a VM of an earlier run is still there: %w", err)
	}
	log.Warn("killing the VM an interrupted suspend or wake left", "pid", m.PID())
	m.Kill()
	select {
	case <-m.Done():
		m.Release()
		return nil
	case <-ctx.Done():
		m.Release()
		return fmt.Errorf("wait for the VM of an earlier run to exit: %w", ctx.Err())
	}
}
