package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
)

// snapshotCreate measures a sandbox create, a clone of the template's
// snapshot, to the first stdout byte of a command in it, against a bare
// QEMU restoring the same snapshot until it runs.
func (r *runner) snapshotCreate(ctx context.Context) (Result, error) {
	spec := sandbox.Spec{Template: r.cfg.Template}
	start := time.Now()
	snap, err := r.rt.TemplateSnapshot(ctx, spec)
	if err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	r.progressf("%s: template snapshot ready (%.0f ms)", ScenarioSnapshot, ms(time.Since(start)))
	n := r.cfg.SnapshotRuns
	clone := func(ctx context.Context) (time.Duration, error) { return r.runtimeFirstOutput(ctx, r.rt, true) }
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
		"file, disk grown, agent session, guest init), then Exec of argv %v until its first stdout byte; baseline: "+
		"a bare QEMU restoring the same snapshot (its configuration, a directory and disk overlay of its own, the "+
		"memory file mapped private, restore, cont) until query-status says running, with no agent session, init "+
		"or exec; %d samples each, alternating, each VM removed after its sample, untimed; the snapshot made "+
		"beforehand (%s, %d MiB); ratio of p50s; p50 difference %+.0f ms",
		r.tpl.Ref(), firstOutputArgv, n, r.tpl.Ref(), snap.VM.MemoryMiB, a.P50-b.P50)
	if failA+failB > 0 {
		notes += fmt.Sprintf("; %d airlock and %d baseline samples failed and were retried", failA, failB)
	}
	return Result{
		Name:     ScenarioSnapshot,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes:    notes,
	}, nil
}
