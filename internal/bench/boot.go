package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/vm"
)

// maxBootFailures is how many failed boots each side of the boot scenario
// tolerates (retrying each) before it gives up: a flaky boot is a finding
// to report, a boot that keeps failing is broken.
const maxBootFailures = 3

// boot measures cold boots to agent ready: a whole sandbox.Runtime.Create
// against QEMU booting the same kernel and initramfs without a disk until
// the agent answers the handshake.
func (r *runner) boot(ctx context.Context) (Result, error) {
	n := r.cfg.BootRuns
	a, b, err := r.retryingPairs(ctx, "boot", n, "airlock", r.bootSandbox, "plain qemu", r.bootPlain)
	if err != nil {
		return Result{}, err
	}
	failA, failB := a.Failures, b.Failures
	notes := fmt.Sprintf("airlock: sandbox create from template %s booted from scratch, not cloned from its snapshot "+
		"(disk overlay, QEMU start, agent handshake, guest init) "+
		"until init answered; baseline: QEMU with the same kernel, initramfs, %d vCPU and %d MiB, no disk, until the "+
		"agent answered the handshake; %d cold boots each, alternating; ratio of p50s",
		r.tpl.Ref(), r.tpl.VCPUs, r.tpl.MemoryMiB, n)
	if failA+failB > 0 {
		notes += fmt.Sprintf("; %d airlock and %d baseline boots failed within %s and were retried",
			failA, failB, r.cfg.BootTimeout)
	}
	return Result{
		Name:     ScenarioBoot,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes:    notes,
	}, nil
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// bootSandbox times one sandbox.Runtime.Create from scratch (ColdBoot:
// not a clone of the template's snapshot), which returns once the agent
// answered init, and then destroys the sandbox.
func (r *runner) bootSandbox(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	sb, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template, ColdBoot: true})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, destroy(sb)
}

// bootPlain times QEMU booting without a sandbox around it until the agent
// answers the handshake, and then stops it. The VM runs in a fresh
// directory under the data directory's sandboxes/, whose paths are short
// enough for unix sockets, with the runtime's jail and cgroup, made
// before the clock starts.
func (r *runner) bootPlain(ctx context.Context) (_ time.Duration, err error) {
	b, err := r.newBare(ctx, vm.Config{
		Kernel: r.cfg.Dir.Kernel(), Initramfs: r.cfg.Dir.Initramfs(), Accel: r.rt.Accel(), CPU: r.rt.CPU(),
		VCPUs: r.tpl.VCPUs, MemoryMiB: r.tpl.MemoryMiB,
	}, nil)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, b.close()) }()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout)
	defer cancel()
	start := time.Now()
	if err := b.boot(ctx, r.cfg.BootTimeout); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
