package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/probe"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/vm"
)

// execTimeout bounds one exec of the exec_rtt scenario.
const execTimeout = 30 * time.Second

// execWarmup is how many untimed execs each side makes first, so that the
// first runs' page faults and cold caches do not count.
const execWarmup = 5

// execRTT measures the round trip of running `true` in a running sandbox
// against a fork/exec of /bin/true on the host, and against the same
// fork/exec inside the guest (variant guest_spawn).
func (r *runner) execRTT(ctx context.Context) (Result, error) {
	sb, err := r.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	guest := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		defer cancel()
		return runInSandbox(ctx, sb, []string{"true"}, nil)
	})
	host := timed(func(ctx context.Context) error {
		// Nothing attached: os/exec gives the child /dev/null, no pipes.
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return fmt.Errorf("run /bin/true on the host: %w", err)
		}
		return nil
	})
	if _, _, err := timePairs(ctx, execWarmup, guest, host, nil); err != nil {
		return Result{}, fmt.Errorf("warm up: %w", err)
	}
	// The in-guest floor runs in blocks between blocks of the pairs, so
	// that drift hits it too; each block is one probe process in the
	// guest, whose first runs are untimed.
	n := r.cfg.ExecRuns
	block := max(1, n/execBlocks)
	var air, base, floor []time.Duration
	for len(air) < n {
		k := min(block, n-len(air))
		a, b, err := timePairs(ctx, k, guest, host, nil)
		if err != nil {
			return Result{}, err
		}
		f, err := guestSpawns(ctx, sb, r.cfg.Probe, guestTrue, k)
		if err != nil {
			return Result{}, fmt.Errorf("in-guest floor: %w", err)
		}
		air, base, floor = append(air, a...), append(base, b...), append(floor, f...)
		r.progressf("exec_rtt %d/%d", len(air), n)
	}
	a, b, f := summarize(air), summarize(base), summarize(floor)
	return Result{
		Name:     ScenarioExecRTT,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Variants: []Variant{{Name: "guest_spawn", Measurement: a, Ratio: ratio(a.P50, f.P50), Baseline: &f}},
		Notes: fmt.Sprintf("airlock: exec of argv [true] in one running %s sandbox until its exit status arrived; "+
			"baseline: fork/exec and wait of /bin/true on the host via os/exec; %d runs each after %d untimed, "+
			"alternating; ratio of p50s; variant guest_spawn: the same execs against the floor in the same VM, "+
			"%s run inside the guest by airlock-probe, copied in (%s spawn), started as the "+
			"agent's exec starts a command (os.StartProcess, stdin /dev/null, pipes for stdout and stderr read "+
			"to their end, a process group of its own) and waited for, timed inside the guest: %d runs in "+
			"blocks of %d between the blocks of airlock and host runs, one probe process a block, each after "+
			"%d untimed runs; ratio of p50s, target at most 1.5 (the difference, %.3f ms, is the host's exec "+
			"request, the agent's work and the link)",
			r.tpl.Ref(), n, execWarmup, guestTrue, probe.Exe, n, block, execWarmup, a.P50-f.P50),
	}, nil
}

// execBlocks is how many blocks exec_rtt's runs are split into, with a
// block of the in-guest floor after each.
const execBlocks = 10

// streamArgv is the command whose stdout stdout_throughput streams: size
// bytes of zeros in 64 KiB writes. Not `head -c`: busybox head copies in
// small blocks and, under TCG, tops out near 20 MiB/s in the guest without
// any stdout transport, so it would measure head rather than airlock.
func streamArgv(size int64) []string {
	const block = 64 << 10
	return []string{"dd", "if=/dev/zero", "bs=" + strconv.Itoa(block), "count=" + strconv.FormatInt(size/block, 10), "status=none"}
}

// streamTimeout bounds one side of stdout_throughput: a minute plus a
// second per MiB, ample even under TCG.
func streamTimeout(mib int) time.Duration {
	return time.Minute + time.Duration(mib)*time.Second
}

