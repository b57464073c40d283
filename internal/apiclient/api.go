package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// ListOptions pages through a list: Limit items per page (0: the server's
// default) starting at PageToken ("" for the first page).
type ListOptions struct {
	Limit     int
	PageToken string
}

func (o ListOptions) query() url.Values {
	q := url.Values{}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.PageToken != "" {
		q.Set("page_token", o.PageToken)
	}
	return q
}

// SandboxFilter narrows ListSandboxes: State ("" for any) and metadata
// labels that must all match.
type SandboxFilter struct {
	State    string
	Metadata map[string]string
}

// Health asks the server whether it is up; it needs no key.
func (c *Client) Health(ctx context.Context) (apiv1.Health, error) {
	var h apiv1.Health
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz", noAuth: true})
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("GET /healthz: decode answer: %w", err)
	}
	return h, nil
}

// CreateSandbox starts creating a sandbox. The returned operation finishes
// when the sandbox runs (WaitOperation waits for it).
func (c *Client) CreateSandbox(ctx context.Context, req apiv1.CreateSandbox, opts ...CallOption) (apiv1.SandboxOperation, error) {
	var out apiv1.SandboxOperation
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &out, opts)
	return out, err
}

// GetSandbox returns a sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (apiv1.Sandbox, error) {
	var out apiv1.Sandbox
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", id), nil, nil, &out, nil)
	return out, err
}

// ListSandboxes returns one page of the sandboxes that match f.
func (c *Client) ListSandboxes(ctx context.Context, f SandboxFilter, lo ListOptions) (apiv1.List[apiv1.Sandbox], error) {
	q := lo.query()
	if f.State != "" {
		q.Set("state", f.State)
	}
	for k, v := range f.Metadata {
		q.Set("metadata."+k, v)
	}
	var out apiv1.List[apiv1.Sandbox]
	err := c.call(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out, nil)
	return out, err
}

// DeleteSandbox starts removing a sandbox with its disk and snapshots.
func (c *Client) DeleteSandbox(ctx context.Context, id string, opts ...CallOption) (apiv1.Operation, error) {
	return c.lifecycle(ctx, http.MethodDelete, p("v1", "sandboxes", id), opts)
}

// PauseSandbox starts pausing a sandbox: its vCPUs stop, its memory stays.
func (c *Client) PauseSandbox(ctx context.Context, id string, opts ...CallOption) (apiv1.Operation, error) {
	return c.lifecycle(ctx, http.MethodPost, p("v1", "sandboxes", id, "pause"), opts)
}

// SuspendSandbox starts suspending a sandbox: its memory goes to disk and
// its VM process exits.
func (c *Client) SuspendSandbox(ctx context.Context, id string, opts ...CallOption) (apiv1.Operation, error) {
	return c.lifecycle(ctx, http.MethodPost, p("v1", "sandboxes", id, "suspend"), opts)
}

// WakeSandbox starts resuming a paused or suspended sandbox.
func (c *Client) WakeSandbox(ctx context.Context, id string, opts ...CallOption) (apiv1.Operation, error) {
	return c.lifecycle(ctx, http.MethodPost, p("v1", "sandboxes", id, "wake"), opts)
}

