package bench

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/timings"
)

func sampleReport() Report {
	return Report{
		Version:   ReportVersion,
		StartedAt: time.Date(2026, 11, 29, 19, 40, 0, 0, time.UTC),
		Host:      Host{CPUs: 2, Accel: "tcg", Kernel: "6.1.0-test"},
		Results: []Result{
			{
				Name: ScenarioBoot, Unit: "ms",
				Airlock:  Measurement{Runs: 5, Failures: 1, Min: 3000, P50: 3512.25, P99: 3700, Max: 3700, Mean: 3500},
				Baseline: Measurement{Runs: 5, Min: 2800, P50: 2890.125, P99: 3001.5, Max: 3001.5, Mean: 2900},
				Ratio:    1.215, Notes: "boot notes",
			},
			{
				Name: ScenarioExecRTT, Unit: "ms",
				Airlock:  Measurement{Runs: 200, Min: 9.5, P50: 12.345, P99: 20.001, Max: 25, Mean: 12.5},
				Baseline: Measurement{Runs: 200, Min: 0.5, P50: 0.801, P99: 1.2, Max: 2, Mean: 0.85},
				Ratio:    15.41, Notes: "exec notes",
			},
			{
				Name: ScenarioThroughput, Unit: "MiB/s",
				Airlock:  Measurement{Runs: 1, Bytes: 200 << 20, Seconds: 6.5, MiBPerS: 30.77},
				Baseline: Measurement{Runs: 5, Bytes: 200 << 20, Seconds: 0.08, MiBPerS: 2500},
				Ratio:    0.01231, Notes: "throughput notes",
			},
		},
	}
}

func TestReportJSONRoundTrip(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(buf.String(), "}\n") {
		t.Errorf("JSON does not end in a newline")
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rep) {
		t.Errorf("round trip changed the report:\n got %+v\nwant %+v", back, rep)
	}
}

// The documented schema: these names are what consumers read.
func TestReportJSONFields(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	hasKeys := func(where string, m map[string]any, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s has no %q: %v", where, k, m)
			}
		}
	}
	hasKeys("report", doc, "version", "started_at", "host", "results")
	if doc["version"] != float64(1) {
		t.Errorf("version = %v, want 1", doc["version"])
	}
	if s, _ := doc["started_at"].(string); s != "2026-11-29T19:40:00Z" {
		t.Errorf("started_at = %v, want RFC 3339", doc["started_at"])
	}
	hasKeys("host", doc["host"].(map[string]any), "cpus", "accel", "kernel")
	boot := doc["results"].([]any)[0].(map[string]any)
	if f := boot["airlock"].(map[string]any)["failures"]; f != float64(1) {
		t.Errorf("boot airlock failures = %v, want 1", f)
	}
	if _, ok := boot["baseline"].(map[string]any)["failures"]; ok {
		t.Errorf("boot baseline has failures without any")
	}
	results := doc["results"].([]any)
	if len(results) != 3 {
		t.Fatalf("%d results, want 3", len(results))
	}
	for _, r := range results {
		res := r.(map[string]any)
		hasKeys("result", res, "name", "unit", "airlock", "baseline", "ratio", "notes")
		var stats []string
		switch res["unit"] {
		case "ms":
			stats = []string{"runs", "min", "p50", "p99", "max", "mean"}
		case "MiB/s":
			stats = []string{"runs", "bytes", "seconds", "mib_per_s"}
		default:
			t.Errorf("result %v has unit %v", res["name"], res["unit"])
		}
		for _, side := range []string{"airlock", "baseline"} {
			m := res[side].(map[string]any)
			hasKeys(res["name"].(string)+"."+side, m, stats...)
			extra := 0
			if _, ok := m["failures"]; ok && res["name"] == ScenarioBoot {
				extra = 1 // present only when boots were retried
			}
			if len(m) != len(stats)+extra {
				t.Errorf("%s.%s has fields of another unit: %v", res["name"], side, m)
			}
		}
	}
}