// stdoutThroughput measures streaming stdout from a sandbox to the host
// against the same command's stdout on the host through a pipe, and, in
// a sandbox booted with an auxiliary port, against the same bytes on that
// port and through a pipe inside the guest (variants transport and
// guest_pipe).
func (r *runner) stdoutThroughput(ctx context.Context) (Result, error) {
	sb, err := r.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	size := int64(r.cfg.ThroughputMiB) << 20
	argv := streamArgv(size)
	timeout := streamTimeout(r.cfg.ThroughputMiB)
	var air, host []Measurement
	for i := 1; i <= streamRuns; i++ {
		a, err := stream(ctx, 1, size, func(ctx context.Context, w io.Writer) error {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return runInSandbox(ctx, sb, argv, w)
		})
		if err != nil {
			return Result{}, err
		}
		b, err := stream(ctx, 1, size, func(ctx context.Context, w io.Writer) error {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return runOnHost(ctx, argv, w)
		})
		if err != nil {
			return Result{}, fmt.Errorf("baseline: %w", err)
		}
		air, host = append(air, a), append(host, b)
		r.progressf("stdout_throughput %d/%d: airlock %.1f MiB/s, host %.1f MiB/s", i, streamRuns, a.MiBPerS, b.MiBPerS)
	}
	a, b := medianRun(air), medianRun(host)
	res := Result{
		Name:     ScenarioThroughput,
		Unit:     "MiB/s",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.MiBPerS, b.MiBPerS),
		Notes: fmt.Sprintf("`%s` in a running %s sandbox, stdout streamed to the host into a byte counter; "+
			"baseline: the same command on the host via os/exec into the same counter; %d runs each, alternating, "+
			"the median run by time of each counting; byte counts verified; ratio of MiB/s",
			strings.Join(argv, " "), r.tpl.Ref(), streamRuns),
	}
	vs, notes, err := r.stdoutFloors(ctx, size, timeout)
	res.Variants = vs
	res.Notes += notes
	if err != nil {
		return res, fmt.Errorf("floors: %w", err)
	}
	return res, nil
}

// floorRuns is how many runs each side of stdout_throughput's floors
// makes, alternating; the median run by time counts.
const floorRuns = 3

// stdoutFloors measures stdout_throughput's floors in a sandbox of their
// own, booted from scratch with an auxiliary port (a clone has its
// snapshot's devices, which lack it), and destroyed after: the same
// stdout streamed to the host, against the same bytes written by the
// same dd straight to the auxiliary port and counted on the host (the
// transport's ceiling), and against dd through a pipe inside the guest,
// timed there. It returns the variants and the notes to add.
func (r *runner) stdoutFloors(ctx context.Context, size int64, timeout time.Duration) (_ []Variant, _ string, err error) {
	r.progressf("stdout_throughput: booting a %s sandbox with an aux port", r.tpl.Ref())
	sb, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template, ColdBoot: true, AuxPort: true})
	if err != nil {
		return nil, "", err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	dev, err := auxDevice(ctx, sb)
	if err != nil {
		return nil, "", err
	}
	var stdout, aux, pipe []Measurement
	sides := []func(context.Context) error{
		func(ctx context.Context) error {
			m, err := stream(ctx, 1, size, func(ctx context.Context, w io.Writer) error {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				return runInSandbox(ctx, sb, streamArgv(size), w)
			})
			stdout = append(stdout, m)
			return err
		},
		func(ctx context.Context) error {
			m, err := auxStream(ctx, sb, dev, size, timeout)
			aux = append(aux, m)
			return err
		},
		func(ctx context.Context) error {
			m, err := guestPipe(ctx, sb, r.cfg.Probe, size, timeout)
			pipe = append(pipe, m)
			return err
		},
	}
	for i := 1; i <= floorRuns; i++ {
		for _, side := range sides {
			if err := side(ctx); err != nil {
				return nil, "", err
			}
		}
		r.progressf("stdout_throughput floors %d/%d: stdout %.1f MiB/s, aux port %.1f MiB/s, in-guest pipe %.1f MiB/s",
			i, floorRuns, stdout[i-1].MiBPerS, aux[i-1].MiBPerS, pipe[i-1].MiBPerS)
	}
	s, x, p := medianRun(stdout), medianRun(aux), medianRun(pipe)
	vs := []Variant{
		{Name: "transport", Measurement: s, Ratio: ratio(s.MiBPerS, x.MiBPerS), Baseline: &x},
		{Name: "guest_pipe", Measurement: s, Ratio: ratio(s.MiBPerS, p.MiBPerS), Baseline: &p},
	}
	notes := fmt.Sprintf("; variants transport and guest_pipe, in another %s sandbox booted from scratch with an "+
		"auxiliary virtio-serial port (%s, on the agent's bus): the same stdout stream to the host against "+
		"the transport's ceiling, the same dd writing to the port's device (of=%s) and its bytes counted on "+
		"the host from the port's socket, timed as the stdout side is, from the exec request to the exit "+
		"status and the last byte (target: stdout at least 0.7 of it, and at least 100 MiB/s if it allows), "+
		"and against dd through a pipe inside the guest, read by airlock-probe, copied in (%s "+
		"pipe) and timed there; %d runs of each, alternating, the median by time counting; byte counts "+
		"verified; ratios of MiB/s", r.tpl.Ref(), vm.AuxPortName, dev, probe.Exe, floorRuns)
	return vs, notes, nil
}

