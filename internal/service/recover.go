package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/vm"
)

// recover brings the store and the host back in line after a restart:
//   - an operation left in flight is finished (delete) or failed with the
//     reason (create: its VM may be half made, so it is removed);
//   - a running sandbox's VM is adopted and its running commands are
//     re-attached; a VM that died while the server was down fails the
//     sandbox with what its console said.
func (s *Service) recover(ctx context.Context) error {
	mine, err := s.onThisNode(ctx)
	if err != nil {
		return err
	}
	ops, err := s.st.ListOperations(ctx, apiv1.OpPending, apiv1.OpRunning)
	if err != nil {
		return err
	}
	for _, op := range ops {
		if !mine(op.TargetID) {
			continue // another node's, or one no node has taken up yet
		}
		if err := s.recoverOp(ctx, op); err != nil {
			return err
		}
	}
	var after string
	for {
		rows, err := s.st.ListSandboxes(ctx, store.SandboxFilter{After: after, Limit: 500})
		if err != nil {
			return err
		}
		for _, sb := range rows {
			if !mine(sb.ID) {
				continue
			}
			s.states[sb.State]++
			switch sb.State {
			case apiv1.StateRunning, apiv1.StatePaused:
				s.recoverRunning(ctx, sb)
			case apiv1.StateSuspended:
				s.live[sb.ID] = s.adoptLive(nil, sb)
			}
		}
		if len(rows) < 500 {
			break
		}
		after = rows[len(rows)-1].ID
	}
	return nil
}

// onThisNode returns whether a sandbox is this service's to run: those
// recorded now on the node of its role, or, with none, every sandbox of
// the store.
func (s *Service) onThisNode(ctx context.Context) (func(id string) bool, error) {
	node := s.role.node()
	if node == "" {
		return func(string) bool { return true }, nil
	}
	nodes, err := s.st.SandboxNodes(ctx)
	if err != nil {
		return nil, err
	}
	return func(id string) bool { return nodes[id] == node }, nil
}

func (s *Service) recoverOp(ctx context.Context, op store.Operation) error {
	now := s.now()
	op.FinishedAt = &now
	sb, err := s.st.GetSandbox(ctx, op.TargetID)
	if err != nil {
		op.Status = apiv1.OpFailed
		op.Error = &store.Error{Code: apiv1.CodeInternal, Message: fmt.Sprintf("the server restarted and the target %s is gone", op.TargetID)}
		return s.st.UpdateOperation(ctx, op)
	}
	vmAlive := false
	if _, err := vm.RunningPID(s.sandboxDir(sb.ID)); err == nil {
		vmAlive = true
	}
	restarted := func(what string) {
		op.Status = apiv1.OpFailed
		op.Error = &store.Error{Code: apiv1.CodeUnavailable, Message: "the server restarted while this " + op.Kind + " was in flight; " + what}
	}
	switch op.Kind {
	case apiv1.OpPause, apiv1.OpWake:
		if sb.State == apiv1.StateWaking {
			if sandbox.SuspendedState(s.sandboxDir(sb.ID)) {
				// The restore did not finish: what it started goes, the
				// saved state stays for another wake.
				if pid, err := vm.RunningPID(s.sandboxDir(sb.ID)); err == nil {
					if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
						s.log.Warn("kill the QEMU of a restore cut short", "sandbox", sb.ID, "pid", pid, "err", err)
					}
				}
				sb.State = apiv1.StateSuspended
				restarted("the sandbox is suspended: wake it again")
				break
			}
			sb.State = apiv1.StateRunning // restored: adopted below
			op.Status = apiv1.OpSucceeded
			break
		}
		// The VM's own status decides between running and paused when it
		// is adopted below.
		restarted("the sandbox is as its VM was found")
	case apiv1.OpSuspend:
		// A save cut short leaves its temporary state file, as big as
		// the VM's memory; whatever happens next, it is never used.
		if err := removeStateTemps(s.sandboxDir(sb.ID)); err != nil {
			s.log.Warn("remove the temporary state of a save cut short", "sandbox", sb.ID, "err", err)
		}
		switch {
		case !vmAlive && sandbox.SuspendedState(s.sandboxDir(sb.ID)):
			sb.State, op.Status = apiv1.StateSuspended, apiv1.OpSucceeded
		case vmAlive:
			sb.State = apiv1.StateRunning
			// Adopt cancels a save still under way and resumes a VM the
			// save had stopped; one stopped before its save began stays
			// paused, as its VM says.
			restarted("the sandbox is as its VM was found: suspend it again")
		default:
			restarted("the sandbox's VM was lost")
			sb.State, sb.LastError = apiv1.StateFailed, op.Error
		}
	case apiv1.OpDelete:
		if err := s.rt.Remove(ctx, sb.ID); err != nil {
			op.Status, op.Error = apiv1.OpFailed, &store.Error{Code: apiv1.CodeInternal, Message: err.Error()}
			sb.State, sb.LastError = apiv1.StateFailed, op.Error
		} else {
			op.Status, sb.State = apiv1.OpSucceeded, apiv1.StateDeleted
		}
		s.cmds.End(sb.ID, "the sandbox was deleted")
	default:
		msg := fmt.Sprintf("the server restarted while this %s was in flight; the sandbox was removed: create it again", op.Kind)
		op.Status = apiv1.OpFailed
		op.Error = &store.Error{Code: apiv1.CodeUnavailable, Message: msg}
		if err := s.rt.Remove(ctx, sb.ID); err != nil {
			s.log.Warn("remove half-made sandbox", "sandbox", sb.ID, "err", err)
		}
		s.cmds.End(sb.ID, "the server restarted")
		sb.State, sb.LastError = apiv1.StateFailed, op.Error
	}
	sb.UpdatedAt = now
	s.log.Info("finished an operation left by the last server", "operation", op.ID, "kind", op.Kind, "status", op.Status)
	return s.st.TransitionSandbox(ctx, sb, op)
}

