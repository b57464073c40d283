// Package mcp serves airlock's sandboxes as the tools of a Model Context
// Protocol server (docs/mcp.md): create a sandbox, run commands, read and
// write files, run code, checkpoint, fork and expose ports. Every tool
// calls an airlock server through internal/apiclient, with the caller's
// API key, so that a tool can do exactly what that key can do over HTTP.
//
// `airlock mcp` serves the tools on stdio with one key; the API server
// serves them at POST /v1/mcp over MCP's streamable HTTP transport, each
// request with the key it was authenticated with (Handler).
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Config says how the tools reach airlock.
type Config struct {
	// Client returns the client a tool call talks to airlock with: on
	// stdio the one configured, over HTTP one with the request's key.
	Client func(req *sdk.CallToolRequest) (*apiclient.Client, error)
	// PortURL returns the URL a port of a sandbox is reached at through
	// the API's ports proxy. Default: under the client's URL.
	PortURL func(req *sdk.CallToolRequest, c *apiclient.Client, sandboxID string, port int) string
	// Version is the server's version as MCP's initialize reports it.
	Version string
	// Log receives the server's own failures. Nil discards them.
	Log *slog.Logger
}

// NewServer returns an MCP server with airlock's tools.
func NewServer(cfg Config) *sdk.Server {
	if cfg.PortURL == nil {
		cfg.PortURL = func(_ *sdk.CallToolRequest, c *apiclient.Client, id string, port int) string {
			return fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/", c.URL(), id, port)
		}
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "airlock", Title: "airlock sandboxes", Version: cfg.Version}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       cfg.Log,
	})
	t := &tools{cfg: cfg}
	t.add(s)
	return s
}

const instructions = `airlock runs code in microVM sandboxes: each has its own kernel, disk and network policy, and root inside it cannot reach the host.
Create a sandbox (create_sandbox), then run shell commands in it (run_command), move files in and out (write_file, read_file, list_files), and delete it when done (delete_sandbox).
Sandboxes made from the code-interpreter template also run code with state kept between calls (run_code).
checkpoint_sandbox saves a running sandbox whole; fork_sandbox makes copies of it that go on from that instant.`

// StdioClient returns a Config.Client that always answers c.
func StdioClient(c *apiclient.Client) func(*sdk.CallToolRequest) (*apiclient.Client, error) {
	return func(*sdk.CallToolRequest) (*apiclient.Client, error) { return c, nil }
}

// Handler serves the tools over MCP's streamable HTTP transport,
// statelessly: every POST carries its own calls and is answered in JSON,
// so any replica of the API can answer any request and no session outlives
// it. api wraps it behind its own authentication, so the request's bearer
// key is known good; self serves the API in process, and each tool call
// goes through it with that key.
func Handler(self http.Handler, version string, log *slog.Logger) http.Handler {
	base := apiclient.InProcess(self)
	srv := NewServer(Config{
		Version: version,
		Log:     log,
		Client: func(req *sdk.CallToolRequest) (*apiclient.Client, error) {
			key := bearer(req)
			if key == "" {
				return nil, fmt.Errorf("no API key on the request: %w", errdefs.ErrUnauthenticated)
			}
			return apiclient.New("http://airlock.in-process", key, apiclient.WithHTTPClient(base)), nil
		},
		PortURL: func(req *sdk.CallToolRequest, _ *apiclient.Client, id string, port int) string {
			return fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/", publicBase(req), id, port)
		},
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Stateless:                    true,
		JSONResponse:                 true,
		Logger:                       log,
		MaxRequestBodyBytes:          MaxRequestBytes,
		PropagateRequestCancellation: true,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		// Set here, over whatever the client sent: only the tools read it.
		r.Header.Set(baseHeader, scheme+"://"+r.Host)
		h.ServeHTTP(w, r)
	})
}

// baseHeader carries, from Handler to the tools, the scheme and host the
// request was addressed to, under which the API's other routes are too.
const baseHeader = "Airlock-Mcp-Base"

// MaxRequestBytes bounds one message to the server, over HTTP or stdio:
// room for a write_file of MaxWriteBytes as JSON-escaped text.
const MaxRequestBytes = 48 << 20

// header is a header of the HTTP request that carried a tool call, ""
// on stdio.
func header(req *sdk.CallToolRequest, name string) string {
	if req == nil || req.Extra == nil || req.Extra.Header == nil {
		return ""
	}
	return req.Extra.Header.Get(name)
}

// bearer is the API key of the HTTP request that carried a tool call.
func bearer(req *sdk.CallToolRequest) string {
	key, _ := strings.CutPrefix(header(req, "Authorization"), "Bearer ")
	return strings.TrimSpace(key)
}

// publicBase is where the HTTP request that carried a tool call was
// addressed to, as Handler recorded it.
func publicBase(req *sdk.CallToolRequest) string { return header(req, baseHeader) }

// errClient is the message of a failed call of airlock, as a tool result
// shows it: the API's message, without the error class the API's code
// already says.
func errClient(what string, err error) error {
	var ae *apiclient.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: %s (%s)", what, ae.Message, ae.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: the call was cancelled or ran out of time", what)
	}
	return fmt.Errorf("%s: %s", what, errdefs.Message(err))
}
