package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// NodeConfig makes a service a cluster node's (airlock node).
type NodeConfig struct {
	// Node, if set, makes this the service of a cluster node of that
	// name: it runs only the sandboxes the cluster binds to it, which
	// other servers admit and it takes up with Realize; recovery and
	// leases touch only sandboxes recorded on this node, and it admits no
	// creates of its own.
	Node string
	// FetchTemplate gets a template image the node lacks, by digest, from
	// the cluster (cluster.TemplateFetcher), so that a sandbox of any
	// ready template can be made on any node.
	FetchTemplate func(ctx context.Context, digest string) (template.Template, error)
}

// nodeRole is a cluster node's: it runs the sandboxes the cluster binds
// to it, and only those.
type nodeRole struct {
	cfg NodeConfig
}

func (r *nodeRole) mayCreate() error {
	return fmt.Errorf("node %s runs the sandboxes the cluster places on it: create sandboxes through the cluster's API: %w", r.cfg.Node, errdefs.ErrPermission)
}

// admit is not reached: mayCreate refuses first.
func (r *nodeRole) admit(context.Context, *Service, newSandbox) (apiv1.SandboxOperation, error) {
	return apiv1.SandboxOperation{}, r.mayCreate()
}

func (*nodeRole) holdsVMs() bool { return true }
func (r *nodeRole) node() string { return r.cfg.Node }

// reaches: a node answers for its own sandboxes only: another's VM is
// not here to act on.
func (r *nodeRole) reaches(ctx context.Context, st *store.Store, id string) error {
	node, err := st.SandboxNode(ctx, id)
	if err != nil {
		return err
	}
	if node != r.cfg.Node {
		return fmt.Errorf("sandbox %s is not on node %s (it is on %q): %w", id, r.cfg.Node, node, errdefs.ErrNotFound)
	}
	return nil
}

func (*nodeRole) markUnavailable(context.Context, *store.Store, []apiv1.Sandbox) error { return nil }

func (*nodeRole) claimDelete(context.Context, *store.Store, string) error { return nil }

func (*nodeRole) deleteBegun(context.Context, *Service, string, string) {}

// realize makes the sandbox's VM (Service.Realize): the node claims the
// row first, so that of two nodes given the same sandbox one makes it.
func (r *nodeRole) realize(ctx context.Context, s *Service, id string) error {
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
		return fmt.Errorf("sandbox %s is %s with no VM on node %s, and only a creating sandbox is made: %w", id, sb.State, r.cfg.Node, errdefs.ErrPrecondition)
	}
	op, err := s.pendingCreate(ctx, id)
	if err != nil {
		return err
	}
	node, err := s.st.ClaimSandboxNode(ctx, id, r.cfg.Node)
	if err != nil {
		return err
	}
	if node != r.cfg.Node {
		return fmt.Errorf("sandbox %s is node %s's, not %s's: %w", id, node, r.cfg.Node, errdefs.ErrConflict)
	}
	// The admitting replica pinned the template by digest.
	pol := storedPolicy(sb)
	defer s.catalogue.HoldImages()()
	want := sandbox.Spec{Template: sb.TemplateDigest, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: &pol}
	spec, tpl, err := s.rt.Resolve(want)
	if errors.Is(err, errdefs.ErrNotFound) && r.cfg.FetchTemplate != nil {
		return r.realizeFetched(s, id, sb, op, want)
	}
	if err != nil {
		return s.failCreate(sb, op, fmt.Errorf("node %s cannot make template %s (%s): %w", r.cfg.Node, sb.TemplateRef, sb.TemplateDigest, err))
	}
	cctx, c, err := s.admitCreate(id, int64(sb.MemoryMiB))
	if errors.Is(err, errMaking) {
		return nil // a call beside this one got there first
	}
	if err != nil {
		// The host is past a cap kube-scheduler does not see (sandboxes
		// making VMs, free disk): the create fails as it would on one host.
		return s.failCreate(sb, op, fmt.Errorf("node %s: %w", r.cfg.Node, err))
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
// cluster (NodeConfig.FetchTemplate) and goes on as realize does. The
// fetched image is not reclaimed meanwhile: the sandbox's row names it.
// A fetch that fails fails the create with the reason.
func (r *nodeRole) realizeFetched(s *Service, id string, sb store.Sandbox, op store.Operation, want sandbox.Spec) error {
	cctx, c, err := s.admitCreate(id, int64(sb.MemoryMiB))
	if errors.Is(err, errMaking) {
		return nil
	}
	if err != nil {
		return s.failCreate(sb, op, fmt.Errorf("node %s: %w", r.cfg.Node, err))
	}
	s.log.Info("template not on this node: fetching it", "sandbox", id, "template", sb.TemplateDigest)
	go func() {
		spec, err := r.fetchAndResolve(cctx, s, sb, want)
		if err != nil {
			s.unadmit(id, c)
			// Recorded on the sandbox and its operation; the request
			// that asked has been answered already.
			_ = s.failCreate(sb, op, fmt.Errorf("node %s cannot make template %s (%s): %w", r.cfg.Node, sb.TemplateRef, sb.TemplateDigest, err))
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
func (r *nodeRole) fetchAndResolve(ctx context.Context, s *Service, sb store.Sandbox, want sandbox.Spec) (sandbox.Spec, error) {
	if _, err := r.cfg.FetchTemplate(ctx, sb.TemplateDigest); err != nil {
		return sandbox.Spec{}, err
	}
	defer s.catalogue.HoldImages()()
	spec, tpl, err := s.rt.Resolve(want)
	if err == nil {
		s.log.Info("realizing sandbox", "sandbox", sb.ID, "template", tpl.Ref())
	}
	return spec, err
}
