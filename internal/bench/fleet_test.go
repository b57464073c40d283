package bench

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

const smapsRollup = `55d4c7a3e000-7ffd2b5fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              142616 kB
Pss:               98765 kB
Pss_Dirty:         80000 kB
Pss_Anon:          80123 kB
Pss_File:          18642 kB
Pss_Shmem:             0 kB
Shared_Clean:      60000 kB
Private_Dirty:     80000 kB
Swap:                  0 kB
SwapPss:               0 kB
`

func TestParseSmapsRollup(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    memUse
		wantErr string
	}{
		{"full", smapsRollup, memUse{pssKiB: 98765, anonKiB: 80123}, ""},
		{"no Pss_Anon on an old kernel", "Rss: 10 kB\nPss: 7 kB\n", memUse{pssKiB: 7}, ""},
		{"Pss_Dirty and SwapPss are not Pss", "Pss_Dirty: 5 kB\nSwapPss: 3 kB\nPss: 9 kB\n", memUse{pssKiB: 9}, ""},
		{"no Pss", "Rss: 10 kB\n", memUse{}, "no Pss line"},
		{"empty", "", memUse{}, "no Pss line"},
		{"not a number", "Pss: lots kB\n", memUse{}, "malformed Pss"},
		{"no unit", "Pss: 12\n", memUse{}, "malformed Pss"},
		{"negative", "Pss_Anon: -1 kB\nPss: 1 kB\n", memUse{}, "malformed Pss_Anon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSmapsRollup([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// This process's own smaps_rollup, as the kernel writes it.
func TestReadMemUseOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		testenv.Lacking(t, "no smaps_rollup on this kernel (Linux 4.14 or later has it)")
	}
	u, err := readMemUse(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.pssKiB <= 0 || u.anonKiB > u.pssKiB {
		t.Errorf("memory use %+v: want a positive PSS no smaller than its anonymous part", u)
	}
	if _, err := readMemUse(-1); err == nil {
		t.Error("pid -1 gave no error")
	}
}

func TestSummarizeKiB(t *testing.T) {
	m := summarizeKiB([]int64{3072, 1024, 2048, 1536})
	want := Measurement{Runs: 4, Min: 1, P50: 1.5, P99: 3, Max: 3, Mean: 1.875}
	if m != want {
		t.Errorf("summarizeKiB = %+v, want %+v", m, want)
	}
	if m := summarizeKiB([]int64{1}); m.P50 != 0.001 {
		t.Errorf("1 KiB = %v MiB, want 0.001 (KiB precision)", m.P50)
	}
	if m := summarizeKiB(nil); m != (Measurement{}) {
		t.Errorf("no samples gave %+v", m)
	}
}

func TestIdleResult(t *testing.T) {
	created := idleSet{
		uses:   []memUse{{pssKiB: 40 << 10, anonKiB: 30 << 10}, {pssKiB: 50 << 10, anonKiB: 35 << 10}, {pssKiB: 60 << 10, anonKiB: 45 << 10}},
		base:   []memUse{{pssKiB: 20 << 10, anonKiB: 10 << 10}, {pssKiB: 22 << 10, anonKiB: 12 << 10}, {pssKiB: 18 << 10, anonKiB: 8 << 10}},
		clones: 3,
	}
	cold := idleSet{
		uses: []memUse{{pssKiB: 80 << 10, anonKiB: 70 << 10}, {pssKiB: 90 << 10, anonKiB: 75 << 10}, {pssKiB: 100 << 10, anonKiB: 85 << 10}},
		base: []memUse{{pssKiB: 30 << 10, anonKiB: 15 << 10}, {pssKiB: 31 << 10, anonKiB: 16 << 10}, {pssKiB: 29 << 10, anonKiB: 14 << 10}},
	}
	res := idleResult(created, cold)
	if res.Name != ScenarioIdlePSS || res.Unit != "MiB" {
		t.Errorf("name, unit = %q, %q", res.Name, res.Unit)
	}
	if res.Airlock.Runs != 3 || res.Airlock.P50 != 50 || res.Airlock.Max != 60 || res.Airlock.Mean != 50 {
		t.Errorf("airlock %+v, want p50 50, max 60, mean 50 MiB", res.Airlock)
	}
	// As many bare QEMUs as sandboxes.
	if res.Baseline.Runs != 3 || res.Baseline.P50 != 20 || res.Baseline.Max != 22 || res.Ratio != 2.5 {
		t.Errorf("baseline %+v, ratio %v; want 3 runs, p50 20 MiB, max 22, ratio 2.5", res.Baseline, res.Ratio)
	}
	// Each variant against the bare QEMUs' matching figure, read beside
	// its own set; the clones against the cold boots.
	want := []struct {
		name         string
		p50, baseP50 float64
	}{
		{"anon", 35, 10},
		{"cold_boot", 90, 30},
		{"cold_boot_anon", 75, 15},
		{"clone_vs_cold_boot", 50, 90},
	}
	if len(res.Variants) != len(want) {
		t.Fatalf("variants %+v, want %d", res.Variants, len(want))
	}
	for i, w := range want {
		v := res.Variants[i]
		if v.Name != w.name || v.P50 != w.p50 || v.Baseline == nil || v.Baseline.P50 != w.baseP50 || v.Ratio != ratio(w.p50, w.baseP50) {
			t.Errorf("variant %d = %+v (baseline %+v), want %s %v MiB against %v", i, v, v.Baseline, w.name, w.p50, w.baseP50)
		}
	}
	t.Run("no Pss_Anon", func(t *testing.T) {
		created, cold := created, cold
		created.base = []memUse{{pssKiB: 20 << 10}}
		res := idleResult(created, cold)
		if len(res.Variants) != 2 || res.Variants[0].Name != "cold_boot" || res.Variants[1].Name != "clone_vs_cold_boot" {
			t.Errorf("variants %+v, want cold_boot and clone_vs_cold_boot", res.Variants)
		}
	})
	t.Run("no cold set", func(t *testing.T) {
		res := idleResult(created, idleSet{})
		if len(res.Variants) != 1 || res.Variants[0].Name != "anon" {
			t.Errorf("variants %+v, want anon alone", res.Variants)
		}
	})
}

func TestCloneWord(t *testing.T) {
	if cloneWord(true) != "a clone" || !strings.Contains(cloneWord(false), "not a clone") {
		t.Errorf("cloneWord = %q, %q", cloneWord(true), cloneWord(false))
	}
}

func TestConcurrentBootTimeout(t *testing.T) {
	tests := []struct {
		n, cpus int
		want    time.Duration
	}{
		{20, 2, 300 * time.Second},
		{21, 2, 330 * time.Second},
		{1, 2, 30 * time.Second},
		{20, 64, 30 * time.Second},
		{3, 0, 90 * time.Second},
	}
	for _, tt := range tests {
		if got := concurrentBootTimeout(30*time.Second, tt.n, tt.cpus); got != tt.want {
			t.Errorf("concurrentBootTimeout(30s, %d, %d) = %v, want %v", tt.n, tt.cpus, got, tt.want)
		}
	}
}

func TestConcurrentResult(t *testing.T) {
	t.Run("all succeed", func(t *testing.T) {
		res, err := concurrentResult(msDurations(900, 1000, 1100), msDurations(4000, 2000, 3000), make([]error, 3), 2000*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res.Name != ScenarioConcurrent || res.Airlock.Runs != 3 || res.Airlock.P50 != 3000 || res.Airlock.Max != 4000 || res.Airlock.Failures != 0 {
			t.Errorf("airlock %+v", res.Airlock)
		}
		// As many creates alone as at once.
		if res.Baseline.Runs != 3 || res.Baseline.P50 != 1000 || res.Baseline.Max != 1100 || res.Ratio != 3 {
			t.Errorf("baseline %+v, ratio %v; want the 3 creates alone, p50 1000 ms, and 3", res.Baseline, res.Ratio)
		}
		// The wall against the same creates one after another.
		if len(res.Variants) != 1 || res.Variants[0].Name != "wall" || res.Variants[0].P50 != 2000 || res.Variants[0].Baseline == nil ||
			res.Variants[0].Baseline.P50 != 3000 || res.Variants[0].Ratio != ratio(2000, 3000) {
			t.Errorf("variants %+v, want wall 2000 ms against the creates alone's sum, 3000", res.Variants)
		}
	})
	t.Run("a failure fails the scenario and is counted", func(t *testing.T) {
		boom := errors.New("boot timed out")
		errs := []error{nil, boom, nil, errors.New("other")}
		res, err := concurrentResult(msDurations(1000, 1000, 1000, 1000), msDurations(2000, 9000, 3000, 9500), errs, 10*time.Second)
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "2 of 4 concurrent creates failed") {
			t.Fatalf("err = %v, want 2 of 4 failed, wrapping the first", err)
		}
		if res.Airlock.Failures != 2 || res.Airlock.Runs != 2 || res.Airlock.Max != 3000 {
			t.Errorf("airlock %+v, want the 2 successes only and 2 failures", res.Airlock)
		}
		if res.Name != ScenarioConcurrent {
			t.Errorf("a failed scenario's result has no name: Run would drop it")
		}
	})
}
