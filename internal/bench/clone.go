package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
)

// The two scenarios here price what a template snapshot saves a create,
// and what a warm one saves a template with a server: a clone against a
// boot, a warm clone against a cold clone that starts its server. Both
// sides run on the same runtime (same jail, template and sample count),
// alternating.

// warmTemplateRef is the template of warm_template_create: the built-in
// with a server (a Jupyter kernel behind E2B's code interpreter protocol),
// whose warm snapshot holds the server up.
const warmTemplateRef = "code-interpreter"

// cloneVsBoot measures a create that clones the template's snapshot
// against a create of the same template booted from scratch
// (Spec.ColdBoot), each to init answered.
func (r *runner) cloneVsBoot(ctx context.Context) (Result, error) {
	spec := sandbox.Spec{Template: r.cfg.Template}
	if _, err := r.rt.TemplateSnapshot(ctx, spec); err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	createOf := func(spec sandbox.Spec, wantClone bool) measure {
		return func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout)
			defer cancel()
			start := time.Now()
			sb, err := r.rt.Create(ctx, spec)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			clone := sb.Snapshot != ""
			if err := destroy(sb); err != nil {
				return 0, err
			}
			if clone != wantClone {
				return 0, fmt.Errorf("the sandbox was %s", cloneWord(clone))
			}
			return d, nil
		}
	}
	cold := spec
	cold.ColdBoot = true
	n := r.cfg.SnapshotRuns
	a, b, err := r.retryingPairs(ctx, ScenarioCloneBoot, n, "clone", createOf(spec, true), "boot", createOf(cold, false))
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: sandbox.Runtime.Create of template %s, a clone of its template snapshot, until init "+
		"answered; baseline: the same create booted from scratch (Spec.ColdBoot: kernel boot, init) on the same "+
		"runtime, with the same jail (%s); %d samples each, alternating, each sandbox destroyed after its sample, "+
		"untimed; the snapshot made beforehand; ratio of p50s, target at most 0.5 (a clone well under a boot)",
		r.tpl.Ref(), jailWord(r.rt.Jailed()), n)
	if a.Failures+b.Failures > 0 {
		notes += fmt.Sprintf("; %d clone and %d boot samples failed and were retried", a.Failures, b.Failures)
	}
	return Result{Name: ScenarioCloneBoot, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// warmTemplateCreate measures a create of warmTemplateRef that clones its
// warm snapshot, server up, against a create of it that clones its cold
// snapshot and starts the server (what a spec with its own environment
// gets, since the warm server saw another), each until the server
// answers its readiness check; then, as variant idle_pss, the PSS of
// every sandbox's QEMU of both sides, kept idle until the end.
func (r *runner) warmTemplateCreate(ctx context.Context) (_ Result, err error) {
	tpl, err := r.rt.Templates().Resolve(warmTemplateRef)
	if err != nil {
		return Result{}, fmt.Errorf("%s needs template %s: %w", ScenarioWarmTemplate, warmTemplateRef, err)
	}
	warm := sandbox.Spec{Template: tpl.Ref()}
	cold := sandbox.Spec{Template: tpl.Ref(), Env: map[string]string{"AIRLOCK_BENCH": "cold"}}
	for _, spec := range []sandbox.Spec{warm, cold} {
		start := time.Now()
		if _, err := r.rt.TemplateSnapshot(ctx, spec); err != nil {
			return Result{}, fmt.Errorf("template snapshot of %s: %w", tpl.Ref(), err)
		}
		if d := time.Since(start); d > time.Second {
			r.progressf("%s: made a template snapshot of %s in %.0f ms", ScenarioWarmTemplate, tpl.Ref(), ms(d))
		}
	}
	var warmLive, coldLive []*sandbox.Sandbox
	defer func() { err = errors.Join(err, destroyAll(append(warmLive, coldLive...))) }()
	createOf := func(spec sandbox.Spec, wantWarm bool, live *[]*sandbox.Sandbox) measure {
		return func(ctx context.Context) (time.Duration, error) {
			start := time.Now()
			sb, err := r.rt.Create(ctx, spec)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			if sb.Snapshot == "" || sb.Warm != wantWarm {
				return 0, errors.Join(fmt.Errorf("the sandbox was %s of the %s snapshot", cloneWord(sb.Snapshot != ""), warmWord(sb.Warm)), destroy(sb))
			}
			*live = append(*live, sb)
			return d, nil
		}
	}
	n := r.cfg.SnapshotRuns
	a, b, err := r.retryingPairs(ctx, ScenarioWarmTemplate, n, "warm clone", createOf(warm, true, &warmLive),
		"cold clone and start", createOf(cold, false, &coldLive))
	if err != nil {
		return Result{}, err
	}
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	pss := func(sbs []*sandbox.Sandbox) ([]int64, error) {
		var kib []int64
		for _, sb := range sbs {
			u, err := readMemUse(sb.Machine().PID())
			if err != nil {
				return nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
			}
			kib = append(kib, u.pssKiB)
		}
		return kib, nil
	}
	wp, err := pss(warmLive)
	if err != nil {
		return Result{}, err
	}
	cp, err := pss(coldLive)
	if err != nil {
		return Result{}, err
	}
	res := warmTemplateResult(a, b, summarizeKiB(wp), summarizeKiB(cp))
	res.Notes = fmt.Sprintf("airlock: sandbox.Runtime.Create of template %s (%d vCPUs, %d MiB), a clone of its warm "+
		"snapshot with its server up, until the server's readiness check answered; baseline: the same create with "+
		"an environment of its own (Spec.Env), a clone of the template's cold snapshot that runs the start command "+
		"and waits for the same check, on the same runtime with the same jail (%s); %d samples each, alternating, "+
		"the snapshots made beforehand; ratio of p50s, target at most 0.5; variant idle_pss (MiB): the PSS of the "+
		"QEMU of each of those sandboxes, all kept running until the last sample and then left %s idle, the warm "+
		"clones (whose server's pages are the snapshot's, shared) against the cold clones that started their own; "+
		"ratio of p50s",
		tpl.Ref(), tpl.VCPUs, tpl.MemoryMiB, jailWord(r.rt.Jailed()), n, idleSettle)
	if a.Failures+b.Failures > 0 {
		res.Notes += fmt.Sprintf("; %d warm and %d cold samples failed and were retried", a.Failures, b.Failures)
	}
	return res, nil
}

// warmTemplateResult assembles warm_template_create's result: the warm
// clones' creates against the cold clones', and their PSS, in MiB, as
// the idle_pss variant.
func warmTemplateResult(warm, cold, warmPSS, coldPSS Measurement) Result {
	return Result{
		Name: ScenarioWarmTemplate, Unit: "ms", Airlock: warm, Baseline: cold, Ratio: ratio(warm.P50, cold.P50),
		Variants: []Variant{{Name: "idle_pss", Unit: "MiB", Measurement: warmPSS, Baseline: &coldPSS, Ratio: ratio(warmPSS.P50, coldPSS.P50)}},
	}
}

// warmWord names a snapshot by whether it is warm.
func warmWord(warm bool) string {
	if warm {
		return "warm"
	}
	return "cold"
}
