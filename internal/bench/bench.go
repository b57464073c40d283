// Package bench measures airlock against baselines taken in the same run on
// the same machine: cold boot to agent ready against a plain QEMU boot, the
// round trip of an exec against a host fork/exec, stdout throughput against
// the same command on the host, the HTTP API (create to first output, exec
// round trip) against the same work through the runtime in-process, the
// lifecycle (pause and resume, suspend and wake) against the same QEMU
// operations on a bare VM, a checkpoint's stop of the vCPUs against QMP
// stop and cont, a fork to its children's first output against a clone
// of the template snapshot to its first output, a fork's children's
// memory and disk against bare clones, a create from the template snapshot to first
// output against a bare QEMU restoring the same snapshot, a create from a
// warm pool member to first output against a plain create, a clone
// against a boot, a warm clone of a template with a server against a
// cold clone that starts it, and the fleet (memory per idle sandbox,
// concurrent creates) against as many bare VMs or creates alone, and the
// network (TCP throughput, connect latency and DNS latency through a
// sandbox's gateway) against the same program on the host, and E2B's JavaScript SDK (create to first output, a command's
// round trip) against the same work over the native API, and template
// builds (cold and cached) against booting a sandbox and running the same
// commands, and a create from an image-built template against one from a
// built-in template, and the jail (create to first output, exec round
// trip) against the same with the jail off. Exec round trips, stdout
// throughput and a create to first output are also measured against
// floors in the same VM: the same work inside the guest, timed there by
// airlock-probe copied into the guest, or on a virtio-serial port without
// airlock.
// A baseline does the same work as its airlock side in the same run, with
// the same jail (bare VMs get the runtime's: Runtime.Confine), template
// and number of samples. Absolute timings vary from host to host (and
// from minute to minute under software emulation); the ratios to the
// baselines are what compare across runs.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/localcluster"
	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
)

// Scenario names.
const (
	ScenarioBoot       = "boot"
	ScenarioExecRTT    = "exec_rtt"
	ScenarioThroughput = "stdout_throughput"
	ScenarioAPICreate  = "api_create_to_first_output"
	ScenarioAPIExecRTT = "api_exec_rtt"
	// ScenarioAPILimits prices a key's limits on creates.
	ScenarioAPILimits  = "api_limits_create"
	ScenarioPause      = "pause_resume"
	ScenarioSuspend    = "suspend_wake_512"
	ScenarioIdlePSS    = "idle_pss"
	ScenarioConcurrent = "concurrent_create"
	ScenarioSnapshot   = "snapshot_create_to_first_output"
	ScenarioWarmPool   = "warm_pool_create_to_first_output"
	// ScenarioCloneBoot prices a clone of the template snapshot against
	// a boot, and ScenarioWarmTemplate a warm clone of a template with a
	// server against a cold clone that starts it.
	ScenarioCloneBoot    = "clone_vs_boot"
	ScenarioWarmTemplate = "warm_template_create"
	// ScenarioRunCodeRTT prices a code interpreter's run in each
	// language against the same in Python.
	ScenarioRunCodeRTT = "run_code_rtt"

	ScenarioNetThroughput = "net_tcp_throughput"
	ScenarioNetConnect    = "net_connect_latency"
	ScenarioNetDNS        = "net_dns_latency"
	// ScenarioNetHTTPKeepAlive and ScenarioNetHTTPConnect price the
	// gateway's per-request Host checks on plain HTTP against a splice.
	ScenarioNetHTTPKeepAlive = "net_http_keepalive"
	ScenarioNetHTTPConnect   = "net_http_connect"

	ScenarioE2BCreate  = "e2b_create_to_first_output"
	ScenarioE2BExecRTT = "e2b_exec_rtt"

	ScenarioTemplateBuild = "template_build"
	ScenarioImageCreate   = "image_template_create_to_first_output"

	ScenarioJail = "jail_cost"

	ScenarioPGCreate  = "postgres_create_to_first_output"
	ScenarioPGExecRTT = "postgres_exec_rtt"

	// ScenarioEventLatency prices a change of state to its webhook
	// delivery.
	ScenarioEventLatency = "event_latency"

	// ScenarioCheckpointPause prices how long a checkpoint stops a
	// sandbox's vCPUs, ScenarioForkFirstOutput a fork to its children's
	// first output, and ScenarioForkPSS what each child of a fork costs
	// the host in memory and disk.
	ScenarioCheckpointPause = "checkpoint_pause_ms"
	ScenarioForkFirstOutput = "fork_to_first_output"
	ScenarioForkPSS         = "fork_marginal_pss"

	ScenarioClusterCreate  = "cluster_create_to_first_output"
	ScenarioClusterExecRTT = "cluster_exec_rtt"
	ScenarioClusterCreates = "cluster_creates_per_second"
)