// recoverRunning adopts a running sandbox's VM, or fails the sandbox.
func (s *Service) recoverRunning(ctx context.Context, sb store.Sandbox) {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pol := storedPolicy(sb)
	box, err := s.rt.Adopt(actx, sb.ID, sandbox.Spec{
		ID: sb.ID, Template: sb.TemplateDigest, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Env: sb.Env, Detach: true,
		Network: &pol,
	})
	if err != nil {
		msg := "the sandbox VM stopped while the server was down: " + err.Error()
		if !errors.Is(err, sandbox.ErrVMExited) {
			msg = "the sandbox VM could not be adopted after a server restart: " + err.Error()
			if err := s.rt.Remove(ctx, sb.ID); err != nil {
				s.log.Warn("remove a sandbox that could not be adopted", "sandbox", sb.ID, "err", err)
			}
		}
		s.log.Warn("sandbox lost while the server was down", "sandbox", sb.ID, "err", err)
		s.cmds.End(sb.ID, "the sandbox VM stopped while the server was down")
		s.states[sb.State]--
		sb.State = apiv1.StateFailed
		sb.LastError = &store.Error{Code: apiv1.CodeUnavailable, Message: msg}
		sb.UpdatedAt = s.now()
		if err := s.st.UpdateSandbox(ctx, sb); err != nil {
			s.log.Error("record failed sandbox", "sandbox", sb.ID, "err", err)
		}
		s.states[sb.State]++
		return
	}
	// The VM's own status is the truth about running and paused (a pause
	// may have been cut short by the restart).
	{
		state := apiv1.StateRunning
		if box.Paused() {
			state = apiv1.StatePaused
		}
		if state != sb.State {
			s.states[sb.State]--
			sb.State, sb.UpdatedAt = state, s.now()
			if err := s.st.UpdateSandbox(ctx, sb); err != nil {
				// The VM is adopted all the same; its next change of
				// state is recorded over the stale one.
				s.log.Error("record adopted sandbox state", "sandbox", sb.ID, "state", state, "err", err)
			}
			s.states[sb.State]++
		}
	}
	lv := s.adoptLive(box, sb)
	s.live[sb.ID] = lv
	if sb.State == apiv1.StatePaused {
		// Its agent answers once it is woken, which re-attaches then.
		s.log.Info("adopted paused sandbox", "sandbox", sb.ID)
		return
	}
	s.cmds.Resume(sb.ID)
	s.log.Info("adopted sandbox", "sandbox", sb.ID)
}

// removeStateTemps removes the temporary files of saves of the sandbox's
// state (vm.Machine.SaveState writes one beside sandbox.StateName and
// renames it once whole) from the sandbox directory dir.
func removeStateTemps(dir string) error {
	// Glob fails only on a malformed pattern, and this one is fixed.
	tmps, _ := filepath.Glob(filepath.Join(dir, "."+sandbox.StateName+".tmp-*"))
	var errs []error
	for _, p := range tmps {
		errs = append(errs, os.Remove(p))
	}
	return errors.Join(errs...)
}
