package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/service"
)

// E2B's snapshots and forks are airlock's checkpoints (docs/e2b.md,
// "Snapshots and forks"): a snapshot is a ready checkpoint of the key, its
// snapshotID the checkpoint's ID, which create takes as a templateID; a
// fork is the native fork, answered once its children run.

// Bounds of E2B's fork request.
const (
	defaultForkTimeout = 15 // seconds, E2B's default
	maxSnapshotLimit   = 100
)

// snapshotRequest is E2B's SandboxSnapshotRequest.
type snapshotRequest struct {
	Name *string `json:"name"`
}

// SnapshotInfo is E2B's SnapshotInfo: the snapshot's ID, which
// Sandbox.create takes as a template, and its names.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotView(c apiv1.Checkpoint) SnapshotInfo {
	names := []string{}
	if c.Name != "" {
		names = append(names, c.Name)
	}
	return SnapshotInfo{SnapshotID: c.ID, Names: names}
}

// isSnapshotID reports whether an E2B template ID is a snapshot's: a
// checkpoint ID. Anything else is a template.
func isSnapshotID(id string) bool { return sandbox.ValidCheckpointID(id) }

// createSnapshot is POST /sandboxes/{id}/snapshots: a checkpoint of the
// sandbox, which runs on; 201 once it is ready. One that fails answers
// 500 with the reason and leaves nothing behind.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req snapshotRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.sandbox(r.Context(), p, id); err != nil {
		return err
	}
	name := ""
	if req.Name != nil {
		name = *req.Name
	}
	co, err := s.cps.Create(r.Context(), p, id, apiv1.CreateCheckpoint{Name: name})
	if err != nil {
		return err
	}
	chk := co.Checkpoint.ID
	op, err := s.waitOp(r.Context(), p, co.Operation.ID)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("snapshot %s of sandbox %s was not ready within %v; it is still being made and shows in listSnapshots once ready: %w", chk, id, s.cfg.WaitTimeout, errTimeout)
		}
		return err
	}
	if op.Status == apiv1.OpFailed {
		// Nobody has its ID: the failed record goes.
		s.dropCheckpoint(p, chk, "a failed snapshot")
		return opFailed("snapshot of sandbox "+id, op)
	}
	c, err := s.cps.Get(r.Context(), p, chk)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotView(c))
	return nil
}

// dropCheckpoint deletes checkpoint id, whose caller is gone or never
// had it, logging what stops it.
func (s *Server) dropCheckpoint(p service.Principal, id, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cps.Delete(ctx, p, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("E2B: delete "+what, "checkpoint", id, "err", err)
	}
}