// Scenarios lists every scenario in the order Run runs them.
func Scenarios() []string {
	return []string{ScenarioBoot, ScenarioSnapshot, ScenarioCloneBoot, ScenarioWarmPool, ScenarioWarmTemplate, ScenarioRunCodeRTT, ScenarioJail, ScenarioExecRTT, ScenarioThroughput,
		ScenarioNetThroughput, ScenarioNetConnect, ScenarioNetDNS, ScenarioNetHTTPKeepAlive, ScenarioNetHTTPConnect, ScenarioPause,
		ScenarioSuspend, ScenarioCheckpointPause, ScenarioForkFirstOutput, ScenarioForkPSS, ScenarioIdleWake, ScenarioIdlePSS, ScenarioConcurrent, ScenarioTemplateBuild, ScenarioImageCreate,
		ScenarioE2BCreate, ScenarioE2BExecRTT, ScenarioPGCreate, ScenarioPGExecRTT, ScenarioEventLatency, ScenarioMCPRunCommand,
		ScenarioClusterCreate, ScenarioClusterExecRTT, ScenarioClusterCreates, ScenarioAPICreate, ScenarioAPIExecRTT, ScenarioAPILimits}
}

// clusterScenarios are those that run a local cluster, which needs
// Config.KubeBin.
var clusterScenarios = []string{ScenarioClusterCreate, ScenarioClusterExecRTT, ScenarioClusterCreates}

// Defaults of the Config fields left zero.
const (
	DefaultTemplate          = "tiny"
	DefaultBootRuns          = 5
	DefaultExecRuns          = 200
	DefaultThroughputMiB     = 200
	DefaultAPIRuns           = 5
	DefaultPauseRuns         = 50
	DefaultSuspendRuns       = 3
	DefaultForkRuns          = 3
	DefaultSandboxes         = 20
	DefaultSnapshotRuns      = 5
	DefaultTemplateBuildRuns = 3
	// DefaultBootTimeout is six times a boot under TCG (about 5 s), so a
	// hung boot costs half a minute rather than the runtime's default
	// minute.
	DefaultBootTimeout = 30 * time.Second
)

// maxThroughputMiB bounds ThroughputMiB (1 TiB), so a typo cannot stream
// for days.
const maxThroughputMiB = 1 << 20

// maxSandboxes bounds Sandboxes, so a typo cannot start a thousand VMs.
const maxSandboxes = 200

// maxForkRuns bounds ForkRuns: each round of fork_to_first_output starts
// a dozen VMs of 512 MiB and each run writes a checkpoint, so a typo
// cannot fill an afternoon or a disk.
const maxForkRuns = 50

// maxTemplateBuildRuns bounds TemplateBuildRuns: each sample boots two
// sandboxes and stores images, so a typo cannot fill an afternoon or a
// disk.
const maxTemplateBuildRuns = 50

