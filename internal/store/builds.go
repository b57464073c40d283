package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Build is one template build and its outcome.
type Build struct {
	// ID names the build ("bld…").
	ID string
	// Owner is the ID of the key that asked for it.
	Owner string
	// Name and Tag are the template it makes.
	Name, Tag string
	// Status is building, ready or failed.
	Status string
	// Digest is the template made, once ready.
	Digest string
	// Request is the request as given (JSON).
	Request json.RawMessage
	// Error says why a failed build failed; nil otherwise.
	Error *Error
	// CreatedAt is when it was asked for; the zero time means now.
	CreatedAt time.Time
	// FinishedAt is when it ended; nil until then.
	FinishedAt *time.Time
	// Node is the cluster node that runs it, "" on a single host.
	Node string
}

const buildColumns = "id, owner, name, tag, status, digest, request, error, created_at, finished_at, node"

// InsertBuild stores b and the operation that runs it, in one transaction.
func (s *Store) InsertBuild(ctx context.Context, b Build, op Operation) error {
	if err := requireID("insert build", b.ID); err != nil {
		return err
	}
	if b.CreatedAt.IsZero() {
		b.CreatedAt = now()
	}
	req, err := rawJSON("request", b.Request)
	if err != nil {
		return fmt.Errorf("insert build %s: %w", b.ID, err)
	}
	bErr, err := errorJSON(b.Error)
	if err != nil {
		return fmt.Errorf("insert build %s: %w", b.ID, err)
	}
	err = s.inTx(ctx, func(t *tx) error {
		_, err := t.ExecContext(ctx, "INSERT INTO builds ("+buildColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			b.ID, b.Owner, b.Name, b.Tag, b.Status, b.Digest, req, bErr, nanos(b.CreatedAt), nullNanos(b.FinishedAt), b.Node)
		if isUniqueViolation(err) {
			return fmt.Errorf("the ID is taken: %w", errdefs.ErrConflict)
		}
		if err != nil {
			return classify(err)
		}
		return insertOperation(ctx, t, op)
	})
	if err != nil {
		return fmt.Errorf("insert build %s: %w", b.ID, err)
	}
	return nil
}

// FinishBuild records b's status, digest, error and finish time together
// with its operation's, in one transaction.
func (s *Store) FinishBuild(ctx context.Context, b Build, op Operation) error {
	bErr, err := errorJSON(b.Error)
	if err != nil {
		return fmt.Errorf("finish build %s: %w", b.ID, err)
	}
	err = s.inTx(ctx, func(t *tx) error {
		res, err := t.ExecContext(ctx, "UPDATE builds SET status = ?, digest = ?, error = ?, finished_at = ? WHERE id = ?",
			b.Status, b.Digest, bErr, nullNanos(b.FinishedAt), b.ID)
		if err != nil {
			return classify(err)
		}
		if err := mustAffect(res, "build", b.ID); err != nil {
			return err
		}
		if err := buildEvent(ctx, t, b); err != nil {
			return err
		}
		return upsertOperation(ctx, t, op)
	})
	if err != nil {
		return fmt.Errorf("finish build %s: %w", b.ID, err)
	}
	return nil
}

// GetBuild returns the build with the given ID.
func (s *Store) GetBuild(ctx context.Context, id string) (Build, error) {
	return getByID(ctx, s.db, "build", "builds", buildColumns, id, scanBuild)
}

// LatestBuild returns the newest build of name:tag, or an
// errdefs.ErrNotFound error when it was never built.
func (s *Store) LatestBuild(ctx context.Context, name, tag string) (Build, error) {
	row := s.db.QueryRowContext(ctx, "SELECT "+buildColumns+" FROM builds WHERE name = ? AND tag = ? ORDER BY seq DESC LIMIT 1", name, tag)
	b, err := scanBuild(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Build{}, fmt.Errorf("build of %s:%s: %w", name, tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return Build{}, fmt.Errorf("get build of %s:%s: %w", name, tag, classify(err))
	}
	return b, nil
}

// ListBuilds returns the builds whose status is one of statuses, or all of
// them when none is given, oldest first.
func (s *Store) ListBuilds(ctx context.Context, statuses ...string) ([]Build, error) {
	query := "SELECT " + buildColumns + " FROM builds"
	var args []any
	if len(statuses) > 0 {
		query += " WHERE status IN (" + placeholders(len(statuses)) + ")"
		for _, st := range statuses {
			args = append(args, st)
		}
	}
	rows, err := s.db.QueryContext(ctx, query+" ORDER BY seq", args...)
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", classify(err))
	}
	defer rows.Close()
	out := []Build{}
	for rows.Next() {
		b, err := scanBuild(rows)
		if err != nil {
			return nil, fmt.Errorf("list builds: %w", err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list builds: %w", classify(err))
	}
	return out, nil
}

// scanBuild reads a row of buildColumns.
func scanBuild(r scanner) (Build, error) {
	var b Build
	var req, bErr sql.NullString
	var created int64
	var finished sql.NullInt64
	if err := r.Scan(&b.ID, &b.Owner, &b.Name, &b.Tag, &b.Status, &b.Digest, &req, &bErr, &created, &finished, &b.Node); err != nil {
		return Build{}, err
	}
	var err error
	if b.Error, err = fromErrorJSON("error", bErr); err != nil {
		return Build{}, err
	}
	b.Request = fromRawJSON(req)
	b.CreatedAt = fromNanos(created)
	b.FinishedAt = fromNullNanos(finished)
	return b, nil
}

// TemplatesInUse returns the template digests of every sandbox that is not
// deleted and of every checkpoint: their disks are overlays of those
// images, and their suspended states may need the images' snapshots.
func (s *Store) TemplatesInUse(ctx context.Context) (map[string]bool, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT DISTINCT template_digest FROM sandboxes WHERE state != ? UNION SELECT DISTINCT template_digest FROM checkpoints", "deleted")
	if err != nil {
		return nil, fmt.Errorf("list templates in use: %w", classify(err))
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("list templates in use: %w", classify(err))
		}
		out[d] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list templates in use: %w", classify(err))
	}
	return out, nil
}

// buildEvent records the end of build b, which t has just written:
// build.succeeded or build.failed; nothing for a build still going.
func buildEvent(ctx context.Context, t *tx, b Build) error {
	ty := map[string]string{apiv1.TemplateReady: apiv1.EventBuildSucceeded, apiv1.TemplateFailed: apiv1.EventBuildFailed}[b.Status]
	if ty == "" {
		return nil
	}
	var owner, name, tag string
	if err := t.QueryRowContext(ctx, "SELECT owner, name, tag FROM builds WHERE id = ?", b.ID).Scan(&owner, &name, &tag); err != nil {
		return classify(err)
	}
	data, _ := json.Marshal(struct { // strings: cannot fail
		BuildID  string `json:"build_id"`
		Template string `json:"template"`
		Digest   string `json:"digest,omitempty"`
		Error    *Error `json:"error,omitempty"`
	}{b.ID, name + ":" + tag, b.Digest, b.Error})
	return appendEvent(ctx, t, Event{Owner: owner, Type: ty, Data: data})
}
