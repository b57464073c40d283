package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// PutBuildContext uploads the tar stream r as a build context (PUT
// /v1/build-contexts), sent as r yields it.
func (c *Client) PutBuildContext(ctx context.Context, r io.Reader) (apiv1.BuildContext, error) {
	var out apiv1.BuildContext
	path := p("v1", "build-contexts")
	resp, err := c.do(ctx, request{method: http.MethodPut, path: path, body: r, ctype: "application/x-tar", accept: "application/json"})
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("PUT %s: decode answer: %w", path, err)
	}
	return out, nil
}

// CreateTemplate starts a template build (POST /v1/templates).
func (c *Client) CreateTemplate(ctx context.Context, req apiv1.CreateTemplate, opts ...CallOption) (apiv1.TemplateOperation, error) {
	var out apiv1.TemplateOperation
	err := c.call(ctx, http.MethodPost, p("v1", "templates"), nil, req, &out, opts)
	return out, err
}

// DeleteTemplate removes the tag name:tag.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, p("v1", "templates", ref), nil, nil, nil, nil)
}

// SaveSandbox starts making a template of a sandbox's disk (POST
// /v1/sandboxes/{id}/template).
func (c *Client) SaveSandbox(ctx context.Context, id string, req apiv1.SaveTemplate, opts ...CallOption) (apiv1.TemplateOperation, error) {
	var out apiv1.TemplateOperation
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", id, "template"), nil, req, &out, opts)
	return out, err
}

// BuildLog opens the build log of the template ref names, replayed from
// its first line. The caller closes the stream.
func (c *Client) BuildLog(ctx context.Context, ref string) (*EventStream, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: p("v1", "templates", ref, "build-log"), accept: "text/event-stream"})
	if err != nil {
		return nil, err
	}
	return NewEventStream(resp.Body), nil
}
