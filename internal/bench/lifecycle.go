package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/vm"
)

// pauseTimeout bounds one pause or resume of pause_resume, on either side.
const pauseTimeout = 30 * time.Second

// suspendTimeout bounds one phase of suspend_wake_512 (a suspend, a wake,
// a save or a restore) on either side: ample for 512 MiB under TCG.
const suspendTimeout = 2 * time.Minute

// suspendMemoryMiB is the memory of the sandbox suspend_wake_512 suspends.
const suspendMemoryMiB = 512

// pauseResume measures Sandbox.Pause and Sandbox.Resume, which refreshes
// the guest's clock and entropy through the agent, against QMP stop and
// cont on the same sandbox's QEMU, without airlock around them.
func (r *runner) pauseResume(ctx context.Context) (Result, error) {
	sb, err := r.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	m := sb.Machine()
	bounded := func(f func(context.Context) error) measure {
		return timed(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
			defer cancel()
			return f(ctx)
		})
	}
	sides := []side{
		{"pause", bounded(sb.Pause)},
		{"resume", bounded(sb.Resume)},
		{"baseline stop", bounded(m.Pause)},
		{"baseline cont", bounded(m.Resume)},
	}
	n := r.cfg.PauseRuns
	ds, err := r.warmRounds(ctx, ScenarioPause, n, 5, sides)
	if err != nil {
		return Result{}, err
	}
	res := twoPhase(ScenarioPause, [2]string{"pause", "resume"}, ds)
	res.Notes = fmt.Sprintf("airlock: Sandbox.Pause (QMP stop) then Sandbox.Resume (QMP cont, then the agent's refresh of "+
		"the guest's clock and entropy) of one running %s sandbox; baseline: QMP stop then cont on the same sandbox's "+
		"QEMU, without the sandbox's bookkeeping or the refresh, so the ratio is what airlock adds to the VMM's own "+
		"pause; %d rounds each after %d untimed, alternating; headline: the whole round, variants pause and resume "+
		"against stop and cont; ratios of p50s", r.tpl.Ref(), n, execWarmup)
	return res, nil
}

// twoPhase assembles the result of a scenario whose rounds time two
// phases on each side; ds holds airlock's first and second phase, then the
// baseline's. The headline compares whole rounds, and a variant per phase
// of airlock compares it with the baseline's matching phase.
func twoPhase(name string, phases [2]string, ds [][]time.Duration) Result {
	a, b := summarize(sumRounds(ds[0], ds[1])), summarize(sumRounds(ds[2], ds[3]))
	res := Result{Name: name, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50)}
	for i, phase := range phases {
		va, vb := summarize(ds[i]), summarize(ds[i+2])
		res.Variants = append(res.Variants, Variant{Name: phase, Measurement: va, Ratio: ratio(va.P50, vb.P50), Baseline: &vb})
	}
	return res
}

// sumRounds adds two phases' durations round by round.
func sumRounds(a, b []time.Duration) []time.Duration {
	out := make([]time.Duration, min(len(a), len(b)))
	for i := range out {
		out[i] = a[i] + b[i]
	}
	return out
}

