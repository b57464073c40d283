package airlock_test

import (
	"os/exec"
	"strings"
	"testing"
)

// layerRules pins who may not import whom, so that the layers in
// docs/architecture.md cannot erode one import at a time. A rule forbids
// pkg to import each of forbid (a package or, with its subpackages, a
// tree): directly if direct is set, else anywhere below pkg.
var layerRules = []struct {
	pkg    string
	forbid []string
	direct bool
	why    string
}{
	{
		pkg:    "internal/service",
		forbid: []string{"net/http"},
		direct: true,
		why:    "the service speaks Go, not HTTP: only the edges (api, e2b, cluster's router) turn its results into responses",
	},
	{
		pkg:    "internal/service",
		forbid: []string{"internal/api", "internal/e2b", "internal/cluster"},
		why:    "the edges call the service, never the other way round",
	},
	{
		pkg:    "internal/builds",
		forbid: []string{"net/http"},
		direct: true,
		why:    "template builds speak Go: only the edges turn their results into responses (a pull's own HTTP is the registry client's, in template/oci)",
	},
	{
		pkg:    "internal/builds",
		forbid: []string{"internal/api", "internal/e2b", "internal/cluster", "internal/service"},
		why:    "the edges call builds, and builds ask the sandbox side through their own Sandboxes interface, which the service implements: never the other way round",
	},
	{
		pkg:    "internal/sessions",
		forbid: []string{"net/http"},
		direct: true,
		why:    "command sessions hand out typed events: the edges (api's SSE, E2B's envd) encode them for HTTP",
	},
	{
		pkg:    "internal/sessions",
		forbid: []string{"internal/api", "internal/e2b", "internal/cluster", "internal/service"},
		why:    "the service and the edges call the command sessions, which ask the service about sandboxes only through their own Sandboxes interface",
	},
	{
		pkg:    "internal/cli",
		forbid: []string{"internal/store", "internal/service", "internal/api", "internal/e2b", "internal/cluster", "internal/node", "internal/secrets"},
		direct: true,
		why:    "the command line reads flags and talks to a server; internal/daemon alone puts a server together",
	},
	{
		pkg:    "cmd/airlock-agent",
		forbid: []string{"internal/probe", "internal/bench"},
		why:    "the guest agent carries no bench code: the bench copies cmd/airlock-probe into a guest instead",
	},
}

func TestLayers(t *testing.T) {
	const module = "github.com/airlockhq/airlock/"
	for _, r := range layerRules {
		t.Run(r.pkg, func(t *testing.T) {
			args := []string{"list", "-deps", "-f", "{{.ImportPath}}", "./" + r.pkg}
			if r.direct {
				args = []string{"list", "-f", `{{join .Imports "\n"}}`, "./" + r.pkg}
			}
			out, err := exec.Command("go", args...).Output()
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("go list %s: %v: %s", r.pkg, err, ee.Stderr)
			} else if err != nil {
				t.Fatalf("go list %s: %v", r.pkg, err)
			}
			for _, dep := range strings.Fields(string(out)) {
				dep = strings.TrimPrefix(dep, module)
				for _, f := range r.forbid {
					if dep == f || strings.HasPrefix(dep, f+"/") {
						t.Errorf("%s imports %s: %s", r.pkg, dep, r.why)
					}
				}
			}
		})
	}
}
