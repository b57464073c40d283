package bench

import (
	"strings"
	"testing"
)

// warm_template_create's PSS variant is in MiB beside a headline in ms,
// against the cold clones' PSS, and the table labels it so.
func TestWarmTemplateResult(t *testing.T) {
	warm := Measurement{Runs: 3, P50: 900, P99: 1000, Max: 1000}
	cold := Measurement{Runs: 3, P50: 38000, P99: 39000, Max: 39000}
	warmPSS := Measurement{Runs: 3, P50: 180, P99: 220, Max: 220}
	coldPSS := Measurement{Runs: 3, P50: 444, P99: 450, Max: 450}
	res := warmTemplateResult(warm, cold, warmPSS, coldPSS)
	if res.Name != ScenarioWarmTemplate || res.Unit != "ms" || res.Ratio != ratio(900, 38000) {
		t.Errorf("result %+v", res)
	}
	if len(res.Variants) != 1 {
		t.Fatalf("variants %+v, want idle_pss", res.Variants)
	}
	v := res.Variants[0]
	if v.Name != "idle_pss" || v.Unit != "MiB" || v.Baseline == nil || v.Baseline.P50 != 444 || v.Ratio != ratio(180, 444) {
		t.Errorf("variant %+v (baseline %+v), want idle_pss in MiB, 180 against 444", v, v.Baseline)
	}
	var out strings.Builder
	if err := WriteTable(&out, Report{Results: []Result{res}}); err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "idle_pss p50") {
			row = strings.Join(strings.Fields(line), " ")
		}
	}
	if want := "idle_pss p50 MiB 180.0 444.0 " + "0.4054x"; row != want {
		t.Errorf("the variant's row is %q, want %q:\n%s", row, want, out.String())
	}
}
