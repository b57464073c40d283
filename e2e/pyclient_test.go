package e2e

import (
	"bytes"
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

// TestPythonClient runs the Python client's live tests
// (clients/python/tests/test_live.py) against a real server with a user
// key: a sandbox created and listed, exec, a streamed command, a stream
// dropped and resumed after its last event, replay from the start and from
// an event, stdin and a kill, files, archives, typed errors (404, 400,
// 401, 409), pause, suspend and wake, a checkpoint with a sandbox from it,
// a fork and a rollback that ends a running command, and deletes. Then it
// checks, with the admin key, that the client left nothing behind.
func TestPythonClient(t *testing.T) {
	python := pythonForClient(t)
	s := sharedServer(t)
	label := "pyclient-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cmd := exec.Command(python, "-m", "unittest", "-v", "tests.test_live")
	cmd.Dir = filepath.Join("..", "clients", "python")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url, "AIRLOCK_API_KEY="+userKey(t, s, "pyclient"),
		"AIRLOCK_TEMPLATE=tiny", "AIRLOCK_TEST_LABEL="+label, "PYTHONDONTWRITEBYTECODE=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("python3 -m unittest tests.test_live (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("the client's live tests failed: %v", err)
	}
	checkUnittestRan(t, out.String(), 10)

	// Every sandbox the tests made (the first, one from a checkpoint, one
	// forked) is deleted, with its directory, and no checkpoint is left.
	var live, deleted apiv1.List[apiv1.Sandbox]
	s.must(t, 200, "GET", "/v1/sandboxes?metadata.test="+label, s.key, nil, &live)
	s.must(t, 200, "GET", "/v1/sandboxes?state=deleted&metadata.test="+label, s.key, nil, &deleted)
	if len(live.Items) != 0 || len(deleted.Items) != 3 {
		t.Errorf("after the client's tests: %d sandboxes not deleted, %d deleted (want 0 and 3)", len(live.Items), len(deleted.Items))
	}
	var chks apiv1.List[apiv1.Checkpoint]
	for _, sb := range deleted.Items {
		checkGone(t, filepath.Join(s.home, "sandboxes", sb.ID), 0)
		s.must(t, 200, "GET", "/v1/checkpoints?sandbox_id="+sb.ID, s.key, nil, &chks)
		if len(chks.Items) != 0 {
			t.Errorf("sandbox %s still has checkpoints: %+v", sb.ID, chks.Items)
		}
	}
}

// pythonForClient returns the python3 the client runs on: 3.11 or later.
func pythonForClient(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		testenv.Lacking(t, "python3 is needed for the Python client (Debian 12 has it)")
	}
	if err := exec.Command(python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))").Run(); err != nil {
		testenv.Lacking(t, "the Python client needs Python 3.11 or later: %s is older (%v)", python, err)
	}
	return python
}

// checkUnittestRan fails unless the verbose output of `python3 -m
// unittest -v` says that want tests ran, each ok, none skipped.
func checkUnittestRan(t *testing.T, out string, want int) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? in \S+\n\nOK$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output does not end with OK")
	}
	if n, _ := strconv.Atoi(m[1]); n != want {
		t.Errorf("%s tests ran, want %d", m[1], want)
	}
	if ok := strings.Count(out, " ... ok\n"); ok != want || strings.Contains(out, "skipped") {
		t.Errorf("%d tests passed of %d, or some were skipped", ok, want)
	}
}