// suspendWake measures Sandbox.Suspend and Runtime.Wake of a 512 MiB
// sandbox against QEMU saving the state of a bare VM of the same
// configuration to a file and a fresh QEMU restoring it.
func (r *runner) suspendWake(ctx context.Context) (_ Result, err error) {
	r.progressf("booting a %s sandbox with %d MiB", r.tpl.Ref(), suspendMemoryMiB)
	sb, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template, MemoryMiB: suspendMemoryMiB})
	if err != nil {
		return Result{}, err
	}
	id := sb.ID
	suspended := false // sb is spent and the sandbox lives in its directory
	defer func() {
		if suspended {
			rctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
			defer cancel()
			err = errors.Join(err, r.rt.Remove(rctx, id))
			return
		}
		err = errors.Join(err, destroy(sb))
	}()
	bare, err := r.suspendBaseline(ctx, sb)
	if err != nil {
		return Result{}, fmt.Errorf("baseline: %w", err)
	}
	defer func() { err = errors.Join(err, bare.close()) }()

	var airBytes, bareBytes int64
	bareState := filepath.Join(bare.dir, sandbox.StateName)
	sides := []side{
		{"suspend", func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
			defer cancel()
			start := time.Now()
			err := sb.Suspend(ctx)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			suspended = true
			return d, largest(&airBytes, filepath.Join(sb.Dir, sandbox.StateName))
		}},
		{"wake", func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
			defer cancel()
			start := time.Now()
			woken, err := r.rt.Wake(ctx, id)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			sb, suspended = woken, false
			return d, nil
		}},
		{"baseline save", func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
			defer cancel()
			start := time.Now()
			err := bare.save(ctx, bareState)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			return d, largest(&bareBytes, bareState)
		}},
		{"baseline restore", func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
			defer cancel()
			return timed(func(ctx context.Context) error {
				if err := bare.restore(ctx, bareState, false); err != nil {
					return err
				}
				// A wake uses its state up too.
				return os.Remove(bareState)
			})(ctx)
		}},
	}
	n := r.cfg.SuspendRuns
	ds, err := timeRounds(ctx, n, sides, func(i int, ds []time.Duration) {
		r.progressf("%s %d/%d: suspend %.0f ms, wake %.0f ms, bare save %.0f ms, bare restore %.0f ms",
			ScenarioSuspend, i, n, ms(ds[0]), ms(ds[1]), ms(ds[2]), ms(ds[3]))
	})
	if err != nil {
		return Result{}, err
	}
	res := twoPhase(ScenarioSuspend, [2]string{"suspend", "wake"}, ds)
	res.Variants[0].Bytes, res.Variants[0].Baseline.Bytes = airBytes, bareBytes
	how := "booted (not a clone: its template snapshot could not be used); baseline: a bare QEMU of the same " +
		"configuration with a disk of its own, booted to the agent's handshake"
	if bare.cfg.MemoryFile != "" {
		how = "cloned from its template snapshot; baseline: a bare clone of the same snapshot (the same " +
			"configuration, the snapshot's memory file mapped private, a disk of its own, no agent session or init)"
	}
	res.Notes = fmt.Sprintf("airlock: Sandbox.Suspend (state saved to the sandbox's directory, QEMU ended) then "+
		"Runtime.Wake (QEMU started again, state restored, agent session, guest refresh) of one running %s sandbox "+
		"of %d MiB, %s, saving its whole state to a file and quitting, then a fresh QEMU restoring that file and "+
		"running on; %d rounds each, alternating; headline: the whole round, variants suspend and wake against "+
		"save and restore, bytes: the largest state file; ratios of p50s",
		r.tpl.Ref(), suspendMemoryMiB, how, n)
	return res, nil
}

// suspendBaseline starts the bare VM that suspend_wake_512 saves and
// restores beside sb: with the configuration sb's VM started with, and,
// when sb is a clone of a template snapshot, as a clone of the same
// snapshot, so that both map the same memory file the same way.
func (r *runner) suspendBaseline(ctx context.Context, sb *sandbox.Sandbox) (*bareVM, error) {
	cfg, err := recordedVM(sb.Dir)
	if err != nil {
		return nil, err
	}
	if cfg.MemoryFile == "" || cfg.MemoryShared {
		// A booted sandbox. Never map another's memory file shared: the
		// bare VM would write into it.
		cfg.MemoryFile, cfg.MemoryShared = "", false
		r.progressf("booting a bare QEMU of the same configuration")
		return r.startBare(ctx, cfg, r.imageDisk(sb.Spec.DiskMiB))
	}
	snap, err := r.rt.TemplateSnapshot(ctx, sandbox.Spec{Template: r.cfg.Template, MemoryMiB: suspendMemoryMiB})
	if err != nil {
		return nil, err
	}
	if snap.MemFile != cfg.MemoryFile {
		return nil, fmt.Errorf("the sandbox maps %s, but its template snapshot is now %s", cfg.MemoryFile, snap.MemFile)
	}
	r.progressf("starting a bare clone of the same template snapshot")
	return r.startBareClone(ctx, snap)
}

