package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// execTimeout bounds one exec of the exec_rtt scenario.
const execTimeout = 30 * time.Second

// execWarmup is how many untimed execs each side makes first, so that the
// first runs' page faults and cold caches do not count.
const execWarmup = 5

// execRTT measures the round trip of running `true` in a running sandbox
// against a fork/exec of /bin/true on the host.
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
	n := r.cfg.ExecRuns
	every := max(1, n/10)
	air, base, err := timePairs(ctx, n, guest, host, func(i int, _, _ time.Duration) {
		if i%every == 0 || i == n {
			r.progressf("exec_rtt %d/%d", i, n)
		}
	})
	if err != nil {
		return Result{}, err
	}
	a, b := summarize(air), summarize(base)
	return Result{
		Name:     ScenarioExecRTT,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: exec of argv [true] in one running %s sandbox until its exit status arrived; "+
			"baseline: fork/exec and wait of /bin/true on the host via os/exec; %d runs each after %d untimed, "+
			"alternating; ratio of p50s", r.tpl.Ref(), n, execWarmup),
	}, nil
}

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
// against the same command's stdout on the host through a pipe.
func (r *runner) stdoutThroughput(ctx context.Context) (Result, error) {
	sb, err := r.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	size := int64(r.cfg.ThroughputMiB) << 20
	argv := streamArgv(size)
	timeout := streamTimeout(r.cfg.ThroughputMiB)
	a, err := stream(ctx, 1, size, func(ctx context.Context, w io.Writer) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return runInSandbox(ctx, sb, argv, w)
	})
	if err != nil {
		return Result{}, err
	}
	r.progressf("stdout_throughput: airlock %d MiB in %.2f s (%.1f MiB/s)", r.cfg.ThroughputMiB, a.Seconds, a.MiBPerS)
	b, err := stream(ctx, streamBaselineRuns, size, func(ctx context.Context, w io.Writer) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return runOnHost(ctx, argv, w)
	})
	if err != nil {
		return Result{}, fmt.Errorf("baseline: %w", err)
	}
	r.progressf("stdout_throughput: host %d MiB in %.2f s (%.1f MiB/s, median of %d)", r.cfg.ThroughputMiB, b.Seconds, b.MiBPerS, b.Runs)
	return Result{
		Name:     ScenarioThroughput,
		Unit:     "MiB/s",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.MiBPerS, b.MiBPerS),
		Notes: fmt.Sprintf("`%s` in a running %s sandbox, stdout streamed to the host into a byte counter; "+
			"baseline: the same command on the host via os/exec into the same counter, median of %d runs; "+
			"byte counts verified; ratio of MiB/s", strings.Join(argv, " "), r.tpl.Ref(), streamBaselineRuns),
	}, nil
}

// streamBaselineRuns is how many times the host side of stdout_throughput
// runs. It takes well under a second, so a single run is at the mercy of
// whatever else the host does in that moment; the median run counts.
const streamBaselineRuns = 5

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
