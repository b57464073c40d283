package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/vm"
)

// idleSettle is how long idle_pss leaves its VMs idle before it reads
// their memory: the guests' boot-time work (init, the agent's start) is
// over well within it, also under TCG.
const idleSettle = 5 * time.Second

// idlePSS measures the proportional set size of the QEMU of each of
// Config.Sandboxes idle sandboxes, clones of the template's snapshot as
// Create makes them, against that of as many bare clones of the same
// snapshot beside them, with the same jail; and then, as variants, the
// same for as many cold-booted sandboxes against as many bare QEMUs of the
// same memory size booted to their agent beside them, and the clones
// against the cold-booted sandboxes.
func (r *runner) idlePSS(ctx context.Context) (_ Result, err error) {
	// Nothing of the earlier scenarios shares the host's pages or CPU.
	if err := r.close(); err != nil {
		return Result{}, err
	}
	spec := sandbox.Spec{Template: r.cfg.Template}
	if err := r.prepareSnapshot(ctx, r.rt, spec); err != nil {
		return Result{}, err
	}
	bootFloor := func(ctx context.Context) (*bareVM, error) {
		return r.startBare(ctx, vm.Config{
			Kernel: r.cfg.Dir.Kernel(), Initramfs: r.cfg.Dir.Initramfs(), Accel: r.rt.Accel(), CPU: r.rt.CPU(),
			VCPUs: r.tpl.VCPUs, MemoryMiB: r.tpl.MemoryMiB,
		}, nil)
	}
	cloneFloor := "bare clones of the same template snapshot (its memory file mapped private, a disk of their own, " +
		"no agent session, init or disk growth)"
	created, err := r.idleFleet(ctx, "created", spec, func(ctx context.Context) (*bareVM, error) {
		snap, err := r.rt.TemplateSnapshot(ctx, spec)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			cloneFloor = "(no template snapshot) bare QEMUs booted to the agent's handshake"
			return bootFloor(ctx)
		}
		return r.startBareClone(ctx, snap)
	})
	if err != nil {
		return Result{}, err
	}
	spec.ColdBoot = true
	cold, err := r.idleFleet(ctx, "cold-booted", spec, bootFloor)
	if err != nil {
		return Result{}, fmt.Errorf("cold boots: %w", err)
	}
	res := idleResult(created, cold)
	n := r.cfg.Sandboxes
	res.Notes = fmt.Sprintf("airlock: PSS (/proc/<pid>/smaps_rollup) of the QEMU of each of %d idle %s sandboxes "+
		"of %d MiB as Create makes them (%d of %d were clones of the template snapshot); baseline: PSS of %d %s, "+
		"each started just before a sandbox (bare, sandbox, bare, ...) and all read beside them after %s idle "+
		"after the last, with the runtime's jail (%s) and cgroup, so that a jailed clone and a bare one map the "+
		"same sealed copy of the snapshot's memory file and the pages all the QEMUs share are split among as "+
		"many processes on both sides; variants: anon (Pss_Anon alone: guest RAM written and QEMU's heap), "+
		"cold_boot and cold_boot_anon, the same for %d sandboxes booted from scratch (Spec.ColdBoot) after the "+
		"first set was removed, against as many bare QEMUs of the same kernel, initramfs, vCPUs and memory, no "+
		"disk, booted to the agent's handshake, started and read the same way (a booted QEMU maps the kernel "+
		"file, which all the booted QEMUs share), and clone_vs_cold_boot: the clones against the cold-booted "+
		"sandboxes (what a clone saves a sandbox's host); no other VM of the bench ran; MiB per sandbox; "+
		"ratios of p50s",
		n, r.tpl.Ref(), r.tpl.MemoryMiB, created.clones, n, n, cloneFloor, idleSettle, jailWord(r.rt.Jailed()), n)
	return res, nil
}

// jailWord says whether a runtime's VMs run jailed.
func jailWord(jailed bool) string {
	if jailed {
		return "on"
	}
	return "off: the runtime runs its VMs unjailed"
}

