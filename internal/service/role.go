package service

import (
	"context"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// A role is the part a service plays: a single host's (localRole), a
// cluster's API replica's (frontRole) or a cluster node's (nodeRole). New
// chooses it once from Config (NodeConfig, FrontConfig); each method
// answers a question the service asks where the three differ. Those
// given the service may read and change its state, as its own methods
// do.
type role interface {
	// mayCreate says whether this server takes creates of its own: nil,
	// or the error that refuses one, asked before anything else is.
	mayCreate() error
	// admit records a new sandbox and its create operation, both checked
	// already, and sets the making of its VM going: here, or by the
	// cluster. It answers the create.
	admit(ctx context.Context, s *Service, c newSandbox) (apiv1.SandboxOperation, error)
	// realize makes the VM of a sandbox the cluster bound to this server
	// (Service.Realize).
	realize(ctx context.Context, s *Service, id string) error
	// holdsVMs says whether this server runs sandboxes' VMs: whether New
	// recovers what an earlier server left and keeps leases and pools,
	// and whether an operation ends in this process, to be waited for
	// here, rather than on another server.
	holdsVMs() bool
	// node is the cluster node whose sandboxes this server runs, "" for
	// every sandbox of its store: recovery and leases touch only those.
	node() string
	// reaches says whether calls on sandbox id are this server's to
	// answer: nil, or an error wrapping errdefs.ErrNotFound.
	reaches(ctx context.Context, st *store.Store, id string) error
	// markUnavailable sets Unavailable on the views of sandboxes this
	// server knows cannot be reached now, with the reason.
	markUnavailable(ctx context.Context, st *store.Store, vs []apiv1.Sandbox) error
	// claimDelete settles that this server carries out the delete of
	// sandbox id, which no other has taken up: nil, or why it may not.
	// It is called under the service's lock, before the delete is
	// recorded.
	claimDelete(ctx context.Context, st *store.Store, id string) error
	// deleteBegun is told that the delete of sandbox id, which was in
	// state from, has been recorded.
	deleteBegun(ctx context.Context, s *Service, id, from string)
}

// newSandbox is a create that CreateSandbox has checked and resolved:
// what a role's admit records and makes.
type newSandbox struct {
	sb    store.Sandbox
	op    store.Operation
	spec  sandbox.Spec      // resolved, the template pinned by digest
	tpl   template.Template // the template the sandbox is made of
	admit func(store.Usage) error
}

// newRole is the role cfg describes (Validate allows one at most).
func newRole(cfg Config) role {
	switch {
	case cfg.Node != "":
		return &nodeRole{cfg: cfg.NodeConfig}
	case cfg.Front:
		return &frontRole{cfg: cfg.FrontConfig}
	default:
		return localRole{}
	}
}
