package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/timings"
)

// firstOutputArgv is the command whose first stdout byte ends a sample of
// api_create_to_first_output.
var firstOutputArgv = []string{"echo", "hi"}

// sharedHomeEntries are the parts of the real data directory the bench's
// server links to: read-only for a server, and slow to make again.
var sharedHomeEntries = []string{"boot", "templates", "accel.json"}

// apiServer is an airlock server run inside the bench process, built by
// internal/daemon as `airlock serve` builds its own: a temporary data
// directory of its own that links the real one's boot artifacts,
// templates and accelerator verdict, with its own store, service, HTTP
// API and E2B API on loopback ports, and a client holding its admin key.
// The baselines of the API scenarios use its runtime, so that both sides
// boot the same way into the same directory.
type apiServer struct {
	home   string // the temporary data directory; short, for unix sockets
	d      *daemon.Daemon
	rt     *sandbox.Runtime
	st     *store.Store
	svc    *service.Service
	bld    *builds.Service
	stop   context.CancelFunc // ends d.Run
	served chan error         // Run's result, sent once it returns
	hc     *http.Client
	client *apiclient.Client
	url    string
	e2bURL string // E2B's API (see startE2BServer)
	// admin is the admin key's principal, for calls to the service itself.
	admin service.Principal

	// live holds the sandboxes made through the API that were not yet
	// deleted; close deletes them. Only Run's goroutine touches it.
	live map[string]bool
}

// apiServer returns the shared API server, starting it on first use.
func (r *runner) apiServer(ctx context.Context) (*apiServer, error) {
	if r.api != nil {
		return r.api, nil
	}
	s, err := startAPIServer(ctx, r.cfg, nil, "")
	if err != nil {
		return nil, fmt.Errorf("start an API server: %w", err)
	}
	r.api = s
	r.progressf("serving the API on %s from a temporary data directory", s.url)
	// The temporary data directory has template snapshots of its own; the
	// first create must not pay for making one.
	if err := r.prepareSnapshot(ctx, s.rt, sandbox.Spec{Template: r.cfg.Template}); err != nil {
		return nil, err
	}
	return s, nil
}

// startAPIServer starts an apiServer as `airlock serve` would, over a
// temporary data directory. With templates (refs), that directory's
// templates are its own, holding only those of the data directory's (see
// newHome), and the service reclaims what its builds leave; without, it
// links the data directory's and reclaims nothing. On failure, what it
// started is stopped again.
//
// With storeAddr (a postgres:// URL) its store is that PostgreSQL database
// instead of a SQLite file in the temporary directory.
func startAPIServer(ctx context.Context, cfg Config, templates []string, storeAddr string) (_ *apiServer, err error) {
	s := &apiServer{live: map[string]bool{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close())
		}
	}()
	if s.home, err = newHome(cfg.Dir, templates); err != nil {
		return nil, err
	}
	s.d, err = daemon.New(ctx, daemon.Config{
		Dir: datadir.Dir{Root: s.home}, Log: cfg.Log, Listen: "127.0.0.1:0", E2BListen: "127.0.0.1:0",
		Accel: cfg.Accel, BootTimeout: cfg.BootTimeout, Store: storeAddr, NoReclaim: templates == nil,
		MaxSandboxes: 32, PingInterval: 15 * time.Second, DefaultEgress: "deny", MaxBuilds: 1, MaxBuildContextMiB: 1024,
	})
	if err != nil {
		return nil, err
	}
	s.rt, s.st, s.svc, s.bld = s.d.Runtime(), s.d.Store(), s.d.Service(), s.d.Builds()
	key := s.d.AdminKey()
	if s.admin, err = s.svc.Authenticate(ctx, key); err != nil {
		return nil, fmt.Errorf("authenticate the admin key: %w", err)
	}
	var runCtx context.Context
	runCtx, s.stop = context.WithCancel(context.Background())
	s.served = make(chan error, 1)
	go func() { s.served <- s.d.Run(runCtx) }() // ends with close's stop
	s.url, s.e2bURL = "http://"+s.d.Addr().String(), "http://"+s.d.E2BAddr().String()
	// A transport of its own, so that close can drop its connections.
	s.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	s.client = apiclient.New(s.url, key, apiclient.WithHTTPClient(s.hc))
	return s, nil
}

