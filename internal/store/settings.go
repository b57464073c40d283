package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// EnsureSetting records value under name unless the store holds a value
// for it already, and returns the value it holds after: value itself, or
// the one recorded first. Of servers racing to set one name, one wins,
// and all of them read the winner's.
func (s *Store) EnsureSetting(ctx context.Context, name, value string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) || strings.ContainsRune(value, 0) {
		return "", fmt.Errorf("setting %q: a name, and no NUL: %w", name, errdefs.ErrInvalid)
	}
	if _, err := s.db.ExecContext(ctx, "INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING", name, value); err != nil {
		return "", fmt.Errorf("set %s: %w", name, classify(err))
	}
	var got string
	if err := s.db.QueryRowContext(ctx, "SELECT value FROM settings WHERE name = ?", name).Scan(&got); err != nil {
		return "", fmt.Errorf("read %s: %w", name, classify(err))
	}
	return got, nil
}
