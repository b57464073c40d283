package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/bench"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const benchAbout = `Measures airlock against baselines taken in the same run on this machine,
and reports each as a ratio airlock/baseline (absolute timings are noisy;
the ratios compare across runs):

  boot                        sandbox create, booted from scratch, to agent ready vs
                              a plain QEMU boot
  snapshot_create_to_first_output
                              sandbox create (a clone of the template snapshot) to
                              the first stdout of echo hi vs a bare QEMU restoring
                              the same snapshot until it runs; floor: that restore
                              plus a fork/exec timed inside the guest
  clone_vs_boot               sandbox create, a clone of the template snapshot, vs
                              the same create booted from scratch
  warm_pool_create_to_first_output
                              sandbox create from a warm pool member (a pool of 1,
                              refilled between samples, untimed) to the first
                              stdout of echo hi vs a plain create (a clone) to the
                              same
  warm_template_create        create of code-interpreter, a clone of its warm
                              snapshot with the server up, vs a clone of its cold
                              snapshot that starts the server; and the PSS of both
  jail_cost                   the same create to first output, exec round trips,
                              a save of a disk and the template configuration
                              written into an image, with the jail (and the image
                              tools' jail) on vs with it off
  exec_rtt                    exec round trip of true vs fork/exec of /bin/true;
                              floor: the same fork/exec timed inside the guest
  stdout_throughput           N MiB of dd if=/dev/zero on stdout vs the same on the
                              host; floors, in a VM with an auxiliary port: the
                              same dd written straight to that port, and through
                              a pipe inside the guest
  net_tcp_throughput          100 MiB sent from a sandbox through its gateway to a
                              server on the host vs a host process sending the same
  net_connect_latency         TCP connect and first byte through the gateway vs the
                              same from a host process
  net_dns_latency             a DNS query to the gateway vs the same query sent by a
                              host process straight to the upstream resolver
  net_http_keepalive          1,000 HTTP requests on one connection to port 80, each
                              judged by its Host, vs the same to another port the
                              gateway splices
  net_http_connect            an HTTP request on a new connection to port 80 (the
                              gateway waits for its head) vs the same spliced
  pause_resume                sandbox pause and resume (with the guest's refresh) vs
                              QMP stop and cont on the same QEMU
  suspend_wake_512            suspend and wake of a 512 MiB sandbox vs a bare QEMU
                              saving its state and a fresh one restoring it
  checkpoint_pause_ms         how long a checkpoint of a 512 MiB sandbox with 100 MiB
                              written stops its vCPUs (and the whole checkpoint) vs
                              QMP stop and cont on the same QEMU
  fork_to_first_output        a fork of 10 (and of 1) of that sandbox to every child's
                              first output of echo hi vs one clone of the template
                              snapshot to its first output
  fork_marginal_pss           PSS and disk overlay of each of a fork's 10 children
                              vs 10 bare clones of the template snapshot
  idle_wake_to_first_output   an exec that wakes a sandbox its idle_s suspended, to
                              its answer, vs an explicit wake and then the exec
  idle_pss                    PSS of each of N idle sandboxes' QEMU vs N bare clones
                              of the same snapshot beside them; then N cold boots
                              vs N bare QEMUs booted to their agent beside them
  concurrent_create           N sandbox creates at once vs N creates alone, one
                              after another
  template_build              a template build of a 3-step Dockerfile FROM tiny, cold
                              and cached, vs booting a sandbox and running the same
                              commands in it
  image_template_create_to_first_output
                              HTTP API create to the first stdout of echo hi from a
                              template built from an uploaded OCI image (busybox) vs
                              the same from the built-in tiny (the same busybox)
  e2b_create_to_first_output  E2B's JS SDK: Sandbox.create('base') to the first output
                              of commands.run('echo hi') vs the same over the native API
  e2b_exec_rtt                E2B's JS SDK: commands.run('true') round trip vs the
                              native API's exec of the same /bin/bash -l -c true
  postgres_create_to_first_output, postgres_exec_rtt
                              the API scenarios' create and exec on a server whose
                              store is PostgreSQL vs one whose store is SQLite
  cluster_create_to_first_output, cluster_exec_rtt
                              the same through an API replica of a local cluster
                              (2 nodes, 2 replicas) vs a single-host server
  cluster_creates_per_second  N creates at once through the local cluster with
                              both nodes schedulable vs with one cordoned
  api_limits_create           api_create_to_first_output by a key with limits (checked
                              in the create's insert) vs by a key without
  api_create_to_first_output  HTTP API create, command, attach to the first stdout
                              of echo hi vs runtime create and exec in-process
  api_exec_rtt                HTTP API exec of true (and a command session to its
                              exit) vs exec of true through the runtime in-process

The net_ scenarios use the base template (python3 times both sides) and
a server on a test host in a network namespace of their own (198.19.N.2,
joined to this host by a veth pair; the sandbox's policy names it), since
no policy opens this host's own addresses. The api_ scenarios serve the API in-process from a temporary data directory
that shares this one's boot artifacts and templates. idle_pss and
concurrent_create run N sandboxes at once (--sandboxes, default 20).
The template scenarios serve the API the same way from a temporary data
directory whose templates are its own (tiny and base, linked), so that
their builds leave this one's alone; the image is made of the host's
static busybox (/usr/bin/busybox, from busybox-static).
The e2b_ scenarios serve E2B's API beside it and run E2B's SDK (npm e2b)
under node, timed inside node; they need node and the SDK installed in
--e2b-sdk DIR's node_modules (default e2e/e2bsdk, from the source tree:
cd e2e/e2bsdk && npm ci), and fail saying so without them.
The cluster_ scenarios run ` + "`airlock localcluster`" + `'s cluster (etcd,
kube-apiserver, kube-scheduler, PostgreSQL) from --kube-bin DIR (make bench
passes it).
Without --only, every scenario this host can run runs, and those it cannot
(no --kube-bin, no node or E2B SDK, no PostgreSQL server binaries, no static
busybox, not root for the net_ scenarios, a template airlock setup did not
make) are skipped, each named with why at the start and under the report;
a scenario named in --only is never skipped: it fails saying what it lacks.
Every baseline runs with the same jail as its sandboxes.
A floor is the same work in the same VM without airlock, reported as a
variant of its scenario with a baseline of its own.
The create scenarios snapshot_create_to_first_output,
warm_pool_create_to_first_output and api_create_to_first_output also
report the p50 of each step of their creates, and of the first exec, as
"timings", shown under their figures.
A scenario that fails after measuring (a concurrent create that failed) is
in the report, with its error, and the command then fails.

Prints JSON when --json is given or stdout is not a terminal, else a table.
Progress goes to stderr.

  airlock bench
  airlock bench --only boot --runs 10
  airlock bench --only api_create_to_first_output,api_exec_rtt --api-runs 3
  airlock bench --only pause_resume,suspend_wake_512 --suspend-runs 3
  airlock bench --only idle_pss,concurrent_create --sandboxes 10
  airlock bench --only checkpoint_pause_ms,fork_to_first_output,fork_marginal_pss --fork-runs 2
  airlock bench --only template_build,image_template_create_to_first_output --build-runs 2
  airlock bench --only e2b_create_to_first_output,e2b_exec_rtt --e2b-sdk e2e/e2bsdk
  airlock bench --only cluster_exec_rtt --kube-bin $(tools/kube/build.sh)
  airlock bench --json -o bench.json`

func runBench(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("bench", "airlock bench [FLAGS]", benchAbout, env)
	tpl := fs.String("template", bench.DefaultTemplate, "template `ref` the sandboxes boot from")
	runs := fs.Int("runs", bench.DefaultBootRuns, "cold boots per side in the boot scenario")
	execRuns := fs.Int("exec-runs", bench.DefaultExecRuns, "execs per side in the exec_rtt and api_exec_rtt scenarios, the rounds of run_code_rtt, and four times the rounds of mcp_run_command_rtt")
	mib := fs.Int("throughput-mib", bench.DefaultThroughputMiB, "`MiB` of stdout per side in the stdout_throughput scenario")
	apiRuns := fs.Int("api-runs", bench.DefaultAPIRuns, "sandboxes per side in the api_create_to_first_output, e2b_create_to_first_output and image_template_create_to_first_output scenarios")
	pauseRuns := fs.Int("pause-runs", bench.DefaultPauseRuns, "rounds of pause and resume per side in the pause_resume scenario")
	suspendRuns := fs.Int("suspend-runs", bench.DefaultSuspendRuns, "rounds of suspend and wake per side in the suspend_wake_512 and idle_wake_to_first_output scenarios")
	forkRuns := fs.Int("fork-runs", bench.DefaultForkRuns, "checkpoints in the checkpoint_pause_ms scenario, and rounds of a clone, a fork of 1 and a fork of 10 in fork_to_first_output")
	sandboxes := fs.Int("sandboxes", bench.DefaultSandboxes, "sandboxes at once in the idle_pss and concurrent_create scenarios")
	snapshotRuns := fs.Int("snapshot-runs", bench.DefaultSnapshotRuns, "samples per side in the snapshot_create_to_first_output, clone_vs_boot, warm_pool_create_to_first_output, warm_template_create and jail_cost scenarios")
	buildRuns := fs.Int("build-runs", bench.DefaultTemplateBuildRuns, "builds per side (cold, cached, baseline) in the template_build scenario")
	e2bSDK := fs.String("e2b-sdk", bench.DefaultE2BSDK, "`dir` whose node_modules holds E2B's JS SDK (npm e2b), for the e2b_ scenarios")
	kubeBin := fs.String("kube-bin", os.Getenv("AIRLOCK_KUBE_BIN"), "`dir` of etcd, kube-apiserver and kube-scheduler (tools/kube/build.sh prints it), for the cluster_ scenarios (default: $AIRLOCK_KUBE_BIN)")
	only := fs.String("only", "", "comma-separated `scenarios` to run (default: every one this host can run): "+strings.Join(bench.Scenarios(), ", "))
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	asJSON := fs.Bool("json", false, "print JSON even on a terminal")
	outFile := fs.String("o", "", "also write the JSON report to `file`")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q: %w", fs.Args(), errdefs.ErrInvalid)
	}
	// Zero would mean "default" to bench.Config; on the command line it is
	// a mistake.
	for _, f := range []struct {
		name string
		v    int
	}{{"runs", *runs}, {"exec-runs", *execRuns}, {"throughput-mib", *mib}, {"api-runs", *apiRuns},
		{"pause-runs", *pauseRuns}, {"suspend-runs", *suspendRuns}, {"fork-runs", *forkRuns}, {"sandboxes", *sandboxes},
		{"snapshot-runs", *snapshotRuns}, {"build-runs", *buildRuns}} {
		if f.v < 1 {
			return fmt.Errorf("bench: --%s must be at least 1 (got %d): %w", f.name, f.v, errdefs.ErrInvalid)
		}
	}
	cfg := bench.Config{
		Dir: env.Dir, Accel: *accel, Template: *tpl,
		BootRuns: *runs, ExecRuns: *execRuns, ThroughputMiB: *mib, APIRuns: *apiRuns,
		PauseRuns: *pauseRuns, SuspendRuns: *suspendRuns, ForkRuns: *forkRuns, Sandboxes: *sandboxes, SnapshotRuns: *snapshotRuns,
		TemplateBuildRuns: *buildRuns, E2BSDK: *e2bSDK, KubeBin: *kubeBin, Scenarios: splitScenarios(*only),
		Progress: env.Stderr, Log: env.Log,
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *outFile != "" {
		// Fail now rather than after minutes of measuring.
		if fi, err := os.Stat(filepath.Dir(*outFile)); err != nil || !fi.IsDir() {
			return fmt.Errorf("bench: -o %s: directory %s does not exist: %w", *outFile, filepath.Dir(*outFile), errdefs.ErrInvalid)
		}
	}

	// ^C and TERM cancel the run, which then removes its sandboxes.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if err != nil && !reportsFailure(rep) {
		return err
	}
	// A scenario that failed after measuring is in the report, with its
	// error: the report is written, and then the run fails.
	return errors.Join(writeBenchReport(env, rep, *outFile, *asJSON), err)
}

// reportsFailure reports whether rep's last result is a scenario that
// failed and says so.
func reportsFailure(rep bench.Report) bool {
	return len(rep.Results) > 0 && rep.Results[len(rep.Results)-1].Error != ""
}

// writeBenchReport writes rep as JSON to outFile, if given, and to stdout
// as JSON or, on a terminal without asJSON, as a table.
func writeBenchReport(env *Env, rep bench.Report, outFile string, asJSON bool) error {
	var js bytes.Buffer
	if err := bench.WriteJSON(&js, rep); err != nil {
		return err
	}
	if outFile != "" {
		if err := os.WriteFile(outFile, js.Bytes(), 0o644); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
	}
	if asJSON || !isTerminalWriter(env.Stdout) {
		if _, err := env.Stdout.Write(js.Bytes()); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
		return nil
	}
	return bench.WriteTable(env.Stdout, rep)
}

// splitScenarios splits a comma-separated flag value, dropping blanks.
func splitScenarios(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
