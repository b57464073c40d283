package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/template"
)

// Limits of what one tool call moves, so that an agent's context and the
// server's memory stay bounded. docs/mcp.md lists them.
const (
	// MaxInlineOutput is how much of each of a command's stdout and
	// stderr run_command returns: the first and the last half of it, with
	// a note of what was cut in between.
	MaxInlineOutput = 32 << 10
	// MaxOutputRead bounds one read_command_output.
	MaxOutputRead = 1 << 20
	// MaxWriteBytes bounds the content of one write_file.
	MaxWriteBytes = 8 << 20
	// MaxReadBytes bounds the file read_file returns.
	MaxReadBytes = 4 << 20
	// MaxListEntries bounds list_files' answer.
	MaxListEntries = 5000
	// MaxListSandboxes bounds list_sandboxes' answer.
	MaxListSandboxes = 1000
	// MaxCodeBytes bounds the code of one run_code.
	MaxCodeBytes = 1 << 20
	// MaxCodeOutput bounds what run_code reads back from the interpreter.
	MaxCodeOutput = 8 << 20
	// DefaultCommandTimeoutS and MaxCommandTimeoutS bound run_command's
	// timeout_s: a tool call waits for its command.
	DefaultCommandTimeoutS = 300
	MaxCommandTimeoutS     = 3600
)

type tools struct{ cfg Config }

func (t *tools) add(s *sdk.Server) {
	sdk.AddTool(s, &sdk.Tool{Name: "create_sandbox", Description: "Create a sandbox (a microVM) and wait until it runs. Returns its ID, which the other tools take as sandbox_id."}, t.createSandbox)
	sdk.AddTool(s, &sdk.Tool{Name: "run_command", Description: "Run a shell command (bash -c) in a sandbox and wait for it to end. A command that fails is a normal result with its exit_code. Long output is cut in the middle; read_command_output reads all of it."}, t.runCommand)
	sdk.AddTool(s, &sdk.Tool{Name: "read_command_output", Description: "Read a command's stdout or stderr from a byte offset, as run_command kept it whole."}, t.readCommandOutput)
	sdk.AddTool(s, &sdk.Tool{Name: "write_file", Description: "Write a file in a sandbox, making its parent directories. content is text, or base64 with encoding \"base64\"."}, t.writeFile)
	sdk.AddTool(s, &sdk.Tool{Name: "read_file", Description: "Read a file in a sandbox: text as it is, anything else as base64 (encoding says which)."}, t.readFile)
	sdk.AddTool(s, &sdk.Tool{Name: "list_files", Description: "List a directory in a sandbox (depth 1 by default)."}, t.listFiles)
	sdk.AddTool(s, &sdk.Tool{Name: "list_sandboxes", Description: "List the sandboxes this API key can see."}, t.listSandboxes)
	sdk.AddTool(s, &sdk.Tool{Name: "delete_sandbox", Description: "Delete a sandbox and everything in it."}, t.deleteSandbox)
	sdk.AddTool(s, &sdk.Tool{Name: "run_code", Description: "Run code in a sandbox made from the code-interpreter template, in a context that keeps its state between calls (variables, imports, cwd). Returns stdout, stderr, results (the last expression's value, charts) and the error if any."}, t.runCode)
	sdk.AddTool(s, &sdk.Tool{Name: "checkpoint_sandbox", Description: "Checkpoint a running, paused or suspended sandbox: its memory, processes and disk at one instant. The sandbox runs on."}, t.checkpointSandbox)
	sdk.AddTool(s, &sdk.Tool{Name: "fork_sandbox", Description: "Fork a sandbox: checkpoint it and make count sandboxes from the checkpoint, each going on from that instant with its own identity. Waits until they run."}, t.forkSandbox)
	sdk.AddTool(s, &sdk.Tool{Name: "expose_port", Description: "Return the URL at which a port a process in the sandbox listens on is reached over HTTP (and WebSocket) through airlock's ports proxy, with this API key."}, t.exposePort)
}

func (t *tools) client(req *sdk.CallToolRequest) (*apiclient.Client, error) {
	c, err := t.cfg.Client(req)
	if err != nil {
		return nil, errClient("airlock", err)
	}
	return c, nil
}

