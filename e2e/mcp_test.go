package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// mcpSDKPin is the npm @modelcontextprotocol/sdk e2e/agents pins.
const mcpSDKPin = "1.32.2"

// TestMCP runs the MCP TypeScript SDK's stdio client, which spawns
// `airlock mcp`, and its streamable HTTP client against POST /v1/mcp
// (e2e/agents/mcp.mjs): every tool, a failing command, long output read
// on, bad IDs, paths and arguments, tenancy, a port reached through the
// URL expose_port gives, a checkpoint and a fork, run_code, and a clean
// exit of the stdio server.
func TestMCP(t *testing.T) {
	node := needNode(t)
	dir, err := filepath.Abs(agentsDir)
	if err != nil {
		t.Fatal(err)
	}
	needNpmPins(t, dir, map[string]string{"@modelcontextprotocol/sdk": mcpSDKPin})
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
