package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

func TestSandboxOwner(t *testing.T) {
	ctx := context.Background()
	s := keyService(t)
	now := time.Now().UTC()
	for _, sb := range []store.Sandbox{
		{ID: "sbxowned", Owner: "keyalice", State: apiv1.StateSuspended},
		{ID: "sbxgone", Owner: "keyalice", State: apiv1.StateDeleted},
	} {
		sb.TemplateRef, sb.OnTimeout, sb.CreatedAt = "base:latest", "delete", now
		op := store.Operation{ID: "op" + sb.ID[3:], Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: sb.Owner,
			Status: apiv1.OpSucceeded, CreatedAt: now}
		if err := s.st.InsertSandbox(ctx, sb, op); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.SandboxOwner(ctx, "sbxowned")
	if err != nil || p.KeyID != "keyalice" || p.Admin() {
		t.Fatalf("owner: %+v %v", p, err)
	}
	// The principal sees its own sandbox, and only as its owner would.
	if sb, err := s.getOwned(ctx, p, "sbxowned"); err != nil || sb.ID != "sbxowned" {
		t.Errorf("the owner's principal does not see its sandbox: %v", err)
	}
	for _, id := range []string{"sbxgone", "sbxnothere", "SBX", "keyalice", ""} {
		if _, err := s.SandboxOwner(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%q: %v, want not found", id, err)
		}
	}
}
