package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/timings"
)

// ReportVersion is the version of the report's JSON schema. It changes only
// when a field is removed or changes meaning; new fields may appear without
// a new version.
const ReportVersion = 1

// Report is the outcome of one bench run. Its JSON form is a stable schema:
//
//	{"version": 1, "started_at": "RFC 3339 time",
//	 "host": {"cpus": 2, "accel": "kvm|tcg", "kernel": "uname -r"},
//	 "results": [{"name": "boot", "unit": "ms",
//	              "airlock": {...}, "baseline": {...},
//	              "ratio": 1.8, "variants": [...],
//	              "timings": {"airlock": {"step": 12.5, ...}, "baseline": {...}},
//	              "notes": "...", "error": "..."}],
//	 "skipped": [{"name": "cluster_exec_rtt", "reason": "..."}]}
//
// See Measurement for what "airlock" and "baseline" hold, Variant for
// the optional "variants", StepTimings for the optional "timings" and
// Skip for the optional "skipped".
type Report struct {
	Version   int       `json:"version"`
	StartedAt time.Time `json:"started_at"`
	Host      Host      `json:"host"`
	Results   []Result  `json:"results"`
	// Skipped are the scenarios a run of every scenario left out because
	// this host cannot run them, in the order of Scenarios(). Absent when
	// none were.
	Skipped []Skip `json:"skipped,omitempty"`
}

// Host describes the machine the bench ran on.
type Host struct {
	// CPUs is the number of CPUs the host offers this process.
	CPUs int `json:"cpus"`
	// Accel is the accelerator the sandboxes ran with: "kvm" or "tcg".
	Accel string `json:"accel"`
	// Kernel is the host kernel's release (uname -r).
	Kernel string `json:"kernel"`
}

// Result is one scenario: airlock and its baseline, measured in the same run.
type Result struct {
	// Name is the scenario: one of Scenarios().
	Name string `json:"name"`
	// Unit is the unit of the headline figures: "ms" for timings, "MiB/s"
	// for throughputs, "MiB" for memory sizes.
	Unit string `json:"unit"`
	// Airlock is what airlock achieved.
	Airlock Measurement `json:"airlock"`
	// Baseline is what the same work achieved without airlock.
	Baseline Measurement `json:"baseline"`
	// Ratio is airlock's headline figure over the baseline's: the p50 for
	// timings and sizes (above 1: airlock is slower or bigger), MiB/s for
	// throughputs (below 1: airlock is slower). Four significant digits.
	Ratio float64 `json:"ratio"`
	// Variants are further ways of doing airlock's side of the work, or
	// parts of it, or airlock's side against a floor of its own,
	// measured in the same run as it and the baseline. Absent when there
	// are none.
	Variants []Variant `json:"variants,omitempty"`
	// Timings break the samples of a create scenario down by step, on
	// the sides whose creates report their steps. Absent when no side
	// does.
	Timings *StepTimings `json:"timings,omitempty"`
	// Notes says what exactly was measured.
	Notes string `json:"notes"`
	// Error, when set, says why the scenario failed; the figures are then
	// those of what did not fail. The run fails with it, after the report
	// is written. Absent when the scenario succeeded.
	Error string `json:"error,omitempty"`
}

// Variant is another way of doing airlock's side of a Result, or one
// phase of it, or that side against a floor: its measurement's fields,
// beside its name and its ratio, computed as Result.Ratio is, to its own
// baseline when it has one (the matching phase of the Result's baseline,
// or the floor: the least the same work costs in the same VM, as an
// in-guest fork/exec for exec_rtt) and else to the Result's.
type Variant struct {
	Name string `json:"name"`
	// Unit is the unit of the variant's figures when it is not the
	// Result's (idle_pss of warm_template_create: "MiB" beside "ms");
	// absent when it is the same.
	Unit string `json:"unit,omitempty"`
	Measurement
	Ratio float64 `json:"ratio"`
	// Baseline is the variant's own baseline; absent when it is compared
	// with the Result's.
	Baseline *Measurement `json:"baseline,omitempty"`
}

