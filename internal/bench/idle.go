package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// ScenarioIdleWake prices the first answer of an exec on a sandbox its
// idle_s suspended, which the exec wakes, against an explicit wake and
// then the exec.
const ScenarioIdleWake = "idle_wake_to_first_output"

// idleWakeIdleS is the idle_s of idle_wake_to_first_output's sandbox:
// short, so the rounds do not wait long for the suspend, yet longer than
// the gap between the baseline's wake and its exec.
const idleWakeIdleS = 2

// idleWake measures, over the API, an exec of `echo` on a sandbox the
// server suspended for idleness, woken by that exec, to its answer,
// against POST .../wake, its operation waited for, and then the same
// exec, on the same sandbox suspended the same way.
func (r *runner) idleWake(ctx context.Context) (_ Result, err error) {
	s, err := r.apiServer(ctx)
	if err != nil {
		return Result{}, err
	}
	r.progressf("booting a %s sandbox with idle_s %d over the API", r.tpl.Ref(), idleWakeIdleS)
	idle := idleWakeIdleS
	created, err := s.client.CreateSandbox(ctx, apiv1.CreateSandbox{Template: r.cfg.Template, IdleS: &idle})
	if err != nil {
		return Result{}, fmt.Errorf("create a sandbox over the API: %w", err)
	}
	id := created.Sandbox.ID
	s.live[id] = true
	defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	op, err := s.client.WaitOperation(ctx, created.Operation.ID)
	if err != nil {
		return Result{}, err
	}
	if op.Status != apiv1.OpSucceeded {
		return Result{}, fmt.Errorf("create sandbox %s: %s", id, opFailure(op))
	}
	exec := func(ctx context.Context) error {
		res, err := s.client.Exec(ctx, id, apiv1.CommandRequest{Argv: []string{"echo", "awake"}})
		if err != nil {
			return fmt.Errorf("exec over the API: %w", err)
		}
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "awake" {
			return fmt.Errorf("exec answered exit %d, stdout %q", res.ExitCode, res.Stdout)
		}
		return nil
	}
	// suspended waits, untimed, for the server to suspend the idle
	// sandbox.
	suspended := func(ctx context.Context) error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			sb, err := s.client.GetSandbox(ctx, id)
			if err != nil {
				return err
			}
			if sb.State == apiv1.StateSuspended {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sandbox %s is still %s two minutes into its idleness", id, sb.State)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	byExec := func(ctx context.Context) (time.Duration, error) {
		if err := suspended(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		err := exec(ctx)
		return time.Since(start), err
	}
	byWake := func(ctx context.Context) (time.Duration, error) {
		if err := suspended(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		op, err := s.client.WakeSandbox(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("wake over the API: %w", err)
		}
		if op, err = s.client.WaitOperation(ctx, op.ID); err != nil {
			return 0, err
		}
		if op.Status != apiv1.OpSucceeded {
			return 0, fmt.Errorf("wake sandbox %s: %s", id, opFailure(op))
		}
		err = exec(ctx)
		return time.Since(start), err
	}
	n := r.cfg.SuspendRuns
	ds, err := timeRounds(ctx, n, []side{{"exec on the idle sandbox", byExec}, {"wake, then exec", byWake}}, func(i int, d []time.Duration) {
		r.progressf("%s: round %d/%d: exec %.0f ms, wake then exec %.0f ms", ScenarioIdleWake, i, n, ms(d[0]), ms(d[1]))
	})
	if err != nil {
		return Result{}, err
	}
	a, b := summarize(ds[0]), summarize(ds[1])
	return Result{Name: ScenarioIdleWake, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("one %s sandbox with idle_s %d, suspended by the server each round before the timing starts; "+
			"airlock: POST /v1/sandboxes/{id}/exec of echo, which wakes it, until its answer; baseline: POST .../wake, "+
			"its operation long-polled to the end, then the same exec; %d rounds each, interleaved; target ratio <= 1.1",
			r.tpl.Ref(), idleWakeIdleS, n)}, nil
}