func TestReportJSONEmptyResults(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Report{Version: ReportVersion, Results: []Result{}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"results": []`) {
		t.Errorf("no results should be an empty list, not null:\n%s", buf.String())
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	want := `airlock bench  2026-11-29T19:40:00Z  host: 2 CPUs, accel tcg, kernel 6.1.0-test

SCENARIO           FIGURE  AIRLOCK  BASELINE     RATIO
boot               p50 ms   3512.2    2890.1    1.215x
                   max ms   3700.0    3001.5
exec_rtt           p50 ms   12.345     0.801    15.41x
                   p99 ms   20.001     1.200
stdout_throughput  MiB/s    30.770    2500.0  0.01231x

boot: boot notes
exec_rtt: exec notes
stdout_throughput: throughput notes
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// The lifecycle and fleet scenarios: variants with baselines of their
// own, bytes written, sizes in MiB, and a failed scenario.
func TestWriteTableLifecycle(t *testing.T) {
	save := Measurement{Runs: 3, Min: 900, P50: 1000, P99: 1100, Max: 1100, Mean: 1000, Bytes: 40 << 20}
	restore := Measurement{Runs: 3, Min: 400, P50: 500, P99: 600, Max: 600, Mean: 500}
	rep := Report{
		Version:   ReportVersion,
		StartedAt: time.Date(2026, 11, 29, 19, 40, 0, 0, time.UTC),
		Host:      Host{CPUs: 2, Accel: "tcg", Kernel: "6.1.0-test"},
		Results: []Result{
			{
				Name: ScenarioSuspend, Unit: "ms",
				Airlock:  Measurement{Runs: 3, Min: 1700, P50: 1800, P99: 1900, Max: 1900, Mean: 1800},
				Baseline: Measurement{Runs: 3, Min: 1400, P50: 1500, P99: 1700, Max: 1700, Mean: 1500},
				Ratio:    1.2,
				Variants: []Variant{
					{Name: "suspend", Measurement: Measurement{Runs: 3, Min: 1000, P50: 1100, P99: 1200, Max: 1200, Mean: 1100, Bytes: 41 << 20}, Ratio: 1.1, Baseline: &save},
					{Name: "wake", Measurement: Measurement{Runs: 3, Min: 600, P50: 700, P99: 800, Max: 800, Mean: 700}, Ratio: 1.4, Baseline: &restore},
				},
				Notes: "suspend notes",
			},
			{
				Name: ScenarioIdlePSS, Unit: "MiB",
				Airlock:  Measurement{Runs: 20, Min: 70, P50: 75.5, P99: 90, Max: 90, Mean: 76.25},
				Baseline: Measurement{Runs: 1, Min: 60, P50: 60, P99: 60, Max: 60, Mean: 60},
				Ratio:    1.258, Notes: "pss notes",
			},
			{
				Name: ScenarioConcurrent, Unit: "ms",
				Airlock:  Measurement{Runs: 19, Failures: 1, Min: 9000, P50: 30000, P99: 50000, Max: 50000, Mean: 30000},
				Baseline: Measurement{Runs: 1, Min: 5000, P50: 5000, P99: 5000, Max: 5000, Mean: 5000},
				Ratio:    6,
				Variants: []Variant{{Name: "wall", Measurement: Measurement{Runs: 1, Min: 52000, P50: 52000, P99: 52000, Max: 52000, Mean: 52000}, Ratio: 10.4}},
				Notes:    "concurrent notes", Error: "1 of 20 concurrent creates failed",
			},
		},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := `airlock bench  2026-11-29T19:40:00Z  host: 2 CPUs, accel tcg, kernel 6.1.0-test

SCENARIO           FIGURE               AIRLOCK  BASELINE   RATIO
suspend_wake_512   p50 ms                1800.0    1500.0    1.2x
                   p99 ms                1900.0    1700.0
                   max ms                1900.0    1700.0
                   suspend p50 ms        1100.0    1000.0    1.1x
                   suspend p99 ms        1200.0    1100.0
                   suspend MiB written   41.000    40.000
                   wake p50 ms            700.0     500.0    1.4x
                   wake p99 ms            800.0     600.0
idle_pss           p50 MiB               75.500    60.000  1.258x
                   mean MiB              76.250    60.000
                   max MiB               90.000    60.000
concurrent_create  p50 ms               30000.0    5000.0      6x
                   p99 ms               50000.0    5000.0
                   max ms               50000.0    5000.0
                   wall p50 ms          52000.0    5000.0   10.4x

suspend_wake_512: suspend notes
idle_pss: pss notes
concurrent_create: FAILED: 1 of 20 concurrent creates failed
concurrent_create: concurrent notes
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// A variant's own baseline and a failed scenario's error are in the JSON,
// and absent when there are none.
func TestReportJSONVariantBaselineAndError(t *testing.T) {
	base := Measurement{Runs: 2, P50: 1}
	rep := Report{Version: ReportVersion, Results: []Result{
		{Name: ScenarioPause, Unit: "ms", Variants: []Variant{
			{Name: "pause", Measurement: Measurement{Runs: 2, P50: 2}, Ratio: 2, Baseline: &base},
			{Name: "other", Measurement: Measurement{Runs: 2, P50: 3}, Ratio: 3},
		}},
		{Name: ScenarioConcurrent, Unit: "ms", Error: "2 of 20 concurrent creates failed"},
	}}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	variants := doc.Results[0]["variants"].([]any)
	pause, other := variants[0].(map[string]any), variants[1].(map[string]any)
	if b, ok := pause["baseline"].(map[string]any); !ok || b["p50"] != float64(1) || pause["p50"] != float64(2) {
		t.Errorf("pause variant %v, want p50 2 and a baseline of p50 1", pause)
	}
	if _, ok := other["baseline"]; ok {
		t.Errorf("variant without a baseline of its own has one: %v", other)
	}
	if _, ok := doc.Results[0]["error"]; ok {
		t.Errorf("a scenario that succeeded has an error: %v", doc.Results[0])
	}
	if doc.Results[1]["error"] != "2 of 20 concurrent creates failed" {
		t.Errorf("failed scenario's error = %v", doc.Results[1]["error"])
	}
}

func TestAlignTable(t *testing.T) {
	tests := []struct {
		name  string
		rows  [][]string
		right []bool
		want  string
	}{
		{"empty", nil, nil, ""},
		{"left and right", [][]string{{"a", "1"}, {"bbb", "22"}}, []bool{false, true}, "a     1\nbbb  22\n"},
		{"trailing blanks trimmed", [][]string{{"x", ""}, {"y", "z"}}, []bool{false, false}, "x\ny  z\n"},
		{"ragged rows", [][]string{{"a"}, {"b", "c"}}, nil, "a\nb  c\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := alignTable(tt.rows, tt.right); got != tt.want {
				t.Errorf("alignTable =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// The floors: variants whose airlock side is the headline's (or, for a
// throughput, another run of it) against floors of their own, in
// throughput rows too.
func TestWriteTableFloors(t *testing.T) {
	exec := Measurement{Runs: 200, Min: 9.5, P50: 12.345, P99: 20.001, Max: 25, Mean: 12.5}
	spawn := Measurement{Runs: 200, Min: 5, P50: 6.5, P99: 9, Max: 10, Mean: 6.6}
	stdout := Measurement{Runs: 3, Bytes: 200 << 20, Seconds: 7, MiBPerS: 28.57}
	aux := Measurement{Runs: 3, Bytes: 200 << 20, Seconds: 2, MiBPerS: 100}
	pipe := Measurement{Runs: 3, Bytes: 200 << 20, Seconds: 0.5, MiBPerS: 400}
	rep := Report{
		Version:   ReportVersion,
		StartedAt: time.Date(2026, 11, 29, 19, 40, 0, 0, time.UTC),
		Host:      Host{CPUs: 2, Accel: "tcg", Kernel: "6.1.0-test"},
		Results: []Result{
			{
				Name: ScenarioExecRTT, Unit: "ms", Airlock: exec,
				Baseline: Measurement{Runs: 200, Min: 0.5, P50: 0.801, P99: 1.2, Max: 2, Mean: 0.85},
				Ratio:    15.41,
				Variants: []Variant{{Name: "guest_spawn", Measurement: exec, Ratio: 1.899, Baseline: &spawn}},
				Notes:    "exec notes",
			},
			{
				Name: ScenarioThroughput, Unit: "MiB/s",
				Airlock:  Measurement{Runs: 1, Bytes: 200 << 20, Seconds: 6.5, MiBPerS: 30.77},
				Baseline: Measurement{Runs: 5, Bytes: 200 << 20, Seconds: 0.08, MiBPerS: 2500},
				Ratio:    0.01231,
				Variants: []Variant{
					{Name: "transport", Measurement: stdout, Ratio: 0.2857, Baseline: &aux},
					{Name: "guest_pipe", Measurement: stdout, Ratio: 0.07143, Baseline: &pipe},
				},
				Notes: "throughput notes",
			},
		},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := `airlock bench  2026-11-29T19:40:00Z  host: 2 CPUs, accel tcg, kernel 6.1.0-test

SCENARIO           FIGURE              AIRLOCK  BASELINE     RATIO
exec_rtt           p50 ms               12.345     0.801    15.41x
                   p99 ms               20.001     1.200
                   guest_spawn p50 ms   12.345     6.500    1.899x
                   guest_spawn p99 ms   20.001     9.000
stdout_throughput  MiB/s                30.770    2500.0  0.01231x
                   transport MiB/s      28.570     100.0   0.2857x
                   guest_pipe MiB/s     28.570     400.0  0.07143x

exec_rtt: exec notes
stdout_throughput: throughput notes
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestStepP50s(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []timings.Timings
		want    timings.Timings
	}{
		{"no samples", nil, nil},
		{"one sample", []timings.Timings{{{Name: "a", MS: 1.5}, {Name: "b", MS: 2}}},
			timings.Timings{{Name: "a", MS: 1.5}, {Name: "b", MS: 2}}},
		{"nearest rank, in order", []timings.Timings{
			{{Name: "a", MS: 5}, {Name: "b", MS: 30}},
			{{Name: "a", MS: 1}, {Name: "b", MS: 10}},
			{{Name: "a", MS: 3}, {Name: "b", MS: 20}},
			{{Name: "a", MS: 2}, {Name: "b", MS: 40}},
		}, timings.Timings{{Name: "a", MS: 2}, {Name: "b", MS: 20}}},
		{"a step only some samples have", []timings.Timings{
			{{Name: "a", MS: 1}, {Name: "first exec", MS: 7}},
			{{Name: "failed clone", MS: 100}, {Name: "a", MS: 3}, {Name: "first exec", MS: 9}},
			{{Name: "a", MS: 2}, {Name: "first exec", MS: 8}},
		}, timings.Timings{{Name: "a", MS: 2}, {Name: "first exec", MS: 8}, {Name: "failed clone", MS: 100}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stepP50s(tc.samples); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stepP50s = %v, want %v", got, tc.want)
			}
		})
	}
	if got := stepTimings(nil, nil); got != nil {
		t.Errorf("stepTimings of no samples = %+v, want nil", got)
	}
}

// Step timings: a row per step under the scenario's figures, a blank cell
// on the side without the step; kept in the JSON, in order.
func TestWriteTableTimings(t *testing.T) {
	rep := Report{
		Version:   ReportVersion,
		StartedAt: time.Date(2026, 11, 29, 19, 40, 0, 0, time.UTC),
		Host:      Host{CPUs: 2, Accel: "tcg", Kernel: "6.1.0-test"},
		Results: []Result{
			{
				Name: ScenarioWarmPool, Unit: "ms",
				Airlock:  Measurement{Runs: 5, Min: 90, P50: 100, P99: 120, Max: 120, Mean: 101},
				Baseline: Measurement{Runs: 5, Min: 500, P50: 600, P99: 700, Max: 700, Mean: 610},
				Ratio:    0.1667,
				Timings: &StepTimings{
					Airlock:  timings.Timings{{Name: "take warm pool member", MS: 1.25}, {Name: "first exec", MS: 40}},
					Baseline: timings.Timings{{Name: "start vm", MS: 300}, {Name: "first exec", MS: 41.5}},
				},
				Notes: "pool notes",
			},
		},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := `airlock bench  2026-11-29T19:40:00Z  host: 2 CPUs, accel tcg, kernel 6.1.0-test

SCENARIO                          FIGURE                          AIRLOCK  BASELINE    RATIO
warm_pool_create_to_first_output  p50 ms                            100.0     600.0  0.1667x
                                  p99 ms                            120.0     700.0
                                  max ms                            120.0     700.0
                                    take warm pool member p50 ms    1.250
                                    first exec p50 ms              40.000    41.500
                                    start vm p50 ms                           300.0

warm_pool_create_to_first_output: pool notes
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}

	buf.Reset()
	if err := WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"timings": {
        "airlock": {
          "take warm pool member": 1.25,
          "first exec": 40
        },
        "baseline": {
          "start vm": 300,
          "first exec": 41.5
        }
      }`) {
		t.Errorf("JSON lacks the timings, in order:\n%s", buf.String())
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rep) {
		t.Errorf("round trip changed the report:\n got %+v\nwant %+v", back, rep)
	}
}
