package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/timings"
)

// The checkpoint and fork scenarios work on one source sandbox of
// forkMemoryMiB whose guest holds forkDirtyMiB of RAM it wrote (a file of
// random bytes on its /dev/shm, a tmpfs: RAM the guest keeps, none of it
// zero pages a save could skip). They go through the runtime
// (sandbox.Runtime.Checkpoint, Create from a checkpoint) rather than the
// API, as a fork over the API does (internal/checkpoint: one checkpoint,
// then the children created at once), without the API's own cost per
// request, which api_create_to_first_output prices. Every checkpoint a
// scenario makes is removed when it ends, after its sandboxes.

const (
	// forkMemoryMiB is the memory of the source sandbox, and so of its
	// children and of the clones they are measured against.
	forkMemoryMiB = 512
	// forkDirtyMiB is how much of the source's RAM its guest has written.
	forkDirtyMiB = 100
	// forkChildren is how many children the larger fork makes, and
	// fork_marginal_pss measures.
	forkChildren = 10
	// forkStopConts is how many QMP stop and cont checkpoint_pause_ms
	// times before each checkpoint, its baseline.
	forkStopConts = 5
	// checkpointTimeout bounds one checkpoint of the source, under TCG:
	// a live save of its RAM and the memory file written from it.
	checkpointTimeout = 5 * time.Minute
	// dirtyTimeout bounds the writing of the source's forkDirtyMiB.
	dirtyTimeout = 5 * time.Minute
)

// dirtyArgv writes forkDirtyMiB of random bytes to the guest's /dev/shm.
var dirtyArgv = []string{"dd", "if=/dev/urandom", "of=/dev/shm/airlock-bench-dirty", "bs=1M", "count=" + strconv.Itoa(forkDirtyMiB)}

// forkSource is the sandbox the checkpoint and fork scenarios checkpoint,
// and the checkpoints made of it. Only one goroutine uses it.
type forkSource struct {
	sb    *sandbox.Sandbox
	rt    *sandbox.Runtime
	made  []string // checkpoint IDs, to remove
	steps []timings.Timings
}

// forkSpec is the spec of the source and of the clones of the baselines.
func (r *runner) forkSpec() sandbox.Spec {
	return sandbox.Spec{Template: r.cfg.Template, MemoryMiB: forkMemoryMiB}
}

// startForkSource creates the source sandbox, from the template snapshot
// of forkSpec (made first if need be, untimed), and has its guest write
// forkDirtyMiB. The VMs of earlier scenarios go first, as for the fleet
// scenarios: a stall and a dozen VMs at once are what the CPUs' sharing
// changes most.
func (r *runner) startForkSource(ctx context.Context, scenario string) (*forkSource, error) {
	if err := r.close(); err != nil {
		return nil, err
	}
	spec := r.forkSpec()
	start := time.Now()
	if _, err := r.rt.TemplateSnapshot(ctx, spec); err != nil {
		return nil, fmt.Errorf("template snapshot of %s with %d MiB: %w", r.tpl.Ref(), forkMemoryMiB, err)
	}
	r.progressf("%s: template snapshot of %d MiB ready (%.0f ms)", scenario, forkMemoryMiB, ms(time.Since(start)))
	sb, err := r.rt.Create(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("create the source sandbox: %w", err)
	}
	src := &forkSource{sb: sb, rt: r.rt}
	dctx, cancel := context.WithTimeout(ctx, dirtyTimeout)
	defer cancel()
	start = time.Now()
	if err := runInSandbox(dctx, sb, dirtyArgv, nil); err != nil {
		return nil, errors.Join(fmt.Errorf("write %d MiB in the source sandbox: %w", forkDirtyMiB, err), src.close())
	}
	r.progressf("%s: source sandbox %s of %d MiB has written %d MiB (%.0f ms)", scenario, sb.ID, forkMemoryMiB, forkDirtyMiB, ms(time.Since(start)))
	return src, nil
}

// checkpoint makes a checkpoint of the source, within checkpointTimeout,
// and keeps its steps.
func (s *forkSource) checkpoint(ctx context.Context) (sandbox.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	id := sandbox.NewCheckpointID()
	s.made = append(s.made, id)
	cp, err := s.rt.Checkpoint(ctx, s.sb, id)
	if err != nil {
		return cp, err
	}
	s.steps = append(s.steps, cp.Timings)
	return cp, nil
}

