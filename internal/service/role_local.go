package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// localRole is a single host's: it takes creates and runs every sandbox
// of its store, each VM on this host.
type localRole struct{}

func (localRole) mayCreate() error { return nil }

// admit checks the host's caps, records the sandbox (desired state
// first: the rows exist before any work starts) and boots it in the
// background.
func (localRole) admit(ctx context.Context, s *Service, c newSandbox) (apiv1.SandboxOperation, error) {
	sb, op := c.sb, c.op
	cctx, cr, err := s.admitCreate(sb.ID, int64(sb.MemoryMiB))
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if err := s.st.InsertSandboxWithin(ctx, sb, op, c.admit); err != nil {
		s.unadmit(sb.ID, cr)
		var le *LimitError
		if errors.As(err, &le) {
			return apiv1.SandboxOperation{}, err
		}
		return apiv1.SandboxOperation{}, fmt.Errorf("record sandbox: %w", err)
	}
	s.countState("", sb.State)
	s.m.opStarted(op.Kind)
	go s.runCreate(cctx, cr, sb, op, c.spec)
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

func (localRole) realize(_ context.Context, _ *Service, id string) error { return notNode(id) }

// notNode refuses a Realize on a server that is no cluster node.
func notNode(id string) error {
	return fmt.Errorf("sandbox %s: only a cluster node's service realizes sandboxes: %w", id, errdefs.ErrPrecondition)
}

func (localRole) holdsVMs() bool { return true }
func (localRole) node() string   { return "" }

func (localRole) reaches(context.Context, *store.Store, string) error { return nil }

func (localRole) markUnavailable(context.Context, *store.Store, []apiv1.Sandbox) error { return nil }

func (localRole) claimDelete(context.Context, *store.Store, string) error { return nil }

func (localRole) deleteBegun(context.Context, *Service, string, string) {}
