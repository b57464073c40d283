package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/timings"
)

// poolReadyTimeout bounds each wait for the warm pool to have its member
// ready: the first, which may make the template's snapshot, and each
// refill after a sample.
const poolReadyTimeout = 3 * time.Minute

// poolStopTimeout bounds StopPools at the end of the scenario, which
// destroys the pool's member. It does not depend on the run's context, so
// that a cancelled run still cleans up.
const poolStopTimeout = 30 * time.Second

// poolStep is the step a create from a warm pool member reports first; a
// sample whose create lacks it did not take a member, and fails.
const poolStep = "take warm pool member"

// warmPoolCreate measures a sandbox create from a warm pool member of the
// bench's template (Claim, then Create with its ID) to the first stdout
// byte of a command in it, against a plain Create, a clone of the same
// template's snapshot with the same spec, to the same. Both sides' VMs are
// detached, as pool members are, and every sandbox is destroyed after its
// sample. The pool (of one) is stopped when the scenario ends, also when
// it fails.
func (r *runner) warmPoolCreate(ctx context.Context) (Result, error) {
	spec, _, err := r.rt.Resolve(sandbox.Spec{Template: r.cfg.Template, Detach: true})
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	if _, err := r.rt.TemplateSnapshot(ctx, spec); err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	r.progressf("%s: template snapshot ready (%.0f ms)", ScenarioWarmPool, ms(time.Since(start)))

	poolCtx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), poolStopTimeout)
		defer scancel()
		r.rt.StopPools(sctx)
	}()
	if err := r.rt.StartPools(poolCtx, []sandbox.PoolSpec{{Template: r.cfg.Template, Size: 1}}, nil); err != nil {
		return Result{}, err
	}
	start = time.Now()
	if err := r.waitPoolReady(ctx); err != nil {
		return Result{}, err
	}
	r.progressf("%s: warm pool ready (%.0f ms)", ScenarioWarmPool, ms(time.Since(start)))

	var stepsA, stepsB []timings.Timings
	pooled := func(ctx context.Context) (time.Duration, error) {
		// A retried sample may find the pool still refilling.
		if err := r.waitPoolReady(ctx); err != nil {
			return 0, err
		}
		var got []timings.Timings
		d, err := r.firstOutput(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) {
			id, ok := r.rt.Claim(spec)
			if !ok {
				return nil, errors.New("no warm pool member fits the spec")
			}
			s := spec
			s.ID = id
			return r.rt.Create(ctx, s)
		}, true, nil, &got)
		if err != nil {
			return 0, err
		}
		if _, ok := got[0].Get(poolStep); !ok {
			return 0, fmt.Errorf("the create did not take a warm pool member: steps %v", got[0])
		}
		stepsA = append(stepsA, got...)
		// The refill runs before the baseline's sample, untimed, so that
		// the two do not share the CPUs.
		return d, r.waitPoolReady(ctx)
	}
	plain := func(ctx context.Context) (time.Duration, error) {
		return r.firstOutput(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) {
			return r.rt.Create(ctx, spec)
		}, true, nil, &stepsB)
	}
	n := r.cfg.SnapshotRuns
	a, b, err := r.retryingPairs(ctx, ScenarioWarmPool, n, "warm pool", pooled, "clone", plain)
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: sandbox.Runtime.Claim of a member of a warm pool of 1 of template %s "+
		"(a clone past its restore and agent session, detached), Create with its ID (the sandbox's part: "+
		"record, policy, disk grown, guest reinit, server check), then Exec of argv %v until its first stdout "+
		"byte; baseline: sandbox.Runtime.Create of the same template with the same spec (detached), a clone "+
		"of its snapshot, then the same Exec; %d samples each, alternating, each sandbox destroyed after its "+
		"sample and the pool refilled before the next, untimed (its member idles during the baseline's "+
		"samples); ratio of p50s; p50 difference %+.0f ms; timings: p50 per step of each side's Create "+
		"(sandbox.Sandbox.Timings), and first exec: from Create's return to the first output byte",
		r.tpl.Ref(), firstOutputArgv, n, a.P50-b.P50)
	if a.Failures+b.Failures > 0 {
		notes += fmt.Sprintf("; %d warm pool and %d baseline samples failed and were retried", a.Failures, b.Failures)
	}
	return Result{
		Name:     ScenarioWarmPool,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Timings:  stepTimings(stepsA, stepsB),
		Notes:    notes,
	}, nil
}

// waitPoolReady waits until every warm pool of the runtime has a member
// ready, for up to poolReadyTimeout.
func (r *runner) waitPoolReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, poolReadyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ready := true
		for _, p := range r.rt.Pools() {
			ready = ready && p.Ready >= 1
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the warm pool's member: %w", ctx.Err())
		case <-tick.C:
		}
	}
}
