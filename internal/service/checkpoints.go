package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// checkpointTimeout bounds the making of one checkpoint.
const checkpointTimeout = 10 * time.Minute

// checkpointPoll is how often a create from a checkpoint that another
// process makes looks at its row.
const checkpointPoll = 100 * time.Millisecond

// Owned returns sandbox id as the store has it, when p may use it.
func (s *Service) Owned(ctx context.Context, p Principal, id string) (store.Sandbox, error) {
	return s.getOwned(ctx, p, id)
}

// mayCheckpoint refuses checkpoints where this server cannot make them:
// in cluster mode a checkpoint would bind the sandboxes made from it to
// the node that holds it, which placement does not know yet.
func (s *Service) mayCheckpoint() error {
	if s.cfg.Front || s.cfg.Node != "" {
		return fmt.Errorf("checkpoints and forks are not available in cluster mode yet (docs/kubernetes.md): %w", errdefs.ErrPrecondition)
	}
	return nil
}

// CheckpointVM begins a lifecycle operation of kind (apiv1.OpCheckpoint or
// OpFork) on sandbox id that makes checkpoint chkID of its VM, which runs
// on (running or paused), or of it at rest (suspended). done is told the outcome before the operation
// ends; creates from chkID that wait for it (waitCheckpoint) go on once
// done has returned.
func (s *Service) CheckpointVM(ctx context.Context, p Principal, id, kind, chkID string, done func(sandbox.Checkpoint, error)) (store.Operation, error) {
	if err := s.mayCheckpoint(); err != nil {
		return store.Operation{}, err
	}
	sb, op, f, from, err := s.beginOp(ctx, p, id, kind, "")
	if err != nil {
		return op, err
	}
	made := make(chan struct{})
	s.mu.Lock()
	s.making[chkID] = made
	s.mu.Unlock()
	go func(sb store.Sandbox, op store.Operation) {
		start := time.Now()
		s.markRunning(&op)
		cp, err := s.checkpointVM(id, chkID, from)
		done(cp, err)
		s.mu.Lock()
		delete(s.making, chkID)
		s.mu.Unlock()
		close(made)
		s.endOp(f, sb, from, op, err, time.Since(start))
	}(sb, op)
	return op, nil
}

// checkpointVM makes checkpoint chkID of sandbox id, which was in state
// from: of its VM, or at rest when it is suspended.
func (s *Service) checkpointVM(id, chkID, from string) (sandbox.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(s.ctx, checkpointTimeout)
	defer cancel()
	if from == apiv1.StateSuspended {
		return s.rt.CheckpointSuspended(ctx, id, chkID)
	}
	_, box, err := s.liveVM(id)
	if err != nil {
		return sandbox.Checkpoint{}, err
	}
	return s.rt.Checkpoint(ctx, box, chkID)
}