// idleSet is what idle_pss read of one set of idle sandboxes.
type idleSet struct {
	uses   []memUse // of each sandbox's QEMU
	base   []memUse // of each of the baseline's bare QEMUs, beside them
	clones int      // how many of the sandboxes were clones
}

// idleFleet starts Config.Sandboxes pairs of a bare VM (with startFloor)
// and a sandboxes of spec, one after another, leaves them idle for
// idleSettle and reads the memory use of every QEMU. The sandboxes and
// the bare VMs are gone before it returns.
func (r *runner) idleFleet(ctx context.Context, what string, spec sandbox.Spec, startFloor func(context.Context) (*bareVM, error)) (_ idleSet, err error) {
	n := r.cfg.Sandboxes
	var fleet []*sandbox.Sandbox
	var bares []*bareVM
	defer func() {
		err = errors.Join(err, destroyAll(fleet))
		for _, b := range bares {
			err = errors.Join(err, b.close())
		}
	}()
	var set idleSet
	for i := 1; i <= n; i++ {
		b, err := startFloor(ctx)
		if err != nil {
			return idleSet{}, fmt.Errorf("baseline %d of %d: %w", i, n, err)
		}
		bares = append(bares, b)
		sb, err := r.rt.Create(ctx, spec)
		if err != nil {
			return idleSet{}, fmt.Errorf("create sandbox %d of %d: %w", i, n, err)
		}
		fleet = append(fleet, sb)
		if sb.Snapshot != "" {
			set.clones++
		}
		if i%5 == 0 || i == n {
			r.progressf("%s: %d/%d sandboxes %s, each beside a bare QEMU", ScenarioIdlePSS, i, n, what)
		}
	}
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return idleSet{}, ctx.Err()
	}
	for i, sb := range fleet {
		u, err := readMemUse(sb.Machine().PID())
		if err != nil {
			return idleSet{}, fmt.Errorf("sandbox %s: %w", sb.ID, err)
		}
		set.uses = append(set.uses, u)
		if u, err = readMemUse(bares[i].m.PID()); err != nil {
			return idleSet{}, fmt.Errorf("baseline: %w", err)
		}
		set.base = append(set.base, u)
	}
	return set, nil
}

// idleResult assembles the idle_pss result: the sandboxes as Create makes
// them against the bare VMs beside them, and as variants their anonymous
// part and the cold-booted set, each against the matching figure of the
// bare VMs beside its set, and the clones against the cold boots.
func idleResult(created, cold idleSet) Result {
	total := func(u memUse) int64 { return u.pssKiB }
	anon := func(u memUse) int64 { return u.anonKiB }
	a, b := created.summary(total)
	res := Result{Name: ScenarioIdlePSS, Unit: "MiB", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50)}
	add := func(name string, set idleSet, of func(memUse) int64) {
		a, b := set.summary(of)
		res.Variants = append(res.Variants, Variant{Name: name, Measurement: a, Ratio: ratio(a.P50, b.P50), Baseline: &b})
	}
	// A kernel that does not report Pss_Anon leaves the anon variants out.
	hasAnon := len(created.base) > 0 && created.base[0].anonKiB > 0
	if hasAnon {
		add("anon", created, anon)
	}
	if len(cold.uses) > 0 {
		add("cold_boot", cold, total)
		if hasAnon {
			add("cold_boot_anon", cold, anon)
		}
		c, _ := cold.summary(total)
		res.Variants = append(res.Variants, Variant{Name: "clone_vs_cold_boot", Measurement: a, Ratio: ratio(a.P50, c.P50), Baseline: &c})
	}
	return res
}

// summary summarizes one figure, in KiB, of the set's sandboxes and of
// the bare QEMUs beside them.
func (s idleSet) summary(of func(memUse) int64) (sandboxes, bare Measurement) {
	kib := func(us []memUse) []int64 {
		out := make([]int64, len(us))
		for i, u := range us {
			out[i] = of(u)
		}
		return out
	}
	return summarizeKiB(kib(s.uses)), summarizeKiB(kib(s.base))
}