// need says what is missing when a required string is empty (the schema
// lets "" through).
func need(field, v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s is required and may not be empty", field)
	}
	return nil
}

// --- sandboxes ---

type createSandboxIn struct {
	Template string         `json:"template,omitempty" jsonschema:"the template to make the sandbox from: base (the default), code-interpreter for run_code, or one of your own"`
	TimeoutS int            `json:"timeout_s,omitempty" jsonschema:"seconds until the sandbox is deleted unless kept alive (default: the server's)"`
	Network  map[string]any `json:"network,omitempty" jsonschema:"its egress policy as docs/api.md describes it, such as {\"egress\": \"allow\"} or {\"egress\": \"deny\", \"allow\": [\"pypi.org\"]} (default: no egress)"`
}

type sandboxOut struct {
	SandboxID string     `json:"sandbox_id"`
	State     string     `json:"state"`
	Template  string     `json:"template"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func sandboxView(sb apiv1.Sandbox) sandboxOut {
	return sandboxOut{SandboxID: sb.ID, State: sb.State, Template: sb.Template.Ref, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt}
}

func (t *tools) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createSandboxIn) (*sdk.CallToolResult, sandboxOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	if in.TimeoutS < 0 {
		return nil, sandboxOut{}, fmt.Errorf("timeout_s %d is negative", in.TimeoutS)
	}
	cr := apiv1.CreateSandbox{Template: in.Template}
	if cr.Template == "" {
		cr.Template = "base"
	}
	if in.TimeoutS > 0 {
		cr.TimeoutS = &in.TimeoutS
	}
	if in.Network != nil {
		if cr.Network, err = json.Marshal(in.Network); err != nil {
			return nil, sandboxOut{}, fmt.Errorf("network: %v", err)
		}
	}
	op, err := c.CreateSandbox(ctx, cr)
	if err != nil {
		return nil, sandboxOut{}, errClient("create_sandbox", err)
	}
	if err := wait(ctx, c, op.Operation); err != nil {
		return nil, sandboxOut{}, errClient("create_sandbox "+op.Sandbox.ID, err)
	}
	sb, err := c.GetSandbox(ctx, op.Sandbox.ID)
	if err != nil {
		return nil, sandboxOut{}, errClient("create_sandbox "+op.Sandbox.ID, err)
	}
	return nil, sandboxView(sb), nil
}

// wait waits for an operation to finish and returns its failure.
func wait(ctx context.Context, c *apiclient.Client, op apiv1.Operation) error {
	if !op.Done() {
		var err error
		if op, err = c.WaitOperation(ctx, op.ID); err != nil {
			return err
		}
	}
	return op.Failure()
}

type listSandboxesIn struct {
	State string `json:"state,omitempty" jsonschema:"only sandboxes in this state (running, paused, suspended, …)"`
}

type listSandboxesOut struct {
	Sandboxes []sandboxOut `json:"sandboxes"`
	// Truncated says there were more than MaxListSandboxes.
	Truncated bool `json:"truncated,omitempty"`
}

func (t *tools) listSandboxes(ctx context.Context, req *sdk.CallToolRequest, in listSandboxesIn) (*sdk.CallToolResult, listSandboxesOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, listSandboxesOut{}, err
	}
	out := listSandboxesOut{Sandboxes: []sandboxOut{}}
	lo := apiclient.ListOptions{Limit: 200}
	for {
		page, err := c.ListSandboxes(ctx, apiclient.SandboxFilter{State: in.State}, lo)
		if err != nil {
			return nil, listSandboxesOut{}, errClient("list_sandboxes", err)
		}
		for _, sb := range page.Items {
			if len(out.Sandboxes) == MaxListSandboxes {
				out.Truncated = true
				return nil, out, nil
			}
			out.Sandboxes = append(out.Sandboxes, sandboxView(sb))
		}
		if page.NextPageToken == "" {
			return nil, out, nil
		}
		lo.PageToken = page.NextPageToken
	}
}

type sandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID, as create_sandbox returned it"`
}

type deleteOut struct {
	SandboxID string `json:"sandbox_id"`
	Deleted   bool   `json:"deleted"`
}