// lifecycle makes a call that answers 202 with an operation, bare or as
// {"sandbox", "operation"}; both are accepted.
func (c *Client) lifecycle(ctx context.Context, method, path string, opts []CallOption) (apiv1.Operation, error) {
	var raw json.RawMessage
	if err := c.call(ctx, method, path, nil, nil, &raw, opts); err != nil {
		return apiv1.Operation{}, err
	}
	var both struct {
		Operation *apiv1.Operation `json:"operation"`
	}
	if err := json.Unmarshal(raw, &both); err == nil && both.Operation != nil {
		return *both.Operation, nil
	}
	var op apiv1.Operation
	if err := json.Unmarshal(raw, &op); err != nil {
		return op, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return op, nil
}

// Keep extends a sandbox's lease to timeoutS seconds from now; 0 keeps it
// until it is deleted.
func (c *Client) Keep(ctx context.Context, id string, timeoutS int, opts ...CallOption) (apiv1.Sandbox, error) {
	var out apiv1.Sandbox
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", id, "keep"), nil, apiv1.Keep{TimeoutS: &timeoutS}, &out, opts)
	return out, err
}

// SandboxMetrics measures a running sandbox now: CPU, memory and disk as
// its guest sees them, and its VMM's use of the host when the server can
// tell. A sandbox that is not running is a conflict.
func (c *Client) SandboxMetrics(ctx context.Context, id string) (apiv1.SandboxMetrics, error) {
	var out apiv1.SandboxMetrics
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", id, "metrics"), nil, nil, &out, nil)
	return out, err
}

// SandboxEvents streams a sandbox's state changes from now on: events named
// "state" whose data is the Sandbox. The caller closes the stream.
func (c *Client) SandboxEvents(ctx context.Context, id string) (*EventStream, error) {
	return c.stream(ctx, p("v1", "sandboxes", id, "events"), nil)
}

// GetOperation returns an operation. With waitS > 0 the server holds the
// answer until the operation finishes or waitS seconds (at most 60) pass.
func (c *Client) GetOperation(ctx context.Context, id string, waitS int) (apiv1.Operation, error) {
	var q url.Values
	if waitS > 0 {
		q = url.Values{"wait_s": {strconv.Itoa(waitS)}}
	}
	var out apiv1.Operation
	err := c.call(ctx, http.MethodGet, p("v1", "operations", id), q, nil, &out, nil)
	return out, err
}

// waitPollS is how long each long poll of WaitOperation lasts.
const waitPollS = 30

// WaitOperation returns the operation once it has finished, succeeded or
// failed, or an error when ctx ends first. A failed operation is not an
// error of WaitOperation: look at its Status and Error.
func (c *Client) WaitOperation(ctx context.Context, id string) (apiv1.Operation, error) {
	for {
		op, err := c.GetOperation(ctx, id, waitPollS)
		if err != nil || op.Done() {
			return op, err
		}
	}
}

// sandboxPoll is how often WaitSandbox looks at a sandbox.
const sandboxPoll = 250 * time.Millisecond

// WaitSandbox returns the sandbox once it has left the creating state (as
// the children of a fork, whose operation ends with the checkpoint, do).
// One that failed to start is returned with an error giving its reason.
func (c *Client) WaitSandbox(ctx context.Context, id string) (apiv1.Sandbox, error) {
	t := time.NewTicker(sandboxPoll)
	defer t.Stop()
	for {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return sb, err
		}
		switch sb.State {
		case apiv1.StateCreating:
		case apiv1.StateFailed:
			msg := "no reason given"
			if sb.LastError != nil && sb.LastError.Message != "" {
				msg = sb.LastError.Message
			}
			return sb, fmt.Errorf("sandbox %s failed: %s", id, msg)
		default:
			return sb, nil
		}
		select {
		case <-ctx.Done():
			return sb, ctx.Err()
		case <-t.C:
		}
	}
}

// CreateCommand makes a command session in a sandbox. The process starts at
// the first Attach.
func (c *Client) CreateCommand(ctx context.Context, sandboxID string, req apiv1.CommandRequest, opts ...CallOption) (apiv1.CommandSession, error) {
	var out apiv1.CommandSession
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "commands"), nil, req, &out, opts)
	return out, err
}

// GetCommand returns a command's state.
func (c *Client) GetCommand(ctx context.Context, id string) (apiv1.Command, error) {
	var out apiv1.Command
	err := c.call(ctx, http.MethodGet, p("v1", "commands", id), nil, nil, &out, nil)
	return out, err
}

// ListCommands returns one page of a sandbox's commands.
func (c *Client) ListCommands(ctx context.Context, sandboxID string, lo ListOptions) (apiv1.List[apiv1.Command], error) {
	var out apiv1.List[apiv1.Command]
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", sandboxID, "commands"), lo.query(), nil, &out, nil)
	return out, err
}

// Attach opens a command's event stream, starting the process on the first
// attach. Options: LastEventID to resume, Token to use the attach token
// instead of the API key. The caller closes the stream.
func (c *Client) Attach(ctx context.Context, commandID string, opts ...CallOption) (*EventStream, error) {
	return c.stream(ctx, p("v1", "commands", commandID, "attach"), opts)
}

func (c *Client) stream(ctx context.Context, path string, opts []CallOption) (*EventStream, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: path, accept: "text/event-stream", opts: opts})
	if err != nil {
		return nil, err
	}
	return NewEventStream(resp.Body), nil
}

// Stdin sends data to a command's stdin; eof closes it after data.
func (c *Client) Stdin(ctx context.Context, commandID string, data []byte, eof bool) error {
	var q url.Values
	if eof {
		q = url.Values{"eof": {"1"}}
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: p("v1", "commands", commandID, "stdin"), query: q,
		body: bytes.NewReader(data), ctype: "application/octet-stream"})
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Signal sends a signal, named without "SIG" ("TERM", "INT"), to a command.
func (c *Client) Signal(ctx context.Context, commandID, signal string) error {
	return c.call(ctx, http.MethodPost, p("v1", "commands", commandID, "signal"), nil, apiv1.Signal{Signal: signal}, nil, nil)
}

