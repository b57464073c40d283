package bench

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// e2bScript is the node program that drives E2B's SDK (see its comment).
//
//go:embed e2b.mjs
var e2bScript []byte

// DefaultE2BSDK is where the e2b_ scenarios look for E2B's JavaScript SDK
// when Config.E2BSDK is empty: the directory of the E2B SDK tests, whose
// node_modules `npm ci` fills, relative to the working directory.
const DefaultE2BSDK = "e2e/e2bsdk"

// e2bTemplate is the template of both sides of the e2b_ scenarios: the
// SDK runs every command under /bin/bash, which tiny lacks.
const e2bTemplate = "base"

// The argvs both sides of the e2b_ scenarios run: what the SDK's
// commands.run('echo hi') and commands.run('true') start in the sandbox.
var (
	e2bFirstOutputArgv = []string{"/bin/bash", "-l", "-c", "echo hi"}
	e2bExecArgv        = []string{"/bin/bash", "-l", "-c", "true"}
)

// nodeMarker starts each line of the node script's messages.
const nodeMarker = "BENCH "

// nodeStartTimeout bounds node's start and the SDK's import, which the
// samples do not count but a sample's timeout must allow for.
const nodeStartTimeout = 30 * time.Second

// e2bSDK is a node and an installed E2B JavaScript SDK.
type e2bSDK struct {
	node        string // node's path
	nodeVersion string // as node --version prints it, without the v
	modules     string // the absolute path of the node_modules holding e2b
	version     string // npm e2b's version
}

// findE2BSDK finds node and the SDK in dir's node_modules (dir empty:
// DefaultE2BSDK). Its errors say what to install.
func findE2BSDK(dir string) (e2bSDK, error) {
	if dir == "" {
		dir = DefaultE2BSDK
	}
	var sdk e2bSDK
	node, err := exec.LookPath("node")
	if err != nil {
		return sdk, errors.New("node is not installed: the e2b_ scenarios run E2B's JavaScript SDK under Node.js >= 20.18.1 " +
			"(Debian: apt-get install nodejs npm)")
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return sdk, fmt.Errorf("%s --version: %w", node, err)
	}
	sdk.node, sdk.nodeVersion = node, strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if !nodeVersionOK(sdk.nodeVersion) {
		return sdk, fmt.Errorf("node %s is too old or unsupported: npm e2b needs Node.js >= 20.18.1 and not 21", sdk.nodeVersion)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return sdk, fmt.Errorf("find the E2B SDK: %w", err)
	}
	sdk.modules = filepath.Join(abs, "node_modules")
	b, err := os.ReadFile(filepath.Join(sdk.modules, "e2b", "package.json"))
	var p struct{ Version string }
	if err != nil || json.Unmarshal(b, &p) != nil || p.Version == "" {
		return sdk, fmt.Errorf("E2B's JavaScript SDK (npm e2b) is not installed in %s: run `cd e2e/e2bsdk && npm ci` "+
			"in airlock's source tree and run the bench from there, or pass --e2b-sdk DIR, a directory whose node_modules holds npm e2b",
			sdk.modules)
	}
	sdk.version = p.Version
	return sdk, nil
}

// nodeVersionOK reports whether node version v (as in "20.18.1") is one
// npm e2b 2.51.0 supports: >=20.18.1 <21 || >=22.
func nodeVersionOK(v string) bool {
	var major, minor, patch int
	if n, _ := fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch); n < 2 {
		return false
	}
	switch {
	case major == 20:
		return minor > 18 || (minor == 18 && patch >= 1)
	case major >= 22:
		return true
	}
	return false
}

