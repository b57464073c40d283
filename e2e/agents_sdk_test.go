package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// The agent-SDK tests run the agent harnesses' own sandbox clients,
// unchanged, against airlock: their cases live in Node scripts under
// e2e/agents (npm packages pinned in its package-lock.json), reported
// one JSON line per case as the E2B SDK scripts do.

const (
	agentsDir       = "agents"
	agentsSDKPin    = "0.18.0" // npm @openai/agents and @openai/agents-extensions
	agentsE2BSDKPin = "2.51.0" // the npm e2b the extension drives
)

// TestOpenAIAgentsE2B drives the OpenAI Agents SDK's E2B sandbox client
// (@openai/agents-extensions/sandbox/e2b) against `airlock serve
// --e2b-listen`, with no model call: a session made from a manifest,
// execCommand (output, exit codes, workdir, environment), files
// (materialized, read back, binary), a PTY fed by writeStdin, an exposed
// port, workspace persistence as a tar and as a native snapshot, pause on
// cleanup and resume from a serialized session state (the sandbox's
// memory and disk kept), and close.
//
// E2E_SDK_CASES, a regular expression, runs only the cases whose names
// match (and those they need).
func TestOpenAIAgentsE2B(t *testing.T) {
	node := needNode(t)
	dir, err := filepath.Abs(agentsDir)
	if err != nil {
		t.Fatal(err)
	}
	needNpmPins(t, dir, map[string]string{"@openai/agents": agentsSDKPin, "@openai/agents-extensions": agentsSDKPin, "e2b": agentsE2BSDKPin})

	e2bAddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	s := newServerEnv(t, nil, "--e2b-listen", e2bAddr, "--e2b-domain", e2bSDKDomain)
	var k struct {
		Key string `json:"key"`
	}
	s.must(t, 201, "POST", "/v1/keys", s.key, map[string]string{"name": "openai-agents", "role": "user", "format": "e2b"}, &k)

	env := []string{
		"E2B_API_URL=http://" + e2bAddr,
		"E2B_SANDBOX_URL=http://" + e2bAddr,
		"E2B_API_KEY=" + k.Key,
		"E2B_DOMAIN=" + e2bSDKDomain,
		"E2E_RUN_ID=" + strconv.FormatInt(time.Now().UnixNano(), 36),
		// The Agents SDK's tracing would export spans to OpenAI: no
		// network call leaves the test.
		"OPENAI_AGENTS_DISABLE_TRACING=1",
	}
	if v := os.Getenv("E2E_SDK_CASES"); v != "" {
		env = append(env, "E2E_CASES="+v)
	}
	res := runSDKScript(t, s, node, dir, "openai-agents.mjs", env, 25*time.Minute)
	if len(res) == 0 {
		t.Fatal("the script reported no case")
	}
	// Every sandbox the client made is gone by the end.
	t.Run("nothing left", func(t *testing.T) {
		var list apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes?limit=100", s.key, nil, &list)
		for _, sb := range list.Items {
			if sb.State != "deleted" {
				t.Errorf("sandbox %s is left %s", sb.ID, sb.State)
			}
		}
	})
}
