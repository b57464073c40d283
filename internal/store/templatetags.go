package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TemplateTag is one entry of a cluster's template catalogue: what a
// name:tag built or saved on a node names, for every replica and node to
// resolve.
type TemplateTag struct {
	Name, Tag string
	// Digest is the image's, "sha256:<hex>".
	Digest string
	// SizeBytes is the image's size.
	SizeBytes int64
	// Settings is the image's template.Settings (JSON).
	Settings json.RawMessage
	// Owner is the ID of the key whose build made it.
	Owner string
	// CreatedAt is when the tag was last pointed; the zero time means now.
	CreatedAt time.Time
}

const templateTagColumns = "name, tag, digest, size_bytes, settings, owner, created_at"

// PutTemplateTag points t.Name:t.Tag at t's image, replacing what it
// named before.
func (s *Store) PutTemplateTag(ctx context.Context, t TemplateTag) error {
	for _, v := range []string{t.Name, t.Tag, t.Digest} {
		if v == "" || strings.ContainsRune(v, 0) {
			return fmt.Errorf("template tag %q:%q of %q: name, tag and digest are required, without NUL: %w", t.Name, t.Tag, t.Digest, errdefs.ErrInvalid)
		}
	}
	if len(t.Settings) == 0 || !json.Valid(t.Settings) {
		return fmt.Errorf("template tag %s:%s: settings are not valid JSON: %w", t.Name, t.Tag, errdefs.ErrInvalid)
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now()
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO template_tags ("+templateTagColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)"+
		" ON CONFLICT (name, tag) DO UPDATE SET digest = excluded.digest, size_bytes = excluded.size_bytes,"+
		" settings = excluded.settings, owner = excluded.owner, created_at = excluded.created_at",
		t.Name, t.Tag, t.Digest, t.SizeBytes, string(t.Settings), t.Owner, nanos(t.CreatedAt))
	if err != nil {
		return fmt.Errorf("tag template %s:%s: %w", t.Name, t.Tag, classify(err))
	}
	return nil
}

// GetTemplateTag returns what name:tag names, or an errdefs.ErrNotFound
// error.
func (s *Store) GetTemplateTag(ctx context.Context, name, tag string) (TemplateTag, error) {
	t, err := scanTemplateTag(s.db.QueryRowContext(ctx, "SELECT "+templateTagColumns+" FROM template_tags WHERE name = ? AND tag = ?", name, tag))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("template %s:%s is not in the catalogue: %w", name, tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("get template tag %s:%s: %w", name, tag, classify(err))
	}
	return t, nil
}

// TemplateTagByDigest returns the newest entry that names digest, or an
// errdefs.ErrNotFound error.
func (s *Store) TemplateTagByDigest(ctx context.Context, digest string) (TemplateTag, error) {
	t, err := scanTemplateTag(s.db.QueryRowContext(ctx, "SELECT "+templateTagColumns+" FROM template_tags WHERE digest = ? ORDER BY seq DESC LIMIT 1", digest))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("template %s is not in the catalogue: %w", digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("get template tag of %s: %w", digest, classify(err))
	}
	return t, nil
}

// ListTemplateTags returns the whole catalogue in the order it was
// written.
func (s *Store) ListTemplateTags(ctx context.Context) ([]TemplateTag, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT "+templateTagColumns+" FROM template_tags ORDER BY seq")
	if err != nil {
		return nil, fmt.Errorf("list template tags: %w", classify(err))
	}
	defer rows.Close()
	out := []TemplateTag{}
	for rows.Next() {
		t, err := scanTemplateTag(rows)
		if err != nil {
			return nil, fmt.Errorf("list template tags: %w", classify(err))
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list template tags: %w", classify(err))
	}
	return out, nil
}

// DeleteTemplateTag removes name:tag from the catalogue; one it lacks is
// errdefs.ErrNotFound.
func (s *Store) DeleteTemplateTag(ctx context.Context, name, tag string) error {
	res, err := s.db.ExecContext(ctx, "DELETE FROM template_tags WHERE name = ? AND tag = ?", name, tag)
	if err != nil {
		return fmt.Errorf("delete template tag %s:%s: %w", name, tag, classify(err))
	}
	return mustAffect(res, "template tag", name+":"+tag)
}

func scanTemplateTag(r scanner) (TemplateTag, error) {
	var t TemplateTag
	var settings string
	var created int64
	if err := r.Scan(&t.Name, &t.Tag, &t.Digest, &t.SizeBytes, &settings, &t.Owner, &created); err != nil {
		return TemplateTag{}, err
	}
	t.Settings, t.CreatedAt = json.RawMessage(settings), fromNanos(created)
	return t, nil
}

// PutBuildContextNode records that the build context id is on node, the
// last node it was uploaded to.
func (s *Store) PutBuildContextNode(ctx context.Context, id, node string) error {
	if id == "" || node == "" || strings.ContainsRune(id, 0) || strings.ContainsRune(node, 0) {
		return fmt.Errorf("build context %q on node %q: both are required, without NUL: %w", id, node, errdefs.ErrInvalid)
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO build_contexts (id, node, created_at) VALUES (?, ?, ?)"+
		" ON CONFLICT (id) DO UPDATE SET node = excluded.node, created_at = excluded.created_at", id, node, nanos(now()))
	if err != nil {
		return fmt.Errorf("record build context %s: %w", id, classify(err))
	}
	return nil
}

// BuildContextNode returns the node the build context id is on, or an
// errdefs.ErrNotFound error.
func (s *Store) BuildContextNode(ctx context.Context, id string) (string, error) {
	var node string
	err := s.db.QueryRowContext(ctx, "SELECT node FROM build_contexts WHERE id = ?", id).Scan(&node)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("build context %s is on no node: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("get build context %s: %w", id, classify(err))
	}
	return node, nil
}
