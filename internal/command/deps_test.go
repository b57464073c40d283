package command

import (
	"os/exec"
	"strings"
	"testing"
)

// Command sessions sit below the edges that encode their events: they
// import no HTTP, no API or E2B layer, no service, store or cluster code.
// Their imports from this module are pinned here.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/airlockhq/airlock/internal/command":     true,
		"github.com/airlockhq/airlock/internal/eventlog":    true,
		"github.com/airlockhq/airlock/internal/apiv1":       true,
		"github.com/airlockhq/airlock/internal/agentclient": true,
		"github.com/airlockhq/airlock/internal/agentproto":  true,
		"github.com/airlockhq/airlock/internal/errdefs":     true,
		"github.com/airlockhq/airlock/internal/textcheck":   true,
		"github.com/airlockhq/airlock/internal/timings":     true,
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "net/http" || strings.HasPrefix(dep, "net/http/"):
			t.Errorf("internal/command imports %s; encoding for HTTP belongs to the edges", dep)
		case strings.HasPrefix(dep, "github.com/airlockhq/airlock/") && !allowed[dep]:
			t.Errorf("internal/command imports %s; keep it below the service and the edges", dep)
		}
	}
}
