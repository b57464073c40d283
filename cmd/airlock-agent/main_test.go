package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// The binary is the agent only as PID 1; anywhere else it runs the probe
// when asked to, and refuses anything else.
func TestProbeDispatch(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "airlock-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	out, err := exec.Command(bin, agentproto.ProbeSpawnArgv(2, "/bin/true")[1:]...).Output()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	var res agentproto.SpawnProbe
	if err := json.Unmarshal(out, &res); err != nil || len(res.RunsNS) != 2 {
		t.Errorf("probe printed %q (%v), want 2 runs", out, err)
	}
	for _, args := range [][]string{nil, {"serve"}, {"probe"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("%q: %v, want exit status 1", args, err)
		}
		want := "must run as PID 1"
		if len(args) > 0 && args[0] == "probe" {
			want = "usage"
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("%q said %q, want %q", args, out, want)
		}
	}
}