func (t *tools) deleteSandbox(ctx context.Context, req *sdk.CallToolRequest, in sandboxIn) (*sdk.CallToolResult, deleteOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, deleteOut{}, err
	}
	if err := need("sandbox_id", in.SandboxID); err != nil {
		return nil, deleteOut{}, err
	}
	op, err := c.DeleteSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, deleteOut{}, errClient("delete_sandbox "+in.SandboxID, err)
	}
	if err := wait(ctx, c, op); err != nil {
		return nil, deleteOut{}, errClient("delete_sandbox "+in.SandboxID, err)
	}
	return nil, deleteOut{SandboxID: in.SandboxID, Deleted: true}, nil
}

// --- commands ---

type runCommandIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox to run the command in"`
	Command   string            `json:"command" jsonschema:"a shell command line, run with bash -c (sh -c where there is no bash)"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"seconds after which the command is killed (default 300, at most 3600)"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"the directory to run it in (default: the user's home)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables to set for it"`
}

type runCommandOut struct {
	// CommandID names the command for read_command_output.
	CommandID string `json:"command_id"`
	// ExitCode is the command's exit status; -1 when a signal ended it
	// or the sandbox was rolled back under it.
	ExitCode int     `json:"exit_code"`
	Signal   *string `json:"signal,omitempty"`
	TimedOut bool    `json:"timed_out,omitempty"`
	Stdout   string  `json:"stdout"`
	Stderr   string  `json:"stderr"`
	// StdoutBytes and StderrBytes are the whole output's sizes.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Truncated says stdout or stderr was cut; Note says how to read on.
	Truncated bool   `json:"truncated,omitempty"`
	Note      string `json:"note,omitempty"`
}

func (t *tools) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runCommandIn) (*sdk.CallToolResult, runCommandOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, runCommandOut{}, err
	}
	if err := errors.Join(need("sandbox_id", in.SandboxID), need("command", in.Command)); err != nil {
		return nil, runCommandOut{}, err
	}
	switch {
	case in.TimeoutS < 0 || in.TimeoutS > MaxCommandTimeoutS:
		return nil, runCommandOut{}, fmt.Errorf("timeout_s %d is out of bounds: use 1 to %d", in.TimeoutS, MaxCommandTimeoutS)
	case in.TimeoutS == 0:
		in.TimeoutS = DefaultCommandTimeoutS
	}
	sess, err := c.CreateCommand(ctx, in.SandboxID, apiv1.CommandRequest{Cmd: in.Command, Cwd: in.Cwd, Env: in.Env, TimeoutS: in.TimeoutS})
	if err != nil {
		return nil, runCommandOut{}, errClient("run_command", err)
	}
	var stdout, stderr headTail
	exit, err := c.StreamCommand(ctx, sess.ID, nil, &stdout, &stderr)
	if err != nil {
		return nil, runCommandOut{}, errClient("run_command "+sess.ID, err)
	}
	out := runCommandOut{
		CommandID: sess.ID, ExitCode: exit.ExitCode, Signal: exit.Signal, TimedOut: exit.TimedOut,
		Stdout: stdout.String(), Stderr: stderr.String(), StdoutBytes: stdout.n, StderrBytes: stderr.n,
	}
	var notes []string
	if stdout.cut() || stderr.cut() {
		out.Truncated = true
		notes = append(notes, fmt.Sprintf("output was cut to its first and last %d KiB per stream: read_command_output with command_id %s reads all of it", MaxInlineOutput/2>>10, sess.ID))
	}
	if exit.TimedOut {
		notes = append(notes, fmt.Sprintf("the command ran past timeout_s %d and was killed", in.TimeoutS))
	}
	if exit.RolledBack {
		notes = append(notes, "the sandbox was rolled back to a checkpoint while the command ran: it has no exit status")
	}
	out.Note = strings.Join(notes, "; ")
	return nil, out, nil
}

// headTail keeps the first and the last MaxInlineOutput/2 bytes written to
// it, and counts all.
type headTail struct {
	head, tail []byte
	n          int64
}