// streamRuns is how many runs each side of stdout_throughput's headline
// makes, alternating; the median run by time of each counts. The host's
// side takes well under a second, so a single run would be at the mercy
// of whatever else the host does in that moment.
const streamRuns = 3

// stream runs run the given number of times, each writing its output to a
// counter that must receive exactly want bytes, and reports the median run
// by time.
func stream(ctx context.Context, runs int, want int64, run func(context.Context, io.Writer) error) (Measurement, error) {
	ds := make([]time.Duration, 0, runs)
	for i := 0; i < runs; i++ {
		var cw countingWriter
		start := time.Now()
		err := run(ctx, &cw)
		d := time.Since(start)
		if err != nil {
			return Measurement{}, err
		}
		if cw.n != want {
			return Measurement{}, fmt.Errorf("received %d bytes of stdout, want %d", cw.n, want)
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	m := throughput(want, percentile(ds, 50))
	m.Runs = runs
	return m, nil
}

// countingWriter counts what is written to it and drops it.
type countingWriter struct {
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// stderrLimit bounds how much of a failed command's stderr an error quotes.
const stderrLimit = 1 << 10

// runInSandbox runs argv in sb with stdout to w (nil discards) and fails
// unless it exits 0.
func runInSandbox(ctx context.Context, sb *sandbox.Sandbox, argv []string, w io.Writer) error {
	return runRequest(ctx, sb, agentproto.ExecRequest{Argv: argv}, w)
}

// runRequest runs req in sb with stdout to w (nil discards) and fails
// unless it exits 0.
func runRequest(ctx context.Context, sb *sandbox.Sandbox, req agentproto.ExecRequest, w io.Writer) error {
	what := req.Cmd
	if len(req.Argv) > 0 {
		what = req.Argv[0]
	}
	var stderr bytes.Buffer
	p, err := sb.Exec(ctx, req, agentclient.Stdio{Stdout: w, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("exec %s in the sandbox: %w", what, err)
	}
	exit, err := sb.Wait(p)
	if err != nil {
		return fmt.Errorf("wait for %s in the sandbox: %w", what, err)
	}
	if exit.ExitCode != 0 {
		return fmt.Errorf("%s in the sandbox exited with status %d: %s", what, exit.ExitCode, clip(stderr.String()))
	}
	return nil
}

// runOnHost runs argv on the host with stdout to w and fails unless it
// exits 0.
func runOnHost(ctx context.Context, argv []string, w io.Writer) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run %s on the host: %w: %s", argv[0], err, clip(stderr.String()))
	}
	return nil
}

// clip trims s and keeps at most stderrLimit bytes of it.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > stderrLimit {
		s = s[:stderrLimit] + "..."
	}
	return s
}