// close destroys the source and removes every checkpoint made of it; the
// sandboxes made from them must be gone before.
func (s *forkSource) close() error {
	errs := []error{destroy(s.sb)}
	for _, id := range s.made {
		removed, err := s.rt.RemoveCheckpoint(id)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("remove checkpoint %s: %w", id, err))
		case !removed:
			errs = append(errs, fmt.Errorf("checkpoint %s is still in use by a sandbox and stays", id))
		}
	}
	return errors.Join(errs...)
}

// checkpointPause measures how long a checkpoint (sandbox.Runtime.Checkpoint)
// of a running 512 MiB sandbox with 100 MiB written stops its vCPUs, as
// the checkpoint reports it and as QEMU does, and the checkpoint's whole
// time, against QMP stop then cont on the same sandbox's QEMU.
func (r *runner) checkpointPause(ctx context.Context) (_ Result, err error) {
	src, err := r.startForkSource(ctx, ScenarioCheckpointPause)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, src.close()) }()
	m := src.sb.Machine()
	stopCont := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
		defer cancel()
		if err := m.Pause(ctx); err != nil {
			return err
		}
		return m.Resume(ctx)
	})
	if _, err := timeRounds(ctx, execWarmup, []side{{"stop and cont", stopCont}}, nil); err != nil {
		return Result{}, fmt.Errorf("warm up: %w", err)
	}
	n := r.cfg.ForkRuns
	var stalls, downtimes, totals, bases []time.Duration
	for i := 1; i <= n; i++ {
		ds, err := timeRounds(ctx, forkStopConts, []side{{"stop and cont", stopCont}}, nil)
		if err != nil {
			return Result{}, err
		}
		bases = append(bases, ds[0]...)
		start := time.Now()
		cp, err := src.checkpoint(ctx)
		total := time.Since(start)
		if err != nil {
			return Result{}, fmt.Errorf("checkpoint %d: %w", i, err)
		}
		down, err := m.SaveDowntime(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("checkpoint %d: %w", i, err)
		}
		stalls, downtimes, totals = append(stalls, cp.Stall), append(downtimes, down), append(totals, total)
		r.progressf("%s %d/%d: stall %.1f ms (QEMU's downtime %.0f ms), checkpoint %.0f ms, %d MiB; stop and cont p50 %.1f ms",
			ScenarioCheckpointPause, i, n, ms(cp.Stall), ms(down), ms(total), cp.SizeBytes>>20, summarize(ds[0]).P50)
	}
	res := checkpointPauseResult(summarize(stalls), summarize(downtimes), summarize(totals), summarize(bases))
	res.Timings = stepTimings(src.steps, nil)
	res.Notes = fmt.Sprintf("airlock: sandbox.Runtime.Checkpoint of one running %s sandbox of %d MiB (a clone of its "+
		"template snapshot) whose guest wrote %d MiB of random bytes to its /dev/shm first; headline: how long its "+
		"vCPUs stood still, as the checkpoint reports it (Checkpoint.Stall: under TCG from the QMP stop the save "+
		"makes before it copies the RAM, under KVM from when a poll of the live save sees "+
		"QEMU stopped before the switchover; through the disk switch, the device state and the poll that sees the "+
		"save's end, to QMP cont's answer); under KVM it misses the moment between QEMU's stop and that "+
		"poll, which variant qemu_downtime, QEMU's own downtime of the save (query-migrate, whole ms, from just "+
		"before its stop to the end of the state, without the cont; under TCG only the switchover), includes; variant total: the whole checkpoint "+
		"(overlay, live save, memory file written by a helper QEMU and synced, record); baseline: QMP stop then "+
		"cont on the same sandbox's QEMU, timed from the client, %d before each checkpoint after %d untimed; "+
		"%d checkpoints, each left in place until the end; ratios of p50s; timings: p50 per step of the checkpoints",
		r.tpl.Ref(), forkMemoryMiB, forkDirtyMiB, forkStopConts, execWarmup, n)
	return res, nil
}

// checkpointPauseResult assembles checkpoint_pause_ms: the stall the
// checkpoints reported against QMP stop and cont, and as variants QEMU's
// own downtime and the checkpoints' whole time against the same.
func checkpointPauseResult(stall, downtime, total, stopCont Measurement) Result {
	return Result{
		Name: ScenarioCheckpointPause, Unit: "ms", Airlock: stall, Baseline: stopCont, Ratio: ratio(stall.P50, stopCont.P50),
		Variants: []Variant{
			{Name: "qemu_downtime", Measurement: downtime, Ratio: ratio(downtime.P50, stopCont.P50)},
			{Name: "total", Measurement: total, Ratio: ratio(total.P50, stopCont.P50)},
		},
	}
}