// newHome makes a temporary data directory that links the parts of real
// that a server only reads. With templates, its templates directory is
// not a link but its own, holding those of real's templates (see
// linkTemplates), so that a server may store, tag and reclaim there. Its
// name is short: the sandboxes' unix sockets live under it.
func newHome(real datadir.Dir, templates []string) (_ string, err error) {
	home, err := os.MkdirTemp("", "alb")
	if err != nil {
		return "", fmt.Errorf("create a temporary data directory: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.RemoveAll(home))
		}
	}()
	for _, name := range sharedHomeEntries {
		if name == "templates" && templates != nil {
			continue
		}
		if err := os.Symlink(filepath.Join(real.Root, name), filepath.Join(home, name)); err != nil {
			return "", fmt.Errorf("link the data directory's %s: %w", name, err)
		}
	}
	if templates != nil {
		if err := linkTemplates(real, datadir.Dir{Root: home}, templates); err != nil {
			return "", err
		}
	}
	return home, nil
}

// linkTemplates puts the templates that refs name in src into dst's
// templates directory: each image as a link to src's (a stored image is never
// written again), its record and its tag as copies, so that what a server
// records, tags or removes in dst leaves src as it was.
func linkTemplates(src, dst datadir.Dir, refs []string) error {
	from, to := template.Open(src), template.Open(dst)
	for _, ref := range refs {
		if _, err := to.Link(from, ref); err != nil {
			return fmt.Errorf("give the temporary data directory template %s: %w", ref, err)
		}
	}
	return nil
}

