package cli

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

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// templateAPI makes the calls of the template build routes, which
// apiclient.Client has no methods for: build contexts, builds, their logs,
// template removal and saving a sandbox as a template. It talks to the
// server c talks to, with the same key, and its errors are *apiclient.Error
// values as c's are.
type templateAPI struct {
	base string // scheme://host[:port][/prefix], no trailing slash
	key  string
	hc   *http.Client
}

func newTemplateAPI(env *Env, c *apiclient.Client) (*templateAPI, error) {
	key, err := apiKey(env.Dir)
	if err != nil {
		return nil, err
	}
	return &templateAPI{base: strings.TrimRight(c.URL(), "/"), key: key, hc: http.DefaultClient}, nil
}

// putBuildContext uploads the tar stream r as a build context, sent as r
// yields it.
func (a *templateAPI) putBuildContext(ctx context.Context, r io.Reader) (apiv1.BuildContext, error) {
	var out apiv1.BuildContext
	resp, err := a.do(ctx, http.MethodPut, "/v1/build-contexts", r, "application/x-tar", "application/json")
	if err != nil {
		return out, err
	}
	return out, decodeAnswer(resp, http.MethodPut, "/v1/build-contexts", &out)
}

// createTemplate starts a build.
func (a *templateAPI) createTemplate(ctx context.Context, req apiv1.CreateTemplate) (apiv1.TemplateOperation, error) {
	var out apiv1.TemplateOperation
	err := a.call(ctx, http.MethodPost, "/v1/templates", req, &out)
	return out, err
}

// deleteTemplate removes the tag name:tag.
func (a *templateAPI) deleteTemplate(ctx context.Context, ref string) error {
	return a.call(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(ref), nil, nil)
}

// saveSandbox starts making a template of a sandbox's disk.
func (a *templateAPI) saveSandbox(ctx context.Context, id string, req apiv1.SaveTemplate) (apiv1.TemplateOperation, error) {
	var out apiv1.TemplateOperation
	err := a.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/template", req, &out)
	return out, err
}

// buildLog opens the build log of the template ref names, replayed from
// its first line. The caller closes the stream.
func (a *templateAPI) buildLog(ctx context.Context, ref string) (*apiclient.EventStream, error) {
	resp, err := a.do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(ref)+"/build-log", nil, "", "text/event-stream")
	if err != nil {
		return nil, err
	}
	return apiclient.NewEventStream(resp.Body), nil
}

// call sends in (when not nil) as JSON and decodes the answer into out
// (when not nil).
func (a *templateAPI) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode request: %w", method, path, err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := a.do(ctx, method, path, body, ctype, "application/json")
	if err != nil {
		return err
	}
	return decodeAnswer(resp, method, path, out)
}

// decodeAnswer decodes resp's body into out (when not nil) and closes it.
func decodeAnswer(resp *http.Response, method, path string, out any) error {
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

// do sends a request and returns the answer when it is a 2xx; the caller
// closes its body. Any other answer becomes an *apiclient.Error.
func (a *templateAPI) do(ctx context.Context, method, path string, body io.Reader, ctype, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %w", method, path, err, errdefs.ErrInvalid)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if a.key != "" {
		req.Header.Set("Authorization", "Bearer "+a.key)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("cannot reach the airlock server at %s: is `airlock serve` running? (set --url or AIRLOCK_URL): %w", a.base, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, answerError(resp)
	}
	return resp, nil
}

// answerError turns a non-2xx answer into an *apiclient.Error and closes
// its body.
func answerError(resp *http.Response) error {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body apiv1.ErrorBody
	if err := json.Unmarshal(raw, &body); err == nil && body.Error.Code != "" {
		return &apiclient.Error{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message, Details: body.Error.Details}
	}
	e := &apiclient.Error{Status: resp.StatusCode, Code: codeOfStatus(resp.StatusCode)}
	if text := strings.TrimSpace(string(raw)); text != "" && len(text) < 200 && !strings.ContainsAny(text, "\n<") {
		e.Message = fmt.Sprintf("the airlock server answered %d %s: %s", resp.StatusCode, http.StatusText(resp.StatusCode), text)
	}
	return e
}

// codeOfStatus is the contract's error code for an HTTP status, for an
// answer without an error body (a proxy in between, say).
func codeOfStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return apiv1.CodeInvalidArgument
	case http.StatusUnauthorized:
		return apiv1.CodeUnauthenticated
	case http.StatusForbidden:
		return apiv1.CodePermissionDenied
	case http.StatusNotFound:
		return apiv1.CodeNotFound
	case http.StatusConflict:
		return apiv1.CodeConflict
	case http.StatusRequestEntityTooLarge:
		return apiv1.CodePayloadTooLarge
	case http.StatusTooManyRequests:
		return apiv1.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		return apiv1.CodeUnavailable
	}
	return apiv1.CodeInternal
}
