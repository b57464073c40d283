package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// FrontConfig makes a service a cluster's API replica's (airlock serve
// --cluster kubernetes).
type FrontConfig struct {
	// Front, if set, makes this the service of a cluster's API replica:
	// it runs no VM. A create is recorded for the cluster to place and a
	// node to make, and Admitted is told of it; the calls on a sandbox
	// that a node runs are routed to that node before they reach the
	// service (internal/api's Forward). It recovers nothing at start and
	// leaves leases to the nodes.
	Front bool
	// Admitted is called after the service records a sandbox.
	Admitted func()
	// NodeDown says why a node cannot be reached now ("" when it can); a
	// sandbox on such a node is shown with Unavailable set to the reason.
	NodeDown func(node string) string
	// Unplaced says why a sandbox no node has taken up waits ("" when it
	// does not, as far as it knows); the sandbox is shown with
	// Unavailable set to the reason.
	Unplaced func(ctx context.Context, id string) string
}

// frontRole is a cluster API replica's: it records creates for the
// cluster to place, and the nodes run the VMs.
type frontRole struct {
	cfg FrontConfig
}

func (*frontRole) mayCreate() error { return nil }

// admit records the sandbox and its pending operation, which the
// controller makes a Pod of and a node realizes. The caps of each host
// are the nodes' to check.
func (r *frontRole) admit(ctx context.Context, s *Service, c newSandbox) (apiv1.SandboxOperation, error) {
	sb, op := c.sb, c.op
	// The node that makes the VM may fetch the image from a peer: it
	// checks the peer's settings against these.
	settings, err := json.Marshal(c.tpl.Settings())
	if err == nil {
		err = s.st.PutTemplateSettings(ctx, c.tpl.Digest, settings)
	}
	if err != nil {
		return apiv1.SandboxOperation{}, fmt.Errorf("record the template's settings: %w", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return apiv1.SandboxOperation{}, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	if err := s.st.InsertSandboxWithin(ctx, sb, op, c.admit); err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			return apiv1.SandboxOperation{}, err
		}
		return apiv1.SandboxOperation{}, fmt.Errorf("record sandbox: %w", err)
	}
	s.m.opStarted(op.Kind)
	if r.cfg.Admitted != nil {
		r.cfg.Admitted()
	}
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

func (*frontRole) realize(_ context.Context, _ *Service, id string) error { return notNode(id) }

func (*frontRole) holdsVMs() bool { return false }
func (*frontRole) node() string   { return "" }

// reaches: the calls on a sandbox a node runs are routed to the node
// before they reach the service; the rest are the replica's.
func (*frontRole) reaches(context.Context, *store.Store, string) error { return nil }

// markUnavailable marks the sandboxes whose node is down, and those being
// created that no node can take up.
func (r *frontRole) markUnavailable(ctx context.Context, st *store.Store, vs []apiv1.Sandbox) error {
	nodes := map[string]string{}
	if len(vs) == 1 {
		node, err := st.SandboxNode(ctx, vs[0].ID)
		if err != nil {
			return err
		}
		nodes[vs[0].ID] = node
	} else if len(vs) > 1 {
		ids := make([]string, 0, len(vs))
		for _, v := range vs {
			ids = append(ids, v.ID)
		}
		var err error
		if nodes, err = st.NodesOf(ctx, ids); err != nil {
			return err
		}
	}
	for i := range vs {
		r.mark(ctx, &vs[i], nodes[vs[i].ID])
	}
	return nil
}

// mark sets v.Unavailable if node, which runs the sandbox, is down, or
// if no node can take up the sandbox being created.
func (r *frontRole) mark(ctx context.Context, v *apiv1.Sandbox, node string) {
	if node == "" && v.State == apiv1.StateCreating && r.cfg.Unplaced != nil {
		if why := r.cfg.Unplaced(ctx, v.ID); why != "" {
			v.Unavailable = &apiv1.Status{Code: apiv1.CodeResourceExhausted, Message: why}
		}
		return
	}
	if node == "" || node == store.ReplicaClaim || r.cfg.NodeDown == nil || v.State == apiv1.StateDeleted || v.State == apiv1.StateFailed {
		return
	}
	if why := r.cfg.NodeDown(node); why != "" {
		v.Unavailable = &apiv1.Status{Code: apiv1.CodeUnavailable, Message: why}
	}
}

// claimDelete: no node had the sandbox when the call was routed here; one
// may take it up meanwhile. The claim settles which: after it, none can.
func (*frontRole) claimDelete(ctx context.Context, st *store.Store, id string) error {
	node, err := st.ClaimSandboxNode(ctx, id, store.ReplicaClaim)
	if err != nil {
		return err
	}
	if node != store.ReplicaClaim {
		return fmt.Errorf("sandbox %s was just taken up by node %s: retry, and the delete goes there: %w", id, node, errdefs.ErrUnavailable)
	}
	return nil
}

// deleteBegun fails the pending create of a sandbox deleted before any
// node took it up, as a single host fails a create its delete cut.
func (*frontRole) deleteBegun(ctx context.Context, s *Service, id, from string) {
	if from != apiv1.StateCreating {
		return
	}
	op, err := s.pendingCreate(ctx, id)
	if err != nil {
		return // none pending
	}
	now := s.now()
	op.Status, op.FinishedAt = apiv1.OpFailed, &now
	op.Error = &store.Error{Code: apiv1.CodeConflict, Message: "the sandbox was deleted while it was being created"}
	if err := s.st.UpdateOperation(ctx, op); err != nil {
		s.log.Warn("fail the create of a deleted sandbox", "sandbox", id, "err", err)
	}
}