// memUse is a process's proportional set size, in KiB, as its
// smaps_rollup reports it: all of it and its anonymous part (0 when the
// kernel does not say).
type memUse struct {
	pssKiB, anonKiB int64
}

// readMemUse reads the memory use of process pid.
func readMemUse(pid int) (memUse, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return memUse{}, fmt.Errorf("read the memory use of qemu (pid %d): %w", pid, err)
	}
	u, err := parseSmapsRollup(b)
	if err != nil {
		return memUse{}, fmt.Errorf("read the memory use of qemu (pid %d): %w", pid, err)
	}
	return u, nil
}

// parseSmapsRollup reads the Pss and Pss_Anon lines of a smaps_rollup
// file; Pss must be there.
func parseSmapsRollup(b []byte) (memUse, error) {
	var u memUse
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "Pss" && key != "Pss_Anon") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return memUse{}, fmt.Errorf("malformed %s line %q", key, sc.Text())
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kib < 0 {
			return memUse{}, fmt.Errorf("malformed %s line %q", key, sc.Text())
		}
		if key == "Pss" {
			u.pssKiB, found = kib, true
		} else {
			u.anonKiB = kib
		}
	}
	if !found {
		return memUse{}, errors.New("smaps_rollup has no Pss line")
	}
	return u, nil
}

// concurrentBootTimeout bounds each boot of concurrent_create: n boots
// share cpus host CPUs, so each may take n/cpus times as long as one
// alone.
func concurrentBootTimeout(one time.Duration, n, cpus int) time.Duration {
	cpus = max(1, cpus)
	return one * time.Duration(max(1, (n+cpus-1)/cpus))
}

