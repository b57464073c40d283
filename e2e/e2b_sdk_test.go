package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// The E2B SDK tests run E2B's own JavaScript SDK (npm e2b and
// @e2b/code-interpreter, pinned in e2e/e2bsdk/package-lock.json) against
// `airlock serve --e2b-listen`. The cases live in Node scripts under
// e2e/e2bsdk; each prints one JSON line per case (harness.mjs), which
// becomes a subtest here with the case's log, node's stderr and the
// server's output when it fails.

const (
	e2bSDKDir    = "e2bsdk"
	e2bSDKDomain = "e2b.test"
	e2bSDKPin    = "2.51.0" // npm e2b
	e2bCIPin     = "2.8.0"  // npm @e2b/code-interpreter
	// e2bCITemplate is the airlock template behind E2B's
	// code-interpreter-v1; runCode is tested only when it is installed.
	e2bCITemplate = "code-interpreter"
	// e2bSnapshotCase is sdk.mjs's case of snapshots and forks.
	e2bSnapshotCase = "createSnapshot, listSnapshots, create from a snapshot, fork, deleteSnapshot"
)

var e2bSDKKeyShape = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

// TestE2BSDK drives the SDK through create (v2), commands, files and
// watches, info, list, timeouts, pause and resume (by connect, and by a
// command with lifecycle.autoResume), guest ports, egress
// with and without internet access, snapshots and forks, and kill; then
// runCode when the code-interpreter template is there, in Python,
// JavaScript, TypeScript, bash and R.
//
// E2E_SDK_CASES, a regular expression, runs only the script cases whose
// names match (and those they need): with
// -run 'TestE2BSDK/(sdk|snapshot|nothing)' and E2E_SDK_CASES=Snapshot, the
// snapshot case alone.
func TestE2BSDK(t *testing.T) {
	node := needNode(t)
	dir, err := filepath.Abs(e2bSDKDir)
	if err != nil {
		t.Fatal(err)
	}
	needSDKModules(t, dir)

	e2bAddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox made without network settings gets the operator's default
	// egress; open here, as E2B's own default is.
	args := []string{"--e2b-listen", e2bAddr, "--e2b-domain", e2bSDKDomain, "--default-egress", "allow"}
	var env []string
	var tn *testNet
	if os.Geteuid() == 0 {
		// The test host of the network tests, and their DNS as the
		// gateways' upstream, so egress can be checked both ways.
		tn = sharedNet(t).tn
		env = tn.serverEnv()
		args = append(args, tn.serverArgs()...)
	} else {
		t.Log("not root: no test host, so the egress cases are skipped")
	}
	s := newServerEnv(t, env, args...)

	var k struct {
		Key    string `json:"key"`
		Format string `json:"format"`
	}
	s.must(t, 201, "POST", "/v1/keys", s.key, map[string]string{"name": "e2b-sdk", "role": "user", "format": "e2b"}, &k)
	if !e2bSDKKeyShape.MatchString(k.Key) {
		t.Fatalf("POST /v1/keys with format e2b gave key %q, want e2b_ and 40 lowercase hex digits", k.Key)
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	scriptEnv := []string{
		"E2B_API_URL=http://" + e2bAddr,
		"E2B_SANDBOX_URL=http://" + e2bAddr,
		"E2B_API_KEY=" + k.Key,
		"E2B_DOMAIN=" + e2bSDKDomain,
		"E2E_RUN_ID=" + runID,
	}
	if v := os.Getenv("E2E_SDK_CASES"); v != "" {
		scriptEnv = append(scriptEnv, "E2E_CASES="+v)
	}
	var allowed, denied string
	var before [3]int
	if tn != nil {
		allowed, denied = "allowed.test", "denied.test"
		scriptEnv = append(scriptEnv, "E2E_EGRESS_ALLOWED="+allowed, "E2E_EGRESS_DENIED="+denied, "E2E_EGRESS_IP="+tn.ip.String())
		before = [3]int{tn.seenCount("http:" + allowed), tn.seenCount("http:" + denied), tn.dns.queries(denied)}
	}

	var sdkResults map[string]sdkCase
	t.Run("sdk", func(t *testing.T) {
		res := runSDKScript(t, s, node, dir, "sdk.mjs", scriptEnv, 12*time.Minute)
		sdkResults = res
		if r, ok := res["allowInternetAccess false blocks egress"]; tn == nil || !ok || r.Skip != "" {
			return
		}
		// What the test host saw: the allowed sandbox reached it, the
		// one without internet access never did, nor did its name
		// reach the upstream DNS.
		t.Run("egress as the test host saw it", func(t *testing.T) {
			if n := tn.seenCount("http:" + allowed); n <= before[0] {
				t.Errorf("the test host got no HTTP request for %s from the sandbox with internet access", allowed)
			}
			if n := tn.seenCount("http:" + denied); n != before[1] {
				t.Errorf("the test host got %d HTTP requests for %s from the sandbox without internet access", n-before[1], denied)
			}
			if n := tn.dns.queries(denied); n != before[2] {
				t.Errorf("the upstream DNS was asked %d times for %s by the sandbox without internet access", n-before[2], denied)
			}
		})
	})

	// The snapshots and forks the SDK made are checkpoints, with their
	// events: each one ready, and deleted by the end (the snapshot by
	// deleteSnapshot, a fork's by the server once its children ran).
	t.Run("snapshot events", func(t *testing.T) {
		r, ok := sdkResults[e2bSnapshotCase]
		if !ok && os.Getenv("E2E_SDK_CASES") != "" {
			return // not selected
		}
		if !ok || !r.OK {
			t.Fatal("not checked: the SDK's snapshot case did not pass")
		}
		var evs apiv1.Events
		s.must(t, 200, "GET", "/v1/events?type=checkpoint.*&limit=1000", k.Key, nil, &evs)
		ready, deleted := map[string]bool{}, map[string]bool{}
		for _, e := range evs.Items {
			var d struct {
				CheckpointID string `json:"checkpoint_id"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil || d.CheckpointID == "" {
				t.Fatalf("event %+v: no checkpoint_id (%v)", e, err)
			}
			switch e.Type {
			case apiv1.EventCheckpointReady:
				ready[d.CheckpointID] = true
			case apiv1.EventCheckpointDeleted:
				deleted[d.CheckpointID] = true
			}
		}
		if len(ready) < 2 {
			t.Errorf("%d checkpoint.ready events, want one for the snapshot and one for the fork: %+v", len(ready), evs.Items)
		}
		for id := range ready {
			if !deleted[id] {
				t.Errorf("checkpoint %s was ready and never deleted: %+v", id, evs.Items)
			}
		}
	})

	t.Run("code-interpreter", func(t *testing.T) {
		var tl struct {
			Items []apiv1.Template `json:"items"`
		}
		s.must(t, 200, "GET", "/v1/templates", s.key, nil, &tl)
		have := false
		for _, tpl := range tl.Items {
			have = have || tpl.Name == e2bCITemplate
		}
		if !have {
			// Each runCode case shows as skipped with the reason, so a
			// missing template is never a silent pass.
			reason := fmt.Sprintf("runCode was not run: the server lists no template named %s (it is not installed)", e2bCITemplate)
			for _, name := range sdkScriptPlan(t, node, dir, "code-interpreter.mjs", scriptEnv) {
				t.Run(name, func(t *testing.T) { testenv.Lacking(t, "%s", reason) })
			}
			return
		}
		// Each language's first run starts its interpreter, which under
		// emulation takes up to a minute or two (TypeScript's checker
		// loads its library then).
		runSDKScript(t, s, node, dir, "code-interpreter.mjs", scriptEnv, 20*time.Minute)
	})

	// Every sandbox the SDK made was killed through it: none may be left.
	t.Run("nothing left", func(t *testing.T) {
		var left []string
		deadline := time.Now().Add(30 * time.Second)
		for {
			var l struct {
				Items []apiv1.Sandbox `json:"items"`
			}
			s.must(t, 200, "GET", "/v1/sandboxes", s.key, nil, &l)
			left = left[:0]
			for _, sb := range l.Items {
				if sb.State != apiv1.StateDeleted {
					left = append(left, sb.ID+" "+sb.State)
				}
			}
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if len(left) > 0 {
			t.Errorf("sandboxes left after the SDK killed its own: %v", left)
		}
	})
}

// needNode returns node's path, or skips the test when node is missing
// or too old; under CI (CI=true) it fails instead, so that CI cannot pass
// without having run the SDK.
func needNode(t *testing.T) string {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		testenv.Lacking(t, "%s: the E2B SDK tests need Node.js >= 20.18.1 and npm (Debian: apt-get install nodejs npm)", why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not installed")
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		missing(fmt.Sprintf("node --version: %v", err))
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	var major, minor int
	fmt.Sscanf(v, "%d.%d", &major, &minor)
	// e2b 2.51.0's engines: >=20.18.1 <21 || >=22.
	if major < 20 || (major == 20 && minor < 18) || major == 21 {
		missing("node " + v + " is too old or unsupported")
	}
	return node
}

// needSDKModules makes sure e2bsdk/node_modules holds the pinned SDKs,
// running `npm ci` when it does not (make e2e does it before the tests).
func needSDKModules(t *testing.T, dir string) {
	t.Helper()
	needNpmPins(t, dir, map[string]string{"e2b": e2bSDKPin, "@e2b/code-interpreter": e2bCIPin})
}

// needNpmPins makes sure dir/node_modules holds each package at its
// version, running `npm ci` in dir when it does not.
func needNpmPins(t *testing.T, dir string, pins map[string]string) {
	t.Helper()
	ok := func() bool {
		for name, want := range pins {
			b, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
			var p struct{ Version string }
			if err != nil || json.Unmarshal(b, &p) != nil || p.Version != want {
				return false
			}
		}
		return true
	}
	if ok() {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Lacking(t, "npm is not installed and %s/node_modules lacks the pinned packages %v (Debian: apt-get install npm)", dir, pins)
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if !ok() {
		t.Fatalf("npm ci in %s did not install %v", dir, pins)
	}
}

// sdkCase is one line of a script's output (see harness.mjs).
type sdkCase struct {
	Plan      []string `json:"plan"`
	Done      bool     `json:"done"`
	Case      string   `json:"case"`
	OK        bool     `json:"ok"`
	Skip      string   `json:"skip"`
	Error     string   `json:"error"`
	MS        int64    `json:"ms"`
	Log       []string `json:"log"`
	Sandboxes []string `json:"sandboxes"`
}

const sdkCaseMarker = "E2E "

func sdkScriptCmd(ctx context.Context, node, dir, script string, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		// The SDK reads E2B_* itself (E2B_DEBUG would bypass the API).
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "E2E_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// sdkScriptPlan returns the names of a script's cases without running them.
func sdkScriptPlan(t *testing.T, node, dir, script string, env []string) []string {
	t.Helper()
	cmd := sdkScriptCmd(context.Background(), node, dir, script, append(env, "E2E_PLAN_ONLY=1"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s with E2E_PLAN_ONLY: %v\n%s", script, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var r sdkCase
		if rest, ok := strings.CutPrefix(line, sdkCaseMarker); ok && json.Unmarshal([]byte(rest), &r) == nil && r.Plan != nil {
			return r.Plan
		}
	}
	t.Fatalf("node %s printed no plan: %s", script, out)
	return nil
}

// runSDKScript runs a script and reports each of its cases as a subtest
// as it finishes. Every case of the plan must be reported, and the script
// must finish; it returns the results by case name.
func runSDKScript(t *testing.T, s *server, node, dir, script string, env []string, limit time.Duration) map[string]sdkCase {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := sdkScriptCmd(ctx, node, dir, script, env)
	var stderr safeBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("node %s: %v", script, err)
	}
	var plan []string
	var other []string
	results := map[string]sdkCase{}
	done := false
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), sdkCaseMarker)
		var r sdkCase
		if !ok || json.Unmarshal([]byte(rest), &r) != nil {
			other = append(other, sc.Text())
			continue
		}
		switch {
		case r.Plan != nil:
			plan = r.Plan
		case r.Done:
			done = true
			if len(r.Sandboxes) > 0 {
				t.Logf("%s made sandboxes %v", script, r.Sandboxes)
			}
		case r.Case != "":
			results[r.Case] = r
			t.Run(r.Case, func(t *testing.T) {
				switch {
				case r.Skip != "":
					testenv.Lacking(t, "%s", r.Skip)
				case !r.OK:
					t.Errorf("%s\n--- case log:\n%s\n--- node stderr (tail):\n%s\n--- server output (tail):\n%s",
						r.Error, strings.Join(r.Log, "\n"), lastBytes(stderr.String(), 4000), lastBytes(s.output(), 6000))
				default:
					// What the case saw, for the record (shown with -v).
					t.Logf("passed in %d ms%s", r.MS, strings.Join(append([]string{""}, r.Log...), "\n"))
				}
			})
		}
	}
	werr := cmd.Wait()
	t.Logf("node %s finished in %s", script, time.Since(start).Round(time.Millisecond))
	if len(other) > 0 {
		t.Logf("other stdout of %s:\n%s", script, strings.Join(other, "\n"))
	}
	if plan == nil || !done {
		t.Errorf("node %s did not finish its cases (plan %v, done %v, exit %v, %s after start)\n--- node stderr:\n%s\n--- server output (tail):\n%s",
			script, plan != nil, done, werr, time.Since(start).Round(time.Second), lastBytes(stderr.String(), 8000), lastBytes(s.output(), 6000))
	}
	for _, name := range plan {
		if _, ok := results[name]; !ok {
			t.Run(name, func(t *testing.T) { t.Errorf("case not reported: %s stopped before it", script) })
		}
	}
	if werr != nil && done && !t.Failed() {
		t.Errorf("node %s exited with %v although every case passed\n%s", script, werr, lastBytes(stderr.String(), 4000))
	}
	return results
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
