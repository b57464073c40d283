package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/probe"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/timings"
)

// snapshotCreate measures a sandbox create, a clone of the template's
// snapshot, to the first stdout byte of a command in it, against a bare
// QEMU restoring the same snapshot until it runs, and against that
// restore plus a fork/exec inside the guest (variant restore_plus_exec).
func (r *runner) snapshotCreate(ctx context.Context) (Result, error) {
	spec := sandbox.Spec{Template: r.cfg.Template}
	start := time.Now()
	snap, err := r.rt.TemplateSnapshot(ctx, spec)
	if err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	r.progressf("%s: template snapshot ready (%.0f ms)", ScenarioSnapshot, ms(time.Since(start)))
	n := r.cfg.SnapshotRuns
	// After each sample, untimed, the in-guest floor of one exec in the
	// sandbox it created.
	var spawns []time.Duration
	spawnFloor := func(ctx context.Context, sb *sandbox.Sandbox) error {
		ds, err := guestSpawns(ctx, sb, r.cfg.Probe, guestTrue, snapshotSpawnRuns)
		if err != nil {
			return fmt.Errorf("in-guest floor: %w", err)
		}
		spawns = append(spawns, ds...)
		return nil
	}
	var steps []timings.Timings
	clone := func(ctx context.Context) (time.Duration, error) {
		return r.runtimeFirstOutput(ctx, r.rt, true, spawnFloor, &steps)
	}
	restore := func(ctx context.Context) (_ time.Duration, err error) {
		ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout)
		defer cancel()
		start := time.Now()
		b, err := r.startBareClone(ctx, snap)
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		return d, b.close()
	}
	a, b, err := r.retryingPairs(ctx, ScenarioSnapshot, n, "airlock", clone, "bare restore", restore)
	if err != nil {
		return Result{}, err
	}
	failA, failB := a.Failures, b.Failures
	notes := fmt.Sprintf("airlock: sandbox.Runtime.Create of template %s, a clone of its snapshot (directory, disk "+
		"overlay, QEMU start, restore of the snapshot's device state with its RAM mapped private from the memory "+
		"file, disk grown, agent session, guest init or, from a warm snapshot, reinit), then Exec of argv %v until its first stdout byte; baseline: "+
		"a bare QEMU restoring the same snapshot (its configuration, a directory and one disk overlay of its own "+
		"made by one qemu-img create, the runtime's jail (%s) and cgroup, the memory file mapped private, through "+
		"the same sealed copy when jailed, restore, cont) until query-status says running, with no agent session, "+
		"init or exec; %d samples each, alternating, each VM removed after its sample, untimed; the snapshot made "+
		"beforehand (%s, %d MiB); ratio of p50s; p50 difference %+.0f ms",
		r.tpl.Ref(), firstOutputArgv, jailWord(r.rt.Jailed()), n, r.tpl.Ref(), snap.VM.MemoryMiB, a.P50-b.P50)
	if failA+failB > 0 {
		notes += fmt.Sprintf("; %d airlock and %d baseline samples failed and were retried", failA, failB)
	}
	s := summarize(spawns)
	floor := addStats(b, s)
	notes += fmt.Sprintf("; variant restore_plus_exec: the same samples against the bare restore plus one exec "+
		"inside the guest, each statistic the sum of the two's (p50 %.3f + %.3f ms): %s forked, executed and "+
		"waited for by airlock-probe, copied in (%s spawn) as the agent's exec does, timed inside "+
		"the guest, %d runs after %d untimed in each sandbox the airlock side created, after its sample, "+
		"untimed; ratio of p50s, target at most 3",
		b.P50, s.P50, guestTrue, probe.Exe, snapshotSpawnRuns, execWarmup)
	notes += "; timings: p50 per step of the airlock side's Create (sandbox.Sandbox.Timings), and first exec: " +
		"from Create's return to the first output byte"
	return Result{
		Name:     ScenarioSnapshot,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Variants: []Variant{{Name: "restore_plus_exec", Measurement: a, Ratio: ratio(a.P50, floor.P50), Baseline: &floor}},
		Timings:  stepTimings(steps, nil),
		Notes:    notes,
	}, nil
}

// snapshotSpawnRuns is how many timed runs the in-guest spawn floor of
// snapshot_create_to_first_output makes in each sandbox.
const snapshotSpawnRuns = 20

// addStats is the floor made of two parts measured apart: each statistic
// the sum of theirs (exact for the mean, a bound for min and max, and
// for the percentiles the sum of the parts' own), with x's runs.
func addStats(x, y Measurement) Measurement {
	add := func(a, b float64) float64 { return roundTo(a+b, 3) }
	return Measurement{Runs: x.Runs, Min: add(x.Min, y.Min), P50: add(x.P50, y.P50), P99: add(x.P99, y.P99),
		Max: add(x.Max, y.Max), Mean: add(x.Mean, y.Mean)}
}