// concurrentCreate measures Config.Sandboxes Runtime.Create calls made at
// once against as many creates made alone, one after another, half of
// them just before the concurrent ones and half just after, so that drift
// hits both sides.
func (r *runner) concurrentCreate(ctx context.Context) (_ Result, err error) {
	// Nothing of the earlier scenarios competes for the CPU.
	if err := r.close(); err != nil {
		return Result{}, err
	}
	n := r.cfg.Sandboxes
	// A runtime of its own: the same directory and accelerator, with a
	// boot timeout that allows for n boots sharing the CPUs.
	timeout := concurrentBootTimeout(r.cfg.BootTimeout, n, runtime.NumCPU())
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: r.cfg.Dir, Accel: r.cfg.Accel, BootTimeout: timeout, Log: r.cfg.Log})
	if err != nil {
		return Result{}, err
	}
	spec := sandbox.Spec{Template: r.cfg.Template}
	if err := r.prepareSnapshot(ctx, rt, spec); err != nil {
		return Result{}, err
	}

	var singles []time.Duration
	singleClones := 0
	alone := func(k int) error {
		for range k {
			start := time.Now()
			sb, err := rt.Create(ctx, spec)
			d := time.Since(start)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			if sb.Snapshot != "" {
				singleClones++
			}
			if err := destroy(sb); err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			singles = append(singles, d)
		}
		return nil
	}
	before := n / 2
	r.progressf("%s: %d creates alone, one after another", ScenarioConcurrent, before)
	if err := alone(before); err != nil {
		return Result{}, err
	}
	r.progressf("%s: now %d at once", ScenarioConcurrent, n)

	ds := make([]time.Duration, n)
	errs := make([]error, n)
	made := make([]*sandbox.Sandbox, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() { // ends when its create does, bounded by ctx and the boot timeout
			defer wg.Done()
			t := time.Now()
			made[i], errs[i] = rt.Create(ctx, spec)
			ds[i] = time.Since(t)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var live []*sandbox.Sandbox
	clones := 0
	for _, sb := range made {
		if sb != nil {
			live = append(live, sb)
			if sb.Snapshot != "" {
				clones++
			}
		}
	}
	// Destroyed before the creates alone that follow, which must not
	// share the host with them.
	if derr := destroyAll(live); derr != nil || ctx.Err() != nil {
		return Result{}, errors.Join(ctx.Err(), derr)
	}
	r.progressf("%s: %d at once in %.0f ms; %d creates alone", ScenarioConcurrent, n, ms(wall), n-before)
	if err := alone(n - before); err != nil {
		return Result{}, err
	}
	res, err := concurrentResult(singles, ds, errs, wall)
	r.progressf("%s: p50 %.0f ms at once, %.0f ms alone", ScenarioConcurrent, res.Airlock.P50, res.Baseline.P50)
	res.Notes = fmt.Sprintf("airlock: %d sandbox.Runtime.Create calls of template %s started at once from as many "+
		"goroutines, each timed to its return (agent ready, init answered; %d of the %d that succeeded were clones of "+
		"the template snapshot, made beforehand), boot timeout %s each; baseline: %d creates of the same template "+
		"alone, one after another on the same runtime, %d just before and %d just after (%d of them clones), each "+
		"destroyed before the next; variant wall: from the first start to the last return, against the sum of "+
		"the creates alone (the same creates one after another: below 1, creating them at once is faster); no "+
		"other VM of the bench ran; ratios of p50s",
		n, r.tpl.Ref(), clones, res.Airlock.Runs, timeout, len(singles), before, n-before, singleClones)
	return res, err
}

// concurrentResult assembles the concurrent_create result from the creates
// alone and the outcomes of the concurrent ones (ds[i] is the duration of
// the create that returned errs[i]). A failed create is counted in the
// airlock side's failures, left out of its statistics and fails the
// scenario: the error is returned with the result. The wall variant is
// compared with the creates alone end to end: their sum.
func concurrentResult(singles, ds []time.Duration, errs []error, wall time.Duration) (Result, error) {
	var ok []time.Duration
	var failed []error
	for i, d := range ds {
		if errs[i] != nil {
			failed = append(failed, errs[i])
			continue
		}
		ok = append(ok, d)
	}
	var serial time.Duration
	for _, d := range singles {
		serial += d
	}
	a, b := summarize(ok), summarize(singles)
	w, sb := summarize([]time.Duration{wall}), summarize([]time.Duration{serial})
	a.Failures = len(failed)
	res := Result{
		Name: ScenarioConcurrent, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50),
		Variants: []Variant{{Name: "wall", Measurement: w, Ratio: ratio(w.P50, sb.P50), Baseline: &sb}},
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("%d of %d concurrent creates failed; the first: %w", len(failed), len(ds), failed[0])
	}
	return res, nil
}

// cloneWord says whether a sandbox was a clone of its template snapshot.
func cloneWord(clone bool) string {
	if clone {
		return "a clone"
	}
	return "booted, not a clone"
}

// prepareSnapshot makes rt's template snapshot for spec, unless it is
// there, before anything is timed, so that no timed create pays for its
// making. A snapshot that cannot be made is not an error: Create then
// boots the sandboxes instead, and the scenarios' notes count the clones.
func (r *runner) prepareSnapshot(ctx context.Context, rt *sandbox.Runtime, spec sandbox.Spec) error {
	start := time.Now()
	if _, err := rt.TemplateSnapshot(ctx, spec); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.progressf("the template snapshot of %s cannot be used, sandboxes will boot: %s", spec.Template, firstLine(err.Error()))
		return nil
	}
	if d := time.Since(start); d > time.Second {
		r.progressf("made the template snapshot of %s in %.0f ms", spec.Template, ms(d))
	}
	return nil
}

// destroyAll destroys the sandboxes, all at once.
func destroyAll(sbs []*sandbox.Sandbox) error {
	errs := make([]error, len(sbs))
	var wg sync.WaitGroup
	for i, sb := range sbs {
		wg.Add(1)
		go func() { // ends within destroyTimeout
			defer wg.Done()
			errs[i] = destroy(sb)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
