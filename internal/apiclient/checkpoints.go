package apiclient

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// CreateCheckpoint starts a checkpoint of a running or paused sandbox,
// which runs on: its memory, devices and disk at one instant.
func (c *Client) CreateCheckpoint(ctx context.Context, sandboxID string, req apiv1.CreateCheckpoint, opts ...CallOption) (apiv1.CheckpointOperation, error) {
	var out apiv1.CheckpointOperation
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "checkpoints"), nil, req, &out, opts)
	return out, err
}

// GetCheckpoint returns a checkpoint.
func (c *Client) GetCheckpoint(ctx context.Context, id string) (apiv1.Checkpoint, error) {
	var out apiv1.Checkpoint
	err := c.call(ctx, http.MethodGet, p("v1", "checkpoints", id), nil, nil, &out, nil)
	return out, err
}

// ListCheckpoints returns one page of the checkpoints the key may see, of
// one sandbox when sandboxID is set, oldest first.
func (c *Client) ListCheckpoints(ctx context.Context, sandboxID string, lo ListOptions) (apiv1.List[apiv1.Checkpoint], error) {
	q := lo.query()
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	var out apiv1.List[apiv1.Checkpoint]
	err := c.call(ctx, http.MethodGet, "/v1/checkpoints", q, nil, &out, nil)
	return out, err
}

// DeleteCheckpoint deletes a checkpoint; its files go once no sandbox
// stands on them.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, p("v1", "checkpoints", id), nil, nil, nil, nil)
}

// Fork starts a checkpoint of a sandbox and req.Count sandboxes from it.
func (c *Client) Fork(ctx context.Context, sandboxID string, req apiv1.Fork, opts ...CallOption) (apiv1.Forked, error) {
	var out apiv1.Forked
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "fork"), nil, req, &out, opts)
	return out, err
}

// Rollback starts returning a sandbox to one of its checkpoints.
func (c *Client) Rollback(ctx context.Context, sandboxID, checkpointID string, opts ...CallOption) (apiv1.SandboxOperation, error) {
	var out apiv1.SandboxOperation
	err := c.call(ctx, http.MethodPost, p("v1", "sandboxes", sandboxID, "rollback"), nil, apiv1.Rollback{Checkpoint: checkpointID}, &out, opts)
	return out, err
}
