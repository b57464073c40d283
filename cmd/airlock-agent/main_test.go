package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The binary is the agent only as PID 1; anywhere else it refuses to run,
// whatever it is asked (the bench's probe is cmd/airlock-probe).
func TestRefusesOutsidePID1(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "airlock-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	for _, args := range [][]string{nil, {"serve"}, {"probe", "spawn", "2", "/bin/true"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("%q: %v, want exit status 1", args, err)
		}
		if want := "must run as PID 1"; !strings.Contains(string(out), want) {
			t.Errorf("%q said %q, want %q", args, out, want)
		}
	}
}