// close deletes the sandboxes made through the API, stops the server and
// the service, removes whatever sandbox is still left in the temporary
// data directory (killing its VM) and then the directory. It does all of
// that whatever fails on the way, and also for a server only partly
// started.
func (s *apiServer) close() error {
	var errs []error
	if s.client != nil {
		for id := range s.live {
			errs = append(errs, s.deleteSandbox(id))
		}
	}
	if s.served != nil {
		s.stop() // Run stops serving and lets go of the sandboxes
		if err := <-s.served; err != nil {
			errs = append(errs, fmt.Errorf("serve the API: %w", err))
		}
	}
	if s.hc != nil {
		s.hc.CloseIdleConnections()
	}
	if s.d != nil {
		s.d.Close() // the service lets go of sandboxes without stopping them
	}
	if s.rt != nil {
		errs = append(errs, s.removeLeftovers())
	}
	if s.home != "" {
		if err := os.RemoveAll(s.home); err != nil {
			errs = append(errs, fmt.Errorf("remove the temporary data directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeLeftovers removes every sandbox in the temporary data directory:
// those whose delete failed, and any whose create the bench never heard
// back from. The service must be closed, so that nothing owns them.
func (s *apiServer) removeLeftovers() error {
	entries, err := os.ReadDir(datadir.Dir{Root: s.home}.Sandboxes())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list leftover sandboxes: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !sandbox.ValidID(e.Name()) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
		errs = append(errs, s.rt.Remove(ctx, e.Name()))
		cancel()
	}
	return errors.Join(errs...)
}

// createSandbox creates a sandbox of template tpl through the API and
// waits, by long polls, for its create operation. The sandbox is in s.live
// from the moment the server named it, also when its create then fails.
func (s *apiServer) createSandbox(ctx context.Context, tpl string) (string, error) {
	id, _, err := s.createSandboxTimed(ctx, tpl)
	return id, err
}

// createSandboxTimed is createSandbox that also returns the steps of the
// create, as its operation reports them.
func (s *apiServer) createSandboxTimed(ctx context.Context, tpl string) (string, timings.Timings, error) {
	created, err := s.client.CreateSandbox(ctx, apiv1.CreateSandbox{Template: tpl})
	if err != nil {
		return "", nil, fmt.Errorf("create a sandbox over the API: %w", err)
	}
	id := created.Sandbox.ID
	s.live[id] = true
	op, err := s.client.WaitOperation(ctx, created.Operation.ID)
	if err != nil {
		return id, nil, fmt.Errorf("wait for the create of sandbox %s: %w", id, err)
	}
	if op.Status != apiv1.OpSucceeded {
		return id, nil, fmt.Errorf("create sandbox %s: %s", id, opFailure(op))
	}
	return id, op.Timings, nil
}

// deleteSandbox deletes sandbox id through the API and waits for the
// delete to finish. It does not depend on the run's context, so that a
// cancelled run still cleans up.
func (s *apiServer) deleteSandbox(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	op, err := s.client.DeleteSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s over the API: %w", id, err)
	}
	if op, err = s.client.WaitOperation(ctx, op.ID); err != nil {
		return fmt.Errorf("wait for the delete of sandbox %s: %w", id, err)
	}
	if op.Status != apiv1.OpSucceeded {
		return fmt.Errorf("delete sandbox %s: %s", id, opFailure(op))
	}
	delete(s.live, id)
	return nil
}

// opFailure says why an operation did not succeed.
func opFailure(op apiv1.Operation) string {
	if op.Error != nil {
		return fmt.Sprintf("operation %s %s: %s", op.ID, op.Status, op.Error.Message)
	}
	return fmt.Sprintf("operation %s %s", op.ID, op.Status)
}

// apiCreate measures, over the HTTP API, a sandbox create to the first
// stdout byte of a command in it against the same through the runtime in
// the same process.
func (r *runner) apiCreate(ctx context.Context) (Result, error) {
	s, err := r.apiServer(ctx)
	if err != nil {
		return Result{}, err
	}
	n := r.cfg.APIRuns
	var stepsA, stepsB []timings.Timings
	a, b, err := r.retryingPairs(ctx, ScenarioAPICreate, n,
		"api", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutputSteps(ctx, s, r.cfg.Template, &stepsA)
		},
		"runtime", func(ctx context.Context) (time.Duration, error) {
			return r.runtimeFirstOutput(ctx, s.rt, false, nil, &stepsB)
		})
	if err != nil {
		return Result{}, err
	}
	failA, failB := a.Failures, b.Failures
	notes := fmt.Sprintf("airlock: POST /v1/sandboxes (template %s), long polls of its create operation, "+
		"POST /v1/sandboxes/{id}/commands of argv %v, attach, until the first stdout event was read, "+
		"from a server in the same process on loopback; baseline: sandbox.Runtime.Create of the same template and "+
		"Exec of the same argv until its first stdout byte, in-process; %d samples each, alternating, each "+
		"sandbox deleted after its sample, untimed; ratio of p50s; p50 difference %+.0f ms",
		r.tpl.Ref(), firstOutputArgv, n, a.P50-b.P50)
	if failA+failB > 0 {
		notes += fmt.Sprintf("; %d API and %d baseline samples failed and were retried", failA, failB)
	}
	notes += "; timings: p50 per step of the create operation's timings (airlock) and of the runtime's " +
		"(baseline), and first exec: from the create's end (the operation's, or Create's return) to the first output"
	return Result{
		Name:     ScenarioAPICreate,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Timings:  stepTimings(stepsA, stepsB),
		Notes:    notes,
	}, nil
}

// firstOutputTimeout bounds one sample of api_create_to_first_output: a
// boot and an exec.
func (r *runner) firstOutputTimeout() time.Duration {
	return r.cfg.BootTimeout + execTimeout
}

// apiFirstOutput times, over the API, a create of a sandbox of template
// tpl to the first stdout event of a command session in it. The command's
// exit (status 0) and the sandbox's delete follow, untimed.
func (r *runner) apiFirstOutput(ctx context.Context, s *apiServer, tpl string) (time.Duration, error) {
	return r.apiFirstOutputSteps(ctx, s, tpl, nil)
}

// apiFirstOutputSteps is apiFirstOutput that, if steps is not nil, adds
// to it for a sample that succeeds the create operation's timings and a
// "first exec" step, from the operation's end to the first stdout event.
func (r *runner) apiFirstOutputSteps(ctx context.Context, s *apiServer, tpl string, steps *[]timings.Timings) (_ time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.firstOutputTimeout())
	defer cancel()
	start := time.Now()
	id, opSteps, err := s.createSandboxTimed(ctx, tpl)
	created := time.Now()
	if id != "" {
		defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	}
	if err != nil {
		return 0, err
	}
	sess, err := s.client.CreateCommand(ctx, id, apiv1.CommandRequest{Argv: firstOutputArgv})
	if err != nil {
		return 0, fmt.Errorf("create a command in sandbox %s: %w", id, err)
	}
	st, err := s.client.Attach(ctx, sess.ID)
	if err != nil {
		return 0, fmt.Errorf("attach to command %s: %w", sess.ID, err)
	}
	defer st.Close()
	if err := untilStdout(st); err != nil {
		return 0, fmt.Errorf("command %s: %w", sess.ID, err)
	}
	d, firstExec := time.Since(start), time.Since(created)
	if err := untilExit(st); err != nil {
		return 0, fmt.Errorf("command %s: %w", sess.ID, err)
	}
	if steps != nil {
		t := slices.Clone(opSteps)
		t.Add(stepFirstExec, firstExec)
		*steps = append(*steps, t)
	}
	return d, nil
}

// runtimeFirstOutput times rt.Create and an Exec in the new sandbox up to
// the first byte of its stdout. The command's exit (status 0), then, if
// not nil, then's work in the sandbox, and the sandbox's destruction
// follow, untimed. With wantClone, a sandbox that Create booted rather
// than cloned from its template snapshot fails the sample, as does a
// failure of then.
func (r *runner) runtimeFirstOutput(ctx context.Context, rt *sandbox.Runtime, wantClone bool, then func(context.Context, *sandbox.Sandbox) error, steps *[]timings.Timings) (time.Duration, error) {
	return r.firstOutput(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) {
		return rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	}, wantClone, then, steps)
}

