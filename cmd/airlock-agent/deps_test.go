package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The agent runs inside every sandbox: it must stay small and must never
// pull in host code (VMM, runtime, CLI). Its imports from this module are
// pinned here.
func TestAgentDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/airlockhq/airlock/cmd/airlock-agent":   true,
		"github.com/airlockhq/airlock/internal/agent":      true,
		"github.com/airlockhq/airlock/internal/agentproto": true,
		"github.com/airlockhq/airlock/internal/timings":    true,
		"github.com/airlockhq/airlock/internal/textcheck":  true,
		"github.com/airlockhq/airlock/internal/errdefs":    true,
		"github.com/hashicorp/yamux":                       true,
		"github.com/creack/pty":                            true,
		"golang.org/x/sys/unix":                            true,
	}
	for _, dep := range strings.Fields(string(out)) {
		if !allowed[dep] && !strings.HasPrefix(dep, "golang.org/x/sys/") && !strings.HasPrefix(dep, "internal/") && !strings.HasPrefix(dep, "vendor/") {
			t.Errorf("the guest agent imports %s; keep host code out of it", dep)
		}
	}
}