// nodeMsg is one message of the node script.
type nodeMsg struct {
	Sandbox string   `json:"sandbox,omitempty"`
	MS      *float64 `json:"ms,omitempty"`
	Killed  bool     `json:"killed,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// parseNodeLine reads a line of the node script's stdout. ok is false for
// a line that is not a message (the SDK or node may print others).
func parseNodeLine(line string) (m nodeMsg, ok bool, err error) {
	rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), nodeMarker)
	if !ok {
		return nodeMsg{}, false, nil
	}
	if err := json.Unmarshal([]byte(rest), &m); err != nil {
		return nodeMsg{}, true, fmt.Errorf("decode the node script's message %q: %w", clip(rest), err)
	}
	return m, true, nil
}

// sample returns the message's sample as a duration.
func (m nodeMsg) sample() (time.Duration, error) {
	if m.MS == nil {
		return 0, errors.New("the node script's message carries no sample")
	}
	if v := *m.MS; v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("the node script measured %v ms", v)
	}
	return time.Duration(*m.MS * float64(time.Millisecond)), nil
}

// e2bServer is the way to E2B's API that an apiServer serves on a
// loopback port, as `airlock serve --e2b-listen` does: an e2b-format key
// of that server and a work directory holding the node script beside a
// link to the SDK's node_modules (node resolves imports from the
// script's directory).
type e2bServer struct {
	sdk  e2bSDK
	url  string
	key  string
	work string
}

// startE2BServer readies an e2bServer over s. On failure, what it made
// is removed again.
func (r *runner) startE2BServer(ctx context.Context, s *apiServer, sdk e2bSDK) (_ *e2bServer, err error) {
	e := &e2bServer{sdk: sdk}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	if e.work, err = os.MkdirTemp("", "alb-e2b"); err != nil {
		return nil, fmt.Errorf("create the node script's directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(e.work, "e2b.mjs"), e2bScript, 0o644); err != nil {
		return nil, fmt.Errorf("write the node script: %w", err)
	}
	if err := os.Symlink(sdk.modules, filepath.Join(e.work, "node_modules")); err != nil {
		return nil, fmt.Errorf("link the E2B SDK: %w", err)
	}
	k, err := s.client.CreateKey(ctx, apiv1.CreateKey{Name: "bench-e2b", Role: "user", Format: "e2b"})
	if err != nil {
		return nil, fmt.Errorf("create an e2b key: %w", err)
	}
	e.key = k.Key
	e.url = s.e2bURL
	r.progressf("serving E2B's API on %s; E2B SDK %s under node %s", e.url, sdk.version, sdk.nodeVersion)
	return e, nil
}

// close removes the work directory, also for a server only partly
// readied. E2B's API is served until the apiServer closes.
func (e *e2bServer) close() error {
	var errs []error
	if e.work != "" {
		if err := os.RemoveAll(e.work); err != nil {
			errs = append(errs, fmt.Errorf("remove the node script's directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// node returns the command running the node script with args, pointed at
// the server. The SDK reads E2B_* itself: none of the bench's own reach it.
func (e *e2bServer) node(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, e.sdk.node, append([]string{"e2b.mjs"}, args...)...)
	cmd.Dir = e.work
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// nodeRun is the node script's progress as its messages said.
type nodeRun struct {
	sandbox string
	killed  bool
	err     error // the first error it reported
}

// note takes in one message and returns it.
func (n *nodeRun) note(m nodeMsg) nodeMsg {
	if m.Sandbox != "" {
		n.sandbox = m.Sandbox
	}
	n.killed = n.killed || m.Killed
	if m.Error != "" && n.err == nil {
		n.err = fmt.Errorf("the E2B SDK: %s", m.Error)
	}
	return m
}

// cleanup deletes, over the native API, the sandbox the script made and
// did not kill.
func (n *nodeRun) cleanup(s *apiServer) error {
	if n.sandbox == "" || n.killed {
		return nil
	}
	return s.deleteSandbox(n.sandbox)
}

// e2bCreate measures, with E2B's SDK, Sandbox.create to the first output
// of commands.run('echo hi') against the same over the native API.
func (r *runner) e2bCreate(ctx context.Context) (_ Result, err error) {
	sdk, err := findE2BSDK(r.cfg.E2BSDK)
	if err != nil {
		return Result{Name: ScenarioE2BCreate, Unit: "ms", Notes: "not run"}, err
	}
	s, e, err := r.e2bServers(ctx, sdk)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, e.close()) }()
	n := r.cfg.APIRuns
	a, b, err := r.retryingPairs(ctx, ScenarioE2BCreate, n,
		"e2b", func(ctx context.Context) (time.Duration, error) { return r.e2bFirstOutput(ctx, s, e) },
		"api", func(ctx context.Context) (time.Duration, error) {
			return r.nativeFirstOutput(ctx, s, e2bTemplate, e2bFirstOutputArgv)
		})
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: E2B's JavaScript SDK (npm e2b %s, node %s), Sandbox.create('%s') then "+
		"commands.run('echo hi') (argv %q in the sandbox) until its first onStdout, timed inside a node process "+
		"started per sample (its start and the SDK's import untimed); baseline: the native API, POST /v1/sandboxes "+
		"of the same template, long polls of its create operation, POST /v1/sandboxes/{id}/commands of the same argv, "+
		"attach, until the first stdout event; both to servers in this process on loopback over one service; "+
		"%d samples each, alternating, each sandbox killed or deleted after its sample, untimed; ratio of p50s; "+
		"p50 difference %+.0f ms", sdk.version, sdk.nodeVersion, e2bTemplate, e2bFirstOutputArgv, n, a.P50-b.P50)
	if a.Failures+b.Failures > 0 {
		notes += fmt.Sprintf("; %d SDK and %d native samples failed and were retried", a.Failures, b.Failures)
	}
	return Result{Name: ScenarioE2BCreate, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// e2bServers returns the shared API server, with the snapshot of
// e2bTemplate made, and an E2B server over it that the caller closes.
func (r *runner) e2bServers(ctx context.Context, sdk e2bSDK) (*apiServer, *e2bServer, error) {
	s, err := r.apiServer(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.rt.Templates().Resolve(e2bTemplate); err != nil {
		return nil, nil, fmt.Errorf("the e2b_ scenarios need template %s (bash): %w", e2bTemplate, err)
	}
	if err := r.prepareSnapshot(ctx, s.rt, sandbox.Spec{Template: e2bTemplate}); err != nil {
		return nil, nil, err
	}
	e, err := r.startE2BServer(ctx, s, sdk)
	if err != nil {
		return nil, nil, fmt.Errorf("start an E2B API server: %w", err)
	}
	return s, e, nil
}

// e2bFirstOutput runs one sample of the node script's create mode and
// returns what it measured.
func (r *runner) e2bFirstOutput(ctx context.Context, s *apiServer, e *e2bServer) (_ time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.firstOutputTimeout()+nodeStartTimeout)
	defer cancel()
	cmd := e.node(ctx, "create", e2bTemplate)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, werr := cmd.Output()
	var run nodeRun
	defer func() { err = errors.Join(err, run.cleanup(s)) }()
	var d time.Duration
	got := false
	for _, line := range strings.Split(string(out), "\n") {
		m, ok, err := parseNodeLine(line)
		if err != nil {
			return 0, err
		}
		if ok && run.note(m).MS != nil {
			if d, err = m.sample(); err != nil {
				return 0, err
			}
			got = true
		}
	}
	switch {
	case run.err != nil:
		return 0, run.err
	case werr != nil:
		return 0, fmt.Errorf("node e2b.mjs create: %w: %s", werr, clip(stderr.String()))
	case !got:
		return 0, fmt.Errorf("node e2b.mjs create printed no sample: %s", clip(string(out)))
	}
	return d, nil
}

// nativeFirstOutput times, over the native API, a create of template tpl
// to the first stdout event of a command session of argv in it. The
// command's exit (status 0) and the sandbox's delete follow, untimed.
func (r *runner) nativeFirstOutput(ctx context.Context, s *apiServer, tpl string, argv []string) (_ time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.firstOutputTimeout())
	defer cancel()
	start := time.Now()
	id, err := s.createSandbox(ctx, tpl)
	if id != "" {
		defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	}
	if err != nil {
		return 0, err
	}
	sess, err := s.client.CreateCommand(ctx, id, apiv1.CommandRequest{Argv: argv})
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
	d := time.Since(start)
	if err := untilExit(st); err != nil {
		return 0, fmt.Errorf("command %s: %w", sess.ID, err)
	}
	return d, nil
}

// nodeExecs is the node script in exec mode: one sandbox, one
// commands.run per request.
type nodeExecs struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *bytes.Buffer // read only after cmd.Wait
	run    nodeRun
	waited bool
}

// startNodeExecs starts the node script in exec mode and waits for its
// sandbox.
func (e *e2bServer) startNodeExecs(ctx context.Context, argv string, timeout time.Duration) (_ *nodeExecs, err error) {
	x := &nodeExecs{cmd: e.node(ctx, "exec", e2bTemplate, argv), stderr: &bytes.Buffer{}}
	x.cmd.Stderr = x.stderr
	if x.stdin, err = x.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := x.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	x.lines = bufio.NewScanner(stdout)
	x.lines.Buffer(make([]byte, 64<<10), 1<<20)
	if err := x.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	m, err := x.next(timeout)
	if err == nil && m.Sandbox == "" {
		err = fmt.Errorf("the node script sent %+v before its sandbox", m)
	}
	if err != nil {
		return nil, errors.Join(err, x.wait())
	}
	return x, nil
}

// next reads the script's next message; one that reports an error, or
// none within timeout, is an error.
func (x *nodeExecs) next(timeout time.Duration) (nodeMsg, error) {
	t := time.AfterFunc(timeout, func() { x.cmd.Process.Kill() })
	defer t.Stop()
	for x.lines.Scan() {
		m, ok, err := parseNodeLine(x.lines.Text())
		if err != nil {
			return nodeMsg{}, err
		}
		if !ok {
			continue
		}
		if x.run.note(m); x.run.err != nil {
			return nodeMsg{}, x.run.err
		}
		return m, nil
	}
	err := x.wait()
	return nodeMsg{}, fmt.Errorf("node e2b.mjs exec ended without a message: %w", errors.Join(err, x.lines.Err()))
}

// runOnce asks for one commands.run and returns what node measured.
func (x *nodeExecs) runOnce(timeout time.Duration) (time.Duration, error) {
	if _, err := io.WriteString(x.stdin, "run\n"); err != nil {
		return 0, fmt.Errorf("ask node for a run: %w", err)
	}
	m, err := x.next(timeout)
	if err != nil {
		return 0, err
	}
	return m.sample()
}

// close asks the script to kill its sandbox and waits for it to exit; a
// sandbox it did not kill is deleted over the native API.
func (x *nodeExecs) close(s *apiServer) error {
	var errs []error
	if _, err := io.WriteString(x.stdin, "quit\n"); err == nil {
		for !x.run.killed {
			if _, err := x.next(destroyTimeout); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	errs = append(errs, x.wait(), x.run.cleanup(s))
	return errors.Join(errs...)
}

// wait closes stdin and waits for node to exit, once; its failure quotes
// its stderr.
func (x *nodeExecs) wait() error {
	if x.waited {
		return nil
	}
	x.waited = true
	x.stdin.Close()
	if err := x.cmd.Wait(); err != nil {
		return fmt.Errorf("node e2b.mjs exec: %w: %s", err, clip(x.stderr.String()))
	}
	return nil
}

// e2bExecRTT measures the round trip of commands.run('true') with E2B's
// SDK, timed inside node, against POST /v1/sandboxes/{id}/exec of the same
// argv over the native API.
func (r *runner) e2bExecRTT(ctx context.Context) (_ Result, err error) {
	sdk, err := findE2BSDK(r.cfg.E2BSDK)
	if err != nil {
		return Result{Name: ScenarioE2BExecRTT, Unit: "ms", Notes: "not run"}, err
	}
	s, e, err := r.e2bServers(ctx, sdk)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, e.close()) }()
	r.progressf("booting a %s sandbox over the native API and one with the E2B SDK", e2bTemplate)
	id, err := s.createSandbox(ctx, e2bTemplate)
	if id != "" {
		defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	}
	if err != nil {
		return Result{}, err
	}
	x, err := e.startNodeExecs(ctx, "true", r.firstOutputTimeout()+nodeStartTimeout)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, x.close(s)) }()
	viaSDK := func(context.Context) (time.Duration, error) { return x.runOnce(execTimeout) }
	native := timed(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		defer cancel()
		return apiExec(ctx, s.client, id, e2bExecArgv)
	})
	sides := []side{{"e2b run", viaSDK}, {"api exec run", native}}
	n := r.cfg.ExecRuns
	ds, err := r.warmRounds(ctx, ScenarioE2BExecRTT, n, 10, sides)
	if err != nil {
		return Result{}, err
	}
	a, b := summarize(ds[0]), summarize(ds[1])
	return Result{
		Name:     ScenarioE2BExecRTT,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: E2B's JavaScript SDK (npm e2b %s, node %s), commands.run('true') on one "+
			"%s sandbox made by Sandbox.create, timed inside one node process from the call to its return; "+
			"baseline: the native API's POST /v1/sandboxes/{id}/exec of argv %q until its answer, on another "+
			"%s sandbox; both sides run that argv (the SDK's commands.run starts /bin/bash -l -c CMD) on servers "+
			"in this process on loopback over one service; %d runs each after %d untimed, interleaved; ratio of p50s",
			sdk.version, sdk.nodeVersion, e2bTemplate, e2bExecArgv, e2bTemplate, n, execWarmup),
	}, nil
}
