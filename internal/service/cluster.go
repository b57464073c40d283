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

// Realize makes the VM of a sandbox that the cluster bound to this node:
// its row, admitted by another server, is creating with its create
// operation pending. The node claims the row first, so that of two nodes
// given the same sandbox one makes it. A sandbox this node already runs
// or is making is left as it is: Realize may be called again for it, as
// when its Pod is made anew after an eviction. A sandbox that has ended
// (deleted, failed) has nothing to make, and its Pod goes with the next
// pass of the controller. It returns once the create is under way; the
// operation records how it ends.
func (s *Service) Realize(ctx context.Context, id string) error {
	if s.cfg.Node == "" {
		return fmt.Errorf("sandbox %s: only a cluster node's service realizes sandboxes: %w", id, errdefs.ErrPrecondition)
	}
	if s.holds(id) {
		return nil
	}
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State == apiv1.StateDeleted || sb.State == apiv1.StateFailed {
		return nil
	}
	if sb.State != apiv1.StateCreating {
		return fmt.Errorf("sandbox %s is %s with no VM on node %s, and only a creating sandbox is made: %w", id, sb.State, s.cfg.Node, errdefs.ErrPrecondition)
	}
	op, err := s.pendingCreate(ctx, id)
	if err != nil {
		return err
	}
	node, err := s.st.ClaimSandboxNode(ctx, id, s.cfg.Node)
	if err != nil {
		return err
	}
	if node != s.cfg.Node {
		return fmt.Errorf("sandbox %s is node %s's, not %s's: %w", id, node, s.cfg.Node, errdefs.ErrConflict)
	}
	// The admitting replica pinned the template by digest.
	pol := storedPolicy(sb)
	defer s.catalogue.HoldImages()()
	want := sandbox.Spec{Template: sb.TemplateDigest, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: &pol}
	spec, tpl, err := s.rt.Resolve(want)
	if errors.Is(err, errdefs.ErrNotFound) && s.cfg.FetchTemplate != nil {
		return s.realizeFetched(id, sb, op, want)
	}
	if err != nil {
		return s.failCreate(sb, op, fmt.Errorf("node %s cannot make template %s (%s): %w", s.cfg.Node, sb.TemplateRef, sb.TemplateDigest, err))
	}
	cctx, c, err := s.admitCreate(id, int64(sb.MemoryMiB))
	if errors.Is(err, errMaking) {
		return nil // a call beside this one got there first
	}
	if err != nil {
		// The host is past a cap kube-scheduler does not see (sandboxes
		// making VMs, free disk): the create fails as it would on one host.
		return s.failCreate(sb, op, fmt.Errorf("node %s: %w", s.cfg.Node, err))
	}
	s.countState("", sb.State)
	s.m.opStarted(op.Kind)
	go s.runCreate(cctx, c, sb, op, spec)
	s.log.Info("realizing sandbox", "sandbox", id, "operation", op.ID, "template", tpl.Ref())
	return nil
}

// realizeFetched makes a sandbox whose template image this node lacks:
// it takes the sandbox's place among the creates, then, apart from the
// Pod's worker (an image may take minutes), fetches the image from the
// cluster (Config.FetchTemplate) and goes on as Realize does. The
// fetched image is not reclaimed meanwhile: the sandbox's row names it.
// A fetch that fails fails the create with the reason.
func (s *Service) realizeFetched(id string, sb store.Sandbox, op store.Operation, want sandbox.Spec) error {
	cctx, c, err := s.admitCreate(id, int64(sb.MemoryMiB))
	if errors.Is(err, errMaking) {
		return nil
	}
	if err != nil {
		return s.failCreate(sb, op, fmt.Errorf("node %s: %w", s.cfg.Node, err))
	}
	s.log.Info("template not on this node: fetching it", "sandbox", id, "template", sb.TemplateDigest)
	go func() {
		spec, err := s.fetchAndResolve(cctx, sb, want)
		if err != nil {
			s.unadmit(id, c)
			// Recorded on the sandbox and its operation; the request
			// that asked has been answered already.
			_ = s.failCreate(sb, op, fmt.Errorf("node %s cannot make template %s (%s): %w", s.cfg.Node, sb.TemplateRef, sb.TemplateDigest, err))
			close(c.done)
			return
		}
		s.countState("", sb.State)
		s.m.opStarted(op.Kind)
		s.runCreate(cctx, c, sb, op, spec)
	}()
	return nil
}

// fetchAndResolve fetches the sandbox's template image and resolves the
// sandbox's spec with it.
func (s *Service) fetchAndResolve(ctx context.Context, sb store.Sandbox, want sandbox.Spec) (sandbox.Spec, error) {
	if _, err := s.cfg.FetchTemplate(ctx, sb.TemplateDigest); err != nil {
		return sandbox.Spec{}, err
	}
	defer s.catalogue.HoldImages()()
	spec, tpl, err := s.rt.Resolve(want)
	if err == nil {
		s.log.Info("realizing sandbox", "sandbox", sb.ID, "template", tpl.Ref())
	}
	return spec, err
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

// admitToCluster records a create on an API replica: the row and its
// pending operation, which the controller makes a Pod of and a node
// realizes. The caps of each host are the nodes' to check.
func (s *Service) admitToCluster(ctx context.Context, sb store.Sandbox, op store.Operation, admit func(store.Usage) error) (apiv1.SandboxOperation, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return apiv1.SandboxOperation{}, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	if err := s.st.InsertSandboxWithin(ctx, sb, op, admit); err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			return apiv1.SandboxOperation{}, err
		}
		return apiv1.SandboxOperation{}, fmt.Errorf("record sandbox: %w", err)
	}
	s.m.opStarted(op.Kind)
	if s.cfg.Admitted != nil {
		s.cfg.Admitted()
	}
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
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

// endUnplacedCreate fails the pending create of a sandbox deleted before
// any node took it up, as a single host fails a create its delete cut.
func (s *Service) endUnplacedCreate(ctx context.Context, id string) {
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