// Resize sets the size of a command's terminal.
func (c *Client) Resize(ctx context.Context, commandID string, rows, cols uint16) error {
	return c.call(ctx, http.MethodPost, p("v1", "commands", commandID, "resize"), nil, apiv1.PTY{Rows: rows, Cols: cols}, nil, nil)
}

// Exec runs a command to its end and returns its output as text.
func (c *Client) Exec(ctx context.Context, sandboxID string, req apiv1.CommandRequest, opts ...CallOption) (apiv1.ExecResult, error) {
	var out apiv1.ExecResult
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "exec"), nil, req, &out, opts)
	return out, err
}

// WriteFile writes what r yields to path in a sandbox, creating parent
// directories. The body is streamed as r produces it, never held whole.
// mode 0 leaves the permissions to the server.
func (c *Client) WriteFile(ctx context.Context, sandboxID, path string, mode fs.FileMode, r io.Reader, opts ...CallOption) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	return c.upload(ctx, p("v1", "sandboxes", sandboxID, "files"), q, r, opts)
}

// ReadFile returns a reader of a file in a sandbox; the caller closes it.
func (c *Client) ReadFile(ctx context.Context, sandboxID, path string) (io.ReadCloser, error) {
	return c.download(ctx, p("v1", "sandboxes", sandboxID, "files"), path)
}

// Stat describes a path in a sandbox.
func (c *Client) Stat(ctx context.Context, sandboxID, path string) (apiv1.Stat, error) {
	var out apiv1.Stat
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", sandboxID, "fs", "stat"), url.Values{"path": {path}}, nil, &out, nil)
	return out, err
}

// List describes what is in a directory of a sandbox, depth levels down.
func (c *Client) List(ctx context.Context, sandboxID, path string, depth int) ([]apiv1.Stat, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out struct {
		Items []apiv1.Stat `json:"items"`
	}
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", sandboxID, "fs", "list"), q, nil, &out, nil)
	return out.Items, err
}

// Mkdir makes a directory in a sandbox.
func (c *Client) Mkdir(ctx context.Context, sandboxID, path string, opts ...CallOption) error {
	return c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "fs", "mkdir"), nil, apiv1.Path{Path: path}, nil, opts)
}

// Move renames a path in a sandbox.
func (c *Client) Move(ctx context.Context, sandboxID, from, to string, opts ...CallOption) error {
	return c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "fs", "move"), nil, apiv1.Move{From: from, To: to}, nil, opts)
}

// Remove deletes a path in a sandbox; a directory with content needs
// recursive.
func (c *Client) Remove(ctx context.Context, sandboxID, path string, recursive bool, opts ...CallOption) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, http.MethodDelete, p("v1", "sandboxes", sandboxID, "files"), q, nil, nil, opts)
}

// ArchiveOut returns a tar stream of a directory in a sandbox; the caller
// closes it.
func (c *Client) ArchiveOut(ctx context.Context, sandboxID, dir string) (io.ReadCloser, error) {
	return c.download(ctx, p("v1", "sandboxes", sandboxID, "archive"), dir)
}

// ArchiveIn extracts the tar stream r into a directory of a sandbox. The
// body is streamed as r produces it.
func (c *Client) ArchiveIn(ctx context.Context, sandboxID, dir string, r io.Reader, opts ...CallOption) error {
	return c.upload(ctx, p("v1", "sandboxes", sandboxID, "archive"), url.Values{"path": {dir}}, r, opts)
}

func (c *Client) upload(ctx context.Context, path string, q url.Values, r io.Reader, opts []CallOption) error {
	// A reader of unknown length goes out chunked, read as it is sent.
	body := io.Reader(http.NoBody)
	if r != nil {
		body = r
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: path, query: q,
		body: body, ctype: "application/octet-stream", opts: opts})
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.Body.Close()
}

