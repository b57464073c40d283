package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/vm"
)

func TestMedianRun(t *testing.T) {
	run := func(s float64) Measurement { return Measurement{Runs: 1, Bytes: 1 << 20, Seconds: s, MiBPerS: 1 / s} }
	tests := []struct {
		name string
		runs []Measurement
		want float64 // seconds of the median run
	}{
		{"none", nil, 0},
		{"one", []Measurement{run(2)}, 2},
		{"three", []Measurement{run(3), run(1), run(2)}, 2},
		{"four: the lower middle", []Measurement{run(4), run(1), run(3), run(2)}, 2},
		{"five", []Measurement{run(5), run(4), run(1), run(3), run(2)}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.runs)
			m := medianRun(tc.runs)
			if m.Seconds != tc.want || m.Runs != len(tc.runs) {
				t.Errorf("median of %v = %+v, want the run of %v s counting %d runs", tc.runs, m, tc.want, len(tc.runs))
			}
			if tc.want != 0 && m.MiBPerS != 1/tc.want {
				t.Errorf("the median run's MiB/s is %v, not its own", m.MiBPerS)
			}
			if !slices.Equal(in, tc.runs) {
				t.Errorf("medianRun reordered its argument")
			}
		})
	}
}

// The median run matches stream's choice: the nearest rank of the times.
func TestMedianRunAsStream(t *testing.T) {
	var runs []Measurement
	var secs []float64
	for _, s := range []float64{0.5, 0.2, 0.9, 0.4, 0.7, 0.3} {
		runs = append(runs, Measurement{Seconds: s})
		secs = append(secs, s)
	}
	slices.Sort(secs)
	if got, want := medianRun(runs).Seconds, percentile(secs, 50); got != want {
		t.Errorf("median run of %v s, want %v s", got, want)
	}
}

func TestAddStats(t *testing.T) {
	restore := Measurement{Runs: 5, Min: 60.1, P50: 75.281, P99: 108.3, Max: 108.3, Mean: 80.0005}
	spawn := Measurement{Runs: 100, Min: 5.2, P50: 7.123, P99: 12, Max: 13, Mean: 7.5}
	got := addStats(restore, spawn)
	want := Measurement{Runs: 5, Min: 65.3, P50: 82.404, P99: 120.3, Max: 121.3, Mean: 87.501}
	if got != want {
		t.Errorf("addStats = %+v, want %+v", got, want)
	}
}

func TestAuxArgv(t *testing.T) {
	got := strings.Join(auxArgv(3<<16, "/dev/vport0p2"), " ")
	if want := "dd if=/dev/zero bs=65536 count=3 status=none of=/dev/vport0p2"; got != want {
		t.Errorf("auxArgv = %q, want %q", got, want)
	}
	if !strings.Contains(auxDeviceCmd, "= "+vm.AuxPortName+" ]") {
		t.Errorf("the device lookup does not look for %s: %s", vm.AuxPortName, auxDeviceCmd)
	}
}
