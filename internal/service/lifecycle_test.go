package service

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
)

// A client that saw an operation finish may ask for the next at once: an
// operation that is recording its end makes the next wait for it, not
// refuse it, while one still running is refused.
func TestNextOpWaitsForTheEnd(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(filepath.Join(dir.Root, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := New(ctx, Config{Dir: dir, Runtime: RuntimeOf(sandboxtest.New(t, dir)), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	sb := store.Sandbox{ID: "sbxnext", Owner: "keyadmin", State: apiv1.StateRunning, TemplateRef: "tiny:latest", TemplateDigest: "sha256:00",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", CreatedAt: now, UpdatedAt: now}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: "opmade", Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: "keyadmin",
		Status: apiv1.OpSucceeded, CreatedAt: now, FinishedAt: &now}); err != nil {
		t.Fatal(err)
	}
	admin := Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}

	got, pause, f, from, err := s.beginOp(ctx, admin, sb.ID, apiv1.OpPause, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, err := s.beginOp(ctx, admin, sb.ID, apiv1.OpWake, ""); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a wake while the pause runs: %v, want a conflict", err)
	}
	// The pause records its end: a wake now waits for it (here until its
	// context ends) instead of answering a conflict.
	s.mu.Lock()
	f.ending = true
	s.mu.Unlock()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, _, _, _, err := s.beginOp(short, admin, sb.ID, apiv1.OpWake, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wake while the pause records its end: %v, want it to wait", err)
	}
	got.State = apiv1.StatePaused
	s.endOp(f, got, from, pause, nil, 0)
	_, wake, wf, wfrom, err := s.beginOp(ctx, admin, sb.ID, apiv1.OpWake, "")
	if err != nil {
		t.Fatalf("a wake once the pause ended: %v", err)
	}
	got.State = apiv1.StateRunning
	s.endOp(wf, got, wfrom, wake, nil, 0)
}
