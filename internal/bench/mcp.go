package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// ScenarioMCPRunCommand prices an MCP run_command of `true` through
// `airlock mcp` on stdio against the same command through the native API.
const ScenarioMCPRunCommand = "mcp_run_command_rtt"

// mcpRunCommand measures, on one sandbox, a tools/call of run_command
// {"command": "true"} from an MCP client to an `airlock mcp` it started
// (this binary, stdio), until its result, against the call that tool
// makes through the native API: POST .../commands, then the attach
// stream read to its exit event.
func (r *runner) mcpRunCommand(ctx context.Context) (_ Result, err error) {
	self, err := os.Executable()
	if err != nil {
		return Result{}, fmt.Errorf("find this airlock binary for `airlock mcp`: %w", err)
	}
	s, err := r.apiServer(ctx)
	if err != nil {
		return Result{}, err
	}
	r.progressf("booting a %s sandbox over the API for %s", r.tpl.Ref(), ScenarioMCPRunCommand)
	id, err := s.createSandbox(ctx, r.cfg.Template)
	if id != "" {
		defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
	}
	if err != nil {
		return Result{}, err
	}

	cmd := exec.Command(self, "mcp", "--url", s.url)
	cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+s.d.AdminKey())
	cmd.Stderr = io.Discard
	client := sdk.NewClient(&sdk.Implementation{Name: "airlock-bench", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return Result{}, fmt.Errorf("start `airlock mcp` and initialize: %w", err)
	}
	defer func() { err = errors.Join(err, cs.Close()) }()

	viaMCP := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox_id": id, "command": "true"}})
		d := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("MCP run_command: %w", err)
		}
		out, _ := res.StructuredContent.(map[string]any)
		if res.IsError || out["exit_code"] != float64(0) {
			return 0, fmt.Errorf("MCP run_command of true answered error %v, %v", res.IsError, res.Content)
		}
		return d, nil
	}
	viaAPI := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		exit, err := s.client.RunCommand(ctx, id, apiv1.CommandRequest{Cmd: "true"}, nil, io.Discard, io.Discard)
		d := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("run true over the API: %w", err)
		}
		if exit.ExitCode != 0 {
			return 0, fmt.Errorf("true over the API exited %d", exit.ExitCode)
		}
		return d, nil
	}
	n := max(r.cfg.ExecRuns/4, 1)
	ds, err := timeRounds(ctx, n, []side{{"MCP run_command", viaMCP}, {"API command", viaAPI}}, func(i int, d []time.Duration) {
		if i%10 == 0 || i == n {
			r.progressf("%s: round %d/%d: MCP %.1f ms, API %.1f ms", ScenarioMCPRunCommand, i, n, ms(d[0]), ms(d[1]))
		}
	})
	if err != nil {
		return Result{}, err
	}
	a, b := summarize(ds[0]), summarize(ds[1])
	return Result{Name: ScenarioMCPRunCommand, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("one %s sandbox; airlock: an MCP client's tools/call of run_command {\"command\": \"true\"} to `airlock mcp` on stdio, "+
			"which makes the same calls as the baseline, until its result; baseline: POST /v1/sandboxes/{id}/commands of true and its attach stream "+
			"read to the exit event, by the Go client; %d rounds each, interleaved", r.tpl.Ref(), n)}, nil
}