// forkRun is one fork: a checkpoint of the source, then its children,
// each created from it and running a command to its first output.
type forkRun struct {
	cp       sandbox.Checkpoint
	children []*sandbox.Sandbox // those created, also when some failed
	// checkpoint is how long the checkpoint took, and total until the
	// last child's first output, both from the fork's start.
	checkpoint, total time.Duration
}

// fork checkpoints the source and creates n children from the checkpoint
// at once, each running firstOutputArgv until its first stdout byte and
// its exit. The caller destroys the children, also when it fails.
func (r *runner) fork(ctx context.Context, src *forkSource, n int) (forkRun, error) {
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout+concurrentBootTimeout(r.firstOutputTimeout(), n, runtime.NumCPU()))
	defer cancel()
	var run forkRun
	start := time.Now()
	cp, err := src.checkpoint(ctx)
	if err != nil {
		return run, fmt.Errorf("checkpoint: %w", err)
	}
	run.cp, run.checkpoint = cp, time.Since(start)
	sbs := make([]*sandbox.Sandbox, n)
	seen := make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { // ends with ctx, which bounds the create and the exec
			defer wg.Done()
			sb, err := r.rt.Create(ctx, sandbox.Spec{Checkpoint: cp.ID})
			if err != nil {
				errs[i] = fmt.Errorf("child %d of %d: %w", i+1, n, err)
				return
			}
			sbs[i] = sb
			if seen[i], err = firstOutputIn(ctx, sb); err != nil {
				errs[i] = fmt.Errorf("child %d of %d (%s): %w", i+1, n, sb.ID, err)
			}
		}()
	}
	wg.Wait()
	last := start
	for i, sb := range sbs {
		if sb != nil {
			run.children = append(run.children, sb)
		}
		if seen[i].After(last) {
			last = seen[i]
		}
	}
	if err := errors.Join(errs...); err != nil {
		return run, err
	}
	run.total = last.Sub(start)
	return run, nil
}

// firstOutputIn runs firstOutputArgv in sb and returns when its first
// stdout byte came; it fails unless the command then exits 0.
func firstOutputIn(ctx context.Context, sb *sandbox.Sandbox) (time.Time, error) {
	first := newFirstWrite()
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: firstOutputArgv}, agentclient.Stdio{Stdout: first})
	if err != nil {
		return time.Time{}, fmt.Errorf("exec %s: %w", firstOutputArgv[0], err)
	}
	var at time.Time
	select {
	case <-first.seen:
		at = time.Now()
	case <-p.Done():
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("wait for the output of %s: %w", firstOutputArgv[0], ctx.Err())
	}
	exit, err := sb.Wait(p)
	if err != nil {
		return time.Time{}, fmt.Errorf("wait for %s: %w", firstOutputArgv[0], err)
	}
	if exit.ExitCode != 0 {
		return time.Time{}, fmt.Errorf("%s exited with status %d", firstOutputArgv[0], exit.ExitCode)
	}
	if at.IsZero() {
		return time.Time{}, fmt.Errorf("%s exited without writing to stdout", firstOutputArgv[0])
	}
	return at, nil
}

