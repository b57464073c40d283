package service

import (
	"context"
	"encoding/json"
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

	insert := func(state string, pid int, req apiv1.CommandRequest) string {
		raw, _ := json.Marshal(req)
		c := store.Command{ID: ids.New("cmd"), SandboxID: sb.ID, Owner: owner.KeyID, Request: raw, State: state, PID: pid, TokenHash: []byte{1}}
		if err := st.InsertCommand(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	running := insert(apiv1.CommandRunning, 42, apiv1.CommandRequest{Argv: []string{"sleep", "9"}, Stdin: true})
	insert(apiv1.CommandExited, 43, apiv1.CommandRequest{Cmd: "true"})
	insert(apiv1.CommandCreated, 0, apiv1.CommandRequest{Cmd: "true"})

	if err := s.SetCommandNote(ctx, owner, running, []byte(`{"tag":"t"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommandNote(ctx, other, running, []byte(`{}`)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another key set a note: %v", err)
	}
	if err := s.SetCommandNote(ctx, owner, running, make([]byte, MaxCommandNote+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("an oversized note: %v", err)
	}
	rcs, err := s.RunningCommands(ctx, owner, sb.ID)
	if err != nil || len(rcs) != 1 {
		t.Fatalf("running commands %+v %v", rcs, err)
	}
	rc := rcs[0]
	if rc.ID != running || rc.PID == nil || *rc.PID != 42 || string(rc.Note) != `{"tag":"t"}` || !rc.Request.Stdin || rc.Request.Argv[0] != "sleep" {
		t.Fatalf("running command %+v", rc)
	}
	if _, err := s.RunningCommands(ctx, other, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another key listed commands: %v", err)
	}
	if _, err := s.AttachNow(ctx, owner, running); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("attach to a command of a sandbox without VM: %v", err)
	}
}

// StartCommand refuses before it records anything: a note over the bound,
// a sandbox without a running VM on this server.
func TestStartCommandRefusals(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(filepath.Join(dir.Root, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s := &Service{role: localRole{}, st: st, cfg: Config{Dir: dir}}
	owner := Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
	sb := store.Sandbox{ID: ids.New("sbx"), Owner: owner.KeyID, State: apiv1.StateRunning, TemplateRef: "tiny:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
	}
	req := apiv1.CommandRequest{Argv: []string{"true"}}
	tests := []struct {
		name string
		note []byte
		want error
	}{
		{"note over the bound", make([]byte, MaxCommandNote+1), errdefs.ErrInvalid},
		{"no VM on this server", []byte(`{}`), errdefs.ErrConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := s.StartCommand(ctx, owner, sb.ID, req, tt.note); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			rows, err := st.ListCommands(ctx, sb.ID, "", 10)
			if err != nil || len(rows) != 0 {
				t.Fatalf("commands recorded: %v %v", rows, err)
			}
		})
	}
}