func (h *headTail) Write(b []byte) (int, error) {
	h.n += int64(len(b))
	const half = MaxInlineOutput / 2
	rest := b
	if room := half - len(h.head); room > 0 {
		k := min(room, len(rest))
		h.head = append(h.head, rest[:k]...)
		rest = rest[k:]
	}
	if len(rest) > 0 {
		h.tail = append(h.tail, rest...)
		if len(h.tail) > 2*half {
			h.tail = append(h.tail[:0], h.tail[len(h.tail)-half:]...)
		}
	}
	return len(b), nil
}

func (h *headTail) cut() bool { return h.n > int64(MaxInlineOutput) }

func (h *headTail) String() string {
	const half = MaxInlineOutput / 2
	tail := h.tail
	if !h.cut() {
		return strings.ToValidUTF8(string(h.head)+string(tail), "\uFFFD")
	}
	tail = tail[len(tail)-half:]
	// Cut on rune boundaries, so that no half character shows.
	head := h.head
	for len(head) > 0 && !utf8.Valid(head) {
		head = head[:len(head)-1]
	}
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return fmt.Sprintf("%s\n[… %d bytes cut …]\n%s", strings.ToValidUTF8(string(head), "\uFFFD"), h.n-int64(len(head)+len(tail)), strings.ToValidUTF8(string(tail), "\uFFFD"))
}

type readOutputIn struct {
	CommandID string `json:"command_id" jsonschema:"the command_id run_command returned"`
	Stream    string `json:"stream,omitempty" jsonschema:"stdout (the default) or stderr"`
	Offset    int64  `json:"offset,omitempty" jsonschema:"the byte offset in the stream to read from (default 0)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"how many bytes to read at most (default and most: 1048576)"`
}

type readOutputOut struct {
	Data string `json:"data"`
	// Encoding is "text", or "base64" when the bytes read are not UTF-8.
	Encoding   string `json:"encoding"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	// Size is how many bytes of the stream there are so far.
	Size int64 `json:"size"`
	// Running says the command has not ended: more may come.
	Running  bool `json:"running"`
	ExitCode *int `json:"exit_code,omitempty"`
}

// outputSettle is how long read_command_output waits on a command that
// still runs for output beyond what the server replays.
const outputSettle = time.Second

func (t *tools) readCommandOutput(ctx context.Context, req *sdk.CallToolRequest, in readOutputIn) (*sdk.CallToolResult, readOutputOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, readOutputOut{}, err
	}
	if err := need("command_id", in.CommandID); err != nil {
		return nil, readOutputOut{}, err
	}
	switch in.Stream {
	case "":
		in.Stream = apiv1.EventStdout
	case apiv1.EventStdout, apiv1.EventStderr:
	default:
		return nil, readOutputOut{}, fmt.Errorf("stream %q is neither stdout nor stderr", in.Stream)
	}
	switch {
	case in.Offset < 0:
		return nil, readOutputOut{}, fmt.Errorf("offset %d is negative", in.Offset)
	case in.Limit < 0 || in.Limit > MaxOutputRead:
		return nil, readOutputOut{}, fmt.Errorf("limit %d is out of bounds: use 1 to %d", in.Limit, MaxOutputRead)
	case in.Limit == 0:
		in.Limit = MaxOutputRead
	}
	cmd, err := c.GetCommand(ctx, in.CommandID)
	if err != nil {
		return nil, readOutputOut{}, errClient("read_command_output "+in.CommandID, err)
	}
	actx := ctx
	if cmd.State != apiv1.CommandExited {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, outputSettle)
		defer cancel()
	}
	st, err := c.Attach(actx, in.CommandID)
	if err != nil {
		return nil, readOutputOut{}, errClient("read_command_output "+in.CommandID, err)
	}
	defer st.Close()
	var (
		buf  bytes.Buffer
		pos  int64
		exit *apiv1.ExitEvent
	)
	for exit == nil {
		ev, err := st.Next()
		if err != nil {
			if actx.Err() != nil && ctx.Err() == nil {
				break // still running: what came so far
			}
			return nil, readOutputOut{}, errClient("read_command_output "+in.CommandID, err)
		}
		switch ev.Name {
		case in.Stream:
			var d apiv1.DataEvent
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, readOutputOut{}, fmt.Errorf("read_command_output %s: bad %s event: %v", in.CommandID, ev.Name, err)
			}
			// Keep the part of this chunk within [Offset, Offset+Limit).
			lo, hi := max(in.Offset-pos, 0), min(in.Offset+int64(in.Limit)-pos, int64(len(d.Data)))
			if lo < hi {
				buf.Write(d.Data[lo:hi])
			}
			pos += int64(len(d.Data))
		case apiv1.EventExit:
			var e apiv1.ExitEvent
			if err := json.Unmarshal(ev.Data, &e); err == nil {
				exit = &e
			}
		}
	}
	out := readOutputOut{Offset: in.Offset, NextOffset: in.Offset + int64(buf.Len()), Size: pos, Running: exit == nil}
	if exit != nil && !exit.RolledBack {
		out.ExitCode = &exit.ExitCode
	}
	out.Data, out.Encoding = encode(buf.Bytes())
	return nil, out, nil
}

// encode is b as text when it is UTF-8, else as base64.
func encode(b []byte) (data, encoding string) {
	if utf8.Valid(b) {
		return string(b), "text"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// --- files ---

type writeFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to write in"`
	Path      string `json:"path" jsonschema:"the file's absolute path, or one relative to the user's home"`
	Content   string `json:"content" jsonschema:"what the file is to hold (at most 8 MiB)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default) or base64, for binary content"`
}

type writeFileOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeFileIn) (*sdk.CallToolResult, writeFileOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, writeFileOut{}, err
	}
	if err := errors.Join(need("sandbox_id", in.SandboxID), need("path", in.Path)); err != nil {
		return nil, writeFileOut{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, writeFileOut{}, fmt.Errorf("content is not base64: %v", err)
		}
	default:
		return nil, writeFileOut{}, fmt.Errorf("encoding %q is neither text nor base64", in.Encoding)
	}
	if len(data) > MaxWriteBytes {
		return nil, writeFileOut{}, fmt.Errorf("content is %d bytes, more than write_file takes (%d): split it, or fetch it from inside the sandbox", len(data), MaxWriteBytes)
	}
	if err := c.WriteFile(ctx, in.SandboxID, in.Path, 0o644, bytes.NewReader(data)); err != nil {
		return nil, writeFileOut{}, errClient("write_file "+in.Path, err)
	}
	return nil, writeFileOut{Path: in.Path, Bytes: len(data)}, nil
}

type pathIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to read in"`
	Path      string `json:"path" jsonschema:"an absolute path, or one relative to the user's home"`
}

type readFileOut struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	// Encoding is "text", or "base64" for content that is not UTF-8.
	Encoding string `json:"encoding"`
	Bytes    int    `json:"bytes"`
}

func (t *tools) readFile(ctx context.Context, req *sdk.CallToolRequest, in pathIn) (*sdk.CallToolResult, readFileOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, readFileOut{}, err
	}
	if err := errors.Join(need("sandbox_id", in.SandboxID), need("path", in.Path)); err != nil {
		return nil, readFileOut{}, err
	}
	st, err := c.Stat(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, readFileOut{}, errClient("read_file "+in.Path, err)
	}
	if st.Type == "directory" {
		return nil, readFileOut{}, fmt.Errorf("read_file %s: it is a directory: use list_files", in.Path)
	}
	if st.SizeBytes > MaxReadBytes {
		return nil, readFileOut{}, fmt.Errorf("read_file %s: it is %d bytes, more than read_file returns (%d): read parts of it with run_command (head, tail, sed -n)", in.Path, st.SizeBytes, MaxReadBytes)
	}
	rc, err := c.ReadFile(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, readFileOut{}, errClient("read_file "+in.Path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxReadBytes+1))
	if err != nil {
		return nil, readFileOut{}, errClient("read_file "+in.Path, err)
	}
	if len(b) > MaxReadBytes {
		return nil, readFileOut{}, fmt.Errorf("read_file %s: it grew past %d bytes while read: read parts of it with run_command", in.Path, MaxReadBytes)
	}
	out := readFileOut{Path: in.Path, Bytes: len(b)}
	out.Content, out.Encoding = encode(b)
	return nil, out, nil
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to list in"`
	Path      string `json:"path" jsonschema:"the directory to list"`
	Depth     int    `json:"depth,omitempty" jsonschema:"how many levels down to list (default 1)"`
}