// StepTimings is, for each side of a Result, the p50 across its samples
// of each step's milliseconds (stepP50s), in the order the steps ran: the
// steps of the sandbox's create (sandbox.Sandbox.Timings, or the create
// operation's timings over the API), then "first exec", from the
// create's end to the first output byte. A side whose creates report no
// steps (a bare QEMU) is absent. Filled by
// snapshot_create_to_first_output (airlock), warm_pool_create_to_first_output
// (both) and api_create_to_first_output (both: the operation's and the
// runtime's); checkpoint_pause_ms gives the steps of its checkpoints
// (sandbox.Checkpoint.Timings), and fork_to_first_output those of its
// forks of 10 (the checkpoint, then the children to the last first
// output) beside its clones'.
type StepTimings struct {
	Airlock  timings.Timings `json:"airlock,omitempty"`
	Baseline timings.Timings `json:"baseline,omitempty"`
}

// Measurement is one side of a Result. Timing scenarios (unit "ms") fill
// runs, min, p50, p99, max and mean, in milliseconds with microsecond
// precision; size scenarios (unit "MiB") fill the same fields in MiB with
// KiB precision, one sample per sandbox; percentiles are nearest-rank.
// Throughput scenarios (unit "MiB/s") fill runs, and bytes, seconds and
// mib_per_s of one run: the median one by time when there were several.
// Timings of phases that write a file (the suspend and save phases of
// suspend_wake_512) add bytes: the largest file one run wrote. The
// scenarios that boot a sandbox per run (boot,
// api_create_to_first_output, snapshot_create_to_first_output,
// clone_vs_boot, warm_pool_create_to_first_output,
// warm_template_create, template_build,
// image_template_create_to_first_output) add failures
// when runs failed and were retried; concurrent_create adds the creates
// that failed, which fail the scenario.
type Measurement struct {
	Runs int `json:"runs,omitempty"`
	// Failures counts failed attempts; they are not in the statistics.
	Failures int     `json:"failures,omitempty"`
	Min      float64 `json:"min,omitempty"`
	P50      float64 `json:"p50,omitempty"`
	P99      float64 `json:"p99,omitempty"`
	Max      float64 `json:"max,omitempty"`
	Mean     float64 `json:"mean,omitempty"`

	Bytes   int64   `json:"bytes,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	MiBPerS float64 `json:"mib_per_s,omitempty"`
}

// WriteJSON writes rep as indented JSON followed by a newline.
func WriteJSON(w io.Writer, rep Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// figure is one row of the table: a statistic of a result on both sides.
type figure struct {
	label             string
	airlock, baseline float64
	headline          bool    // the statistic a ratio compares
	ratio             float64 // that ratio, when headline
}

// figures lists the statistics the table shows for r: its own, then a p50
// and p99 row for each variant (a MiB/s row for a throughput's), and
// what its runs wrote if they wrote files.
func figures(r Result) []figure {
	a, b := r.Airlock, r.Baseline
	if r.Unit == "MiB/s" {
		out := []figure{{r.Unit, a.MiBPerS, b.MiBPerS, true, r.Ratio}}
		for _, v := range r.Variants {
			vb := b
			if v.Baseline != nil {
				vb = *v.Baseline
			}
			out = append(out, figure{v.Name + " " + r.Unit, v.MiBPerS, vb.MiBPerS, true, v.Ratio})
		}
		return out
	}
	u := " " + r.Unit
	p50 := figure{"p50" + u, a.P50, b.P50, true, r.Ratio}
	p99 := figure{"p99" + u, a.P99, b.P99, false, 0}
	maxi := figure{"max" + u, a.Max, b.Max, false, 0}
	var out []figure
	switch r.Name {
	case ScenarioBoot:
		out = []figure{p50, maxi}
	case ScenarioExecRTT, ScenarioAPIExecRTT:
		out = []figure{p50, p99}
	case ScenarioIdlePSS:
		out = []figure{p50, {"mean" + u, a.Mean, b.Mean, false, 0}, maxi}
	default:
		out = []figure{p50, p99, maxi}
	}
	for _, v := range r.Variants {
		vb := b
		if v.Baseline != nil {
			vb = *v.Baseline
		}
		u := u
		if v.Unit != "" {
			u = " " + v.Unit
		}
		out = append(out, figure{v.Name + " p50" + u, v.P50, vb.P50, true, v.Ratio})
		if v.Runs > 1 {
			out = append(out, figure{v.Name + " p99" + u, v.P99, vb.P99, false, 0})
		}
		if v.Bytes > 0 || vb.Bytes > 0 {
			out = append(out, figure{v.Name + " MiB written", float64(v.Bytes) / (1 << 20), float64(vb.Bytes) / (1 << 20), false, 0})
		}
	}
	return out
}

// stepRows lists the table rows of r's step timings, one per step (the
// airlock side's in order, then those only the baseline has), with a
// blank cell on a side that lacks the step.
func stepRows(r Result) [][]string {
	if r.Timings == nil {
		return nil
	}
	var names []string
	for _, t := range []timings.Timings{r.Timings.Airlock, r.Timings.Baseline} {
		for _, s := range t {
			if !slices.Contains(names, s.Name) {
				names = append(names, s.Name)
			}
		}
	}
	cell := func(t timings.Timings, name string) string {
		if v, ok := t.Get(name); ok {
			return formatFigure(v)
		}
		return ""
	}
	rows := make([][]string, 0, len(names))
	for _, n := range names {
		rows = append(rows, []string{"", "  " + n + " p50 ms", cell(r.Timings.Airlock, n), cell(r.Timings.Baseline, n), ""})
	}
	return rows
}

// WriteTable writes rep as an aligned table for people, with the notes
// below it. A result's step timings follow its figures, a row per step.
func WriteTable(w io.Writer, rep Report) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "airlock bench  %s  host: %d CPUs, accel %s, kernel %s\n\n",
		rep.StartedAt.Format(time.RFC3339), rep.Host.CPUs, rep.Host.Accel, rep.Host.Kernel)
	rows := [][]string{{"SCENARIO", "FIGURE", "AIRLOCK", "BASELINE", "RATIO"}}
	for _, r := range rep.Results {
		for i, f := range figures(r) {
			name, ratioCell := "", ""
			if i == 0 {
				name = r.Name
			}
			if f.headline {
				ratioCell = strconv.FormatFloat(f.ratio, 'g', 4, 64) + "x"
			}
			rows = append(rows, []string{name, f.label, formatFigure(f.airlock), formatFigure(f.baseline), ratioCell})
		}
		rows = append(rows, stepRows(r)...)
	}
	sb.WriteString(alignTable(rows, []bool{false, false, true, true, true}))
	if len(rep.Results) > 0 {
		sb.WriteString("\n")
	}
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(&sb, "%s: FAILED: %s\n", r.Name, r.Error)
		}
		fmt.Fprintf(&sb, "%s: %s\n", r.Name, r.Notes)
	}
	if len(rep.Skipped) > 0 {
		sb.WriteString("\n")
	}
	for _, k := range rep.Skipped {
		fmt.Fprintf(&sb, "skipped %s: %s\n", k.Name, k.Reason)
	}
	if _, err := io.WriteString(w, sb.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// formatFigure prints v with three decimals below 100 and one above, so
// sub-millisecond timings keep their microseconds.
func formatFigure(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// alignTable lays rows out in columns two spaces apart; right[i] aligns
// column i to the right. Trailing spaces are trimmed.
func alignTable(rows [][]string, right []bool) string {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(cell))
		}
	}
	var sb strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-len(cell))
			if i < len(right) && right[i] {
				line.WriteString(pad + cell)
			} else {
				line.WriteString(cell + pad)
			}
		}
		sb.WriteString(strings.TrimRight(line.String(), " "))
		sb.WriteString("\n")
	}
	return sb.String()
}
