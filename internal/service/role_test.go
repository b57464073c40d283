package service

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
)

// cluster is a front (an API replica) and a node over one store and one
// data directory, each with its own fake runtime, as a cluster's servers
// share its database and, here, its template images.
type cluster struct {
	front    *fixture
	node     *Service
	nodeRT   *sandboxtest.Runtime
	admitted atomic.Int32
	down     string // what the front's NodeDown says of every node
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{}
	c.front = newFixtureWith(t, func(cfg *Config) {
		cfg.FrontConfig = FrontConfig{Front: true, Admitted: func() { c.admitted.Add(1) },
			NodeDown: func(string) string { return c.down }}
	})
	c.nodeRT = sandboxtest.New(t, c.front.dir)
	c.node = c.startNode(t, "node-a")
	return c
}

// startNode starts the service of node name over the cluster's store.
func (c *cluster) startNode(t *testing.T, name string) *Service {
	t.Helper()
	s, err := New(context.Background(), Config{Dir: c.front.dir, Runtime: RuntimeOf(c.nodeRT), Store: c.front.st,
		Clock: c.front.clock, ShutdownGrace: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		NodeConfig: NodeConfig{Node: name}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestRoles drives each role through the service: what a single host, a
// cluster's API replica and a cluster node each do where they differ.
func TestRoles(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *cluster)
	}{
		{"a node refuses a create", func(t *testing.T, c *cluster) {
			_, err := c.node.CreateSandbox(ctx, c.front.admin, apiv1.CreateSandbox{Template: "base"})
			if !errors.Is(err, errdefs.ErrPermission) {
				t.Fatalf("a create on a node: %v, want a permission error", err)
			}
			if n := c.nodeRT.Calls(sandboxtest.StepCreate); n != 0 {
				t.Fatalf("the node made %d VMs", n)
			}
		}},
		{"a front records a create and boots nothing", func(t *testing.T, c *cluster) {
			so := c.front.create(t, apiv1.CreateSandbox{})
			if so.Sandbox.State != apiv1.StateCreating || so.Operation.Status != apiv1.OpPending {
				t.Fatalf("the create answered %s, %s", so.Sandbox.State, so.Operation.Status)
			}
			if n := c.admitted.Load(); n != 1 {
				t.Fatalf("Admitted was called %d times", n)
			}
			if n := c.front.rt.Calls(sandboxtest.StepCreate) + c.nodeRT.Calls(sandboxtest.StepCreate); n != 0 {
				t.Fatalf("%d VMs were made", n)
			}
			// Its end is on another server: a wait reads the row.
			op, err := c.front.s.GetOperation(ctx, c.front.admin, so.Operation.ID, 300*time.Millisecond)
			if err != nil || op.Status != apiv1.OpPending {
				t.Fatalf("the create's operation: %s, %v", op.Status, err)
			}
		}},
		{"a node realizes what a front recorded", func(t *testing.T, c *cluster) {
			so := c.front.create(t, apiv1.CreateSandbox{})
			if err := c.node.Realize(ctx, so.Sandbox.ID); err != nil {
				t.Fatal(err)
			}
			if op := c.front.wait(t, so.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("the create ended %s %+v", op.Status, op.Error)
			}
			if g := c.nodeRT.State(so.Sandbox.ID); g != sandboxtest.Running {
				t.Fatalf("the node's guest is %q", g)
			}
			// A second node cannot take it, nor see it.
			other := c.startNode(t, "node-b")
			if err := other.Realize(ctx, so.Sandbox.ID); err == nil {
				t.Fatal("a second node realized a running sandbox")
			}
			if _, err := other.GetSandbox(ctx, c.front.admin, so.Sandbox.ID); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("another node's sandbox from node-b: %v, want not found", err)
			}
			if sb, err := c.node.GetSandbox(ctx, c.front.admin, so.Sandbox.ID); err != nil || sb.State != apiv1.StateRunning {
				t.Fatalf("the sandbox from its node: %s, %v", sb.State, err)
			}
		}},
		{"only a node realizes", func(t *testing.T, c *cluster) {
			so := c.front.create(t, apiv1.CreateSandbox{})
			if err := c.front.s.Realize(ctx, so.Sandbox.ID); !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("a front realized: %v", err)
			}
			local := newFixture(t)
			if err := local.s.Realize(ctx, so.Sandbox.ID); !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("a single host realized: %v", err)
			}
		}},
		{"a front shows a sandbox on a node that is down", func(t *testing.T, c *cluster) {
			so := c.front.create(t, apiv1.CreateSandbox{})
			if err := c.node.Realize(ctx, so.Sandbox.ID); err != nil {
				t.Fatal(err)
			}
			c.front.wait(t, so.Operation.ID)
			c.down = "node-a stopped answering"
			sb := c.front.state(t, so.Sandbox.ID)
			if sb.Unavailable == nil || sb.Unavailable.Code != apiv1.CodeUnavailable || sb.Unavailable.Message != c.down {
				t.Fatalf("get: unavailable %+v", sb.Unavailable)
			}
			list, err := c.front.s.ListSandboxes(ctx, c.front.admin, SandboxFilter{})
			if err != nil || len(list.Items) != 1 || list.Items[0].Unavailable == nil {
				t.Fatalf("list: %+v, %v", list.Items, err)
			}
			// The node shows no such thing of its own sandboxes.
			if sb, err := c.node.GetSandbox(ctx, c.front.admin, so.Sandbox.ID); err != nil || sb.Unavailable != nil {
				t.Fatalf("from the node: %+v, %v", sb.Unavailable, err)
			}
		}},
		{"a front's delete of an unplaced sandbox ends its create", func(t *testing.T, c *cluster) {
			so := c.front.create(t, apiv1.CreateSandbox{})
			del, err := c.front.s.DeleteSandbox(ctx, c.front.admin, so.Sandbox.ID)
			if err != nil {
				t.Fatal(err)
			}
			if op := c.front.wait(t, del.Operation.ID); op.Status != apiv1.OpSucceeded {
				t.Fatalf("the delete ended %s %+v", op.Status, op.Error)
			}
			op := c.front.wait(t, so.Operation.ID)
			if op.Status != apiv1.OpFailed || op.Error == nil || op.Error.Code != apiv1.CodeConflict {
				t.Fatalf("the create ended %s %+v, want a conflict", op.Status, op.Error)
			}
			// No node may take it up now.
			if node, err := c.front.st.SandboxNode(ctx, so.Sandbox.ID); err != nil || node != store.ReplicaClaim {
				t.Fatalf("the sandbox's node: %q, %v", node, err)
			}
		}},
		{"recovery and leases on a node touch only its sandboxes", func(t *testing.T, c *cluster) {
			lease := 60
			mine := c.front.create(t, apiv1.CreateSandbox{TimeoutS: &lease})
			if err := c.node.Realize(ctx, mine.Sandbox.ID); err != nil {
				t.Fatal(err)
			}
			c.front.wait(t, mine.Operation.ID)
			// Another node's running sandbox, whose VM is not on this
			// host: a recovery that touched it would fail it.
			theirs := c.front.create(t, apiv1.CreateSandbox{TimeoutS: &lease})
			sb, err := c.front.st.GetSandbox(ctx, theirs.Sandbox.ID)
			if err != nil {
				t.Fatal(err)
			}
			sb.State = apiv1.StateRunning
			if err := c.front.st.UpdateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if err := c.front.st.SetSandboxNode(ctx, sb.ID, "node-b"); err != nil {
				t.Fatal(err)
			}
			c.node.Close()
			c.node = c.startNode(t, "node-a")
			if sb := c.front.state(t, mine.Sandbox.ID); sb.State != apiv1.StateRunning {
				t.Fatalf("node-a's sandbox after its restart: %s", sb.State)
			}
			if sb := c.front.state(t, theirs.Sandbox.ID); sb.State != apiv1.StateRunning {
				t.Fatalf("node-b's sandbox after node-a's restart: %s (%+v)", sb.State, sb.LastError)
			}
			// Both leases end: node-a deletes its own and leaves node-b's.
			c.front.clock.Advance(2 * time.Minute)
			c.front.waitState(t, mine.Sandbox.ID, apiv1.StateDeleted)
			if sb := c.front.state(t, theirs.Sandbox.ID); sb.State != apiv1.StateRunning {
				t.Fatalf("node-b's sandbox after its lease ended on node-a: %s", sb.State)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newCluster(t)) })
	}
}
