package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

func TestOpGet(t *testing.T) {
	f := newFakeServer(t)
	if _, _, err := f.run(t, "", "sandbox", "create", "--no-wait"); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := f.run(t, "", "op", "get", "op2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID:", "op2", "Kind:", "create", "Target:", "sbx1", "Status:", "running", "Finished:", "-"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}

	stdout, _, err = f.run(t, "", "op", "get", "--wait", "--json", "op2")
	var op apiv1.Operation
	if err != nil || json.Unmarshal([]byte(stdout), &op) != nil || op.Status != apiv1.OpSucceeded || op.FinishedAt == nil {
		t.Fatalf("--wait --json: %v\n%s", err, stdout)
	}
}

func TestOpGetFailed(t *testing.T) {
	f := newFakeServer(t)
	if _, _, err := f.run(t, "", "sandbox", "create", "--no-wait", "--template", "broken"); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := f.run(t, "", "op", "get", "op2", "--wait")
	if ExitCode(err) != 1 {
		t.Fatalf("exit %d (%v), want 1 for a failed operation", ExitCode(err), err)
	}
	if !strings.Contains(stdout, "Error:") || !strings.Contains(stdout, "kernel panic") {
		t.Fatalf("output:\n%s", stdout)
	}
	if _, _, err := f.run(t, "", "op", "get", "opnone"); ExitCode(err) != 2 {
		t.Fatalf("unknown operation: exit %d", ExitCode(err))
	}
}