// firstOutput is runtimeFirstOutput with the create its own: it times
// create and an Exec in the sandbox it returns up to the first byte of
// its stdout, and destroys the sandbox. If steps is not nil, a sample
// that succeeds adds to it the sandbox's Timings and a "first exec" step,
// from create's return to that first byte.
func (r *runner) firstOutput(ctx context.Context, create func(context.Context) (*sandbox.Sandbox, error), wantClone bool, then func(context.Context, *sandbox.Sandbox) error, steps *[]timings.Timings) (_ time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.firstOutputTimeout())
	defer cancel()
	start := time.Now()
	sb, err := create(ctx)
	if err != nil {
		return 0, err
	}
	created := time.Now()
	defer func() {
		if derr := destroy(sb); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	first := newFirstWrite()
	var stderr bytes.Buffer
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: firstOutputArgv}, agentclient.Stdio{Stdout: first, Stderr: &stderr})
	if err != nil {
		return 0, fmt.Errorf("exec %s in the sandbox: %w", firstOutputArgv[0], err)
	}
	select {
	case <-first.seen:
	case <-p.Done():
	case <-ctx.Done():
		return 0, fmt.Errorf("wait for the output of %s in the sandbox: %w", firstOutputArgv[0], ctx.Err())
	}
	d, firstExec := time.Since(start), time.Since(created)
	exit, err := sb.Wait(p)
	if err != nil {
		return 0, fmt.Errorf("wait for %s in the sandbox: %w", firstOutputArgv[0], err)
	}
	if exit.ExitCode != 0 {
		return 0, fmt.Errorf("%s in the sandbox exited with status %d: %s", firstOutputArgv[0], exit.ExitCode, clip(stderr.String()))
	}
	select {
	case <-first.seen:
	default:
		return 0, fmt.Errorf("%s in the sandbox exited without writing to stdout", firstOutputArgv[0])
	}
	if wantClone && sb.Snapshot == "" {
		return 0, fmt.Errorf("sandbox %s was booted, not cloned from its template snapshot (see the log)", sb.ID)
	}
	if then != nil {
		if err := then(ctx, sb); err != nil {
			return 0, err
		}
	}
	if steps != nil {
		t := slices.Clone(sb.Timings)
		t.Add(stepFirstExec, firstExec)
		*steps = append(*steps, t)
	}
	return d, nil
}

