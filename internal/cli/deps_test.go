package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// The command line reads flags and talks to a server; it does not
// assemble one. The server is put together in internal/daemon alone, so
// the CLI imports none of the packages a server is made of.
func TestCLIDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/airlockhq/airlock/internal/"
	forbidden := map[string]bool{
		mod + "store":    true,
		mod + "service":  true,
		mod + "api":      true,
		mod + "e2b":      true,
		mod + "e2b/envd": true,
		mod + "cluster":  true,
		mod + "node":     true,
		mod + "secrets":  true,
	}
	for _, imp := range strings.Fields(string(out)) {
		if forbidden[imp] {
			t.Errorf("the CLI imports %s; reach the server through internal/daemon", imp)
		}
	}
}