// forkFirstOutput measures a fork of 1 and of forkChildren children of
// the source, each from the start of its checkpoint to the last child's
// first output, against one clone of the template snapshot (of the same
// memory) created to its first output, in alternating rounds.
func (r *runner) forkFirstOutput(ctx context.Context) (_ Result, err error) {
	src, err := r.startForkSource(ctx, ScenarioForkFirstOutput)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, src.close()) }()
	spec := r.forkSpec()
	var cloneSteps, forkSteps []timings.Timings
	clone := func(ctx context.Context) (time.Duration, error) {
		return r.firstOutput(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) {
			return r.rt.Create(ctx, spec)
		}, true, nil, &cloneSteps)
	}
	forkOf := func(n int) measure {
		return func(ctx context.Context) (time.Duration, error) {
			run, err := r.fork(ctx, src, n)
			if derr := destroyAll(run.children); derr != nil {
				err = errors.Join(err, fmt.Errorf("destroy the children: %w", derr))
			}
			if err != nil {
				return 0, err
			}
			if n == forkChildren {
				var t timings.Timings
				t.Add("checkpoint", run.checkpoint)
				t.Add("children to first output", run.total-run.checkpoint)
				forkSteps = append(forkSteps, t)
			}
			return run.total, nil
		}
	}
	n := r.cfg.ForkRuns
	ds, err := timeRounds(ctx, n, []side{{"clone", clone}, {"fork of 1", forkOf(1)}, {"fork of " + strconv.Itoa(forkChildren), forkOf(forkChildren)}},
		func(i int, ds []time.Duration) {
			r.progressf("%s %d/%d: clone %.0f ms, fork of 1 %.0f ms, fork of %d %.0f ms",
				ScenarioForkFirstOutput, i, n, ms(ds[0]), ms(ds[1]), forkChildren, ms(ds[2]))
		})
	if err != nil {
		return Result{}, err
	}
	res := forkResult(summarize(ds[2]), summarize(ds[1]), summarize(ds[0]))
	res.Timings = stepTimings(forkSteps, cloneSteps)
	res.Notes = fmt.Sprintf("airlock: a fork of %d children of one running %s sandbox of %d MiB whose guest wrote %d MiB "+
		"of random bytes to its /dev/shm: sandbox.Runtime.Checkpoint of it (it runs on), then %d Runtime.Create "+
		"from the checkpoint at once (each a QEMU restoring the checkpoint, its memory file mapped private, with "+
		"the guest's identity, entropy and clock renewed), each then Exec of argv %v, timed from the checkpoint's "+
		"start to the last child's first stdout byte; variant fork_1: the same with one child; baseline: one "+
		"Runtime.Create of the same template and memory, a clone of its template snapshot, then the same Exec to "+
		"its first stdout byte; %d rounds (clone, fork of 1, fork of %d), every sandbox destroyed after its "+
		"sample, untimed; ratios of p50s, target for the fork of %d at most 3; timings: p50 of the checkpoint and "+
		"of the children (from the checkpoint's end to the last first output) of the fork of %d, and of the "+
		"clone's create steps and first exec. What bounds the fork on this host (%d CPUs, accelerator %s): each "+
		"child is a QEMU of its own whose restore, agent session, guest reinit and exec run guest code (emulated "+
		"under tcg), and the %d children share the CPUs, so they take at least %d/%d times one clone's CPU time, "+
		"after a checkpoint that copies the source's RAM live and writes it to a memory file before the first "+
		"child starts",
		forkChildren, r.tpl.Ref(), forkMemoryMiB, forkDirtyMiB, forkChildren, firstOutputArgv, n, forkChildren,
		forkChildren, forkChildren, runtime.NumCPU(), r.rt.Accel(), forkChildren, forkChildren, runtime.NumCPU())
	return res, nil
}

// forkResult assembles fork_to_first_output: the fork of forkChildren
// against one clone, and the fork of one as a variant against the same.
func forkResult(forkN, fork1, clone Measurement) Result {
	return Result{
		Name: ScenarioForkFirstOutput, Unit: "ms", Airlock: forkN, Baseline: clone, Ratio: ratio(forkN.P50, clone.P50),
		Variants: []Variant{{Name: "fork_1", Measurement: fork1, Ratio: ratio(fork1.P50, clone.P50)}},
	}
}