// Config configures a bench run.
type Config struct {
	// Dir is the data directory holding the boot artifacts and templates.
	// Required.
	Dir datadir.Dir
	// Accel is the accelerator: "kvm", "tcg" or "auto" (the default: the
	// runtime's cached probe verdict).
	Accel string
	// Template is the template ref sandboxes boot from. Default "tiny".
	// The stdout scenario needs `dd` in it. Run resolves it before
	// anything boots. The network scenarios use template base (python3)
	// whatever it says.
	Template string
	// BootRuns is how many cold boots each side of the boot scenario makes.
	// Default 5.
	BootRuns int
	// ExecRuns is how many execs each side of exec_rtt and api_exec_rtt
	// makes, how many rounds run_code_rtt makes, and four times those of
	// mcp_run_command_rtt. Default 200.
	ExecRuns int
	// ThroughputMiB is how many MiB stdout_throughput streams, in MiB.
	// Default 200.
	ThroughputMiB int
	// APIRuns is how many sandboxes each side of api_create_to_first_output
	// and image_template_create_to_first_output creates, one sample each.
	// Default 5.
	APIRuns int
	// PauseRuns is how many rounds of pause and resume pause_resume makes
	// on each side. Default 50.
	PauseRuns int
	// SuspendRuns is how many rounds of suspend and wake suspend_wake_512
	// and idle_wake_to_first_output make on each side. Default 3.
	SuspendRuns int
	// ForkRuns is how many checkpoints checkpoint_pause_ms makes (each
	// after forkStopConts QMP stop and cont, its baseline) and how many
	// rounds of a clone, a fork of 1 and a fork of forkChildren
	// fork_to_first_output makes. Default 3.
	ForkRuns int
	// Sandboxes is how many sandboxes idle_pss keeps idle (in each of its
	// two sets) and concurrent_create creates at once. Default 20.
	Sandboxes int
	// SnapshotRuns is how many samples each side of
	// snapshot_create_to_first_output, clone_vs_boot,
	// warm_pool_create_to_first_output, warm_template_create and
	// jail_cost takes. Default 5.
	SnapshotRuns int
	// TemplateBuildRuns is how many samples template_build takes of each
	// of its sides: a cold build, the same build cached, and the baseline.
	// Default 3, at most 50.
	TemplateBuildRuns int
	// E2BSDK is the directory whose node_modules holds E2B's JavaScript
	// SDK (npm e2b), which the e2b_ scenarios run under node. Default
	// DefaultE2BSDK, relative to the working directory.
	E2BSDK string
	// KubeBin is the directory of etcd, kube-apiserver and
	// kube-scheduler (tools/kube/build.sh prints it), for the cluster_
	// scenarios' local cluster. Required when Scenarios names them; a run
	// of every scenario without it skips them, saying so.
	KubeBin string
	// Airlock is the airlock binary the local cluster's nodes and
	// replicas run. Default: this process's executable.
	Airlock string
	// Probe is the airlock-probe binary (cmd/airlock-probe) copied into
	// a guest to time its floors there. Default: airlock-probe beside
	// this process's executable.
	Probe string
	// Scenarios selects the scenarios to run by name; empty means every
	// one this host can run (the others are the report's Skipped, each
	// with what it lacks). They run in the order of Scenarios() whatever
	// the order here.
	Scenarios []string
	// BootTimeout bounds one boot to agent ready, on either side. Default
	// DefaultBootTimeout.
	BootTimeout time.Duration
	// Progress receives a line per step, so long runs are not silent. Nil
	// discards them.
	Progress io.Writer
	// Log receives the runtime's diagnostics. Nil discards them.
	Log *slog.Logger
}

