package service

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Realize makes the VM of a sandbox that the cluster bound to this node:
// its row, admitted by another server, is creating with its create
// operation pending. The node claims the row first, so that of two nodes
// given the same sandbox one makes it. A sandbox this node already runs
// or is making is left as it is: Realize may be called again for it, as
// when its Pod is made anew after an eviction. A sandbox that has ended
// (deleted, failed) has nothing to make, and its Pod goes with the next
// pass of the controller. It returns once the create is under way; the
// operation records how it ends. Only a cluster node's service realizes
// sandboxes: another's refuses with an error wrapping
// errdefs.ErrPrecondition.
func (s *Service) Realize(ctx context.Context, id string) error {
	return s.role.realize(ctx, s, id)
}

// holds says whether this service runs, or is making, the sandbox.
func (s *Service) holds(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, creating := s.creating[id]
	_, live := s.live[id]
	return creating || live
}

// pendingCreate returns the create operation of a sandbox still to be made.
func (s *Service) pendingCreate(ctx context.Context, id string) (store.Operation, error) {
	ops, err := s.st.ListOperations(ctx, apiv1.OpPending)
	if err != nil {
		return store.Operation{}, err
	}
	for _, op := range ops {
		if op.TargetID == id && op.Kind == apiv1.OpCreate {
			return op, nil
		}
	}
	return store.Operation{}, fmt.Errorf("sandbox %s has no pending create: %w", id, errdefs.ErrPrecondition)
}

// failCreate ends a create this node cannot run: the sandbox fails with
// the reason, and so does its operation. It returns err.
func (s *Service) failCreate(sb store.Sandbox, op store.Operation, err error) error {
	status := store.ErrorOf(err)
	now := s.now()
	op.Status, op.Error, op.FinishedAt = apiv1.OpFailed, &status, &now
	sb.State, sb.LastError, sb.UpdatedAt = apiv1.StateFailed, &status, now
	if terr := s.st.TransitionSandbox(s.ctx, sb, op); terr != nil {
		return fmt.Errorf("%w (and recording it failed: %v)", err, terr)
	}
	return err
}

// pollOperation reads an operation's row every 200 ms until it is done or
// wait has passed.
func (s *Service) pollOperation(ctx context.Context, get func() (store.Operation, error), wait time.Duration) (apiv1.Operation, error) {
	deadline := time.Now().Add(wait)
	for {
		op, err := get()
		if err != nil || op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed || !time.Now().Before(deadline) {
			return op.View(), err
		}
		select {
		case <-ctx.Done():
			return apiv1.Operation{}, ctx.Err()
		case <-s.ctx.Done():
			return op.View(), nil
		case <-time.After(min(200*time.Millisecond, time.Until(deadline))):
		}
	}
}