// RollbackVM begins a lifecycle operation that returns sandbox id to its
// checkpoint chkID (internal/checkpoint checked that it is the sandbox's
// and ready): the sandbox is waking meanwhile, and running after. Its
// command sessions end with rolled_back; a rollback that fails before
// the VM was replaced leaves the sandbox as it was, one that fails after
// fails it.
func (s *Service) RollbackVM(ctx context.Context, p Principal, id, chkID string) (apiv1.SandboxOperation, error) {
	if err := s.mayCheckpoint(); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	cur, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if err := s.checkFreeDisk(s.sandboxDir(id)); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if cur.State == apiv1.StateSuspended {
		// It takes its memory and vCPUs back, as a wake does.
		if err := s.admitWake(ctx, cur); err != nil {
			return apiv1.SandboxOperation{}, err
		}
	}
	sb, op, f, from, err := s.beginOp(ctx, p, id, apiv1.OpRollback, apiv1.StateWaking)
	if err != nil {
		s.endWake(id)
		return apiv1.SandboxOperation{}, err
	}
	go func(sb store.Sandbox, op store.Operation) {
		defer s.endWake(id)
		start := time.Now()
		s.markRunning(&op)
		err := s.rollbackVM(id, chkID)
		switch {
		case err == nil:
			sb.State = apiv1.StateRunning
		case errors.Is(err, sandbox.ErrVMExited):
			st := store.ErrorOf(err)
			sb.State, sb.LastError = apiv1.StateFailed, &st
		default:
			sb.State = from
		}
		s.endOp(f, sb, apiv1.StateWaking, op, err, time.Since(start))
	}(sb, op)
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

// rollbackVM has the runtime replace sandbox id's VM (or saved state)
// with one from checkpoint chkID.
func (s *Service) rollbackVM(id, chkID string) error {
	lv := s.getLive(id)
	if lv == nil {
		return fmt.Errorf("sandbox %s is not known to this server: %w", id, errdefs.ErrConflict)
	}
	select {
	case s.slots <- struct{}{}:
	case <-s.ctx.Done():
		return fmt.Errorf("the server is shutting down: %w", errdefs.ErrUnavailable)
	}
	defer func() { <-s.slots }()
	// The VM's context ends first, so the command pumps let go of their
	// processes as for a suspend.
	box := lv.dropBox()
	s.cmds.Wait(id)
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	nb, err := s.rt.Rollback(ctx, id, box, chkID)
	switch {
	case err == nil:
		s.cmds.RolledBack(id, "the sandbox was rolled back to checkpoint "+chkID)
		lv.setBox(nb)
		return nil
	case errors.Is(err, sandbox.ErrVMExited):
		s.cmds.Lost(id, "the sandbox was lost in its rollback")
		return err
	}
	// Nothing changed: the VM, if it had one, goes on.
	if box != nil {
		lv.setBox(box)
	}
	s.cmds.Resume(id)
	return err
}

// checkpointOf returns checkpoint id for a create by p: one p may use
// that has not failed.
func (s *Service) checkpointOf(ctx context.Context, p Principal, id string) (store.Checkpoint, error) {
	if !sandbox.ValidCheckpointID(id) {
		return store.Checkpoint{}, fmt.Errorf("checkpoint %q is not a checkpoint ID (chk…): %w", truncateID(id), errdefs.ErrInvalid)
	}
	c, err := s.st.GetCheckpoint(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(c.Owner) {
		return store.Checkpoint{}, fmt.Errorf("checkpoint %s not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return c, err
	}
	if c.State == apiv1.CheckpointFailed {
		return c, fmt.Errorf("checkpoint %s failed; nothing can be made from it: %w", id, errdefs.ErrConflict)
	}
	return c, nil
}

// truncateID shortens what a caller gave as an ID for an error message.
func truncateID(id string) string {
	if len(id) > 40 {
		return id[:40] + "…"
	}
	return id
}

// waitCheckpoint waits until checkpoint id is ready, for a create from
// it: at once when it is, on its making when this process makes it, or
// by looking at its row.
func (s *Service) waitCheckpoint(ctx context.Context, id string) error {
	for {
		s.mu.Lock()
		made := s.making[id]
		s.mu.Unlock()
		if made != nil {
			select {
			case <-made:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		c, err := s.st.GetCheckpoint(ctx, id)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", id, err)
		}
		switch c.State {
		case apiv1.CheckpointReady:
			return nil
		case apiv1.CheckpointFailed:
			msg := "no reason was recorded"
			if c.Error != nil {
				msg = c.Error.Message
			}
			return fmt.Errorf("checkpoint %s failed: %s: %w", id, msg, errdefs.ErrConflict)
		}
		select {
		case <-time.After(checkpointPoll):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// RemoveCheckpoint removes checkpoint id's files from this host unless a
// sandbox stands on them (sandbox.Runtime.RemoveCheckpoint).
func (s *Service) RemoveCheckpoint(id string) (bool, error) { return s.rt.RemoveCheckpoint(id) }

// CheckpointsOnHost lists the checkpoints whose files this host holds.
func (s *Service) CheckpointsOnHost() ([]string, error) { return s.rt.Checkpoints() }