// Validate checks the configuration before anything starts. Its errors
// wrap errdefs.ErrInvalid.
func (c *Config) Validate() error {
	var errs []error
	if c.Dir.Root == "" {
		errs = append(errs, errors.New("data directory is required"))
	}
	switch c.Accel {
	case "", "auto", "kvm", "tcg":
	default:
		errs = append(errs, fmt.Errorf("accelerator %q is not auto, kvm or tcg", c.Accel))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"boot runs", c.BootRuns}, {"exec runs", c.ExecRuns}, {"throughput MiB", c.ThroughputMiB}, {"api runs", c.APIRuns},
		{"pause runs", c.PauseRuns}, {"suspend runs", c.SuspendRuns}, {"fork runs", c.ForkRuns}, {"sandboxes", c.Sandboxes},
		{"snapshot runs", c.SnapshotRuns}, {"template build runs", c.TemplateBuildRuns}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %d)", n.name, n.v))
		}
	}
	if c.Sandboxes > maxSandboxes {
		errs = append(errs, fmt.Errorf("sandboxes %d is above the limit of %d", c.Sandboxes, maxSandboxes))
	}
	if c.ForkRuns > maxForkRuns {
		errs = append(errs, fmt.Errorf("fork runs %d is above the limit of %d", c.ForkRuns, maxForkRuns))
	}
	if c.TemplateBuildRuns > maxTemplateBuildRuns {
		errs = append(errs, fmt.Errorf("template build runs %d is above the limit of %d", c.TemplateBuildRuns, maxTemplateBuildRuns))
	}
	if c.ThroughputMiB > maxThroughputMiB {
		errs = append(errs, fmt.Errorf("throughput MiB %d is above the limit of %d", c.ThroughputMiB, maxThroughputMiB))
	}
	if c.BootTimeout < 0 {
		errs = append(errs, fmt.Errorf("boot timeout %s must not be negative", c.BootTimeout))
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios(), s) {
			errs = append(errs, fmt.Errorf("unknown scenario %q: choose from %s", s, strings.Join(Scenarios(), ", ")))
		}
	}
	if c.KubeBin == "" {
		// Named, they fail now; in a run of every scenario they are
		// skipped, saying why.
		for _, s := range clusterScenarios {
			if slices.Contains(c.Scenarios, s) {
				errs = append(errs, fmt.Errorf("scenario %s runs a local cluster and needs the Kubernetes binaries "+
					"(tools/kube/build.sh builds them and prints their directory): give their directory, or leave the cluster_ scenarios out", s))
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench config: %w: %w", err, errdefs.ErrInvalid)
	}
	return nil
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Accel == "" {
		c.Accel = "auto"
	}
	if c.Template == "" {
		c.Template = DefaultTemplate
	}
	if c.BootRuns == 0 {
		c.BootRuns = DefaultBootRuns
	}
	if c.ExecRuns == 0 {
		c.ExecRuns = DefaultExecRuns
	}
	if c.ThroughputMiB == 0 {
		c.ThroughputMiB = DefaultThroughputMiB
	}
	if c.APIRuns == 0 {
		c.APIRuns = DefaultAPIRuns
	}
	if c.PauseRuns == 0 {
		c.PauseRuns = DefaultPauseRuns
	}
	if c.SuspendRuns == 0 {
		c.SuspendRuns = DefaultSuspendRuns
	}
	if c.ForkRuns == 0 {
		c.ForkRuns = DefaultForkRuns
	}
	if c.Sandboxes == 0 {
		c.Sandboxes = DefaultSandboxes
	}
	if c.SnapshotRuns == 0 {
		c.SnapshotRuns = DefaultSnapshotRuns
	}
	if c.TemplateBuildRuns == 0 {
		c.TemplateBuildRuns = DefaultTemplateBuildRuns
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = DefaultBootTimeout
	}
	if c.Probe == "" {
		if self, err := os.Executable(); err == nil {
			c.Probe = filepath.Join(filepath.Dir(self), "airlock-probe")
		}
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// selected reports whether scenario name is to run.
func (c *Config) selected(name string) bool {
	return len(c.Scenarios) == 0 || slices.Contains(c.Scenarios, name)
}

// runner holds what the scenarios of one run share.
type runner struct {
	cfg Config
	rt  *sandbox.Runtime
	tpl template.Template

	// sb is the sandbox the exec scenarios share, created on first use and
	// destroyed by close. Only Run's goroutine touches it.
	sb *sandbox.Sandbox
	// api is the server the API scenarios share, started on first use and
	// stopped by close. Only Run's goroutine touches it.
	api *apiServer
	// tplAPI is the server the template scenarios share, whose templates
	// directory is its own; started on first use and stopped by close.
	// Only Run's goroutine touches it.
	tplAPI *apiServer
	// pg is the PostgreSQL cluster of the postgres_ scenarios and pgAPI the
	// server whose store it holds; both started on first use and stopped
	// by close. Only Run's goroutine touches them.
	pg    *localpg.Cluster
	pgAPI *apiServer
	// cluster is the cluster_ scenarios' local cluster, in clusterDir,
	// and clusterSrv a client of its first replica; started on first use
	// and stopped by close. Only Run's goroutine touches them.
	cluster    *localcluster.Cluster
	clusterDir string
	clusterSrv *apiServer
}

// Run runs the selected scenarios one after another and reports them. Every
// sandbox and VM it starts is gone when it returns, also when it fails or
// ctx ends. It stops at the first scenario that fails; a scenario that
// reports its failure (concurrent_create, or stdout_throughput when its
// floors fail) is then the last result of rep, with its Error set.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	cfg = cfg.withDefaults()
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: cfg.Dir, Accel: cfg.Accel, BootTimeout: cfg.BootTimeout, Log: cfg.Log})
	if err != nil {
		return Report{}, err
	}
	tpl, err := rt.Templates().Resolve(cfg.Template)
	if err != nil {
		return Report{}, err
	}
	r := &runner{cfg: cfg, rt: rt, tpl: tpl}
	defer func() {
		if cerr := r.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()

	rep = Report{
		Version:   ReportVersion,
		StartedAt: time.Now().UTC().Truncate(time.Second),
		Host:      Host{CPUs: runtime.NumCPU(), Accel: string(rt.Accel()), Kernel: hostKernel()},
		Results:   []Result{},
		Skipped:   cfg.skips(hostLacks(cfg, rt)),
	}
	for _, k := range rep.Skipped {
		r.progressf("skipping %s: %s", k.Name, k.Reason)
	}
	scenarios := []struct {
		name string
		run  func(context.Context) (Result, error)
	}{
		{ScenarioBoot, r.boot},
		{ScenarioSnapshot, r.snapshotCreate},
		{ScenarioCloneBoot, r.cloneVsBoot},
		{ScenarioWarmPool, r.warmPoolCreate},
		{ScenarioWarmTemplate, r.warmTemplateCreate},
		{ScenarioRunCodeRTT, r.runCodeRTT},
		{ScenarioJail, r.jailCost},
		{ScenarioExecRTT, r.execRTT},
		{ScenarioThroughput, r.stdoutThroughput},
		{ScenarioNetThroughput, r.netTCPThroughput},
		{ScenarioNetConnect, r.netConnectLatency},
		{ScenarioNetDNS, r.netDNSLatency},
		{ScenarioNetHTTPKeepAlive, func(ctx context.Context) (Result, error) { return r.netHTTP(ctx, true) }},
		{ScenarioNetHTTPConnect, func(ctx context.Context) (Result, error) { return r.netHTTP(ctx, false) }},
		{ScenarioPause, r.pauseResume},
		{ScenarioSuspend, r.suspendWake},
		{ScenarioCheckpointPause, r.checkpointPause},
		{ScenarioForkFirstOutput, r.forkFirstOutput},
		{ScenarioForkPSS, r.forkMarginalPSS},
		{ScenarioIdleWake, r.idleWake},
		{ScenarioIdlePSS, r.idlePSS},
		{ScenarioConcurrent, r.concurrentCreate},
		{ScenarioTemplateBuild, r.templateBuild},
		{ScenarioImageCreate, r.imageTemplateCreate},
		{ScenarioE2BCreate, r.e2bCreate},
		{ScenarioE2BExecRTT, r.e2bExecRTT},
		{ScenarioPGCreate, r.pgCreate},
		{ScenarioPGExecRTT, r.pgExecRTT},
		{ScenarioEventLatency, r.eventLatency},
		{ScenarioMCPRunCommand, r.mcpRunCommand},
		{ScenarioClusterCreate, r.clusterCreate},
		{ScenarioClusterExecRTT, r.clusterExecRTT},
		{ScenarioClusterCreates, r.clusterCreates},
		{ScenarioAPICreate, r.apiCreate},
		{ScenarioAPILimits, r.apiLimits},
		{ScenarioAPIExecRTT, r.apiExecRTT},
	}
	for _, s := range scenarios {
		if !cfg.selected(s.name) || skipped(rep.Skipped, s.name) {
			continue
		}
		res, err := s.run(ctx)
		if err != nil && ctx.Err() != nil {
			// What was cut short says nothing; the console tails it
			// carries would only bury the reason.
			return rep, fmt.Errorf("bench %s: interrupted: %w", s.name, ctx.Err())
		}
		if err != nil {
			if res.Name != "" {
				// The scenario measured what did not fail, and says so.
				res.Error = err.Error()
				rep.Results = append(rep.Results, res)
			}
			return rep, fmt.Errorf("bench %s: %w", s.name, err)
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// progressf writes one progress line.
func (r *runner) progressf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
}

// sandbox returns the shared sandbox, creating it on first use.
func (r *runner) sandbox(ctx context.Context) (*sandbox.Sandbox, error) {
	if r.sb != nil {
		return r.sb, nil
	}
	r.progressf("booting a %s sandbox", r.tpl.Ref())
	sb, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	if err != nil {
		return nil, err
	}
	r.sb = sb
	return sb, nil
}

// close stops the API servers and destroys the shared sandbox, whichever
// of them there are. The fleet scenarios call it first, so that no other
// VM runs beside theirs; a later scenario that needs one starts it again.
func (r *runner) close() error {
	errs := []error{r.closeCluster(), r.closePostgres()}
	if r.api != nil {
		errs = append(errs, r.api.close())
		r.api = nil
	}
	if r.tplAPI != nil {
		errs = append(errs, r.tplAPI.close())
		r.tplAPI = nil
	}
	if r.sb != nil {
		errs = append(errs, destroy(r.sb))
		r.sb = nil
	}
	return errors.Join(errs...)
}

// destroyTimeout bounds the teardown of one sandbox. It does not depend on
// the run's context, so that a cancelled run still cleans up.
const destroyTimeout = 15 * time.Second

func destroy(sb *sandbox.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	return sb.Destroy(ctx)
}

// hostKernel is the host kernel's release, as uname -r prints it.
func hostKernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// measure does one run of a measurement and returns how long the measured
// part took; setup and teardown around it are not counted.
type measure func(ctx context.Context) (time.Duration, error)

// timed measures the whole of f.
func timed(f func(context.Context) error) measure {
	return func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		err := f(ctx)
		return time.Since(start), err
	}
}

// retrying returns a measure that repeats m after a failure, until it
// succeeds or *failures reaches limit; *failures counts over every call.
// Each failure goes to onFail. Failures after ctx ended are not retried.
func retrying(m measure, limit int, failures *int, onFail func(error)) measure {
	return func(ctx context.Context) (time.Duration, error) {
		for {
			d, err := m(ctx)
			if err == nil || ctx.Err() != nil {
				return d, err
			}
			*failures++
			if *failures >= limit {
				return 0, fmt.Errorf("%d failed attempts, the last: %w", *failures, err)
			}
			onFail(err)
		}
	}
}

// timePairs runs a and then b n times, alternating so that drift in the
// host's speed affects both alike, and returns their durations. step, if
// not nil, is called after each pair with its number (from 1) and
// durations. It stops at the first error or when ctx ends.
// retryingPairs times n alternating samples of a and b (named nameA and
// nameB in progress lines of scenario), retrying each side's failures up
// to maxBootFailures, and summarizes both with their failure counts.
func (r *runner) retryingPairs(ctx context.Context, scenario string, n int, nameA string, a measure, nameB string, b measure) (Measurement, Measurement, error) {
	i := 1 // the pair being measured, for progress lines
	var failA, failB int
	onFail := func(side string, failures *int) func(error) {
		return func(err error) {
			r.progressf("%s %d/%d: %s run failed, retrying (%d of %d failures allowed): %s",
				scenario, i, n, side, *failures, maxBootFailures-1, firstLine(err.Error()))
		}
	}
	da, db, err := timePairs(ctx, n,
		retrying(a, maxBootFailures, &failA, onFail(nameA, &failA)),
		retrying(b, maxBootFailures, &failB, onFail(nameB, &failB)),
		func(done int, da, db time.Duration) {
			r.progressf("%s %d/%d: %s %.0f ms, %s %.0f ms", scenario, done, n, nameA, ms(da), nameB, ms(db))
			i = done + 1
		})
	if err != nil {
		return Measurement{}, Measurement{}, err
	}
	ma, mb := summarize(da), summarize(db)
	ma.Failures, mb.Failures = failA, failB
	return ma, mb, nil
}

func timePairs(ctx context.Context, n int, a, b measure, step func(i int, da, db time.Duration)) ([]time.Duration, []time.Duration, error) {
	ds, err := timeRounds(ctx, n, []side{{"run", a}, {"baseline run", b}}, func(i int, ds []time.Duration) {
		if step != nil {
			step(i, ds[0], ds[1])
		}
	})
	return ds[0], ds[1], err
}

// warmRounds runs execWarmup untimed rounds of sides, then n timed ones
// (see timeRounds), with a progress line for scenario every n/progress
// rounds.
func (r *runner) warmRounds(ctx context.Context, scenario string, n, progress int, sides []side) ([][]time.Duration, error) {
	if _, err := timeRounds(ctx, execWarmup, sides, nil); err != nil {
		return nil, fmt.Errorf("warm up: %w", err)
	}
	every := max(1, n/progress)
	return timeRounds(ctx, n, sides, func(i int, _ []time.Duration) {
		if i%every == 0 || i == n {
			r.progressf("%s %d/%d", scenario, i, n)
		}
	})
}

// side is one of the measures timeRounds takes turns with; label names its
// runs in errors.
type side struct {
	label string
	m     measure
}

// timeRounds runs each side in turn, n rounds, so that drift in the host's
// speed affects all alike, and returns the durations of each side. step,
// if not nil, is called after each round with its number (from 1) and the
// round's durations. It stops at the first error or when ctx ends.
func timeRounds(ctx context.Context, n int, sides []side, step func(i int, ds []time.Duration)) ([][]time.Duration, error) {
	all := make([][]time.Duration, len(sides))
	for j := range all {
		all[j] = make([]time.Duration, 0, n)
	}
	round := make([]time.Duration, len(sides))
	for i := 1; i <= n; i++ {
		if err := ctx.Err(); err != nil {
			return all, err
		}
		for j, s := range sides {
			d, err := s.m(ctx)
			if err != nil {
				return all, fmt.Errorf("%s %d: %w", s.label, i, err)
			}
			round[j] = d
		}
		for j, d := range round {
			all[j] = append(all[j], d)
		}
		if step != nil {
			step(i, round)
		}
	}
	return all, nil
}
