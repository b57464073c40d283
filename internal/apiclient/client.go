// Package apiclient is a Go client of airlock's HTTP API, version 1: one
// method per route, the contract's errors as *Error values that errors.Is
// matches against the errdefs classes, and a reader of the server-sent event
// streams that commands write their output to.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// DefaultURL is where `airlock serve` listens unless told otherwise.
const DefaultURL = "http://127.0.0.1:7700"

// Client calls one airlock server. It is safe for concurrent use.
type Client struct {
	base string // scheme://host[:port][/prefix], no trailing slash
	key  string // API key sent as a bearer token; "" sends none
	hc   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests with hc instead of
// http.DefaultClient. hc should have no overall Timeout: event streams and
// long polls stay open for as long as their context allows.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// New returns a client of the server at baseURL (DefaultURL when empty)
// that authenticates with the API key key.
func New(baseURL, key string, opts ...Option) *Client {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: key, hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

// URL returns the server's base URL as the client uses it.
func (c *Client) URL() string { return c.base }

// CallOption adjusts one call.
type CallOption func(*callOptions)

type callOptions struct {
	idempotencyKey string
	lastEventID    int64
	hasLastEventID bool
	token          string
	upgrade        string // a protocol to upgrade the connection to
}

// IdempotencyKey sends key as the Idempotency-Key header of a mutating call:
// a retry with the same key within 24 hours returns the first answer and
// does nothing twice.
func IdempotencyKey(key string) CallOption {
	return func(o *callOptions) { o.idempotencyKey = key }
}

// LastEventID makes an attach resume after the event with this ID: the
// server replays every later event.
func LastEventID(id int64) CallOption {
	return func(o *callOptions) { o.lastEventID, o.hasLastEventID = id, true }
}

// Token authenticates the call with token (such as a command's attach
// token) instead of the client's API key.
func Token(token string) CallOption {
	return func(o *callOptions) { o.token = token }
}

// Error is a failed call as the server described it. errors.Is matches it
// against the errdefs class of its code.
type Error struct {
	Status  int            // HTTP status
	Code    string         // the contract's error code, such as "not_found"
	Message string         // what was wrong and what to do, for a person
	Details map[string]any // optional structured details
}

// Error returns the server's message.
func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("the airlock server answered %d %s", e.Status, http.StatusText(e.Status))
}

// Unwrap maps the error code to its errdefs class, or nil when it has none.
func (e *Error) Unwrap() error {
	return errdefs.ByCode(e.Code).Err
}

// codeForStatus is the contract's code for a status, used when an answer
// has no error body (a proxy in between, say).
func codeForStatus(status int) string {
	return errdefs.ByHTTPStatus(status).Code
}

// ReadError turns a non-2xx answer into an *Error and closes its body.
func ReadError(resp *http.Response) error {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body apiv1.ErrorBody
	if err := json.Unmarshal(raw, &body); err == nil && body.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message, Details: body.Error.Details}
	}
	e := &Error{Status: resp.StatusCode, Code: codeForStatus(resp.StatusCode)}
	if text := strings.TrimSpace(string(raw)); text != "" && len(text) < 200 && !strings.ContainsAny(text, "\n<") {
		e.Message = fmt.Sprintf("the airlock server answered %d %s: %s", resp.StatusCode, http.StatusText(resp.StatusCode), text)
	}
	return e
}

// unreachableError says the server could not be dialled.
type unreachableError struct {
	url string
	err error // the dial error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach the airlock server at %s: is `airlock serve` running? (set --url or AIRLOCK_URL)", e.url)
}

func (e *unreachableError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.err} }

// request is one call to make.
type request struct {
	method string
	path   string // starting with /, already escaped
	query  url.Values
	body   io.Reader
	ctype  string // content type of body
	accept string
	noAuth bool
	// raw hands back every answer, not only a 2xx: the caller tells the
	// API's errors from those of what it proxies to.
	raw  bool
	opts []CallOption
}

// do sends r and returns the answer when it is a 2xx; the caller closes
// its body. Any other answer becomes an *Error.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	var o callOptions
	for _, f := range r.opts {
		f(&o)
	}
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, r.body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %w", r.method, r.path, err, errdefs.ErrInvalid)
	}
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	switch {
	case r.noAuth:
	case o.token != "":
		req.Header.Set("Authorization", "Bearer "+o.token)
	case c.key != "":
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if o.idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", o.idempotencyKey)
	}
	if o.hasLastEventID {
		req.Header.Set("Last-Event-ID", fmt.Sprint(o.lastEventID))
	}
	if o.upgrade != "" {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", o.upgrade)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, &unreachableError{url: c.base, err: err}
		}
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if (resp.StatusCode < 200 || resp.StatusCode > 299) && !r.raw && !(o.upgrade != "" && resp.StatusCode == http.StatusSwitchingProtocols) {
		return nil, ReadError(resp)
	}
	return resp, nil
}

// call sends in (when not nil) as JSON and decodes the answer into out
// (when not nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any, opts []CallOption) error {
	r := request{method: method, path: path, query: query, accept: "application/json", opts: opts}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode request: %w", method, path, err)
		}
		r.body, r.ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// p joins escaped path segments: p("v1", "sandboxes", id) is
// "/v1/sandboxes/<id>".
func p(segs ...string) string {
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}
