package service

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
)

// runningSandbox returns the held sandbox p owns, or an error naming its
// state when it has no running VM.
func (s *Service) runningSandbox(ctx context.Context, p Principal, id string) (*live, store.Sandbox, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return nil, sb, err
	}
	lv := s.getLive(id)
	if sb.State != apiv1.StateRunning || lv == nil || !lv.hasVM() {
		return nil, sb, fmt.Errorf("sandbox %s is %s, not running: %w", id, sb.State, errdefs.ErrConflict)
	}
	return lv, sb, nil
}

// sandboxes answers the command sessions' questions about the sandboxes
// (sessions.Sandboxes).
type sandboxes struct{ s *Service }

var _ sessions.Sandboxes = sandboxes{}

func (x sandboxes) Owned(ctx context.Context, p Principal, id string) (store.Sandbox, error) {
	return x.s.getOwned(ctx, p, id)
}

func (x sandboxes) Running(ctx context.Context, p Principal, id string) error {
	_, _, err := x.s.runningSandbox(ctx, p, id)
	return err
}

func (x sandboxes) Use(ctx context.Context, id string) (func(), error) {
	return x.s.use(ctx, id)
}

func (x sandboxes) Hold(id string) func() { return x.s.idle.Hold(id) }

func (x sandboxes) Live(id string) (context.Context, bool) {
	lv := x.s.getLive(id)
	if lv == nil {
		return nil, false
	}
	return lv.ctx, true
}

func (x sandboxes) VM(id string) (sessions.VM, context.Context, error) {
	lv := x.s.getLive(id)
	if lv == nil {
		return nil, nil, fmt.Errorf("sandbox %s has no running VM: %w", id, errdefs.ErrConflict)
	}
	box, vmCtx, err := lv.vm()
	if err != nil {
		return nil, nil, err
	}
	return box, vmCtx, nil
}
