package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// The agent client tests run clients agents use, unchanged, from npm
// (pinned in e2e/agents/package-lock.json), with the case runner of the
// E2B SDK tests (e2bsdk/harness.mjs).
const agentsDir = "agents"

// agentClientPins are the packages e2e/agents must hold, at these versions.
var agentClientPins = map[string]string{
	"@modelcontextprotocol/sdk": "1.32.2",
	"@openai/agents":            "0.18.0",
	"@openai/agents-extensions": "0.18.0",
	"e2b":                       e2bSDKPin,
}

// needAgentClients makes sure e2e/agents/node_modules holds the pinned
// clients, running `npm ci` when it does not (make e2e does it first),
// and returns the directory.
func needAgentClients(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(agentsDir)
	if err != nil {
		t.Fatal(err)
	}
	ok := func() bool {
		for name, want := range agentClientPins {
			b, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
			var p struct{ Version string }
			if err != nil || json.Unmarshal(b, &p) != nil || p.Version != want {
				return false
			}
		}
		return true
	}
	if ok() {
		return dir
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Lacking(t, "npm is not installed and %s/node_modules lacks the pinned clients (Debian: apt-get install npm)", dir)
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if !ok() {
		t.Fatalf("npm ci in %s did not install %v", dir, agentClientPins)
	}
	return dir
}

// TestMCP runs the MCP TypeScript SDK's stdio client, which spawns
// `airlock mcp`, and its streamable HTTP client against POST /v1/mcp
// (e2e/agents/mcp.mjs): every tool, a failing command, long output read
// on, bad IDs, paths and arguments, tenancy, a port reached through the
// URL expose_port gives, a checkpoint and a fork, run_code, and a clean
// exit of the stdio server.
func TestMCP(t *testing.T) {
	node := needNode(t)
	dir := needAgentClients(t)
	s := sharedServer(t)
	var keys []string
	for _, name := range []string{"mcp", "mcp-other"} {
		var k apiv1.KeyCreated
		s.must(t, 201, "POST", "/v1/keys", s.key, map[string]string{"name": name, "role": "user"}, &k)
		keys = append(keys, k.Key)
	}
	env := []string{
		"AIRLOCK_URL=" + s.url,
		"AIRLOCK_API_KEY=" + keys[0],
		"AIRLOCK_OTHER_KEY=" + keys[1],
		"AIRLOCK=" + airlockBin(t),
	}
	var tl struct {
		Items []apiv1.Template `json:"items"`
	}
	s.must(t, 200, "GET", "/v1/templates", s.key, nil, &tl)
	for _, tpl := range tl.Items {
		if tpl.Name == e2bCITemplate {
			env = append(env, "E2E_CODE_INTERPRETER=1")
		}
	}
	runSDKScript(t, s, node, dir, "mcp.mjs", env, 12*time.Minute)
}
