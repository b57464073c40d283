package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
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