// stepFirstExec names the step from a create's end to the first output
// byte of the command run in the sandbox, in Result.Timings.
const stepFirstExec = "first exec"

// firstWrite is a writer that closes seen at the first write of a byte or
// more, and drops what it is given.
type firstWrite struct {
	seen chan struct{}
	once sync.Once
}

func newFirstWrite() *firstWrite { return &firstWrite{seen: make(chan struct{})} }

func (f *firstWrite) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { close(f.seen) })
	}
	return len(p), nil
}

// untilStdout reads events up to the first stdout event that carries
// data. A command that exits first is an error.
func untilStdout(st *apiclient.EventStream) error {
	for {
		ev, err := st.Next()
		if err != nil {
			return fmt.Errorf("read its event stream before any output: %w", err)
		}
		switch ev.Name {
		case apiv1.EventStdout:
			var out apiv1.DataEvent
			if err := json.Unmarshal(ev.Data, &out); err != nil {
				return fmt.Errorf("decode a stdout event: %w", err)
			}
			if len(out.Data) > 0 {
				return nil
			}
		case apiv1.EventExit:
			return fmt.Errorf("exited without writing to stdout: %s", ev.Data)
		}
	}
}

// untilExit reads events up to the exit event and fails unless the
// command exited with status 0; then it quotes the command's stderr.
func untilExit(st *apiclient.EventStream) error {
	var stderr bytes.Buffer
	for {
		ev, err := st.Next()
		if err != nil {
			return fmt.Errorf("read its event stream before its exit: %w", err)
		}
		switch ev.Name {
		case apiv1.EventStderr:
			var out apiv1.DataEvent
			if json.Unmarshal(ev.Data, &out) == nil && stderr.Len() < stderrLimit {
				stderr.Write(out.Data)
			}
		case apiv1.EventExit:
			var exit apiv1.ExitEvent
			if err := json.Unmarshal(ev.Data, &exit); err != nil {
				return fmt.Errorf("decode its exit event: %w", err)
			}
			if exit.ExitCode != 0 || exit.Signal != nil || exit.TimedOut {
				return fmt.Errorf("exited with %s: %s", ev.Data, clip(stderr.String()))
			}
			return nil
		}
	}
}

// apiExecRTT measures the round trip of `true` over the API's exec
// against the same through the runtime in-process, and, as a variant, a
// command session with an attach to its exit.
func (r *runner) apiExecRTT(ctx context.Context) (_ Result, err error) {
	s, err := r.apiServer(ctx)
	if err != nil {
		return Result{}, err
	}
	r.progressf("booting a %s sandbox over the API", r.tpl.Ref())
	id, err := s.createSandbox(ctx, r.cfg.Template)
	if id != "" {
		defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	}
	if err != nil {
		return Result{}, err
	}
	local, err := r.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	argv := []string{"true"}
	viaExec := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		defer cancel()
		return apiExec(ctx, s.client, id, argv)
	})
	viaSession := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		defer cancel()
		return apiSession(ctx, s.client, id, argv)
	})
	inProcess := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		defer cancel()
		return runInSandbox(ctx, local, argv, nil)
	})
	sides := []side{{"api exec run", viaExec}, {"command session run", viaSession}, {"baseline run", inProcess}}
	n := r.cfg.ExecRuns
	ds, err := r.warmRounds(ctx, ScenarioAPIExecRTT, n, 10, sides)
	if err != nil {
		return Result{}, err
	}
	return apiExecResult(summarize(ds[0]), summarize(ds[1]), summarize(ds[2]),
		fmt.Sprintf("airlock: POST /v1/sandboxes/{id}/exec of argv %v until its answer; session: "+
			"POST /v1/sandboxes/{id}/commands of the same argv, then attach until the exit event; both over "+
			"loopback to a server in the same process, on one running %s sandbox; baseline: Sandbox.Exec and "+
			"Wait of the same argv in-process, on another running sandbox of the same template; %d runs each "+
			"after %d untimed, interleaved; ratios of p50s", argv, r.tpl.Ref(), n, execWarmup)), nil
}