type listFilesOut struct {
	Entries   []apiv1.Stat `json:"entries"`
	Truncated bool         `json:"truncated,omitempty"`
}

func (t *tools) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listFilesIn) (*sdk.CallToolResult, listFilesOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, listFilesOut{}, err
	}
	if err := errors.Join(need("sandbox_id", in.SandboxID), need("path", in.Path)); err != nil {
		return nil, listFilesOut{}, err
	}
	if in.Depth < 0 {
		return nil, listFilesOut{}, fmt.Errorf("depth %d is negative", in.Depth)
	}
	if in.Depth == 0 {
		in.Depth = 1
	}
	entries, err := c.List(ctx, in.SandboxID, in.Path, in.Depth)
	if err != nil {
		return nil, listFilesOut{}, errClient("list_files "+in.Path, err)
	}
	out := listFilesOut{Entries: entries}
	if out.Entries == nil {
		out.Entries = []apiv1.Stat{}
	}
	if len(out.Entries) > MaxListEntries {
		out.Entries, out.Truncated = out.Entries[:MaxListEntries], true
	}
	return nil, out, nil
}

// --- code, checkpoints, ports ---

type runCodeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"a sandbox made from the code-interpreter template"`
	Code      string `json:"code" jsonschema:"the code to run"`
	Language  string `json:"language,omitempty" jsonschema:"python (the default), or another language the sandbox's interpreter offers (javascript, typescript, bash, …)"`
	ContextID string `json:"context_id,omitempty" jsonschema:"the interpreter context to run in (default: the sandbox's default context of the language)"`
}

type codeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type runCodeOut struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Results are what the code displayed or evaluated to, by MIME
	// field (text, html, png, …), as E2B's code interpreter has them.
	Results        []map[string]any `json:"results"`
	Error          *codeError       `json:"error,omitempty"`
	ExecutionCount int              `json:"execution_count,omitempty"`
}

func (t *tools) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeIn) (*sdk.CallToolResult, runCodeOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, runCodeOut{}, err
	}
	if err := errors.Join(need("sandbox_id", in.SandboxID), need("code", in.Code)); err != nil {
		return nil, runCodeOut{}, err
	}
	if len(in.Code) > MaxCodeBytes {
		return nil, runCodeOut{}, fmt.Errorf("code is %d bytes, more than run_code takes (%d): write it to a file with write_file and run that", len(in.Code), MaxCodeBytes)
	}
	body := map[string]any{"code": in.Code}
	if in.Language != "" {
		body["language"] = in.Language
	}
	if in.ContextID != "" {
		body["context_id"] = in.ContextID
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, runCodeOut{}, err
	}
	resp, err := c.Port(ctx, in.SandboxID, template.CodeInterpreterPort, http.MethodPost, "execute", bytes.NewReader(b), "application/json")
	if err != nil {
		var ae *apiclient.Error
		if errors.As(err, &ae) && ae.Status == http.StatusBadGateway {
			return nil, runCodeOut{}, fmt.Errorf("run_code: sandbox %s runs no code interpreter on port %d: make the sandbox from the code-interpreter template", in.SandboxID, template.CodeInterpreterPort)
		}
		return nil, runCodeOut{}, errClient("run_code", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, runCodeOut{}, fmt.Errorf("run_code: the interpreter answered %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	out := runCodeOut{Results: []map[string]any{}}
	var stdout, stderr strings.Builder
	dec := json.NewDecoder(io.LimitReader(resp.Body, MaxCodeOutput))
	for {
		var line map[string]any
		if err := dec.Decode(&line); err == io.EOF {
			break
		} else if err != nil {
			return nil, runCodeOut{}, fmt.Errorf("run_code: the interpreter's answer broke off or passed %d bytes: %v", MaxCodeOutput, err)
		}
		text, _ := line["text"].(string)
		switch line["type"] {
		case "stdout":
			stdout.WriteString(text)
		case "stderr":
			stderr.WriteString(text)
		case "result":
			delete(line, "type")
			out.Results = append(out.Results, line)
		case "error":
			e := &codeError{}
			e.Name, _ = line["name"].(string)
			e.Value, _ = line["value"].(string)
			e.Traceback, _ = line["traceback"].(string)
			out.Error = e
		case "number_of_executions":
			if n, ok := line["execution_count"].(float64); ok {
				out.ExecutionCount = int(n)
			}
		}
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	return nil, out, nil
}

type checkpointIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to checkpoint"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the checkpoint"`
}

