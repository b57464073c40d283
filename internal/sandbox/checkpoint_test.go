package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// writeJSON writes v as JSON to path, making its directory.
func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A template snapshot's disk layer that only a checkpoint's chain, or a
// sandbox's chain below its nearest layer, stands on is still in use:
// remaking the snapshot must carry it, or the checkpoint and every
// sandbox made from it lose their disk.
func TestLayersInUseFollowsChains(t *testing.T) {
	r := testRuntime(t)
	warm := filepath.Join(r.cfg.Dir.Root, "snapshots", "x", layerName("a"))
	deep := filepath.Join(r.cfg.Dir.Root, "snapshots", "y", layerName("b"))
	chk := NewCheckpointID()
	chkLayer := filepath.Join(r.cfg.Dir.Checkpoint(chk), checkpointDiskName)
	writeJSON(t, filepath.Join(r.cfg.Dir.Checkpoint(chk), checkpointRecordName),
		checkpointRecord{ID: chk, Backing: []string{chkLayer, warm, "image"}})
	var rec record
	rec.Layer = chkLayer
	rec.VM.Backing = []string{chkLayer, deep, "image"}
	writeJSON(t, filepath.Join(r.cfg.Dir.Sandbox("sbxchild"), RecordName), rec)

	used, err := r.layersInUse()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{warm, deep, chkLayer} {
		if !used[p] {
			t.Errorf("layer %s is not counted in use: %v", p, used)
		}
	}
}

// A sandbox rolls back to its own checkpoints only, and a checkpoint ID
// that is not one names nothing: each refused before anything changes.
func TestRollbackRefusesOthersCheckpoints(t *testing.T) {
	r := testRuntime(t)
	id := NewCheckpointID()
	dir := r.cfg.Dir.Checkpoint(id)
	writeJSON(t, filepath.Join(dir, checkpointRecordName),
		checkpointRecord{ID: id, Sandbox: "sbxother", Spec: Spec{DiskMiB: 512}, Backing: []string{filepath.Join(dir, checkpointDiskName)}})
	mine := r.cfg.Dir.Sandbox("sbxmine")
	writeJSON(t, filepath.Join(mine, StateName), "a saved state")
	check := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
		if !SuspendedState(mine) {
			t.Fatalf("%s removed the sandbox's saved state", what)
		}
	}
	_, err := r.Rollback(context.Background(), "sbxmine", nil, id)
	check("rollback to another sandbox's checkpoint", err, errdefs.ErrInvalid)
	for _, bad := range []string{"chk../../x", "sbxabc", "chk", "chk\\x00a", "", "chk" + strings.Repeat("a", 70)} {
		_, err := r.Rollback(context.Background(), "sbxmine", nil, bad)
		check(fmt.Sprintf("rollback to %q", bad), err, errdefs.ErrInvalid)
		if _, err := r.RemoveCheckpoint(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("remove checkpoint %q: %v, want invalid", bad, err)
		}
	}
	_, err = r.Rollback(context.Background(), "sbxmine", nil, NewCheckpointID())
	check("rollback to a missing checkpoint", err, errdefs.ErrNotFound)
	_, err = r.Rollback(context.Background(), "../sbxmine", nil, id)
	check("rollback of a bad sandbox ID", err, errdefs.ErrInvalid)
}

// A checkpoint that a sandbox is being made from (or rolled back to) is
// not removed under it, even before the sandbox's record names it: it is
// left for a later removal.
func TestRemoveCheckpointWaitsForItsUsers(t *testing.T) {
	r := testRuntime(t)
	id := NewCheckpointID()
	writeJSON(t, filepath.Join(r.cfg.Dir.Checkpoint(id), checkpointRecordName), checkpointRecord{ID: id})
	r.chkUse.RLock()
	removed, err := r.RemoveCheckpoint(id)
	r.chkUse.RUnlock()
	if err != nil || removed {
		t.Fatalf("RemoveCheckpoint during a create from a checkpoint: %v, %v; want it kept", removed, err)
	}
	if _, err := os.Stat(r.cfg.Dir.Checkpoint(id)); err != nil {
		t.Fatalf("the checkpoint's files went: %v", err)
	}
	if removed, err := r.RemoveCheckpoint(id); err != nil || !removed {
		t.Fatalf("RemoveCheckpoint once nothing uses it: %v, %v", removed, err)
	}
}