// apiExecResult assembles the api_exec_rtt result from its three sides.
func apiExecResult(viaExec, viaSession, inProcess Measurement, notes string) Result {
	return Result{
		Name:     ScenarioAPIExecRTT,
		Unit:     "ms",
		Airlock:  viaExec,
		Baseline: inProcess,
		Ratio:    ratio(viaExec.P50, inProcess.P50),
		Variants: []Variant{{Name: "session", Measurement: viaSession, Ratio: ratio(viaSession.P50, inProcess.P50)}},
		Notes:    notes,
	}
}

// apiExec runs argv in sandbox id with POST .../exec and fails unless it
// exits 0.
func apiExec(ctx context.Context, c *apiclient.Client, id string, argv []string) error {
	res, err := c.Exec(ctx, id, apiv1.CommandRequest{Argv: argv})
	if err != nil {
		return fmt.Errorf("exec %s over the API: %w", argv[0], err)
	}
	if res.ExitCode != 0 || res.Signal != nil || res.TimedOut {
		return fmt.Errorf("%s over the API exited with status %d: %s", argv[0], res.ExitCode, clip(res.Stderr))
	}
	return nil
}

// apiSession runs argv in sandbox id as a command session, attached until
// its exit event, and fails unless it exits 0.
func apiSession(ctx context.Context, c *apiclient.Client, id string, argv []string) error {
	sess, err := c.CreateCommand(ctx, id, apiv1.CommandRequest{Argv: argv})
	if err != nil {
		return fmt.Errorf("create a command over the API: %w", err)
	}
	st, err := c.Attach(ctx, sess.ID)
	if err != nil {
		return fmt.Errorf("attach to command %s: %w", sess.ID, err)
	}
	defer st.Close()
	if err := untilExit(st); err != nil {
		return fmt.Errorf("command %s: %w", sess.ID, err)
	}
	return nil
}

// apiLimits measures a create to first output over the API by a user key
// with limits on everything a create counts, which the store checks
// against the key's usage inside the create's insert, against the same by
// the admin key, which has no limits and counts nothing.
func (r *runner) apiLimits(ctx context.Context) (Result, error) {
	s, err := r.apiServer(ctx)
	if err != nil {
		return Result{}, err
	}
	high := int64(1 << 30)
	k, err := s.svc.CreateKey(ctx, s.admin, apiv1.CreateKey{Name: "bench-limited", Role: apiv1.RoleUser,
		Limits: &apiv1.Limits{Sandboxes: &high, VCPUs: &high, MemoryMiB: &high, DiskMiB: &high}})
	if err != nil {
		return Result{}, fmt.Errorf("create a limited key: %w", err)
	}
	limited := *s
	limited.client = apiclient.New(s.url, k.Key, apiclient.WithHTTPClient(s.hc))
	n := r.cfg.APIRuns
	a, b, err := r.retryingPairs(ctx, ScenarioAPILimits, n,
		"limited", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, &limited, r.cfg.Template)
		},
		"unlimited", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, s, r.cfg.Template)
		})
	if err != nil {
		return Result{}, err
	}
	return Result{
		Name:     ScenarioAPILimits,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: api_create_to_first_output's create and first output (template %s) by a user key with "+
			"limits on sandboxes, vcpus, memory_mib and disk_mib, each counted against its usage in the store's insert; "+
			"baseline: the same by the admin key, which has no limits and counts nothing; same server, %d samples each, "+
			"alternating; ratio of p50s (exec is not limited: it counts nothing)", r.tpl.Ref(), n),
	}, nil
}
