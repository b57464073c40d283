package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
)

// jailCost measures what the jail costs (docs/hardening.md): a create
// from the template snapshot to first output, and the round trip of an
// exec, with the jail and cgroup on (the default runtime) against the
// same with them off (a runtime over the same data directory with
// Unjailed), alternating, in the same run.
func (r *runner) jailCost(ctx context.Context) (Result, error) {
	if !r.rt.Jailed() {
		return Result{}, fmt.Errorf("%s needs the jail on", ScenarioJail)
	}
	off, err := sandbox.New(ctx, sandbox.Config{Dir: r.cfg.Dir, Accel: r.cfg.Accel, BootTimeout: r.cfg.BootTimeout, Log: r.cfg.Log, Unjailed: true})
	if err != nil {
		return Result{}, err
	}
	if _, err := r.rt.TemplateSnapshot(ctx, sandbox.Spec{Template: r.cfg.Template}); err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	n := r.cfg.SnapshotRuns
	on := func(ctx context.Context) (time.Duration, error) {
		return r.runtimeFirstOutput(ctx, r.rt, true, nil, nil)
	}
	bare := func(ctx context.Context) (time.Duration, error) {
		return r.runtimeFirstOutput(ctx, off, true, nil, nil)
	}
	createOn, createOff, err := r.retryingPairs(ctx, ScenarioJail, n, "jailed", on, "unjailed", bare)
	if err != nil {
		return Result{}, err
	}

	// One sandbox of each kind for the exec round trips.
	jailed, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	if err != nil {
		return Result{}, err
	}
	defer destroy(jailed)
	unjailed, err := off.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	if err != nil {
		return Result{}, err
	}
	defer destroy(unjailed)
	execIn := func(sb *sandbox.Sandbox) measure {
		return timed(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, execTimeout)
			defer cancel()
			return runInSandbox(ctx, sb, []string{"true"}, nil)
		})
	}
	if _, _, err := timePairs(ctx, execWarmup, execIn(jailed), execIn(unjailed), nil); err != nil {
		return Result{}, fmt.Errorf("warm up: %w", err)
	}
	m := max(10, r.cfg.ExecRuns/2)
	da, db, err := timePairs(ctx, m, execIn(jailed), execIn(unjailed), nil)
	if err != nil {
		return Result{}, err
	}
	execOn, execOff := summarize(da), summarize(db)
	r.progressf("%s: exec round trip jailed %.2f ms, unjailed %.2f ms (p50)", ScenarioJail, execOn.P50, execOff.P50)
	return Result{
		Name:     ScenarioJail,
		Unit:     "ms",
		Airlock:  createOn,
		Baseline: createOff,
		Ratio:    ratio(createOn.P50, createOff.P50),
		Variants: []Variant{{Name: "exec_rtt_jailed_vs_unjailed", Measurement: execOn, Ratio: ratio(execOn.P50, execOff.P50)}},
		Notes: fmt.Sprintf("airlock: a create of template %s from its snapshot to the first stdout byte of %v with the jail "+
			"on (own user, mount namespace, no capabilities, no_new_privs, QEMU's seccomp sandbox, cgroup, the "+
			"memory file as a sealed copy); baseline: the same through a runtime with the jail off; %d samples each, "+
			"alternating; ratio of p50s (p50 difference %+.0f ms). Variant: exec of true, %d round trips each in one "+
			"jailed and one unjailed sandbox, alternating (jailed p50 %.2f ms, unjailed %.2f ms)",
			r.tpl.Ref(), firstOutputArgv, n, createOn.P50-createOff.P50, m, execOn.P50, execOff.P50),
	}, nil
}
