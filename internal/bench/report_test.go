package bench

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
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