// listSnapshots is GET /snapshots: the key's ready checkpoints, in the
// native list's order, of one sandbox (sandboxID) and of one name or ID
// (name) when asked; limit (1 to 100, default 100) a page, nextToken the
// next.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, err := query(r)
	if err != nil {
		return err
	}
	limit := maxSnapshotLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSnapshotLimit {
			return fmt.Errorf("limit %q is out of bounds: use 1 to %d: %w", truncate(v, 20), maxSnapshotLimit, errdefs.ErrInvalid)
		}
		limit = n
	}
	sandboxID, name, token := q.Get("sandboxID"), q.Get("name"), q.Get("nextToken")
	if sandboxID != "" && fields.ID("sandbox", "sbx", sandboxID) != nil {
		// No sandbox of that ID, so no snapshot of it.
		writeJSON(w, http.StatusOK, []SnapshotInfo{})
		return nil
	}
	if token != "" {
		if _, err := fields.After(token, "chk"); err != nil {
			return fmt.Errorf("nextToken is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
		}
	}
	var items []apiv1.Checkpoint
	for len(items) <= limit {
		page, err := s.cps.List(r.Context(), p, sandboxID, token, fields.MaxLimit)
		if err != nil {
			return err
		}
		for _, c := range page.Items {
			if c.State == apiv1.CheckpointReady && (name == "" || name == c.Name || name == c.ID) {
				items = append(items, c)
			}
		}
		if page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
	}
	out := []SnapshotInfo{}
	for i, c := range items {
		if i == limit {
			w.Header().Set("X-Next-Token", fields.PageToken(items[i-1].ID))
			break
		}
		out = append(out, snapshotView(c))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is DELETE /snapshots/{id}, and DELETE /templates/{id}
// for a snapshot's ID (what Sandbox.deleteSnapshot sends): 204, or 404
// when the key has no such snapshot. A template's ID answers 501: E2B's
// template routes are not served.
func (s *Server) deleteSnapshot(templates bool) handler {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		id := r.PathValue("id")
		if templates && !isSnapshotID(id) {
			return unsupportedRoute(templatesWhat)(w, r, p)
		}
		if !isSnapshotID(id) {
			return fmt.Errorf("snapshot %q not found: %w", truncate(id, 80), errdefs.ErrNotFound)
		}
		if err := s.cps.Delete(r.Context(), p, id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// forkRequest is E2B's SandboxForkRequest.
type forkRequest struct {
	Count   *int `json:"count"`
	Timeout *int `json:"timeout"`
}

// forkResult is E2B's SandboxForkResult: exactly one of the two is set.
type forkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork: the native fork, count children
// (1 to 100, default 1) of the sandbox as it is now, each with its own
// identity, the source's metadata and a lease of timeout seconds (default
// 15) from when it runs. It answers 201 once every child runs or failed,
// one result each; the failed ones are deleted. The checkpoint they were
// made from is deleted then too (E2B keeps no snapshot of a fork); its
// storage goes once no child stands on it.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req forkRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	count, timeout := 1, defaultForkTimeout
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > apiv1.MaxForks {
		return fmt.Errorf("count %d is out of bounds: use 1 to %d: %w", count, apiv1.MaxForks, errdefs.ErrInvalid)
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		return fmt.Errorf("timeout %d must be greater than 0 (seconds each fork lives without setTimeout): %w", timeout, errdefs.ErrInvalid)
	}
	id := r.PathValue("id")
	src, err := s.sandbox(r.Context(), p, id)
	if err != nil {
		return err
	}
	fk, err := s.cps.Fork(r.Context(), p, id, apiv1.Fork{Count: count, TimeoutS: &timeout, Metadata: src.Metadata})
	if err != nil {
		return err
	}
	out := make([]forkResult, len(fk.Sandboxes))
	var wg sync.WaitGroup
	for i, child := range fk.Sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.forkChild(r.Context(), p, child.ID)
		}()
	}
	wg.Wait()
	// The children are made: the checkpoint goes once its operation has
	// recorded its end.
	ctx := context.WithoutCancel(r.Context())
	if _, err := s.waitOp(ctx, p, fk.Operation.ID); err != nil {
		s.log.Warn("E2B fork: wait for the fork's checkpoint", "checkpoint", fk.Checkpoint, "err", err)
	}
	s.dropCheckpoint(p, fk.Checkpoint, "a fork's checkpoint")
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// forkChild waits until a child of a fork runs, and answers it; one that
// failed, or that is not up within the wait timeout, is deleted and
// answers why.
func (s *Server) forkChild(ctx context.Context, p service.Principal, id string) forkResult {
	sb, err := s.settled(ctx, p, id)
	if err == nil && sb.State == apiv1.StateRunning {
		v := s.sandboxView(sb)
		return forkResult{Sandbox: &v}
	}
	s.abandon(p, id)
	switch {
	case err != nil:
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("fork %s did not start within %v, and was deleted: %w", id, s.cfg.WaitTimeout, errTimeout)
		}
		code := status(err)
		return forkResult{Error: &Error{Code: code, Message: message(err)}}
	case sb.LastError != nil:
		code := errdefs.ByCode(sb.LastError.Code).HTTPStatus
		if code < 500 && code != http.StatusTooManyRequests {
			code = http.StatusInternalServerError
		}
		return forkResult{Error: &Error{Code: code, Message: fmt.Sprintf("fork %s failed: %s", id, sb.LastError.Message)}}
	}
	return forkResult{Error: &Error{Code: http.StatusInternalServerError, Message: fmt.Sprintf("fork %s is %s, not running", id, sb.State)}}
}
