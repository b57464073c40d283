package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Secret is a named value of one API key's tenant, kept sealed: the store
// never sees the value itself (internal/secrets seals and opens it).
type Secret struct {
	// Owner is the ID of the API key that stored the secret.
	Owner string
	// Name is unique per owner.
	Name string
	// Sealed is the value as internal/secrets sealed it.
	Sealed []byte
	// CreatedAt is when the name was first stored; the zero time means now.
	CreatedAt time.Time
	// UpdatedAt is when the value was last set; the zero time means
	// CreatedAt on insert, now on replace.
	UpdatedAt time.Time
}

// PutSecret stores sec, replacing the value of a secret with the same owner
// and name. A replace keeps the first CreatedAt. It reports whether the
// secret is new.
func (s *Store) PutSecret(ctx context.Context, sec Secret) (created bool, err error) {
	if sec.Owner == "" || sec.Name == "" {
		return false, fmt.Errorf("put secret: empty owner or name: %w", errdefs.ErrInvalid)
	}
	if sec.CreatedAt.IsZero() {
		sec.CreatedAt = now()
	}
	put := func(t *tx) error {
		created = false
		res, err := t.ExecContext(ctx, "UPDATE secrets SET sealed = ?, updated_at = ? WHERE owner = ? AND name = ?",
			nonNil(sec.Sealed), nanos(updatedAt(sec.UpdatedAt, now())), sec.Owner, sec.Name)
		if err != nil {
			return classify(err)
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		created = true
		_, err = t.ExecContext(ctx, "INSERT INTO secrets (owner, name, sealed, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
			sec.Owner, sec.Name, nonNil(sec.Sealed), nanos(sec.CreatedAt), nanos(updatedAt(sec.UpdatedAt, sec.CreatedAt)))
		return err
	}
	err = s.inTx(ctx, put)
	if isUniqueViolation(err) {
		// On PostgreSQL another process inserted the same secret between
		// this one's update and insert; now the update finds it.
		err = s.inTx(ctx, put)
	}
	if err != nil {
		return false, fmt.Errorf("put secret %s: %w", sec.Name, classify(err))
	}
	return created, nil
}

// updatedAt is t, or def when t is zero.
func updatedAt(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}

// GetSecret returns the secret of owner with the given name.
func (s *Store) GetSecret(ctx context.Context, owner, name string) (Secret, error) {
	sec := Secret{Owner: owner, Name: name}
	var created, updated int64
	err := s.db.QueryRowContext(ctx, "SELECT sealed, created_at, updated_at FROM secrets WHERE owner = ? AND name = ?",
		owner, name).Scan(&sec.Sealed, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("get secret %s: %w", name, classify(err))
	}
	sec.Sealed = nonNil(sec.Sealed)
	sec.CreatedAt, sec.UpdatedAt = fromNanos(created), fromNanos(updated)
	return sec, nil
}

// ListSecrets returns the secrets of owner ordered by name, without their
// sealed values (Sealed is nil).
func (s *Store) ListSecrets(ctx context.Context, owner string) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT name, created_at, updated_at FROM secrets WHERE owner = ? ORDER BY name", owner)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", classify(err))
	}
	defer rows.Close()
	list := []Secret{}
	for rows.Next() {
		sec := Secret{Owner: owner}
		var created, updated int64
		if err := rows.Scan(&sec.Name, &created, &updated); err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		sec.CreatedAt, sec.UpdatedAt = fromNanos(created), fromNanos(updated)
		list = append(list, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list secrets: %w", classify(err))
	}
	return list, nil
}

// DeleteSecret removes the secret of owner with the given name.
func (s *Store) DeleteSecret(ctx context.Context, owner, name string) error {
	res, err := s.db.ExecContext(ctx, "DELETE FROM secrets WHERE owner = ? AND name = ?", owner, name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, classify(err))
	}
	return mustAffect(res, "secret", name)
}
