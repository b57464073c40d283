package bench

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestForkScenariosSelectable(t *testing.T) {
	all := Scenarios()
	i := slices.Index(all, ScenarioSuspend)
	if want := []string{ScenarioSuspend, "checkpoint_pause_ms", "fork_to_first_output", "fork_marginal_pss"}; i < 0 || !slices.Equal(all[i:i+4], want) {
		t.Fatalf("Scenarios() = %v, want %v in a row, after the lifecycle's", all, want)
	}
	for _, s := range []string{ScenarioCheckpointPause, ScenarioForkFirstOutput, ScenarioForkPSS} {
		c := Config{Dir: datadir.Dir{Root: "/x"}, Scenarios: []string{s}}
		if err := c.Validate(); err != nil {
			t.Errorf("--only %s: %v", s, err)
		}
		for _, o := range all {
			if got, want := c.selected(o), o == s; got != want {
				t.Errorf("--only %s: selected(%s) = %v, want %v", s, o, got, want)
			}
		}
	}
}

func TestForkRunsConfig(t *testing.T) {
	dir := datadir.Dir{Root: "/x"}
	if got := (Config{Dir: dir}).withDefaults().ForkRuns; got != DefaultForkRuns {
		t.Errorf("default ForkRuns = %d, want %d", got, DefaultForkRuns)
	}
	if got := (Config{Dir: dir, ForkRuns: 7}).withDefaults().ForkRuns; got != 7 {
		t.Errorf("ForkRuns 7 became %d", got)
	}
	tests := []struct {
		runs    int
		wantErr string // empty: valid
	}{
		{1, ""},
		{maxForkRuns, ""},
		{-1, "fork runs must not be negative"},
		{maxForkRuns + 1, "fork runs 51 is above the limit of 50"},
	}
	for _, tt := range tests {
		err := (&Config{Dir: dir, ForkRuns: tt.runs}).Validate()
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("ForkRuns %d: Validate() = %v, want nil", tt.runs, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ForkRuns %d: Validate() = %v, want an invalid config saying %q", tt.runs, err, tt.wantErr)
		}
	}
}

// checkpoint_pause_ms compares the reported stall with QMP stop and
// cont, and QEMU's own downtime and the whole checkpoint with the same.
func TestCheckpointPauseResult(t *testing.T) {
	stall := Measurement{Runs: 3, P50: 120, P99: 150, Max: 150}
	down := Measurement{Runs: 3, P50: 110, P99: 140, Max: 140}
	total := Measurement{Runs: 3, P50: 9000, P99: 9500, Max: 9500}
	stopCont := Measurement{Runs: 15, P50: 2, P99: 4, Max: 4}
	res := checkpointPauseResult(stall, down, total, stopCont)
	if res.Name != ScenarioCheckpointPause || res.Unit != "ms" || res.Airlock.P50 != 120 || res.Baseline.P50 != 2 || res.Ratio != ratio(120, 2) {
		t.Errorf("result %+v, want the stall against stop and cont", res)
	}
	want := map[string]float64{"qemu_downtime": ratio(110, 2), "total": ratio(9000, 2)}
	if len(res.Variants) != len(want) {
		t.Fatalf("variants %+v, want %v", res.Variants, want)
	}
	for _, v := range res.Variants {
		if r, ok := want[v.Name]; !ok || v.Ratio != r || v.Baseline != nil || v.Unit != "" {
			t.Errorf("variant %+v, want one of %v against the result's baseline", v, want)
		}
	}
}

// fork_to_first_output's headline is the fork of ten against one clone;
// the fork of one is a variant against the same clone.
func TestForkResult(t *testing.T) {
	res := forkResult(Measurement{Runs: 3, P50: 30000}, Measurement{Runs: 3, P50: 12000}, Measurement{Runs: 3, P50: 4000})
	if res.Name != ScenarioForkFirstOutput || res.Unit != "ms" || res.Ratio != ratio(30000, 4000) || res.Baseline.P50 != 4000 {
		t.Errorf("result %+v, want the fork of %d against the clone", res, forkChildren)
	}
	if len(res.Variants) != 1 || res.Variants[0].Name != "fork_1" || res.Variants[0].Ratio != ratio(12000, 4000) || res.Variants[0].Baseline != nil {
		t.Errorf("variants %+v, want fork_1 against the clone", res.Variants)
	}
}

// fork_marginal_pss reports each figure per VM in MiB, the children's
// against the bare clones'.
func TestForkPSSResult(t *testing.T) {
	kids := []childUse{
		{mem: memUse{pssKiB: 40 << 10, anonKiB: 30 << 10}, diskKiB: 1 << 10, diskSizeKiB: 2 << 10},
		{mem: memUse{pssKiB: 42 << 10, anonKiB: 31 << 10}, diskKiB: 1 << 10, diskSizeKiB: 2 << 10},
	}
	base := []childUse{
		{mem: memUse{pssKiB: 20 << 10, anonKiB: 10 << 10}, diskKiB: 512, diskSizeKiB: 1 << 10},
		{mem: memUse{pssKiB: 20 << 10, anonKiB: 10 << 10}, diskKiB: 512, diskSizeKiB: 1 << 10},
	}
	res := forkPSSResult(kids, base)
	if res.Name != ScenarioForkPSS || res.Unit != "MiB" || res.Airlock.Runs != 2 || res.Airlock.Max != 42 || res.Baseline.P50 != 20 {
		t.Errorf("result %+v, want the children's PSS in MiB against the bare clones'", res)
	}
	tests := []struct {
		name          string
		p50, baseline float64
	}{
		{"anon", 30, 10},
		{"disk_allocated", 1, 0.5},
		{"disk_size", 2, 1},
	}
	if len(res.Variants) != len(tests) {
		t.Fatalf("variants %+v, want %d", res.Variants, len(tests))
	}
	for i, tt := range tests {
		v := res.Variants[i]
		if v.Name != tt.name || v.P50 != tt.p50 || v.Baseline == nil || v.Baseline.P50 != tt.baseline || v.Ratio != ratio(tt.p50, tt.baseline) {
			t.Errorf("variant %d = %+v (baseline %+v), want %s %v against %v", i, v, v.Baseline, tt.name, tt.p50, tt.baseline)
		}
	}
}

// A sparse file's length is not what it takes on the disk.
func TestFileSpace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.qcow2")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	alloc, size, err := fileSpace(path)
	if err != nil {
		t.Fatal(err)
	}
	if size != 64<<20 || alloc < 64<<10 || alloc >= 64<<20 {
		t.Errorf("fileSpace = %d allocated, %d long; want 64 MiB long with at least 64 KiB but not all of it allocated", alloc, size)
	}
	if _, _, err := fileSpace(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("fileSpace of a missing file succeeded")
	}
}