type checkpointOut struct {
	CheckpointID string `json:"checkpoint_id"`
	SandboxID    string `json:"sandbox_id"`
	State        string `json:"state"`
}

func (t *tools) checkpointSandbox(ctx context.Context, req *sdk.CallToolRequest, in checkpointIn) (*sdk.CallToolResult, checkpointOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, checkpointOut{}, err
	}
	if err := need("sandbox_id", in.SandboxID); err != nil {
		return nil, checkpointOut{}, err
	}
	op, err := c.CreateCheckpoint(ctx, in.SandboxID, apiv1.CreateCheckpoint{Name: in.Name})
	if err != nil {
		return nil, checkpointOut{}, errClient("checkpoint_sandbox "+in.SandboxID, err)
	}
	if err := wait(ctx, c, op.Operation); err != nil {
		return nil, checkpointOut{}, errClient("checkpoint_sandbox "+in.SandboxID, err)
	}
	chk, err := c.GetCheckpoint(ctx, op.Checkpoint.ID)
	if err != nil {
		return nil, checkpointOut{}, errClient("checkpoint_sandbox "+in.SandboxID, err)
	}
	return nil, checkpointOut{CheckpointID: chk.ID, SandboxID: chk.SandboxID, State: chk.State}, nil
}

type forkIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to fork"`
	Count     int    `json:"count,omitempty" jsonschema:"how many sandboxes to make (default 1, at most 100)"`
}

type forkOut struct {
	CheckpointID string   `json:"checkpoint_id"`
	SandboxIDs   []string `json:"sandbox_ids"`
}

func (t *tools) forkSandbox(ctx context.Context, req *sdk.CallToolRequest, in forkIn) (*sdk.CallToolResult, forkOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, forkOut{}, err
	}
	if err := need("sandbox_id", in.SandboxID); err != nil {
		return nil, forkOut{}, err
	}
	if in.Count == 0 {
		in.Count = 1
	}
	if in.Count < 1 || in.Count > apiv1.MaxForks {
		return nil, forkOut{}, fmt.Errorf("count %d is out of bounds: use 1 to %d", in.Count, apiv1.MaxForks)
	}
	f, err := c.Fork(ctx, in.SandboxID, apiv1.Fork{Count: in.Count})
	if err != nil {
		return nil, forkOut{}, errClient("fork_sandbox "+in.SandboxID, err)
	}
	if err := wait(ctx, c, f.Operation); err != nil {
		return nil, forkOut{}, errClient("fork_sandbox "+in.SandboxID, err)
	}
	out := forkOut{CheckpointID: f.Checkpoint, SandboxIDs: []string{}}
	for _, sb := range f.Sandboxes {
		if _, err := c.WaitSandbox(ctx, sb.ID); err != nil {
			return nil, forkOut{}, errClient("fork_sandbox: child "+sb.ID, err)
		}
		out.SandboxIDs = append(out.SandboxIDs, sb.ID)
	}
	return nil, out, nil
}

type exposePortIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox a process listens in"`
	Port      int    `json:"port" jsonschema:"the TCP port it listens on, 1 to 65535"`
}

type exposePortOut struct {
	URL string `json:"url"`
	// Auth says what a request to URL must carry.
	Auth string `json:"auth"`
}

func (t *tools) exposePort(ctx context.Context, req *sdk.CallToolRequest, in exposePortIn) (*sdk.CallToolResult, exposePortOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, exposePortOut{}, err
	}
	if err := need("sandbox_id", in.SandboxID); err != nil {
		return nil, exposePortOut{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return nil, exposePortOut{}, fmt.Errorf("port %d is not from 1 to 65535", in.Port)
	}
	sb, err := c.GetSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, exposePortOut{}, errClient("expose_port "+in.SandboxID, err)
	}
	return nil, exposePortOut{
		URL:  t.cfg.PortURL(req, c, sb.ID, in.Port),
		Auth: "send the header Authorization: Bearer <the API key this MCP server uses>",
	}, nil
}