// forkMarginalPSS measures what each child of a fork of forkChildren
// costs the host: the PSS of its QEMU and the space its disk overlay
// takes, against as many bare clones of the template snapshot of the same
// memory, started once the children are gone.
func (r *runner) forkMarginalPSS(ctx context.Context) (_ Result, err error) {
	src, err := r.startForkSource(ctx, ScenarioForkPSS)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, src.close()) }()
	snap, err := r.rt.TemplateSnapshot(ctx, r.forkSpec())
	if err != nil {
		return Result{}, err
	}
	run, err := r.fork(ctx, src, forkChildren)
	children := run.children
	defer func() { err = errors.Join(err, destroyAll(children)) }()
	if err != nil {
		return Result{}, err
	}
	r.progressf("%s: %d children forked in %.0f ms", ScenarioForkPSS, forkChildren, ms(run.total))
	if err := settle(ctx); err != nil {
		return Result{}, err
	}
	var kids []childUse
	for _, sb := range children {
		u, err := readChildUse(sb.Machine().PID(), filepath.Join(sb.Dir, "disk.qcow2"))
		if err != nil {
			return Result{}, fmt.Errorf("child %s: %w", sb.ID, err)
		}
		kids = append(kids, u)
	}
	err = destroyAll(children)
	children = nil
	if err != nil {
		return Result{}, fmt.Errorf("destroy the children: %w", err)
	}

	var bares []*bareVM
	defer func() {
		for _, b := range bares {
			err = errors.Join(err, b.close())
		}
	}()
	for i := 1; i <= forkChildren; i++ {
		b, err := r.startBareClone(ctx, snap)
		if err != nil {
			return Result{}, fmt.Errorf("bare clone %d of %d: %w", i, forkChildren, err)
		}
		bares = append(bares, b)
	}
	r.progressf("%s: %d bare clones started", ScenarioForkPSS, forkChildren)
	if err := settle(ctx); err != nil {
		return Result{}, err
	}
	var base []childUse
	for _, b := range bares {
		u, err := readChildUse(b.m.PID(), b.cfg.Disk)
		if err != nil {
			return Result{}, fmt.Errorf("bare clone: %w", err)
		}
		base = append(base, u)
	}
	res := forkPSSResult(kids, base)
	res.Notes = fmt.Sprintf("airlock: the %d children of one fork (as fork_to_first_output's: a checkpoint, then %d "+
		"Runtime.Create from it at once, each running argv %v) of a running %s sandbox of %d MiB whose guest wrote "+
		"%d MiB of random bytes to its /dev/shm, left %s idle: PSS (/proc/<pid>/smaps_rollup) of each child's QEMU; "+
		"baseline: %d bare clones of the template snapshot of the same memory (its memory file mapped private, "+
		"a disk of their own, no agent session, init or disk growth, with the runtime's jail (%s)), started "+
		"once the children were gone and read after as long idle; the children's pages of the checkpoint's "+
		"memory file are shared among the %d of them, the bare clones' of the template's among them and the "+
		"source; variants: anon (Pss_Anon: guest RAM written since the restore and QEMU's heap), disk_allocated "+
		"(the blocks of each one's disk overlay) and disk_size (its length); the fork's checkpoint took %.1f MiB "+
		"of disk once, for all its children (its memory file and the source's disk up to then); MiB per child; "+
		"ratios of p50s",
		forkChildren, forkChildren, firstOutputArgv, r.tpl.Ref(), forkMemoryMiB, forkDirtyMiB, idleSettle,
		forkChildren, jailWord(r.rt.Jailed()), forkChildren, float64(run.cp.SizeBytes)/(1<<20))
	return res, nil
}

// settle waits idleSettle, or until ctx ends.
func settle(ctx context.Context) error {
	select {
	case <-time.After(idleSettle):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// childUse is what one VM of fork_marginal_pss costs the host: its QEMU's
// memory and its disk overlay's allocated blocks and length, in KiB.
type childUse struct {
	mem                  memUse
	diskKiB, diskSizeKiB int64
}

// readChildUse reads the memory use of QEMU pid and the size of disk.
func readChildUse(pid int, disk string) (childUse, error) {
	u, err := readMemUse(pid)
	if err != nil {
		return childUse{}, err
	}
	alloc, size, err := fileSpace(disk)
	if err != nil {
		return childUse{}, err
	}
	return childUse{mem: u, diskKiB: alloc >> 10, diskSizeKiB: size >> 10}, nil
}

// fileSpace returns the bytes path's blocks take on the disk and its
// length.
func fileSpace(path string) (allocated, size int64, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, fmt.Errorf("size of a disk overlay: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("size of a disk overlay %s: no block count", path)
	}
	return st.Blocks * 512, fi.Size(), nil
}

// forkPSSResult assembles fork_marginal_pss: the children's PSS against
// the bare clones', and as variants the anonymous part and the disk
// overlays' allocated blocks and lengths, each against the bare clones'.
func forkPSSResult(kids, base []childUse) Result {
	of := func(us []childUse, f func(childUse) int64) Measurement {
		out := make([]int64, len(us))
		for i, u := range us {
			out[i] = f(u)
		}
		return summarizeKiB(out)
	}
	pss := func(u childUse) int64 { return u.mem.pssKiB }
	a, b := of(kids, pss), of(base, pss)
	res := Result{Name: ScenarioForkPSS, Unit: "MiB", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50)}
	for _, v := range []struct {
		name string
		f    func(childUse) int64
	}{
		{"anon", func(u childUse) int64 { return u.mem.anonKiB }},
		{"disk_allocated", func(u childUse) int64 { return u.diskKiB }},
		{"disk_size", func(u childUse) int64 { return u.diskSizeKiB }},
	} {
		va, vb := of(kids, v.f), of(base, v.f)
		res.Variants = append(res.Variants, Variant{Name: v.name, Measurement: va, Ratio: ratio(va.P50, vb.P50), Baseline: &vb})
	}
	return res
}
