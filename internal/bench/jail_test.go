package bench

import (
	"strings"
	"testing"
)

// Each of jail_cost's variants is printed beside its own unjailed
// baseline, never beside the create's.
func TestJailResultEachVariantHasItsOwnBaseline(t *testing.T) {
	m := func(p50 float64) Measurement { return Measurement{Runs: 5, P50: p50, P99: p50 + 1, Max: p50 + 1} }
	res := jailResult(m(450), m(380), m(14), m(16), m(520), m(170), m(60), m(18))
	if res.Ratio != ratio(450, 380) {
		t.Errorf("ratio %v, want the create's", res.Ratio)
	}
	want := map[string][2]float64{
		"exec_rtt_jailed_vs_unjailed":           {14, 16},
		"save_tools_jailed_vs_unjailed":         {520, 170},
		"image_config_tools_jailed_vs_unjailed": {60, 18},
	}
	if len(res.Variants) != len(want) {
		t.Fatalf("variants %+v, want %d", res.Variants, len(want))
	}
	for _, v := range res.Variants {
		w, ok := want[v.Name]
		if !ok || v.Baseline == nil || v.P50 != w[0] || v.Baseline.P50 != w[1] || v.Ratio != ratio(w[0], w[1]) {
			t.Errorf("variant %+v (baseline %+v), want %v", v, v.Baseline, w)
		}
	}
	var out strings.Builder
	if err := WriteTable(&out, Report{Results: []Result{res}}); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{
		"exec_rtt_jailed_vs_unjailed p50 ms   14.000  16.000",
		"save_tools_jailed_vs_unjailed p50 ms  520.0   170.0",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(row), " ")) {
			t.Errorf("the table lacks the row %q:\n%s", row, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "_jailed_vs_unjailed") && strings.Contains(line, "380.0") {
			t.Errorf("a variant is printed beside the create's baseline: %q", line)
		}
	}
}
