package airlock_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/testenv"
)

// TestPythonClientUnit runs the Python client's unit tests
// (clients/python/tests/test_unit.py) against their fake server: error
// mapping, the event stream's parsing, reconnects with Last-Event-ID, and
// what the requests carry. e2e/pyclient_test.go runs its live tests.
func TestPythonClientUnit(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		testenv.Lacking(t, "python3 is needed for the Python client's tests (Debian 12 has it)")
	}
	if err := exec.Command(python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))").Run(); err != nil {
		testenv.Lacking(t, "the Python client needs Python 3.11 or later: %s is older (%v)", python, err)
	}
	cmd := exec.Command(python, "-m", "unittest", "-v", "tests.test_unit")
	cmd.Dir = "clients/python"
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest tests.test_unit:\n%s", out)
	if err != nil {
		t.Fatalf("the client's unit tests failed: %v", err)
	}
	if !regexp.MustCompile(`(?m)^Ran \d+ tests in \S+\n\nOK$`).Match(out) || strings.Contains(string(out), "skipped") {
		t.Errorf("the unit tests did not all run and pass")
	}
}
