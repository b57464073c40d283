package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// RegisterClusterNode records name as an airlock node of the cluster,
// reached at endpoint (a base URL), replacing what it recorded before.
// Only an agent that holds the store's credentials can: a Kubernetes
// Node that merely carries airlock's label is not registered.
func (s *Store) RegisterClusterNode(ctx context.Context, name, endpoint string) error {
	if err := requireID("register node", name); err != nil {
		return err
	}
	if u, err := url.Parse(endpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("register node %s: endpoint %q is not an http(s) base URL: %w", name, endpoint, errdefs.ErrInvalid)
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO cluster_nodes (name, endpoint, updated_at) VALUES (?, ?, ?)"+
		" ON CONFLICT (name) DO UPDATE SET endpoint = excluded.endpoint, updated_at = excluded.updated_at",
		name, endpoint, nanos(now()))
	if err != nil {
		return fmt.Errorf("register node %s: %w", name, classify(err))
	}
	return nil
}

// UnregisterClusterNode forgets node name; a name not registered is no
// error.
func (s *Store) UnregisterClusterNode(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM cluster_nodes WHERE name = ?", name); err != nil {
		return fmt.Errorf("unregister node %s: %w", name, classify(err))
	}
	return nil
}

// ClusterNodes returns the registered nodes and their endpoints, by name.
func (s *Store) ClusterNodes(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT name, endpoint FROM cluster_nodes")
	if err != nil {
		return nil, fmt.Errorf("list cluster nodes: %w", classify(err))
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, endpoint string
		if err := rows.Scan(&name, &endpoint); err != nil {
			return nil, fmt.Errorf("list cluster nodes: %w", classify(err))
		}
		out[name] = endpoint
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list cluster nodes: %w", classify(err))
	}
	return out, nil
}

// PutTemplateSettings records the settings (template.Settings JSON) of the
// image digest, as a server that pins it read them, replacing what was
// recorded before.
func (s *Store) PutTemplateSettings(ctx context.Context, digest string, settings []byte) error {
	if err := requireID("record template settings", digest); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO template_settings (digest, settings, updated_at) VALUES (?, ?, ?)"+
		" ON CONFLICT (digest) DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at",
		digest, string(settings), nanos(now()))
	if err != nil {
		return fmt.Errorf("record the settings of %s: %w", digest, classify(err))
	}
	return nil
}

// TemplateSettings returns the settings recorded for the image digest:
// those of PutTemplateSettings, else of the newest catalogue entry that
// names it; errdefs.ErrNotFound when neither has it.
func (s *Store) TemplateSettings(ctx context.Context, digest string) ([]byte, error) {
	var settings string
	err := s.db.QueryRowContext(ctx, "SELECT settings FROM template_settings WHERE digest = ?", digest).Scan(&settings)
	if err == nil {
		return []byte(settings), nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("get the settings of %s: %w", digest, classify(err))
	}
	t, err := s.TemplateTagByDigest(ctx, digest)
	if err != nil {
		return nil, err
	}
	return t.Settings, nil
}