func (c *Client) download(ctx context.Context, path, file string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: path, query: url.Values{"path": {file}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListTemplates returns one page of the templates.
func (c *Client) ListTemplates(ctx context.Context, lo ListOptions) (apiv1.List[apiv1.Template], error) {
	var out apiv1.List[apiv1.Template]
	err := c.call(ctx, http.MethodGet, "/v1/templates", lo.query(), nil, &out, nil)
	return out, err
}

// GetTemplate returns a template by name, name:tag or digest.
func (c *Client) GetTemplate(ctx context.Context, ref string) (apiv1.Template, error) {
	var out apiv1.Template
	err := c.call(ctx, http.MethodGet, p("v1", "templates", ref), nil, nil, &out, nil)
	return out, err
}

// CreateKey makes an API key. The answer is the only time its secret is
// shown.
func (c *Client) CreateKey(ctx context.Context, req apiv1.CreateKey, opts ...CallOption) (apiv1.KeyCreated, error) {
	var out apiv1.KeyCreated
	err := c.call(ctx, http.MethodPost, "/v1/keys", nil, req, &out, opts)
	return out, err
}

// ListKeys returns one page of the API keys, without their secrets.
func (c *Client) ListKeys(ctx context.Context, lo ListOptions) (apiv1.List[apiv1.Key], error) {
	var out apiv1.List[apiv1.Key]
	err := c.call(ctx, http.MethodGet, "/v1/keys", lo.query(), nil, &out, nil)
	return out, err
}

// GetKey returns a key with its limits and usage; id "self" is the
// client's own key.
func (c *Client) GetKey(ctx context.Context, id string) (apiv1.Key, error) {
	var out apiv1.Key
	err := c.call(ctx, http.MethodGet, p("v1", "keys", id), nil, nil, &out, nil)
	return out, err
}

// SetKeyLimits replaces a key's own limits (admin only).
func (c *Client) SetKeyLimits(ctx context.Context, id string, l apiv1.Limits, opts ...CallOption) (apiv1.Key, error) {
	var out apiv1.Key
	err := c.call(ctx, http.MethodPatch, p("v1", "keys", id), nil, apiv1.SetLimits{Limits: &l}, &out, opts)
	return out, err
}

// DeleteKey revokes an API key.
func (c *Client) DeleteKey(ctx context.Context, id string, opts ...CallOption) error {
	return c.call(ctx, http.MethodDelete, p("v1", "keys", id), nil, nil, nil, opts)
}

// PutSecret stores a secret for the client's key, replacing the value of
// one with the same name, and reports whether the name is new (201) rather
// than replaced (200). The value is sent once and never answered.
func (c *Client) PutSecret(ctx context.Context, req apiv1.PutSecret, opts ...CallOption) (apiv1.Secret, bool, error) {
	var out apiv1.Secret
	b, err := json.Marshal(req)
	if err != nil {
		return out, false, fmt.Errorf("POST /v1/secrets: encode request: %w", err)
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/secrets", body: bytes.NewReader(b),
		ctype: "application/json", accept: "application/json", opts: opts})
	if err != nil {
		return out, false, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, false, fmt.Errorf("POST /v1/secrets: decode answer: %w", err)
	}
	return out, resp.StatusCode == http.StatusCreated, nil
}

// ListSecrets returns one page of the client's key's secrets, by name,
// without their values.
func (c *Client) ListSecrets(ctx context.Context, lo ListOptions) (apiv1.List[apiv1.Secret], error) {
	var out apiv1.List[apiv1.Secret]
	err := c.call(ctx, http.MethodGet, "/v1/secrets", lo.query(), nil, &out, nil)
	return out, err
}

// DeleteSecret removes a secret of the client's key.
func (c *Client) DeleteSecret(ctx context.Context, name string, opts ...CallOption) error {
	return c.call(ctx, http.MethodDelete, p("v1", "secrets", name), nil, nil, nil, opts)
}

// EventQuery selects events in ListEvents.
type EventQuery struct {
	AfterSeq int64
	Limit    int      // 0: the server's default
	WaitS    int      // hold the call up to this long for an event
	Types    []string // "kind.*" for every type of a kind
}

// ListEvents returns the caller's events after q.AfterSeq, in order.
func (c *Client) ListEvents(ctx context.Context, q EventQuery) (apiv1.Events, error) {
	v := url.Values{}
	if q.AfterSeq > 0 {
		v.Set("after_seq", strconv.FormatInt(q.AfterSeq, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.WaitS > 0 {
		v.Set("wait_s", strconv.Itoa(q.WaitS))
	}
	if len(q.Types) > 0 {
		v.Set("type", strings.Join(q.Types, ","))
	}
	var out apiv1.Events
	err := c.call(ctx, http.MethodGet, p("v1", "events"), v, nil, &out, nil)
	return out, err
}