// largest stats the file at path and raises *size to its size.
func largest(size *int64, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("size of the saved state: %w", err)
	}
	*size = max(*size, fi.Size())
	return nil
}

// recordedVM reads the configuration a sandbox's VM was started with from
// the record (sandbox.RecordName) in its directory dir.
func recordedVM(dir string) (vm.Config, error) {
	var rec struct {
		VM vm.Config `json:"vm"`
	}
	b, err := os.ReadFile(filepath.Join(dir, sandbox.RecordName))
	if err != nil {
		return vm.Config{}, fmt.Errorf("read the sandbox's VM record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return vm.Config{}, fmt.Errorf("read the sandbox's VM record: %w", err)
	}
	return rec.VM, nil
}

// bareVM is a QEMU without a sandbox around it, as the baselines run it,
// in a directory of its own under the data directory's sandboxes/, whose
// paths are short enough for unix sockets. It runs with the jail and
// cgroup the run's runtime gives its sandboxes (none when it runs them
// unjailed), so that a baseline and the sandboxes it is measured against
// differ only in what airlock adds. Only one goroutine uses it.
type bareVM struct {
	dir     string
	cfg     vm.Config // as it starts: Dir and Disk its own, Incoming off
	m       *vm.Machine
	log     *slog.Logger
	release func() // frees the jail's user and the cgroup; nil before they are taken
}

// newBareDir makes a directory for a bare VM.
func newBareDir(d datadir.Dir) (string, error) {
	if err := os.MkdirAll(d.Sandboxes(), 0o755); err != nil {
		return "", fmt.Errorf("create sandboxes directory: %w", err)
	}
	dir, err := os.MkdirTemp(d.Sandboxes(), "bench-")
	if err != nil {
		return "", fmt.Errorf("create a bare VM's directory: %w", err)
	}
	return dir, nil
}

// bareDisk is a bare VM's own disk: a qcow2 overlay over the chain
// backing (nearest first, the nearest in format), of sizeMiB (0: the
// nearest's size), as a sandbox's disk is made.
type bareDisk struct {
	backing []string
	format  string
	sizeMiB int
}

// imageDisk is a disk over the run's template image alone, of sizeMiB
// (0: the image's size).
func (r *runner) imageDisk(sizeMiB int) *bareDisk {
	return &bareDisk{backing: []string{r.tpl.Image}, format: "raw", sizeMiB: sizeMiB}
}

// newBare prepares a bare VM of cfg, whose Dir it replaces, and starts
// nothing yet: its directory, its disk (one qemu-img create, or none when
// disk is nil), and the runtime's jail and cgroup. On failure nothing of
// it is left.
func (r *runner) newBare(ctx context.Context, cfg vm.Config, disk *bareDisk) (_ *bareVM, err error) {
	dir, err := newBareDir(r.cfg.Dir)
	if err != nil {
		return nil, err
	}
	b := &bareVM{dir: dir, log: r.cfg.Log}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close())
		}
	}()
	cfg.Dir, cfg.Disk, cfg.Backing, cfg.Detach, cfg.Incoming = dir, "", nil, false, false
	cfg.Jail, cfg.Cgroup = nil, nil
	if disk != nil {
		cfg.Disk, cfg.Backing = filepath.Join(dir, "disk.qcow2"), disk.backing
		if err := createOverlay(ctx, disk.backing[0], disk.format, cfg.Disk, disk.sizeMiB); err != nil {
			return nil, err
		}
	}
	if b.release, err = r.rt.Confine(&cfg); err != nil {
		return nil, fmt.Errorf("jail a bare qemu: %w", err)
	}
	b.cfg = cfg
	return b, nil
}

// startBare boots a bare VM of cfg as newBare prepares it until its agent
// answers the handshake, and closes the agent session again.
func (r *runner) startBare(ctx context.Context, cfg vm.Config, disk *bareDisk) (_ *bareVM, err error) {
	b, err := r.newBare(ctx, cfg, disk)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close())
		}
	}()
	if err := b.boot(ctx, r.cfg.BootTimeout); err != nil {
		return nil, err
	}
	return b, nil
}

