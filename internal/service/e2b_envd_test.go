package service

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
)

func TestEnvdAccessors(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(filepath.Join(dir.Root, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s := &Service{role: localRole{}, st: st, cfg: Config{Dir: dir}}
	owner := Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
	other := Principal{KeyID: "keyother", Role: apiv1.RoleUser}

	sb := store.Sandbox{ID: ids.New("sbx"), Owner: owner.KeyID, State: apiv1.StateRunning, TemplateRef: "tiny:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{"K": "v"}, Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
	}
	env, err := s.SandboxEnv(ctx, owner, sb.ID)
	if err != nil || env["K"] != "v" {
		t.Fatalf("env %v %v", env, err)
	}
	if _, err := s.SandboxEnv(ctx, other, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another key read the env: %v", err)
	}
}
