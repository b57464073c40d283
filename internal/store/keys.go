package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Key is an API key. Only a hash of its secret is kept.
type Key struct {
	// ID names the key ("key…"); it is the owner of what the key creates.
	ID string
	// Name is the label given at creation.
	Name string
	// Role is "admin" or "user".
	Role string
	// Hash is the sha256 of the key's secret. No two keys have the same
	// hash, so a key can be found by it (GetKeyByHash).
	Hash []byte
	// Format is how the key reads: "airlock" or "e2b"; "" means "airlock".
	Format string
	// CreatedAt is when the key was made; the zero time means now.
	CreatedAt time.Time
	// Limits are the key's own limits, JSON of apiv1.Limits; nil means
	// none of its own.
	Limits json.RawMessage
}

const keyColumns = "id, name, role, hash, format, created_at, limits"

// InsertKey stores k. A key with the same ID or the same hash is a
// conflict.
func (s *Store) InsertKey(ctx context.Context, k Key) error {
	if err := requireID("insert key", k.ID); err != nil {
		return err
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = now()
	}
	if k.Format == "" {
		k.Format = "airlock"
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO keys ("+keyColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)",
		k.ID, k.Name, k.Role, nonNil(k.Hash), k.Format, nanos(k.CreatedAt), limitsText(k.Limits))
	if isUniqueViolationOf(err, "keys", "hash") {
		return fmt.Errorf("insert key %s: another key has the same hash: %w", k.ID, errdefs.ErrConflict)
	}
	if isUniqueViolation(err) {
		return fmt.Errorf("insert key %s: the ID is taken: %w", k.ID, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert key %s: %w", k.ID, classify(err))
	}
	return nil
}

// GetKey returns the key with the given ID.
func (s *Store) GetKey(ctx context.Context, id string) (Key, error) {
	return getByID(ctx, s.db, "key", "keys", keyColumns, id, scanKey)
}

// GetKeyByHash returns the key whose Hash is hash. The error does not show
// the hash.
func (s *Store) GetKeyByHash(ctx context.Context, hash []byte) (Key, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, "SELECT "+keyColumns+" FROM keys WHERE hash = ?", nonNil(hash)))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("key with that hash: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("get key by hash: %w", classify(err))
	}
	return k, nil
}

// ListKeys returns every key in the order they were created.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT "+keyColumns+" FROM keys ORDER BY seq")
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", classify(err))
	}
	defer rows.Close()
	keys := []Key{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list keys: %w", classify(err))
	}
	return keys, nil
}

// DeleteKey removes the key with the given ID.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, "DELETE FROM keys WHERE id = ?", id)
	if err != nil {
		return fmt.Errorf("delete key %s: %w", id, classify(err))
	}
	return mustAffect(res, "key", id)
}

// SetKeyLimits replaces the key's own limits (JSON of apiv1.Limits).
func (s *Store) SetKeyLimits(ctx context.Context, id string, limits json.RawMessage) error {
	res, err := s.db.ExecContext(ctx, "UPDATE keys SET limits = ? WHERE id = ?", limitsText(limits), id)
	if err != nil {
		return fmt.Errorf("set limits of key %s: %w", id, classify(err))
	}
	return mustAffect(res, "key", id)
}

// limitsText is limits as stored: "{}" for none.
func limitsText(limits json.RawMessage) string {
	if len(limits) == 0 {
		return "{}"
	}
	return string(limits)
}

// CountKeys returns the number of keys with the given role, or of all keys
// when role is "".
func (s *Store) CountKeys(ctx context.Context, role string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM keys WHERE ? = '' OR role = ?", role, role).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count keys: %w", classify(err))
	}
	return n, nil
}

// scanKey reads a row of keyColumns.
func scanKey(r scanner) (Key, error) {
	var k Key
	var created int64
	var limits string
	if err := r.Scan(&k.ID, &k.Name, &k.Role, &k.Hash, &k.Format, &created, &limits); err != nil {
		return Key{}, err
	}
	if limits != "{}" {
		k.Limits = json.RawMessage(limits)
	}
	k.Hash = nonNil(k.Hash)
	k.CreatedAt = fromNanos(created)
	return k, nil
}