// boot starts the VM's QEMU and waits until its agent answers the
// handshake, then closes the agent session again.
func (b *bareVM) boot(ctx context.Context, timeout time.Duration) error {
	var err error
	if b.m, err = vm.Start(ctx, b.cfg, b.log); err != nil {
		return fmt.Errorf("start a bare qemu: %w", err)
	}
	c, err := sandbox.ConnectAgent(ctx, b.m, timeout)
	if err != nil {
		return fmt.Errorf("bare qemu boot: %w", err)
	}
	c.Close()
	return nil
}

// startBareClone starts a bare VM as a clone of snap, as Runtime.Create
// does but without a sandbox around it: a QEMU of the snapshot's
// configuration with a directory and a disk of its own (one overlay, over
// the warm snapshot's disk layer or else the template image, at the size
// the snapshot's guest saw) and the snapshot's memory file mapped private
// (jailed, through the same sealed copy the runtime's clones map),
// restoring the snapshot's device state and running on until QEMU says it
// runs. There is no agent session, init or exec, and the disk is not
// grown.
func (r *runner) startBareClone(ctx context.Context, snap sandbox.TemplateSnapshot) (_ *bareVM, err error) {
	cfg := snap.VM
	cfg.MemoryFile, cfg.MemoryShared = snap.MemFile, false
	disk := r.imageDisk(0)
	if snap.Warm {
		// The guest of a warm snapshot has its disk layer mounted: the
		// disk is an overlay of that, as a sandbox's is.
		disk = &bareDisk{backing: []string{snap.Disk, r.tpl.Image}, format: "qcow2", sizeMiB: snap.DiskMiB}
	}
	b, err := r.newBare(ctx, cfg, disk)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close())
		}
	}()
	if err := b.restore(ctx, snap.StateFile, true); err != nil {
		return nil, err
	}
	return b, nil
}

// save writes the VM's state to path and ends its QEMU, as a suspend does.
func (b *bareVM) save(ctx context.Context, path string) error {
	if err := b.m.SaveState(ctx, path, false); err != nil {
		return err
	}
	return b.m.Stop(ctx)
}

// restore ends the VM's QEMU if one runs, starts a fresh one of the same
// configuration waiting for a restore, restores the state at path into it
// (ignoreShared as it was saved) and runs the guest until QEMU says it
// runs, as a wake or a clone does without its agent session and the rest.
func (b *bareVM) restore(ctx context.Context, path string, ignoreShared bool) error {
	if b.m != nil {
		b.m.Stop(ctx)
	}
	cfg := b.cfg
	cfg.Incoming = true
	m, err := vm.Start(ctx, cfg, b.log)
	if err != nil {
		return fmt.Errorf("start a bare qemu to restore into: %w", err)
	}
	b.m = m
	if err := m.RestoreState(ctx, path, ignoreShared); err != nil {
		return err
	}
	if err := m.Resume(ctx); err != nil {
		return err
	}
	return untilRunning(ctx, m)
}

// untilRunning polls m's run state until it is running.
func untilRunning(ctx context.Context, m *vm.Machine) error {
	for {
		st, err := m.Status(ctx)
		if err != nil {
			return err
		}
		if st == vm.StatusRunning {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the vm to run (it is %s): %w", st, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// close stops the VM, if it runs, gives back its jail's user and cgroup,
// and removes its directory.
func (b *bareVM) close() error {
	if b.m != nil {
		b.m.Stop(context.Background()) // bounded: Stop kills QEMU after 2 s
	}
	if b.release != nil {
		b.release()
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("remove a bare VM's directory: %w", err)
	}
	return nil
}

// createOverlay makes a qcow2 disk of sizeMiB (0: the image's size) at
// path backed by the read-only template image base, as a sandbox's disk
// is made.
func createOverlay(ctx context.Context, base, format, path string, sizeMiB int) error {
	args := []string{"create", "-q", "-f", "qcow2", "-b", base, "-F", format, path}
	if sizeMiB > 0 {
		args = append(args, fmt.Sprintf("%dM", sizeMiB))
	}
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
