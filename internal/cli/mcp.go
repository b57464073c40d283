package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/mcp"
)

const mcpAbout = `Serves airlock's sandboxes as the tools of a Model Context Protocol
server on stdin and stdout, for an agent (Claude Desktop, Cursor, an
agent SDK) to start as a subprocess: create_sandbox, run_command,
read_command_output, write_file, read_file, list_files, list_sandboxes,
delete_sandbox, run_code, checkpoint_sandbox, fork_sandbox and
expose_port (docs/mcp.md). Every tool calls the server at --url with the
API key of --key-file, else of $AIRLOCK_API_KEY, else the admin key file,
and can do what that key can. It serves until stdin closes.

The same tools are served over HTTP at POST /v1/mcp by the server itself.

  AIRLOCK_URL=http://127.0.0.1:7700 AIRLOCK_API_KEY=... airlock mcp
  airlock mcp --url https://airlock.example:7700 --key-file ~/.airlock-key`

func runMCP(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("mcp", "airlock mcp [FLAGS]", mcpAbout, env)
	sf := addServerFlags(fs)
	keyFile := fs.String("key-file", "", "read the API key from this `file` instead of $AIRLOCK_API_KEY")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("mcp takes no arguments, got %q: see `airlock mcp -h`: %w", pos[0], errdefs.ErrInvalid)
	}
	var c *apiclient.Client
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("mcp: --key-file: %w: %w", err, errdefs.ErrInvalid)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			return fmt.Errorf("mcp: --key-file %s is empty: %w", *keyFile, errdefs.ErrInvalid)
		}
		if c, err = sf.clientWithKey(key); err != nil {
			return err
		}
	} else if c, err = sf.client(env); err != nil {
		return err
	}
	// Say early, on stderr (which MCP clients log), when the server is not
	// there; the tools still answer, each with the error.
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := c.Health(hctx); err != nil {
		fmt.Fprintf(env.Stderr, "airlock mcp: the airlock server at %s does not answer (%s): tool calls will fail until it does\n", c.URL(), Message(err))
	}
	cancel()
	srv := mcp.NewServer(mcp.Config{Client: mcp.StdioClient(c), Version: Version(), Log: env.Log})
	t := &sdk.IOTransport{Reader: io.NopCloser(env.Stdin), Writer: nopWriteCloser{env.Stdout}, MaxLineLength: mcp.MaxRequestBytes}
	if err := srv.Run(ctx, t); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
