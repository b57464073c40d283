package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// What envd asks of commands: notes, the running commands with their
// requests, an attach from the present; only the owner's.
func TestEnvdAccessors(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	st, s := f.st, f.c
	owner := tenancy.Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
	other := tenancy.Principal{KeyID: "keyother", Role: apiv1.RoleUser}

	sb := store.Sandbox{ID: ids.New("sbx"), Owner: owner.KeyID, State: apiv1.StateRunning, TemplateRef: "tiny:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{"K": "v"}, Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
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
	f := newFixture(t)
	st, s := f.st, f.c
	owner := tenancy.Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
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

// A command's note and log live under its sandbox's directory, named by
// the sandbox and command IDs. IDs that climb out of it, carry a NUL or
// run long are refused and leave no file anywhere: not with a caller's
// IDs that name nothing, and not even with a sandbox row whose ID is
// hostile and that the sandboxes call running.
func TestNotePathsStayInside(t *testing.T) {
	ctx := context.Background()
	outer := t.TempDir()
	f := newFixture(t)
	f.dir.Root = outer + "/data" // unused by the fixture's store; the paths below are what count
	f.c.cfg.Dir = f.dir
	owner := tenancy.Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
	rt := sandboxtest.New(t, f.dir)
	if _, err := rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	spec, _, err := rt.Resolve(sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Destroy(ctx) })
	before := filesUnder(t, outer)

	hostile := []string{
		"sbx/../../escape", "sbx/../../../escape", "sbx\x00x", "../x", "sbx" + strings.Repeat("a", 5000),
		"sbx/..", "/etc/passwd", "",
	}
	req := apiv1.CommandRequest{Argv: []string{"true"}}
	for _, id := range hostile {
		if _, _, err := f.c.StartCommand(ctx, owner, id, req, []byte(`{"tag":"x"}`)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("StartCommand in %.40q: %v, want not found", id, err)
		}
		if err := f.c.SetCommandNote(ctx, owner, id, []byte(`{}`)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("SetCommandNote on %.40q: %v, want not found", id, err)
		}
		// A row with this ID, running here, with a VM.
		sb := store.Sandbox{ID: id, Owner: owner.KeyID, State: apiv1.StateRunning, TemplateRef: "base:latest",
			VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Metadata: map[string]string{}}
		if err := f.st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: id, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
			continue // the store refused it: nothing to look after
		}
		f.sb.look(id, vm)
		if _, _, err := f.c.StartCommand(ctx, owner, id, req, []byte(`{"tag":"x"}`)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("StartCommand in stored %.40q: %v, want not found", id, err)
		}
		f.sb.let(id)
	}
	if after := filesUnder(t, outer); !slices.Equal(before, after) {
		t.Fatalf("files made by refused calls:\nbefore %q\nafter  %q", before, after)
	}
}

// filesUnder lists the paths under root.
func filesUnder(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
