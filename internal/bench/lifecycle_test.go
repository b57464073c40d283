package bench

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

func TestTwoPhase(t *testing.T) {
	// Airlock's phases, then the baseline's, three rounds each.
	ds := [][]time.Duration{
		msDurations(10, 12, 11),
		msDurations(30, 31, 29),
		msDurations(1, 2, 1),
		msDurations(5, 5, 6),
	}
	res := twoPhase(ScenarioPause, [2]string{"pause", "resume"}, ds)
	if res.Name != ScenarioPause || res.Unit != "ms" {
		t.Errorf("name, unit = %q, %q", res.Name, res.Unit)
	}
	// Rounds: airlock 40, 43, 40; baseline 6, 7, 7.
	if res.Airlock.Runs != 3 || res.Airlock.P50 != 40 || res.Airlock.Max != 43 {
		t.Errorf("airlock %+v, want the round sums 40, 43, 40", res.Airlock)
	}
	if res.Baseline.P50 != 7 || res.Baseline.Min != 6 {
		t.Errorf("baseline %+v, want the round sums 6, 7, 7", res.Baseline)
	}
	if res.Ratio != ratio(40, 7) {
		t.Errorf("ratio %v, want %v", res.Ratio, ratio(40, 7))
	}
	if len(res.Variants) != 2 {
		t.Fatalf("%d variants, want 2", len(res.Variants))
	}
	// Each phase against the baseline's matching one: pause against stop,
	// resume against cont.
	tests := []struct {
		name         string
		p50, baseP50 float64
	}{
		{"pause", 11, 1},
		{"resume", 30, 5},
	}
	for i, tt := range tests {
		v := res.Variants[i]
		if v.Name != tt.name || v.P50 != tt.p50 || v.Baseline == nil || v.Baseline.P50 != tt.baseP50 {
			t.Errorf("variant %d = %+v (baseline %+v), want %s p50 %v against %v", i, v, v.Baseline, tt.name, tt.p50, tt.baseP50)
			continue
		}
		if v.Ratio != ratio(tt.p50, tt.baseP50) {
			t.Errorf("variant %s ratio %v, want %v", v.Name, v.Ratio, ratio(tt.p50, tt.baseP50))
		}
	}
}

func TestSumRounds(t *testing.T) {
	got := sumRounds(msDurations(1, 2, 3), msDurations(10, 20))
	if len(got) != 2 || got[0] != 11*time.Millisecond || got[1] != 22*time.Millisecond {
		t.Errorf("sumRounds = %v, want [11ms 22ms]: rounds both sides finished", got)
	}
}

func TestLargest(t *testing.T) {
	dir := t.TempDir()
	small, big := filepath.Join(dir, "small"), filepath.Join(dir, "big")
	if err := os.WriteFile(small, make([]byte, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, p := range []string{small, big, small} {
		if err := largest(&size, p); err != nil {
			t.Fatal(err)
		}
	}
	if size != 100 {
		t.Errorf("size = %d, want the largest, 100", size)
	}
	if err := largest(&size, filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing state file gave no error")
	}
}

func TestRecordedVM(t *testing.T) {
	dir := t.TempDir()
	want := vm.Config{Kernel: "/k", Initramfs: "/i", Accel: vm.AccelTCG, VCPUs: 1, MemoryMiB: 512,
		Disk: "/d/disk.qcow2", Dir: "/d", TSCKHz: 2000000}
	b, err := json.Marshal(map[string]any{"spec": sandbox.Spec{Template: "sha256-x", MemoryMiB: 512}, "vm": want})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, sandbox.RecordName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := recordedVM(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("recordedVM = %+v, want %+v", got, want)
	}
	if _, err := recordedVM(t.TempDir()); err == nil {
		t.Error("a directory without a record gave no error")
	}
}

// dataDir is an empty data directory.
func dataDir(t *testing.T) datadir.Dir {
	return datadir.Dir{Root: t.TempDir()}
}

func TestNewBareDir(t *testing.T) {
	d := dataDir(t)
	dir, err := newBareDir(d)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != d.Sandboxes() || !strings.HasPrefix(filepath.Base(dir), "bench-") {
		t.Errorf("bare VM directory %s, want bench-* under %s", dir, d.Sandboxes())
	}
	// Not a sandbox's name: Sweep and Runtime.Remove leave it alone.
	if sandbox.ValidID(filepath.Base(dir)) {
		t.Errorf("bare VM directory %s has a sandbox's name", dir)
	}
}

func TestBareVMCloseWithoutMachine(t *testing.T) {
	dir, err := newBareDir(dataDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := (&bareVM{dir: dir}).close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("close left %s (stat: %v)", dir, err)
	}
}

func TestCreateOverlay(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		testenv.Lacking(t, "qemu-img is not installed")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base.ext4")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.qcow2")
	if err := createOverlay(context.Background(), base, "raw", disk, 4); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", disk).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
		Backing     string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Format != "qcow2" || info.VirtualSize != 4<<20 || info.Backing != base {
		t.Errorf("overlay %+v, want qcow2 of 4 MiB over %s", info, base)
	}
	if err := createOverlay(context.Background(), filepath.Join(dir, "missing"), "raw", filepath.Join(dir, "x.qcow2"), 4); err == nil {
		t.Error("an overlay over a missing image was made")
	}
}
