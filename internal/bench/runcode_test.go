package bench

import (
	"testing"
)

// run_code_rtt's headline is JavaScript against Python, and each other
// language is a variant against Python too.
func TestRunCodeResult(t *testing.T) {
	m := []Measurement{{Runs: 3, P50: 10}, {Runs: 3, P50: 20}, {Runs: 3, P50: 30}, {Runs: 3, P50: 15}, {Runs: 3, P50: 40}}
	res := runCodeResult(m)
	if res.Name != ScenarioRunCodeRTT || res.Baseline.P50 != 10 || res.Airlock.P50 != 20 || res.Ratio != 2 {
		t.Errorf("result %+v, want javascript (20) against python (10)", res)
	}
	want := []struct {
		name  string
		ratio float64
	}{{"typescript", 3}, {"bash", 1.5}, {"r", 4}}
	if len(res.Variants) != len(want) {
		t.Fatalf("variants %+v, want %v", res.Variants, want)
	}
	for i, w := range want {
		if v := res.Variants[i]; v.Name != w.name || v.Ratio != w.ratio || v.Baseline != nil {
			t.Errorf("variant %d = %+v, want %s at %v against the result's baseline", i, v, w.name, w.ratio)
		}
	}
}
